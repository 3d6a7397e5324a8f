"""The grading machinery: the generator's rules (nbgrader's), source stripping, rebuilding a
notebook's definitions, the student release, the grader's environment and its command line. A
class graded for real (honest work, the report, submissions that cheat) is in
tests/test_grading_class.py (make test-grader)."""

import csv
import json
import os
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_utils.grading import generate, limits
from course_utils.grading.core import Raised
from course_utils.grading.generate import SolutionFormatError, make_exercise, stub_cell_source
from course_utils.grading.grade import Options, main as grade_main
from course_utils.grading.notebook_code import graded_objects, rebuild
from course_utils.grading.release import check_release, release
from course_utils.grading.strip import strip_source
from course_utils.layout import exercise_name

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "00_gpu_memory_basics.ipynb"
EXERCISE = ROOT / "exercises" / "00_gpu_memory_basics_exercise.ipynb"

pytestmark = pytest.mark.timeout(600)


def solution_cell(src, cell_type="code"):
    cell = new_code_cell(src) if cell_type == "code" else new_markdown_cell(src)
    cell.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False, "grade_id": "x",
                                 "schema_version": 3}
    return cell


# -- the generator ---------------------------------------------------------------------------------
def test_committed_exercises_match_the_generator():
    assert generate.generate(check=True) == ([], []), "run: python -m course_utils.grading.generate"


def test_regions_follow_nbgraders_rule_and_keep_hints_above():
    src = "def f(x):\n    # Hint: add one\n    # BEGIN SOLUTION\n    return x + 1\n    # END SOLUTION\n"
    out, found = stub_cell_source(src)
    assert found and "    # Hint: add one" in out and "return x + 1" not in out
    assert "    # YOUR CODE HERE\n    raise NotImplementedError()" in out
    with pytest.raises(SolutionFormatError, match="without"):
        stub_cell_source("### BEGIN SOLUTION\nx = 1\n")
    with pytest.raises(SolutionFormatError, match="nested"):
        stub_cell_source("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n")
    with pytest.raises(SolutionFormatError, match="hint inside"):
        stub_cell_source("### BEGIN SOLUTION\n### HINT: the answer\nx = 1\n### END SOLUTION\n")


def test_markdown_solutions_and_unmarked_cells():
    nb = new_notebook(cells=[solution_cell("The answer is\n### BEGIN SOLUTION\n42\n### END SOLUTION", "markdown"),
                             solution_cell("x = 42")])
    ex = make_exercise(nb)
    assert ex.cells[0].source == "The answer is\nYOUR ANSWER HERE" and "42" not in ex.cells[1].source
    bad = new_notebook(cells=[new_markdown_cell("### BEGIN SOLUTION\n42\n### END SOLUTION")])
    with pytest.raises(SolutionFormatError, match="not marked as an nbgrader solution cell"):
        make_exercise(bad)
    bad = new_notebook(cells=[new_code_cell("x = 1  # BEGIN SOLUTION\n# END SOLUTION")])
    with pytest.raises(SolutionFormatError, match="not marked"):
        make_exercise(bad)


def test_execution_metadata_and_outputs_are_not_copied():
    nb = nbformat.read(SOLUTION, as_version=4)
    # the first cell the learner answers in (not a fixed index: the setup cell and the imports
    # come before it)
    i = next(k for k, c in enumerate(nb.cells) if c.cell_type == "code" and "BEGIN SOLUTION" in c.source)
    nb.cells[i].metadata["execution"] = {"iopub.execute_input": "2026-11-23T10:00:00Z"}
    nb.cells[i].outputs = [nbformat.v4.new_output("stream", text="hi")]
    nb.cells[i].execution_count = 3
    ex = make_exercise(nb)
    assert "execution" not in ex.cells[i].metadata and ex.cells[i].outputs == []
    assert ex.cells[i].execution_count is None and ex.cells[i].metadata["nbgrader"]["solution"]


def test_check_reports_stale_and_orphaned_exercises(tmp_path):
    for d in ("solutions", "exercises"):
        (tmp_path / d).mkdir()
    (tmp_path / "solutions" / SOLUTION.name).write_bytes(SOLUTION.read_bytes())
    (tmp_path / "exercises" / "99_gone.ipynb").write_text("{}")
    stale, orphaned = generate.generate(check=True, root=tmp_path)
    assert stale == [SOLUTION.name] and orphaned == ["99_gone.ipynb"]
    generate.generate(root=tmp_path)
    assert generate.generate(check=True, root=tmp_path) == ([], [])
    assert not (tmp_path / "exercises" / "99_gone.ipynb").exists()


def test_solutions_carry_nbgrader_metadata():
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        meta = [c.metadata.get("nbgrader", {}) for c in nb.cells]
        tests = [m for m in meta if m.get("grade")]
        assert tests and all(m["locked"] and m["points"] > 0 for m in tests), path.name
        ids = [m["grade_id"] for m in meta if m]
        assert len(ids) == len(set(ids)), path.name
        for cell, m in zip(nb.cells, meta, strict=True):
            if "BEGIN SOLUTION" in cell.source:
                assert m.get("solution"), (path.name, cell.source[:60])
            if m.get("grade"):  # a test cell ends with the check's score: nbgrader's partial credit
                assert cell.source.strip().splitlines()[-1].startswith("check_") and not cell.source.endswith(";")
        from course_utils.grading.registry import exercise

        points = sum(m["points"] for m in tests)
        assert points == exercise(path.name[:2]).max_score, path.name


# -- stripping and rebuilding -----------------------------------------------------------------------
def test_strip_source_removes_classes_methods_and_judge_side_code():
    src = ("class A:\n    def keep(self):\n        return 1\n    def answer(self):\n        return 42\n\n"
           "class B(A):\n    x = 1\n\n@reference\ndef ref():\n    return 42\n\n@P.judge\ndef j(got, seed):\n"
           "    return 42\n\ndef observe():\n    return 7\n")
    out = strip_source(src, ["A.answer", "B"], message="nope", strip_marked=True)
    ns = {"reference": lambda f: f, "P": type("P", (), {"judge": staticmethod(lambda f: f)})}
    exec(out.replace("from course_utils.grading.core import RefusedObject as _Refused",
                     "_Refused = RuntimeError"), ns)
    assert ns["A"]().keep() == 1 and ns["observe"]() == 7
    for call in (lambda: ns["A"]().answer(), lambda: ns["B"](), ns["ref"], lambda: ns["j"](1, 2)):
        with pytest.raises(RuntimeError):
            call()
    with pytest.raises(RuntimeError):
        type("C", (ns["B"],), {})
    with pytest.raises(ValueError, match="nothing to strip"):
        strip_source(src, ["Missing"])


def test_rebuild_keeps_definitions_and_skips_computation():
    nb = new_notebook(cells=[
        new_code_cell("import math\nSIZE = 4\nscale = lambda v: v * SIZE\nrun = expensive()\nprint('x')"),
        new_code_cell("%time x = 1\ndef f(n):\n    return scale(math.prod((n, n)))"),
        new_code_cell("def g(: broken"),
        new_code_cell("from os.path import join as f2\nclass K:\n    pass\nimport does_not_exist"),
    ])
    rb = rebuild(nb)
    objs = graded_objects(rb, ["f", "K", "f2", "run", "missing"])
    assert objs["f"](3) == 36 and isinstance(objs["K"], type)
    assert isinstance(objs["f2"], Raised) and objs["f2"].kind == "refused" and "posixpath" in objs["f2"].message
    assert objs["run"].kind == "missing" and objs["missing"].kind == "missing"
    assert any("code cell 3 does not parse" in p for p in rb.problems)
    assert any("ModuleNotFoundError" in p and "code cell 4" in p for p in rb.problems)
    assert "return scale" in rb.sources["f"]


def test_limits_find_descendants_and_rss():
    import subprocess
    import sys

    before = limits.descendants()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert p.pid in limits.descendants() and limits.tree_rss([p.pid]) > 0
    assert limits.kill_new_descendants(before) >= 1
    assert not Path(f"/proc/{p.pid}").exists()  # killed and reaped


# -- the student release ------------------------------------------------------------------------------
def test_release_has_no_answers_and_its_checks_still_work(tmp_path):
    out = tmp_path / "release"
    info = release(out)
    assert not (out / "solutions").exists() and not (out / "tests").exists()
    assert not (out / "course_utils" / "templates").exists()  # the scaffold's example solution
    assert sorted(p.name for p in (out / "exercises").glob("*.ipynb")) == \
        sorted(exercise_name(p) for p in (ROOT / "solutions").glob("*.ipynb"))
    assert check_release(out) == []
    assert "def reference_log_hooks" in (out / "course_utils/grading/ex02.py").read_text()  # kept, see docs
    assert "course_utils/grading/ex07.py" in info["stripped"]
    assert "def best_segment_count" in (out / "course_utils/grading/ex07.py").read_text()
    assert "not in the student release" in (out / "course_utils/grading/ex07.py").read_text()
    assert 'testpaths = ["notebooks", "exercises"]' in (out / "pyproject.toml").read_text()  # no tests/ here
    assert (out / "constraints.txt").read_text() == (ROOT / "constraints.txt").read_text()  # make install needs it
    import subprocess
    import sys

    code = ("from course_utils.grading.ex07 import check_segments\n"
            "s = check_segments(lambda n: 2, verbose=False)\n"
            "p = s.report.parts[0]\nprint(p.checked, p.message)\n"
            "from course_utils.grading.ex00 import check_tensor_nbytes\n"
            "print(float(check_tensor_nbytes(lambda s, d: 0, verbose=False)))")
    r = subprocess.run([sys.executable, "-c", code], cwd=out, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(out), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["False checked by your teacher's grader (its answer is not in the student release)",
                                     "0.0"]


# -- what the grader's processes import (a class graded for real: tests/test_grading_class.py) -------------
def test_submissions_import_what_pythonpath_installed_but_never_the_course(tmp_path, monkeypatch):
    # a GPU machine without network gets nbformat & co. with pip install --target and PYTHONPATH
    # (docs/teaching.md); the grader's processes must see them -- `make test-compat` found every
    # submission ending at startup -- but not the checkout's course_utils, which holds the answers
    from course_utils.grading import grader as grade_module

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(ROOT), str(tmp_path / "missing")]))
    assert grade_module.package_paths() == [str(site)]
    with grade_module.Grader(Options()) as grader:
        env = grader._env(tmp_path, tmp_path / "lib")
        assert grader.workdir.is_dir()
    assert not grader.workdir.exists()  # close() removes the grader's folder
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "lib"), str(site)]
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    assert str(site) in limits.python_read_paths()  # and Landlock lets the submission read them


# -- the command line --------------------------------------------------------------------------
def write(folder, name, nb):
    nbformat.write(nb, folder / name)


def test_cli_errors_before_grading(tmp_path, capsys):
    assert grade_main([str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert grade_main([str(empty)]) == 2
    assert "nothing to grade" in capsys.readouterr().err
    for flag in ("--timeout", "--total-timeout", "--check-timeout", "--memory"):
        for bad in ("0", "-5"):
            assert grade_main([str(empty), flag, bad]) == 2
            assert "must be > 0" in capsys.readouterr().err
    (tmp_path / "taken").write_text("a file")
    assert grade_main([str(empty), "--csv", str(tmp_path / "taken" / "x.csv")]) == 2
    assert "cannot write there" in capsys.readouterr().err


def test_cli_writes_csv_and_json_into_new_folders(tmp_path, capsys):
    folder = tmp_path / "sub"
    folder.mkdir()
    write(folder, "00_bob.ipynb", nbformat.read(EXERCISE, as_version=4))
    out_csv, out_json = tmp_path / "new" / "deeper" / "class.csv", tmp_path / "other" / "class.json"
    assert grade_main([str(folder), "--csv", str(out_csv), "--json", str(out_json), "--no-progress",
                       "--timeout", "30"]) == 0
    out = capsys.readouterr()
    assert "without encryption" not in out.err and "without encryption" not in out.out
    (r,) = csv.DictReader(open(out_csv))
    assert r["score"] == "0" and r["status"] == "graded"
    assert "not implemented yet: replace `raise NotImplementedError()`" in r["failed_parts"]
    (j,) = json.loads(out_json.read_text())
    assert j["parts"][0]["message"].startswith("not implemented yet") and j["seed"] is not None

