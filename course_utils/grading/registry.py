"""Which module holds which exercise's checks."""

from __future__ import annotations

import importlib

from .core import Exercise

#: exercise number -> module (course_utils.grading.exNN)
MODULES = {f"{k:02d}": f"course_utils.grading.ex{k:02d}" for k in range(11)}


def exercise(nn_id: str) -> Exercise:
    """The ``Exercise`` of number ``nn_id`` ("00" ... "10"); KeyError names the known ones."""
    if nn_id not in MODULES:
        raise KeyError(f"no exercise {nn_id!r}; known: {', '.join(sorted(MODULES))}")
    return importlib.import_module(MODULES[nn_id]).EX


def load_all() -> dict[str, Exercise]:
    """Import every exercise module now (the grader does this before any submission runs)."""
    return {k: exercise(k) for k in sorted(MODULES)}
