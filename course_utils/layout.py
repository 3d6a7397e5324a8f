"""The course's file names: notebook NN's lesson, exercise and solution.

A lesson ``notebooks/NN_topic.ipynb`` has its exercise in ``exercises/NN_topic_exercise.ipynb``,
generated from its solution ``solutions/NN_topic.ipynb``. The exercise's name differs from the
lesson's because JupyterLab titles a tab with the file's name only: a learner with the lesson and
its exercise open side by side must be able to tell the two tabs apart. Every part of the course
that names an exercise file (the generator, the scaffold, the student release, the site) asks this
module, and ``notebook_title`` reads a lesson's title (the README tables, the zip's README).
"""

from __future__ import annotations

from pathlib import Path, PurePath

from .checks import ScaffoldError, guard
from .files import read_notebook

#: what an exercise's file name adds to its lesson's stem
EXERCISE_SUFFIX = "_exercise"


def lesson_stem(name: str | PurePath) -> str:
    """The lesson's stem of a course file: ``07_checkpointing`` for ``07_checkpointing.ipynb``,
    ``exercises/07_checkpointing_exercise.ipynb`` or ``solutions/07_checkpointing.ipynb``."""
    stem = PurePath(name).name.removesuffix(".ipynb")
    return stem.removesuffix(EXERCISE_SUFFIX)


def exercise_name(name: str | PurePath) -> str:
    """The exercise's file name (in ``exercises/``) of a lesson or solution: ``07_checkpointing``
    or ``07_checkpointing.ipynb`` -> ``07_checkpointing_exercise.ipynb``."""
    return f"{lesson_stem(name)}{EXERCISE_SUFFIX}.ipynb"


def notebook_title(path: str | Path) -> str:
    """A notebook's title from its first cell's first line: '# 05 · In-place ReLU' -> 'In-place ReLU'.
    A file that is not such a notebook: ``RecordError`` (unreadable) or ``ScaffoldError`` (no title)."""
    cells = read_notebook(path)["cells"]
    source = cells[0]["source"] if cells else ""
    text = "".join(source) if isinstance(source, list) else source
    if not isinstance(text, str) or not text.strip():
        raise ScaffoldError(f"{path} has no title: its first cell is not a line '# NN · Title'.",
                            "start the notebook with a markdown cell '# NN · Title'.")
    return text.splitlines()[0].lstrip("# ").split("·", 1)[-1].strip()


guard(globals(), ScaffoldError)
