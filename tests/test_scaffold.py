"""Adding a notebook is one step: in a copy of the repository, `python -m course_utils.scaffold`
makes the next notebook with its exercise, and the course's tests accept it with no other edit:
the consistency checks, the new exercise's grading tests (full marks, untouched 0, its wrong
answers), the generator and nbgrader-metadata checks, the student release, the generated
tables, and the new notebook and solution under nbval."""

import os
import shutil
import subprocess
import sys

import pytest

from course_utils import scaffold

ROOT = scaffold.ROOT
#: set to 1 (make test-scaffold FULL=1) to run make test's whole suite on the scaffolded copy
FULL_ENV = "COURSE_SCAFFOLD_FULL_SUITE"


def _repository_files() -> list[str]:
    """The files of the checkout: tracked, and new ones git does not ignore."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"not a git checkout ({err}): the test copies the files git lists")
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]


@pytest.mark.scaffold
@pytest.mark.timeout(2400)
def test_a_scaffolded_next_notebook_passes_the_tests_with_no_other_edit(tmp_path):
    copy = tmp_path / "course"
    for rel in _repository_files():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, copy / rel)
    nn = f"{int(scaffold.entries()[-1].nn) + 1:02d}"
    env = {**os.environ, "PYTHONPATH": str(copy), "COURSE_SIZE": "tiny", "MPLBACKEND": "Agg"}
    made = subprocess.run([sys.executable, "-m", "course_utils.scaffold", nn, "A throwaway notebook"],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    new = scaffold.Entry(nn, f"{nn}_a_throwaway_notebook")
    for rel in (new.notebook, new.solution, new.exercise, new.grading, new.wrong):
        assert (copy / rel).is_file(), f"the scaffold did not write {rel}:\n{made.stdout}"
    assert scaffold.problems(copy) == []
    if os.environ.get(FULL_ENV) == "1":  # make test-scaffold FULL=1: all of make test's suite
        cmd = ["-n", "auto", "--dist", "loadfile", "-m", "not grader and not emulated and not scaffold",
               "tests", "notebooks", new.solution]
        timeout = 1800
    else:
        selected = " or ".join([nn, "course_layout", "every_exercise", "three_parts", "committed_exercises",
                                "nbgrader_metadata", "release_has_no_answers", "teaching_timings", "readme_blocks"])
        cmd = ["-p", "no:xdist", "-k", selected, "tests/test_course_layout.py", "tests/test_exercises.py",
               "tests/test_grading.py", "tests/test_readme.py", new.notebook, new.solution]
        timeout = 500
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *cmd],
                         cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    passed = [line[len("PASSED "):] for line in run.stdout.splitlines() if line.startswith("PASSED ")]
    # the new exercise's grading tests and both new notebooks were among them
    for item in (f"tests/test_exercises.py::test_solution_full_marks_untouched_zero[{nn}]",
                 f"tests/test_exercises.py::test_typical_wrong_answer_fails_its_part[{nn}-",
                 "tests/test_course_layout.py::test_the_course_parts_agree[check_links]",
                 f"{new.notebook}::Cell 0", f"{new.solution}::Cell 0"):
        assert any(p.startswith(item) for p in passed), (item, run.stdout[-3000:])


def test_a_row_goes_into_its_own_sections_table_not_a_later_numbered_one():
    """README has numbered tables in other sections (the GPU kit's plan: `| 12 | `notebook/02` |`):
    the notebooks' row is added under '## The notebooks', after its own rows."""
    text = ("# T\n\n## The notebooks\n\n| NN | notebook |\n|---|---|\n| 00 | `00_a` |\n| 01 | `01_b` |\n\n"
            "## The GPU kit\n\n| # | task |\n|---|---|\n| 01 | `diagnose/cublas` |\n| 12 | `notebook/01` |\n")
    out = scaffold._insert_row(text, "## The notebooks", r"\| \d\d \| `", "02", "| 02 | `02_c` |", "README.md")
    notebooks, kit = out.split("## The GPU kit")
    assert notebooks.rstrip().endswith("| 01 | `01_b` |\n| 02 | `02_c` |") and "02_c" not in kit
