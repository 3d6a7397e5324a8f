"""Exercises: generated from the solutions; stubs fail, solutions pass, wrong answers fail with
a message; the grader's class report for fixture submissions is exactly as expected."""

import csv
import json
import linecache
from pathlib import Path

import nbformat
import pytest

from course_utils import checks
from course_utils.exercises import generate, make_exercise, stub_source
from course_utils.grade import grade_many, main as grade_main, summary

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))

#: one planted mistake per exercise: (text in the solution, what replaces it)
WRONG = {
    "00": ("* torch.empty((), dtype=dtype).element_size()", ""),
    "01": ("nn.Conv3d(out_channels, out_channels, 3, padding=1)",
           "nn.Conv3d(out_channels, out_channels, 3, padding=1, bias=False)"),
    "02": ("if key not in skip and key not in seen:", "if key not in skip:"),
    "03": ("return 26 * n**3 * 4", "return 13 * n**3 * 4"),
    "04": ("scaler.scale(loss).backward()", "loss.backward()"),
    "05": ('"Sigmoid": False', '"Sigmoid": True'),
    "06": ("dx = g * dy", "dx = dy"),
    "07": ("(s - 1) + 2 * n / s", "(s - 1) + n / s"),
    "08": ("loss = nn.functional.cross_entropy(ddp(xs), ys)", "loss = nn.functional.cross_entropy(ddp(x), y)"),
    "09": ("skips.append(down(skips[-1]))", "skips.append(down(skips[-1]).detach())"),
    "10": ('checkpointing="every level"', 'checkpointing="none"'),
}


def run_cells(nb, replace=None) -> dict:
    """Execute a notebook's code cells in one namespace, in-process; a failing cell is skipped
    (as the learner's kernel would go on)."""
    ns: dict = {"__name__": "__main__"}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        src = cell.source
        if replace and replace[0] in src:
            src = src.replace(*replace)
        name = f"<cell-{id(nb)}-{i}>"  # registered so that inspect.getsource works, as in IPython
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        try:
            exec(compile(src, name, "exec"), ns)
        except Exception:
            pass
    return ns


def score(nn_id, ns):
    reports = checks.run_exercise(nn_id, ns)
    return sum(r.score for r in reports), sum(r.max_score for r in reports), reports


def test_one_exercise_per_solution_and_registry():
    ids = [p.name[:2] for p in SOLUTIONS]
    assert ids == sorted(checks.EXERCISES) == sorted(WRONG)


def test_committed_exercises_match_the_generator():
    assert generate(check=True) == [], "run: python -m course_utils.exercises"


def test_stub_keeps_hints_and_indentation():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    ### HINT: add one\n    return x + 1\n    ### END SOLUTION\n"
    out = stub_source(src)
    assert "    # Hint: add one" in out and "    raise NotImplementedError" in out
    assert "return x + 1" not in out
    with pytest.raises(ValueError, match="without"):
        stub_source("### BEGIN SOLUTION\nx = 1\n")


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name[:2])
def test_solution_passes_stub_fails_wrong_fails(path):
    nn_id = path.name[:2]
    sol = nbformat.read(path, as_version=4)
    got, top, _ = score(nn_id, run_cells(sol))
    assert got == top > 0, f"the solution of {nn_id} must pass every check"
    got, top, reports = score(nn_id, run_cells(make_exercise(sol)))
    assert got == 0, f"the stub of {nn_id} must fail"
    assert all("not implemented" in p.message or "not defined" in p.message or p.message
               for r in reports for p in r.parts)
    old, new = WRONG[nn_id]
    assert old in "".join(c.source for c in sol.cells), f"planted mistake for {nn_id} not found"
    got, top, reports = score(nn_id, run_cells(sol, (old, new)))
    assert got < top, f"the planted mistake in {nn_id} must lose points"
    failed = [p for r in reports for p in r.parts if not p.passed]
    assert all(len(p.message) > 10 for p in failed)


# -- the grader on a class folder ------------------------------------------------------------
@pytest.fixture(scope="module")
def class_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    sol = nbformat.read(ROOT / "solutions" / "00_gpu_memory_basics.ipynb", as_version=4)

    def variant(name, edit):
        nb = nbformat.reads(nbformat.writes(sol), as_version=4)
        edit(nb)
        nbformat.write(nb, folder / f"00_{name}.ipynb")

    variant("alice_correct", lambda nb: None)

    def wrong(nb):
        for c in nb.cells:
            c.source = c.source.replace(*WRONG["00"])
    variant("bob_wrong", wrong)
    variant("carol_crash", lambda nb: nb.cells.insert(1, nbformat.v4.new_code_cell("import sys; sys.exit(3)")))
    variant("dave_loop", lambda nb: nb.cells.insert(1, nbformat.v4.new_code_cell("while True:\n    pass")))
    variant("eve_tamper", lambda nb: nb.cells.append(nbformat.v4.new_code_cell(
        "import course_utils.checks as c\nc.check_tensor_nbytes = lambda *a, **k: None")))
    return folder


def test_grader_report_for_a_class(class_folder, tmp_path):
    results = {r.submission: r for r in grade_many([str(class_folder)], timeout=10, progress=False)}
    assert [(k, r.score, r.max_score) for k, r in sorted(results.items())] == [
        ("00_alice_correct.ipynb", 4, 4),
        ("00_bob_wrong.ipynb", 0, 4),
        ("00_carol_crash.ipynb", 4, 4),   # sys.exit in a cell: that cell fails, the rest runs
        ("00_dave_loop.ipynb", 4, 4),     # the loop is interrupted after the timeout
        ("00_eve_tamper.ipynb", 0, 4),
    ]
    assert results["00_alice_correct.ipynb"].notes == []
    assert "expected 9,984,000, got 2,496,000" in results["00_bob_wrong.ipynb"].parts[0]["message"]
    assert any("SystemExit" in n for n in results["00_carol_crash.ipynb"].notes)
    assert any("timed out" in n for n in results["00_dave_loop.ipynb"].notes)
    assert any("tampering" in n and "check_tensor_nbytes" in n for n in results["00_eve_tamper.ipynb"].notes)
    table = summary(list(results.values()))
    assert "5 submission(s)" in table

    out_csv, out_json = tmp_path / "class.csv", tmp_path / "class.json"
    assert grade_main([str(class_folder / "00_alice_correct.ipynb"), "--csv", str(out_csv),
                       "--json", str(out_json), "--no-progress", "--timeout", "30"]) == 0
    rows = list(csv.DictReader(open(out_csv)))
    assert rows[0]["score"] == "4" and rows[0]["percent"] == "100.0"
    assert json.loads(out_json.read_text())[0]["parts"][0]["score"] == 1


def test_grader_bad_paths(tmp_path, capsys):
    assert grade_main([str(tmp_path / "missing")]) == 2
    bad = tmp_path / "notes.ipynb"
    bad.write_text("{}")
    (r,) = grade_many([str(bad)], progress=False)
    assert r.score == 0 and "NN_topic" in r.notes[0]
