"""The student release's own README and Makefile (``python -m course_utils.grading.release OUT``):
they name only what the release contains, list every notebook and exercise, and their make
targets run there; ``check_release`` reports a README or Makefile that names what is missing.
And the nbgrader course's ``nbgrader_config.py``: no nbgrader command warns about it."""

from __future__ import annotations

import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_utils.grading.release import ROOT, check_release, nbgrader_course, release
from course_utils.layout import exercise_name
from course_utils.markdown import CODE, links

MAKE = shutil.which("make")
TARGETS = {"install", "lab", "test", "check", "clean"}
VENV = Path(sys.executable).parent.parent  # the venv running the tests: stands in for the release's .venv


def makefile_targets(text: str) -> set[str]:
    return {n for m in re.finditer(r"(?m)^([A-Za-z0-9_][\w .-]*?)\s*:(?!=)", text) for n in m.group(1).split()}


def heading(notebook: Path) -> str:
    """``# 03 · The memory-limit test`` -> ``The memory-limit test``."""
    first = nbformat.read(notebook, as_version=4).cells[0].source.splitlines()[0]
    return first.removeprefix("# ").split(" · ", 1)[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "course-release"
    release(out)
    return out


@pytest.fixture
def copy(built, tmp_path):
    """A copy of the release to spoil."""
    return Path(shutil.copytree(built, tmp_path / "course-release"))


def test_the_readme_links_and_names_only_what_the_release_contains(built):
    readme, makefile = (built / "README.md").read_text(), (built / "Makefile").read_text()
    targets = links(readme)
    assert "notebooks/00_gpu_memory_basics.ipynb" in targets and "exercises/10_capstone_exercise.ipynb" in targets
    for target in targets:
        assert (built / target).exists(), f"README.md links to {target}, not in the release"
    for text in (readme, makefile):
        for absent in ("docs/teaching.md", "solutions/", "tests/", "CONTRIBUTING.md", "tools/", "site/",
                       "test-grader", "make site"):
            assert absent not in text, absent
    assert not (built / "docs" / "teaching.md").exists() and not (built / "solutions").exists()
    assert (built / "docs" / "gpu-runs").is_dir()  # notebook 02 links to its record
    assert check_release(built) == []


def test_every_make_target_the_readme_gives_is_in_the_makefile(built):
    readme = (built / "README.md").read_text()
    targets = makefile_targets((built / "Makefile").read_text())
    given = {m.group(1) for m in re.finditer(r"\bmake\s+(?:[A-Z_]+=\S*\s+)*([a-z][\w-]*)",
                                             "\n".join(m.group(0) for m in CODE.finditer(readme)))}
    assert TARGETS <= given, given  # the README documents each of them
    assert given <= targets, given - targets


@pytest.mark.skipif(MAKE is None, reason="needs make")
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_each_make_target_of_the_release_resolves(built, target):
    r = subprocess.run([MAKE, "-n", target], cwd=built, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    if target != "clean":
        assert "pip install -q -c constraints.txt -e \".[lab,test]\"" in r.stdout  # installs first
    if target == "lab":  # on the release's root: the notebooks' links to ../exercises/ work
        assert re.search(r"jupyter lab( --allow-root)?\s*$", r.stdout, re.M), r.stdout


def test_the_readme_lists_every_notebook_in_order_with_its_exercise(built):
    readme = (built / "README.md").read_text()
    rows = [line for line in readme.splitlines() if re.match(r"\| \d\d \|", line)]
    notebooks = sorted((built / "notebooks").glob("*.ipynb"))
    assert [row[2:4] for row in rows] == [nb.name[:2] for nb in notebooks]
    for row, nb in zip(rows, notebooks, strict=True):
        assert f"[{heading(nb)}](notebooks/{nb.name})" in row
        assert f"(exercises/{nb.stem}_exercise.ipynb)" in row
    teacher = {row[2:4]: row.rsplit("|", 2)[1].strip() for row in rows}
    assert teacher["00"] == "-" and "`best_segments` (1)" in teacher["07"]
    assert "`naive_estimate`" not in teacher["03"]  # secret, but checked in the release: its reference is kept


def test_the_release_pytest_runs_its_notebooks_and_exercises(built):
    text = (built / "pyproject.toml").read_text()
    m = re.search(r"(?m)^testpaths = \[(.*)\]$", text)
    paths = re.findall(r'"([^"]+)"', m.group(1))
    assert paths == ["notebooks", "exercises"]
    assert all((built / p).is_dir() for p in paths)
    assert "make test-grader" not in text.split("markers")[0]  # its comments were the repository's


@pytest.mark.parametrize("spoil, reported", [
    (lambda out: _append(out / "README.md", "\nSee [the teacher's guide](docs/teaching.md).\n"),
     ["README.md links to docs/teaching.md", "README.md names docs/teaching.md"]),
    (lambda out: _append(out / "README.md", "\nThe answers are in `solutions/`.\n"), ["README.md names solutions/"]),
    (lambda out: _append(out / "README.md", "\n```bash\nmake site\n```\n"),
     ["README.md gives `make site`, but the release's Makefile has no target site"]),
    (lambda out: _append(out / "Makefile", "\nlint:\n\t$(BIN)/python tools/check_stripped.py\n"),
     ["Makefile uses tools/check_stripped.py", "Makefile names tools/"]),
    (lambda out: _append(out / "Makefile", "\n# the grader: make test-grader\n"),
     ["Makefile gives `make test-grader`"]),
    (lambda out: (out / "README.md").unlink(), ["README.md is missing"]),
    # what the old release shipped: the repository's own README and Makefile
    (lambda out: [shutil.copy(ROOT / n, out / n) for n in ("README.md", "Makefile")],
     ["README.md links to docs/teaching.md", "README.md names tests/", "Makefile uses tools/check_stripped.py"]),
], ids=["link-to-teaching", "names-solutions", "make-site", "makefile-tools", "makefile-comment-target",
        "no-readme", "repository-readme-and-makefile"])
def test_check_release_reports_what_the_readme_or_makefile_names_but_lacks(copy, spoil, reported):
    spoil(copy)
    problems = check_release(copy)
    for expected in reported:
        assert any(p.startswith(expected) for p in problems), (expected, problems)


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def _make_check(out: Path, *args: str) -> subprocess.CompletedProcess:
    """``make check`` in ``out`` with the tests' venv as its .venv (-o: not installed again)."""
    stamp = VENV / ".installed"
    return subprocess.run([MAKE, "-o", str(stamp), f"VENV={VENV}", "check", *args], cwd=out, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=""))


@pytest.mark.skipif(MAKE is None, reason="needs make")
def test_make_check_fails_an_untouched_exercise_and_passes_its_solution(built, copy):
    exercise = copy / "exercises" / "00_gpu_memory_basics_exercise.ipynb"
    shutil.copy(ROOT / "solutions" / "00_gpu_memory_basics.ipynb", copy / "exercises" / "00_solved.ipynb")
    r = _make_check(copy, "EX=00")
    assert r.returncode != 0, r.stdout
    assert "00_gpu_memory_basics_exercise.ipynb: 0/5 points" in r.stdout and "not implemented yet" in r.stdout, r.stdout
    assert "00_solved.ipynb: 5/5 points" in r.stdout, r.stdout
    assert "1 of 2 exercises have parts to fix" in r.stdout, r.stdout
    assert exercise.read_text() == (built / "exercises" / exercise.name).read_text()  # not changed


WRONG = runpy.run_path(str(ROOT / "tests" / "wrong_answers" / "ex00.py"))["WRONG"]


@pytest.mark.grader
@pytest.mark.sweep  # make test-sweep: make test runs make check on the untouched exercise and its solution, and
# tests/test_exercises.py grades each typical wrong answer in-process
def test_make_check_fails_each_typical_wrong_answer_on_its_part(copy):
    from course_utils.grading.registry import exercise

    names = {p.key: p.name for p in exercise("00").parts}
    solution = ROOT / "solutions" / "00_gpu_memory_basics.ipynb"
    (copy / "exercises" / "00_gpu_memory_basics_exercise.ipynb").unlink()
    for i, (_what, old, new, _failing) in enumerate(WRONG):
        nb = nbformat.read(solution, as_version=4)
        for cell in nb.cells:
            cell.source = cell.source.replace(old, new)
        nbformat.write(nb, copy / "exercises" / f"00_wrong{i}.ipynb")
    r = _make_check(copy, "EX=00")
    assert r.returncode != 0 and f"{len(WRONG)} of {len(WRONG)} exercises have parts to fix" in r.stdout, r.stdout
    for i, (what, _old, _new, failing) in enumerate(WRONG):
        block = r.stdout.split(f"00_wrong{i}.ipynb:")[1].split(".ipynb:")[0]
        for key in failing:
            assert f"[FAIL] {names[key]}" in block, (what, block)


@pytest.mark.grader
@pytest.mark.sweep  # every solution top to bottom (8-9 min on a loaded machine): make test-sweep, not CI
def test_every_solution_passes_make_check_and_the_teacher_parts_are_the_readmes(copy):
    """The whole course: each solution in the release passes every part the release can check,
    and the parts it leaves to the teacher are the ones the README's table names."""
    for sol in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"):
        shutil.copy(sol, copy / "exercises" / exercise_name(sol))  # in place of its exercise
    r = subprocess.run([sys.executable, "check_exercises.py"], cwd=copy, capture_output=True, text=True,
                       timeout=1800, env=dict(os.environ, PYTHONPATH=""))
    teacher_lines = {}
    for block in re.split(r"(?m)^(?=\d\d_)", r.stdout):
        if block[:2].isdigit():
            teacher_lines[block[:2]] = [m.group(1).split(":")[0] for m in
                                        re.finditer(r"\[TEACHER\] (.*) \(\d+\): checked by your teacher", block)]
    readme = (copy / "README.md").read_text()
    for row in (line for line in readme.splitlines() if re.match(r"\| \d\d \|", line)):
        column = row.rsplit("|", 2)[1]
        names = [] if column.strip() == "-" else [n.strip().strip("`") for n in re.split(r" \(\d+\),?", column)
                                                   if n.strip()]
        assert teacher_lines[row[2:4]] == names, (row, teacher_lines[row[2:4]])
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]


# -- nbgrader -----------------------------------------------------------------------------------------
def _nbgrader(course: Path, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(course), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    r = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


@pytest.mark.grader
def test_nbgrader_reads_the_course_config_and_generate_assignment_enters_it_without_a_warning(tmp_path):
    """nbgrader reads the course's config without a warning (a setting it does not recognise
    is a warning in every command's output), and generate_assignment enters exercise 00 in its
    database. One course and two nbgrader commands (each a process importing nbgrader: ~8 CPU-s);
    the config test that ran ``db assignment list`` alone repeated the second command here."""
    pytest.importorskip("nbgrader")
    course = tmp_path / "course"
    nbgrader_course(course)
    out = _nbgrader(course, "generate_assignment", "ex00")
    out += _nbgrader(course, "db", "assignment", "list")
    assert "not recognized" not in out and "WARNING" not in out, out
    assert "There are 1 assignments in the database" in out and "ex00" in out, out
