"""A pytest plugin for nbval runs that keeps what nbval throws away: the executed notebook.

    COURSE_NBVAL_KEEP=DIR python -m pytest --nbval-lax -p course_utils.gpu_kit.nbval_record notebooks/02_x.ipynb

After every cell nbval runs, the notebook with the outputs so far is written to
``DIR/<name>.ipynb`` and each cell's outcome and seconds to ``DIR/<name>.cells.json`` (each file
whole: a temporary file, then a rename), so a run stopped at any moment leaves what it executed.
nbval reads a cell's outputs from the kernel into ``item.test_outputs`` (the ``output_type`` of
each is the kernel message's type: ``stream``, ``display_data``, ``execute_result``, ``error``,
nbformat's own names); they are copied into the cell. Without ``COURSE_NBVAL_KEEP`` it does nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ..checks import RecordError, guard
from ..files import atomic_write

ENV_VAR = "COURSE_NBVAL_KEEP"
_STATE: dict[str, dict[str, Any]] = {}  # notebook path -> {"nb", "cells", "count"}


def _output(out: Any, count: int) -> dict[str, Any]:
    kind = out.get("output_type")
    if kind == "stream":
        return {"output_type": "stream", "name": out.get("name", "stdout"), "text": out.get("text", "")}
    if kind in ("display_data", "execute_result"):
        d = {"output_type": kind, "data": dict(out.get("data", {})), "metadata": dict(out.get("metadata", {}))}
        if kind == "execute_result":
            d["execution_count"] = count
        return d
    if kind == "error":
        return {"output_type": "error", "ename": out.get("ename", ""), "evalue": out.get("evalue", ""),
                "traceback": list(out.get("traceback", []))}
    return {"output_type": "stream", "name": "stderr", "text": f"[an output of type {kind!r} left out]\n"}


def _save(item: Any, report: Any) -> None:
    folder = Path(os.environ[ENV_VAR])
    folder.mkdir(parents=True, exist_ok=True)
    nb_path = Path(str(item.parent.path))
    state = _STATE.setdefault(str(nb_path), {"nb": item.parent.nb, "cells": [], "count": 0})
    state["count"] += 1
    cell = item.cell
    cell.execution_count = state["count"]
    cell.outputs = [_output(o, state["count"]) for o in (getattr(item, "test_outputs", None) or [])]
    error = ""
    if report.failed:
        error = str(getattr(report, "longreprtext", "") or report.longrepr)[-2000:]
    state["cells"].append({"code cell": getattr(item, "cell_num", None), "outcome": report.outcome,
                           "seconds": round(report.duration, 2), "error": error})
    atomic_write(folder / nb_path.name, json.dumps(state["nb"], indent=1, default=dict))
    atomic_write(folder / (nb_path.stem + ".cells.json"), json.dumps(state["cells"], indent=1))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any):  # noqa: ARG001 - pytest's hook spec (item, call)
    """After each cell nbval runs (its call, or a setup that failed): write the notebook so far and
    the cell's outcome to ``COURSE_NBVAL_KEEP``; without that variable, nothing."""
    outcome = yield
    report = outcome.get_result()
    if not os.environ.get(ENV_VAR) or not hasattr(item, "cell") or not hasattr(item, "test_outputs"):
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _save(item, report)


guard(globals(), RecordError)
