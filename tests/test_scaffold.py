"""The contributor path (CONTRIBUTING.md, "Adding a notebook"), as written. Adding a notebook is one
step: in a copy of the repository, `python -m course_utils.scaffold` makes the next notebook with its
exercise, and `make check-notebook`'s tests accept it with no other edit: the consistency checks, the
check cells' points, the new exercise's grading tests (full marks, untouched 0, its wrong answers),
the generator and nbgrader-metadata checks, the student release, the generated tables, and the new
notebook and solution under nbval; `scaffold --check` refuses only its `TODO(scaffold)` placeholders.
Then issue 45's defects, each found by following CONTRIBUTING.md literally: its commands run in the
venv, its examples take the next free number, its check runs the layout tests, a wrong points total
and a placeholder left are refused, and new notebooks are stripped and linted; the Makefile lists its
targets (`make help`)."""

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from course_utils import scaffold

ROOT = scaffold.ROOT
#: set to 1 (make test-scaffold FULL=1) to run make test's whole suite on the scaffolded copy
FULL_ENV = "COURSE_SCAFFOLD_FULL_SUITE"
#: the tests that refuse a fresh scaffold, by design: its placeholders, and the doc's example number
#: (the scaffolded copy has used it); make test-scaffold FULL=1 deselects them on the copy
REFUSE_A_FRESH_SCAFFOLD = ("tests/test_scaffold.py::test_the_course_passes_scaffold_check_beyond_the_layout_tests",
                           "tests/test_scaffold.py::test_the_examples_take_the_next_free_number")


def _make_n(target: str, *assignments: str) -> list[str]:
    """The commands `make TARGET` would run, with $(BIN) as B/ (make -n: nothing runs)."""
    out = subprocess.run(["make", "--no-print-directory", "-n", "-B", target, "STAMP=/dev/null", "BIN=B", *assignments],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("B/")]


def check_notebook_pytest(nn: str) -> list[str]:
    """The pytest arguments of `make check-notebook NN=nn` (CONTRIBUTING.md's step 6)."""
    (line,) = [c for c in _make_n("check-notebook", f"NN={nn}") if " -m pytest " in c]
    return shlex.split(line.split(" -m pytest ", 1)[1])


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
    # scaffold --check refuses the fresh scaffold for its placeholders, and for nothing else
    refused = scaffold.release_problems(copy)
    assert refused and all(scaffold.PLACEHOLDER in p for p in refused), refused
    assert {p.split(",")[0].split(":")[0] for p in refused} == {new.notebook, new.solution, new.grading, new.wrong}
    if os.environ.get(FULL_ENV) == "1":  # make test-scaffold FULL=1: all of make test's suite
        cmd = ["-n", "auto", "--dist", "loadfile", "-m", "not grader and not emulated and not scaffold",
               *(f"--deselect={t}" for t in REFUSE_A_FRESH_SCAFFOLD), "tests", "notebooks", new.solution]
        timeout = 1800
    else:  # make check-notebook's pytest run, as CONTRIBUTING.md's step 6 gives it
        cmd = [a for arg in check_notebook_pytest(nn) for a in (sorted(str(p.relative_to(copy))
               for p in copy.glob(arg)) if "*" in arg else [arg])]
        cmd = [a for a in cmd if a != "-q"]  # -q once, below: -qq would hide the PASSED lines
        timeout = 500
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *cmd],
                         cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    passed = [line[len("PASSED "):] for line in run.stdout.splitlines() if line.startswith("PASSED ")]
    # the new exercise's grading tests and both new notebooks were among them
    for item in (f"tests/test_exercises.py::test_solution_full_marks_untouched_zero[{nn}]",
                 f"tests/test_exercises.py::test_typical_wrong_answer_fails_its_part[{nn}-",
                 "tests/test_course_layout.py::test_the_course_parts_agree[check_links]",
                 f"tests/test_check_cells.py::test_each_check_cell_runs_the_parts_its_points_say[{nn}]",
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


# -- issue 45: CONTRIBUTING.md followed literally -----------------------------------------------
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
#: a bare `python ...` or `pytest ...` (not .venv/bin/python): in a fresh shell it has no torch
BARE = re.compile(r"(?<![\w/.-])(?<!-m )(?:python3?|pytest)(?=\s)")


def _code(text: str) -> list[str]:
    """The code blocks and code spans of a markdown text."""
    return [m.group(1) or m.group(2) for m in re.finditer(r"```[a-z]*\n(.*?)```|`([^`\n]+)`", text, re.S)]


@pytest.fixture
def course(tmp_path):
    """The files the scaffold and its checks read, in a temporary folder (as test_course_layout's)."""
    for folder in ("notebooks", "solutions", "exercises", "tests/wrong_answers", "docs"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "course_utils" / "grading", tmp_path / "course_utils" / "grading",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "results").mkdir()
    for path in [*ROOT.glob("*.md"), ROOT / "tests" / "README.md", ROOT / "results" / "timings.json"]:
        shutil.copy(path, tmp_path / path.relative_to(ROOT))
    assert scaffold.problems(tmp_path) == []  # (a scaffolded copy's new notebook keeps its placeholders)
    return tmp_path


def _main(*argv: str, root: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = scaffold.main(list(argv), root=root)
    return code, out.getvalue(), err.getvalue()


def test_contributings_commands_run_in_the_venv_that_make_install_creates():
    """Defect 1: `python -m course_utils...` in a fresh shell: No module named 'torch'."""
    bare = [c for c in _code(CONTRIBUTING) if BARE.search(c)]
    assert not bare, f"CONTRIBUTING.md: write .venv/bin/python (make install creates .venv) in: {bare}"
    first = CONTRIBUTING.index("make install")
    assert first < CONTRIBUTING.index(".venv/bin/python") and first < CONTRIBUTING.index("## Adding a notebook")


def test_the_scaffolds_next_steps_run_in_the_venv(course):
    (course / ".venv" / "bin").mkdir(parents=True)
    (course / ".venv" / "bin" / "python").touch()
    nxt = scaffold.next_number(course)
    code, out, err = _main(nxt, "Activation offloading", "--no-timings", root=course)
    assert code == 0, err
    steps = out.split("Next (CONTRIBUTING.md", 1)[1]
    assert ".venv/bin/python -m course_utils.grading.generate" in steps and not BARE.search(steps), steps
    assert f"make check-notebook NN={nxt}" in steps and f"next free number, {int(nxt) + 1:02d}" in steps


def test_the_examples_take_the_next_free_number():
    """Defect 2: the examples said 11, which exists: copying them did nothing and exited 0. When a
    notebook takes the example's number, move the examples on to the next one."""
    nxt = scaffold.next_number()
    said = {("CONTRIBUTING.md", n) for n in re.findall(r"scaffold (\d\d) \"|NN=(\d\d)", CONTRIBUTING) for n in n if n}
    said |= {("Makefile", n) for n in re.findall(r"NN=(\d\d)", (ROOT / "Makefile").read_text())}
    assert said and {n for _, n in said} == {nxt}, (f"use the next free number, {nxt}, in every example (CONTRIBUTING.md's 'Adding a notebook', "
                                            f"the Makefile's new-notebook and check-notebook lines): {sorted(said)}")


def test_an_existing_number_with_another_title_is_refused_naming_the_next_one(course):
    """Defect 2: `scaffold 11 "Activation offloading"` on an existing 11 wrote nothing and exited 0."""
    last, nxt = scaffold.entries(course)[-1], scaffold.next_number(course)
    before = sorted(p.relative_to(course) for p in course.rglob("*"))
    other = "A title no notebook has"  # (the example's title may be the last notebook's: a scaffolded copy)
    code, out, err = _main(last.nn, other, "--no-timings", root=course)
    assert code != 0 and sorted(p.relative_to(course) for p in course.rglob("*")) == before
    assert f"notebook {last.nn} exists already ({last.notebook}" in err and f"next free number, {nxt}" in err, err
    assert f'scaffold {nxt} "{other}"' in err and "Nothing was written" in err, err


def test_an_existing_number_with_nothing_to_add_says_so(course):
    last, nxt = scaffold.entries(course)[-1], scaffold.next_number(course)
    code, out, err = _main(last.nn, root=course)  # no title: complete what it lacks; nothing, and it says so
    assert code == 0 and "has all its parts already: nothing was written" in out and f"number, {nxt}" in out, out
    title = scaffold.title(course, last)  # its own title: asked to create, nothing created: not a success
    code, out, err = _main(last.nn, title, root=course)
    assert code == 1 and "nothing was written" in err, (out, err)


def _selects(args: list[str], names: list[str]) -> bool:
    """Whether pytest ARGS select an item whose node names (folder, file, item) are NAMES: -k as
    pytest evaluates it (a substring of any name, case-insensitive)."""
    if "-k" not in args:
        return True
    expr = Expression.compile(args[args.index("-k") + 1])
    return expr.evaluate(lambda sub, **kw: any(sub.lower() in n.lower() for n in names))


def test_the_documented_check_runs_the_layout_tests_and_the_notebooks_own():
    """Defect 3: step 6's `pytest ... -k NN` deselected every test of tests/test_course_layout.py."""
    step6 = CONTRIBUTING[CONTRIBUTING.index("6. **Check**"):CONTRIBUTING.index("## Tests")]
    assert "make check-notebook NN=" in step6
    nn, stem = "12", "12_activation_offloading"
    args = check_notebook_pytest(nn)
    files = [a for a in args if a.endswith((".py", ".ipynb"))]
    assert {"tests/test_course_layout.py", "tests/test_check_cells.py", f"notebooks/{nn}_*.ipynb",
            f"solutions/{nn}_*.ipynb"} <= set(files)
    for names in (["tests", "test_course_layout.py", "test_the_course_parts_agree[check_links]"],
                  ["tests", "test_check_cells.py", "test_the_scaffold_reads_each_parts_points_as_the_exercise_has_them[00]"],
                  ["tests", "test_exercises.py", f"test_solution_full_marks_untouched_zero[{nn}]"],
                  ["notebooks", f"{stem}.ipynb", "Cell 0"], ["solutions", f"{stem}.ipynb", "Cell 3"]):
        assert _selects(args, names), (names, args)
    # any other pytest command the doc gives for the layout tests selects them too
    for cmd in (c for c in _code(CONTRIBUTING) if "pytest" in c and "test_course_layout.py" in c):
        assert _selects(shlex.split(cmd.replace("NN", nn)), ["tests", "test_course_layout.py",
                                                              "test_the_course_parts_agree[check_files]"]), cmd


def test_scaffold_check_names_a_wrong_points_total_and_its_fix(course):
    """Defect 4: a check cell worth a point too many passed every documented check."""
    e = scaffold.entries(course)[0]
    path = course / e.solution
    nb = json.loads(path.read_text(encoding="utf-8"))
    k, grade_id, pts = scaffold.check_cells(path)[0]
    nb["cells"][k]["metadata"]["nbgrader"]["points"] = pts + 1
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    max_score = sum(scaffold.part_points(course, e).values())
    code, out, err = _main("--check", root=course)
    assert code == 1, out
    (found,) = [line for line in out.splitlines() if scaffold.PLACEHOLDER not in line]
    assert found.startswith(f"{e.solution}: the points of its check cells (cell {k} '{grade_id}': {pts + 1}"), found
    assert f"add up to {max_score + 1}, but exercise {e.nn}'s max_score is {max_score} (its parts' points in " \
           f"{e.grading}" in found and "metadata.nbgrader.points" in found and "tests/test_check_cells.py" in found


def test_scaffold_check_refuses_the_templates_placeholders_and_names_each(course):
    """Defect 6: the template's example text, left in place, passed every check. The fresh scaffold
    passes the tests (problems(): test_course_layout), and --check refuses each placeholder."""
    nxt = scaffold.next_number(course)
    scaffold.scaffold(nxt, "Activation offloading", root=course, timings=False)
    new = next(e for e in scaffold.entries(course) if e.nn == nxt)
    assert [p for p in scaffold.problems(course) if "timings.json" not in p] == []
    code, out, err = _main("--check", root=course)
    assert code == 1 and [line for line in out.splitlines() if "timings.json" not in line] == \
        scaffold.check_placeholders(course), out
    mine = (new.notebook, new.solution, new.grading, new.wrong)
    found = [line for line in out.splitlines() if line.startswith(mine)]
    assert {line.split(",")[0].split(":")[0] for line in found} == set(mine), out
    assert any(line.startswith(f"{new.notebook}, cell 0: the scaffold's placeholder is still there "
                               "(TODO(scaffold): this notebook is the template's example") for line in found), found
    assert all("replace it with this notebook's own text and delete the marker" in line for line in found)
    # replaced, the marker's lines deleted: accepted
    for rel in (new.notebook, new.solution, new.grading, new.wrong):
        path = course / rel
        path.write_text("\n".join(line for line in path.read_text(encoding="utf-8").split("\n")
                                  if "TODO(scaffold)" not in line or rel.endswith(".ipynb")), encoding="utf-8")
        if rel.endswith(".ipynb"):
            nb = json.loads(path.read_text(encoding="utf-8"))
            for cell in nb["cells"]:
                text = "".join(cell["source"])
                cell["source"] = re.sub(r"\*\*TODO\(scaffold\):\*\*[^\n]*\n\n?", "", text)
            path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    assert not [line for line in scaffold.check_placeholders(course) if line.startswith(mine)]
    for rel in (new.grading, new.wrong):  # "delete this line", done literally, leaves valid Python
        compile((course / rel).read_text(encoding="utf-8"), rel, "exec")


def test_the_course_passes_scaffold_check_beyond_the_layout_tests():
    """What `scaffold --check` adds to test_course_layout's checks holds for the course: no
    TODO(scaffold) placeholder left, every exercise's check cells worth its max_score. (A fresh
    scaffold fails this test by design: make test-scaffold FULL=1 deselects it on its copy.)"""
    found = scaffold.check_placeholders() + scaffold.check_points()
    assert not found, "\n".join(found)


def test_strip_and_the_lint_see_new_notebooks_that_git_does_not_track_yet(tmp_path, capsys):
    """Defect 5: `make strip` and the stripped-output lint listed `git ls-files` only: a new notebook
    with outputs, not yet added, passed the lint and kept its outputs."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_stripped
    finally:
        sys.path.remove(str(ROOT / "tools"))
    cell = {"cell_type": "code", "execution_count": 1, "id": "a", "metadata": {}, "source": "1",
            "outputs": [{"output_type": "execute_result", "data": {"text/plain": "1"}, "metadata": {}, "execution_count": 1}]}
    for rel, cells in (("notebooks/00_old.ipynb", []), ("notebooks/12_new.ipynb", [cell]),
                       ("build/x.ipynb", [cell]), ("docs/gpu-runs/r.ipynb", [cell])):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    (tmp_path / ".gitignore").write_text("build/\n")
    git = ["git", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "notebooks/00_old.ipynb"], cwd=tmp_path, check=True)
    listed = [p.relative_to(tmp_path).as_posix() for p in check_stripped.repository_notebooks(tmp_path)]
    assert listed == ["notebooks/00_old.ipynb", "notebooks/12_new.ipynb"]  # untracked in, ignored and exempt out
    assert check_stripped.problems(tmp_path / "notebooks/12_new.ipynb") == ["cell 0: outputs and execution_count"]
    assert check_stripped.main(["--list"], root=tmp_path) == 0
    assert capsys.readouterr().out.split() == listed
    assert check_stripped.main(["--dirty"], root=tmp_path) == 0
    assert capsys.readouterr().out.split() == ["notebooks/12_new.ipynb"]
    # make strip clears what the lint flags, and rewrites nothing else (nbconvert reformats what it writes)
    out = subprocess.run(["make", "--no-print-directory", "-n", "-B", "strip", "STAMP=/dev/null", "BIN=B"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert 'dirty="$(B/python tools/check_stripped.py --dirty)"' in out and \
        "B/jupyter nbconvert --clear-output --inplace $dirty" in out, out


def test_make_help_lists_every_target_in_one_line_and_is_the_default():
    """`make` alone lists every target (`## comment` on its rule line); no comment in the Makefile
    runs over one line (the explanations are CONTRIBUTING.md's, "The Makefile")."""
    makefile = (ROOT / "Makefile").read_text()
    phony = {t for line in re.findall(r"^\.PHONY:(.*)$", makefile, re.M) for t in line.split()}
    out = subprocess.run(["make", "--no-print-directory", "-s"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    listed = re.findall(r"^  make (\S+) +\S", out, re.M)
    assert sorted(listed) == sorted(phony) and len(out.splitlines()) == len(listed) + 1, out
    lines = makefile.splitlines()
    runs = [i + 1 for i in range(len(lines) - 1) if lines[i].lstrip().startswith("#")
            and lines[i + 1].lstrip().startswith("#")]
    assert not runs, f"Makefile: comments over several lines at lines {runs}: one line each (move the rest to CONTRIBUTING.md)"


# -- issue 43: a scaffold validates everything before its first write, and undoes a failed one --
def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes: what a refused or undone scaffold must leave as it was."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(code: int, err: str) -> bool:
    """Refused as the command line should: a non-zero exit, one line on stderr with its fix."""
    return code != 0 and len(err.strip().splitlines()) == 1 and "Fix:" in err


def test_a_corrupt_timings_file_is_refused_before_the_first_write(course):
    """Issue 43: the scaffold wrote five files and three edits, then failed on a truncated
    results/timings.json (a JSONDecodeError naming no file), and left them all."""
    (course / "results" / "timings.json").write_text('{"rows": {"00": {"notebooks": 1')
    before = _tree(course)
    code, out, err = _main(scaffold.next_number(course), "Activation offloading", "--no-timings", root=course)
    assert _refused(code, err) and "results/timings.json" in err and "cut short" in err, (code, err)
    assert _tree(course) == before
    code, out, err = _main("--check", root=course)  # --check names it too, instead of a traceback
    assert code == 1 and "results/timings.json" in out and "Fix:" in out, out


def test_a_title_the_files_cannot_hold_is_refused_before_the_first_write(course):
    """Issue 43: a 300-character title reached a raw OSError (File name too long) after the
    notebook's folder was listed; control characters, a lone surrogate and what breaks the
    markdown tables, links or the grading module's Python were written as they came."""
    before, nxt = _tree(course), scaffold.next_number(course)
    for title in ("x" * 300, "tab\there", "nul\x00byte", "lone \ud800 surrogate", "a | b", "cost in $",
                  "[a link](x)", 'say """hi', "back\\slash", "<b>bold</b>", "!!!", "   "):
        code, out, err = _main(nxt, title, "--no-timings", root=course)
        assert _refused(code, err) and "title" in err, (title, code, err)
    assert _tree(course) == before


def test_a_number_that_is_not_two_digits_is_refused_with_the_fix(course):
    before = _tree(course)
    for nn in ("1", "123", "ab", "-1", "\u0661\u0663", "", "1 "):
        code, out, err = _main(nn, "Activation offloading", "--no-timings", root=course)
        assert _refused(code, err), (nn, code, err)
    assert _tree(course) == before


def test_an_existing_number_with_another_title_is_refused_even_when_the_file_names_would_agree(course):
    """Issue 43: `scaffold NN "Title"` for an existing NN whose files the title would name (the
    same words, another spelling) ignored the title, wrote the parts NN lacked and exited 0."""
    last = scaffold.entries(course)[-1]
    (course / last.wrong).unlink()
    before = _tree(course)
    other = last.stem[3:].replace("_", " ").upper() + "!"  # slug(other) is its file name: only the title differs
    code, out, err = _main(last.nn, other, "--no-timings", root=course)
    assert _refused(code, err) and f"notebook {last.nn} exists already" in err, (code, err)
    assert _tree(course) == before


def test_an_existing_notebook_named_by_its_own_title_gets_the_parts_it_lacks(course):
    """Its own title is no other title, though its file name is not the title's words (05's
    `inplace_relu` for 'In-place ReLU'): it was refused as if it named another notebook."""
    e = next(e for e in scaffold.entries(course)
             if scaffold.slug(scaffold.title(course, e)) != e.stem[3:])
    (course / e.wrong).unlink()
    code, out, err = _main(e.nn, scaffold.title(course, e), "--no-timings", root=course)
    assert code == 0 and f"wrote {e.wrong}" in out and (course / e.wrong).is_file(), (code, out, err)


def test_a_failed_timing_puts_back_every_file_the_scaffold_wrote(course, monkeypatch):
    """A failure after the writes (here the new notebook's timing) leaves the tree as it was:
    every file it created removed, every file it edited restored."""
    def timing_fails(root, nn):  # noqa: ARG001 - _time's signature
        (root / "results" / "timings.json").write_text("{}")  # what the timing run had written
        raise scaffold.ScaffoldError(f"timing notebook {nn} failed.", "fix the notebook")
    monkeypatch.setattr(scaffold, "_time", timing_fails)
    before = _tree(course)
    code, out, err = _main(scaffold.next_number(course), "Activation offloading", root=course)
    assert code == 2 and "timing notebook" in err and "as it was" in err, err
    assert _tree(course) == before


def test_a_failed_write_puts_back_every_file_the_scaffold_wrote(course, monkeypatch):
    """A full disk at the last of the scaffold's writes (the previous notebook's **Next:** link):
    the message names the file and the fix, and the five files and two rows before it are gone."""
    real, prev = scaffold.atomic_write, scaffold.entries(course)[-1]

    def full_disk_at_the_link(path, data):
        if Path(path) == course / prev.notebook:
            raise OSError(28, "No space left on device")
        real(path, data)
    monkeypatch.setattr(scaffold, "atomic_write", full_disk_at_the_link)
    before = _tree(course)
    code, out, err = _main(scaffold.next_number(course), "Activation offloading", "--no-timings", root=course)
    assert _refused(code, err) and prev.notebook in err and "the disk is full" in err, err
    assert _tree(course) == before


def test_a_file_changed_during_the_timing_is_not_put_back_over(course, monkeypatch):
    """The timing runs for about a minute: a teacher who edits the new notebook meanwhile keeps the
    edit when the timing then fails (the rest is put back, and the message names what was kept);
    the fix says how to keep the files and time them later, not to fix files that are gone."""
    nn = scaffold.next_number(course)

    def edited_then_fails(root, nn_):  # noqa: ARG001 - _time's signature
        entry = next(e for e in scaffold.entries(root) if e.nn == nn_)
        (root / entry.notebook).write_text("the teacher's edit\n")
        raise scaffold.ScaffoldError(f"timing notebook {nn_} failed.", "run the scaffold again with --no-timings")
    monkeypatch.setattr(scaffold, "_time", edited_then_fails)
    code, out, err = _main(nn, "Activation offloading", root=course)
    kept = sorted((course / "notebooks").glob(f"{nn}_*.ipynb"))
    assert code == 2 and "changed since it wrote them" in err and "--no-timings" in err, err
    assert [p.read_text() for p in kept] == ["the teacher's edit\n"]
    assert not list((course / "solutions").glob(f"{nn}_*.ipynb"))  # not edited: put back (removed)
