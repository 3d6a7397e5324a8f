"""Predictions shared by every process of one test session.

A prediction of a configuration (a training step under FakeTensorMode) costs seconds of CPU and is
a pure function of its arguments and of the code. Each process already memoizes it
(``functools.lru_cache``), but the test suite runs the same configurations in many processes: the
pytest workers, every notebook's kernel, the ranks they launch. Where ``COURSE_SESSION_CACHE``
names a folder, ``shared`` keeps each result there too, so that the first process to need it
computes it and the others read it.

The folder lives as long as one pytest session (the repository's ``conftest.py`` makes a fresh one
for every session, and removes it at the end), so a result never outlives the code that computed
it: a test run on changed code (a mutant, a scaffolded copy) starts its own empty folder. Outside
a test session (a learner's notebook, the site's build) the variable is unset and nothing is kept
on disk. A graded submission never sees the variable (the grader passes on a fixed list of
variables), and a grading sandbox ignores it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .checks import RecordError, guard
from .files import atomic_write

ENV_VAR = "COURSE_SESSION_CACHE"


def folder() -> Path | None:
    """The session's folder, or None where results are not shared."""
    value = os.environ.get(ENV_VAR)
    if not value or os.environ.get("COURSE_GRADER_SANDBOX"):
        return None
    return Path(value)


def shared(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a pure function of arguments whose ``repr`` identifies them (tuples of names and
    numbers): within a session, its result is computed once for all processes (``name`` keeps
    functions apart)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            where = folder()
            if where is None:
                return fn(*args)
            path = where / f"{name}-{hashlib.sha256(repr(args).encode()).hexdigest()[:40]}.pickle"
            try:
                with open(path, "rb") as f:
                    return pickle.load(f)
            except Exception:  # noqa: BLE001 - not computed yet, the folder gone, or a file cut short or
                pass  # foreign (unpickling can raise anything): compute it here
            value = fn(*args)
            if where.is_dir():  # a folder removed at the session's end is not made again
                try:  # whole or not at all: another process may be reading
                    atomic_write(path, pickle.dumps(value))
                except RecordError:
                    pass  # a full disk, a folder removed meanwhile: the result is only not shared
            return value

        return wrapper

    return decorate


guard(globals(), RecordError)
