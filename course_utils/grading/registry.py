"""Which module holds which exercise's checks: ``course_utils/grading/exNN.py``, one per exercise,
found from the files present (a new ``ex11.py`` is an exercise; no list to edit)."""

from __future__ import annotations

import importlib
from pathlib import Path

from .core import Exercise

_HERE = Path(__file__).resolve().parent

#: exercise number -> module (course_utils.grading.exNN), one per ``exNN.py`` in this folder
MODULES = {p.stem[2:]: f"{__package__}.{p.stem}" for p in sorted(_HERE.glob("ex[0-9][0-9].py"))}


def exercise(nn_id: str) -> Exercise:
    """The ``Exercise`` of number ``nn_id`` (e.g. "00"); KeyError names the known ones."""
    if nn_id not in MODULES:
        raise KeyError(f"no exercise {nn_id!r} (no course_utils/grading/ex{nn_id}.py); "
                       f"known: {', '.join(sorted(MODULES))}")
    return importlib.import_module(MODULES[nn_id]).EX


def load_all() -> dict[str, Exercise]:
    """Import every exercise module now (the grader does this before any submission runs)."""
    return {k: exercise(k) for k in sorted(MODULES)}
