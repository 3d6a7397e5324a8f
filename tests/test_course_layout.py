"""The course's parts agree: every notebook has its solution, exercise, grading module, wrong
answers, README row, teaching-guide row, timing and links (course_utils/scaffold.py lists what a
notebook consists of). Each failure names the file to edit and the fix; `python -m
course_utils.scaffold --check` lists them all at once, `python -m course_utils.scaffold NN`
creates what notebook NN lacks."""

import json
import shutil

import pytest

from course_utils import markdown, scaffold
from course_utils.grading.registry import MODULES, exercise

CHECKS = [scaffold.check_files, scaffold.check_tables, scaffold.check_timings, scaffold.check_links]


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_the_course_parts_agree(check):
    found = check()
    assert not found, "\n".join(found)


def test_every_notebook_has_an_exercise_module_and_no_module_is_left_over():
    assert sorted(MODULES) == [e.nn for e in scaffold.entries()], "see test_the_course_parts_agree[check_files]"


def test_parts_read_from_the_source_are_the_exercises_parts():
    """check_tables counts an exercise's parts from its source (`X = EX.part("key", ...)`)."""
    for e in scaffold.entries():
        assert scaffold._parts(scaffold.ROOT, e) == [p.key for p in exercise(e.nn).parts], (
            f"{e.grading}: declare each part as `NAME = EX.part(\"key\", ...)` at the top level")


# -- the checks catch each missing part and say what to do --------------------------------------
@pytest.fixture
def course(tmp_path):
    """The course's files that the checks read, in a temporary folder."""
    root = scaffold.ROOT
    for folder in ("notebooks", "solutions", "exercises", "tests/wrong_answers", "docs"):
        shutil.copytree(root / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "course_utils").mkdir()
    shutil.copytree(root / "course_utils" / "grading", tmp_path / "course_utils" / "grading",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "results").mkdir()
    for path in [*root.glob("*.md"), root / "tests" / "README.md", root / "results" / "timings.json"]:
        shutil.copy(path, tmp_path / path.relative_to(root))
    assert scaffold.problems(tmp_path) == []
    return tmp_path


def test_a_missing_solution_module_or_wrong_answers_file_is_named_with_its_fix(course):
    (course / "solutions" / "05_inplace_relu.ipynb").unlink()
    (course / "course_utils" / "grading" / "ex03.py").unlink()
    (course / "tests" / "wrong_answers" / "ex07.py").unlink()
    found = scaffold.check_files(course)
    assert any(p.startswith("solutions/05_inplace_relu.ipynb is missing") and "course_utils.scaffold 05" in p
               for p in found), found
    assert any(p.startswith("course_utils/grading/ex03.py is missing") for p in found), found
    assert any(p.startswith("tests/wrong_answers/ex07.py is missing") and "WRONG" in p for p in found), found
    (course / "exercises" / "05_inplace_relu_exercise.ipynb").unlink()
    assert any("course_utils.grading.generate" in p for p in scaffold.check_files(course))


def test_names_gaps_and_strays_are_named(course):
    last = int(scaffold.entries(course)[-1].nn)
    skipped, gap, stray = (f"{last + k:02d}" for k in (1, 2, 3))
    shutil.copy(course / "notebooks" / "00_gpu_memory_basics.ipynb", course / "notebooks" / f"{gap}_later.ipynb")
    shutil.copy(course / "solutions" / "00_gpu_memory_basics.ipynb", course / "solutions" / "Draft.ipynb")
    (course / "tests" / "wrong_answers" / f"ex{last:02d}.py").rename(course / "tests" / "wrong_answers" / f"ex{stray}.py")
    found = "\n".join(scaffold.check_files(course))
    assert f"no notebook {skipped} before {gap}" in found and "solutions/Draft.ipynb: name it NN_topic.ipynb" in found
    assert f"tests/wrong_answers/ex{stray}.py belongs to no notebook" in found
    assert f"tests/wrong_answers/ex{last:02d}.py is missing" in found


def test_a_solution_importing_another_exercises_checks_is_named(course):
    path = course / "solutions" / "04_mixed_precision.ipynb"
    path.write_text(path.read_text().replace("course_utils.grading.ex04", "course_utils.grading.ex03"))
    assert any(p.startswith("solutions/04_mixed_precision.ipynb imports course_utils.grading.ex03")
               for p in scaffold.check_files(course))


def test_missing_or_wrong_table_rows_are_named(course):
    readme = course / "README.md"
    readme.write_text("\n".join(line for line in readme.read_text().splitlines() if not line.startswith("| 07 | `07_")))
    teaching = course / "docs" / "teaching.md"
    text = teaching.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 03 | ") and line.endswith(" | 5 |"))
    teaching.write_text(text.replace(row, row.rsplit("|", 2)[0] + "| 9 |"))
    found = scaffold.check_tables(course)
    assert any(p.startswith("README.md, table under '## The notebooks': no row for notebooks/07_checkpointing.ipynb")
               and "| 07 | `07_checkpointing` |" in p for p in found), found
    assert any("exercise 03 has 5 parts" in p and "the row says 9" in p for p in found), found


def test_a_missing_timing_is_named_with_the_command(course):
    path = course / "results" / "timings.json"
    data = json.loads(path.read_text())
    del data["rows"]["04"]["solutions"]
    path.write_text(json.dumps(data))
    assert scaffold.check_timings(course) == [
        "results/timings.json has no time for solutions/04_mixed_precision.ipynb: run "
        "`python -m course_utils.readme --render --timings 04` (about a minute)"]


def test_broken_and_missing_links_are_named(course):
    path = course / "notebooks" / "02_measure_memory_with_hooks.ipynb"
    path.write_text(path.read_text().replace("03_memory_limit_test.ipynb", "03_limit.ipynb")
                    .replace("../exercises/02_", "../exercises/2_"))
    found = "\n".join(scaffold.check_links(course))
    assert "notebooks/02_measure_memory_with_hooks.ipynb: the link (03_limit.ipynb) leads to no file" in found
    assert "notebooks/02_measure_memory_with_hooks.ipynb: no link to the next notebook: add `**Next:** [03 · " in found
    assert "notebooks/02_measure_memory_with_hooks.ipynb: no link to its exercise" in found
    assert markdown.links("see `f(...)` and [x](a.md#part), [y](https://e.org), [z](#top)") == ["a.md"]
