"""course_utils.layout: a lesson, its exercise and its solution have names JupyterLab's tabs tell apart."""

import json
from pathlib import Path

import pytest

from course_utils import layout
from course_utils.checks import RecordError, ScaffoldError
from course_utils.layout import EXERCISE_SUFFIX, exercise_name, lesson_stem, notebook_title

ROOT = Path(__file__).resolve().parent.parent


def test_an_exercise_is_named_after_its_lesson_with_a_suffix():
    for given in ("07_checkpointing", "07_checkpointing.ipynb", "solutions/07_checkpointing.ipynb",
                  Path("exercises/07_checkpointing_exercise.ipynb")):
        assert lesson_stem(given) == "07_checkpointing"
        assert exercise_name(given) == "07_checkpointing_exercise.ipynb"


def test_no_lesson_and_exercise_share_a_file_name():
    """JupyterLab titles a tab with the file's name only: a lesson and its exercise of one name opened
    as two identical tabs (issue 41). Fails on the layout before the exercises were renamed."""
    lessons = {p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    exercises = {p.name for p in (ROOT / "exercises").glob("[0-9][0-9]_*.ipynb")}
    assert lessons and exercises and not lessons & exercises
    assert {lesson_stem(e) for e in exercises} <= {lesson_stem(n) for n in lessons}
    assert all(e.endswith(f"{EXERCISE_SUFFIX}.ipynb") for e in exercises)
    solutions = {p.name for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")}
    assert {exercise_name(s) for s in solutions} == exercises  # one exercise per solution, by this module's rule


def test_a_title_is_the_first_heading_without_its_number(tmp_path):
    for first, title in (("# 05 · In-place ReLU\n\n> a quote", "In-place ReLU"), ("# Draft", "Draft")):
        path = tmp_path / "nb.ipynb"
        path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": [first]}]}))
        assert notebook_title(path) == title


@pytest.mark.parametrize("content, error, words", [
    ('{"cells": [{"source": ["# 05 · In-place', RecordError, "cut short"),  # a save interrupted
    ('[]', RecordError, r"is a list \(\[...\]\), not an object"),
    ('{"cells": []}', ScaffoldError, "has no title"),
    ('{"cells": [{"source": 5}]}', RecordError, "not a list of cells"),
])
def test_a_notebook_without_a_readable_title_is_named_with_the_fix(tmp_path, content, error, words):
    """Before: a KeyError, IndexError or JSONDecodeError that named no file (the site, the
    scaffold and the release read every title through notebook_title)."""
    path = tmp_path / "05_x.ipynb"
    path.write_text(content)
    with pytest.raises(error, match=words) as info:
        layout.notebook_title(path)
    assert str(path) in str(info.value) and "Fix:" in str(info.value)
