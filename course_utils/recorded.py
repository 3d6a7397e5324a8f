"""Figures recorded on a real CUDA GPU, shown where the learner's machine has none.

A notebook cell that needs a GPU has two branches::

    if cfg.is_cuda:
        table = measure_something()                 # the real torch.cuda figure
        recorded.record("02/expandable_segments", table)
        display(table)
    else:
        recorded.show("02/expandable_segments")     # the figure a GPU showed, labelled

``record`` writes nothing unless ``$COURSE_RECORD_DIR`` is set: the GPU kit
(``python -m course_utils.gpu_report``) sets it while it executes every notebook at full size,
then collects what the cells recorded into ``recorded/<gpu>.json`` in the repository. ``show``
reads those files and prints the figure with the GPU, the date and the torch version it was
recorded with -- or, when no GPU run has been recorded yet, says so in one line.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ENV_VAR = "COURSE_RECORD_DIR"
# where ``show``/``lookup`` read recorded figures from, instead of the repository's recorded/
# (the site's build points it at a fixture recording in its tests)
SHOW_ENV_VAR = "COURSE_RECORDED"
ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "recorded"


def recorded_folder() -> Path:
    """Where recorded figures are read from: ``$COURSE_RECORDED``; else the checkout's
    ``recorded/``; else, for course_utils installed from its wheel (a hosted notebook, where
    the course's zip is unpacked beside it), ``recorded/`` in or one folder above the notebook's
    working directory."""
    if os.environ.get(SHOW_ENV_VAR):
        return Path(os.environ[SHOW_ENV_VAR])
    for folder in (RECORDED, Path.cwd() / "recorded", Path.cwd().parent / "recorded"):
        if folder.is_dir():
            return folder
    return RECORDED


def _encode(value: Any) -> dict[str, Any]:
    """A JSON form of a figure: a pandas DataFrame, a string, or anything ``json`` accepts."""
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(value, pd.DataFrame):
        return {"kind": "table", "columns": [str(c) for c in value.columns],
                "index": [str(i) for i in value.index],
                "data": json.loads(value.to_json(orient="values", double_precision=6))}
    if isinstance(value, str):
        return {"kind": "text", "data": value}
    try:
        json.dumps(value)
    except TypeError as err:
        raise TypeError(
            f"recorded figures must be a DataFrame, a string or JSON data, got "
            f"{type(value).__name__} ({err}). Fix: convert it, e.g. to a dict of numbers."
        ) from None
    return {"kind": "json", "data": value}


def _decode(entry: dict[str, Any]) -> Any:
    if entry["kind"] == "table":
        import pandas as pd

        return pd.DataFrame(entry["data"], columns=entry["columns"], index=entry.get("index"))
    return entry["data"]


def machine() -> dict[str, str]:
    """What a figure was recorded on: GPU name, torch and CUDA versions, date."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu-{platform.machine()}"
    return {"gpu": gpu, "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "date": datetime.date.today().isoformat()}


def file_stem(gpu: str) -> str:
    """A GPU's name as a file name: ``NVIDIA H100 80GB HBM3`` -> ``NVIDIA_H100_80GB_HBM3``."""
    return gpu.replace(" ", "_").replace("/", "_")


def record(key: str, value: Any, folder: str | Path | None = None) -> Any:
    """Keep ``value`` (measured on a GPU) under ``key`` in ``folder``, or, without one, in
    ``$COURSE_RECORD_DIR`` if the GPU kit is collecting figures from notebooks; otherwise do
    nothing. Returns ``value``."""
    out = folder or os.environ.get(ENV_VAR)
    if not out:
        return value
    if not key or any(c in key for c in "\\:*?\"<>| "):
        raise ValueError(f"record key {key!r}: use letters, digits, '_', '-', '.' and '/'")
    entry = {"key": key, **machine(), **_encode(value)}
    path = Path(out) / (key.replace("/", "__") + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry, indent=1))
    return value


def merged(src: str | Path) -> dict[str, Any]:
    """The per-figure files ``record`` wrote under ``src``, as one recording:
    ``{"meta": {gpu, torch, cuda, date}, "figures": {key: figure}}``."""
    entries = [json.loads(p.read_text()) for p in sorted(Path(src).glob("*.json"))]
    if not entries:
        raise FileNotFoundError(f"no recorded figures under {src}")
    meta = {k: entries[0][k] for k in ("gpu", "torch", "cuda", "date")}
    figures = {e["key"]: {k: v for k, v in e.items() if k not in meta and k != "key"} for e in entries}
    return {"meta": meta, "figures": figures}


def write(data: dict[str, Any], dest: str | Path) -> Path:
    """Write a recording (``merged``'s form) to ``dest`` whole or not at all (a temporary file
    beside it, then a rename: a full disk never leaves half a file for ``show`` to read)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def collect(src: str | Path, dest: str | Path | None = None) -> Path:
    """Merge the per-figure files ``record`` wrote under ``src`` into one
    ``recorded/<gpu>.json`` (what the repository keeps). Returns its path."""
    data = merged(src)
    return write(data, Path(dest) if dest else RECORDED / (file_stem(data["meta"]["gpu"]) + ".json"))


@dataclass
class Recorded:
    """One figure recorded on a GPU (``lookup``'s answer): its key, its value, and the run's GPU,
    date and versions; ``label`` says so in words."""

    key: str
    value: Any
    meta: dict[str, str]

    @property
    def label(self) -> str:
        m = self.meta
        return f"recorded on {m['gpu']}, {m['date']}, torch {m['torch']} (CUDA {m['cuda']})"


def lookup(key: str, folder: str | Path | None = None) -> Recorded | None:
    """The newest recording of ``key`` among the ``*.json`` of ``folder`` (by default
    ``recorded_folder()``), or None."""
    found = []
    for path in sorted(Path(folder or recorded_folder()).glob("*.json")):
        data = json.loads(path.read_text())
        if key in data.get("figures", {}):
            found.append((data["meta"]["date"], data["meta"], data["figures"][key]))
    if not found:
        return None
    _, meta, entry = max(found, key=lambda f: f[0])
    return Recorded(key, _decode(entry), meta)


def show(key: str, what: str = "", folder: str | Path | None = None) -> Any:
    """Print (and display, in a notebook) the GPU figure recorded under ``key``, labelled with
    where it came from; without a recording, say so. ``what`` describes the figure for that
    case. Returns the value or None."""
    rec = lookup(key, folder)
    if rec is None:
        print(f"No GPU run has been recorded for this figure yet{f' ({what})' if what else ''}: "
              "this machine has no CUDA GPU. On one, `python -m course_utils.gpu_report` records it.")
        return None
    print(f"This machine has no CUDA GPU. The figure below was {rec.label}:")
    try:
        from IPython.display import display
    except ImportError:  # plain Python
        display = print
    display(rec.value)
    return rec.value
