"""Exercises: every solution scores full marks, every untouched exercise 0 on every part with a
message that helps without giving the answer, and the wrong answers learners write fail the part
they should. Graded the way the grader does it: objects rebuilt from the notebook's code,
observed, the observation round-tripped as data, judged."""

import re
import runpy
from pathlib import Path

import nbformat
import pytest

from course_utils.grading.core import roundtrip
from course_utils.grading.generate import make_exercise
from course_utils.grading.registry import MODULES, exercise
from course_utils.grading.sandbox import observe_notebook

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = {p.name[:2]: p for p in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))}
SEED = 20261123

pytestmark = pytest.mark.timeout(600)


def grade(nb, nn_id, keys=None, seed=SEED):
    ex = exercise(nn_id)
    keys = keys or [p.key for p in ex.parts]
    obs = observe_notebook(nb, nn_id, keys, seed)
    return {k: ex.judge(k, roundtrip(obs[k]), seed) for k in keys}


def solution(nn_id):
    return nbformat.read(SOLUTIONS[nn_id], as_version=4)


def edited(nn_id, old, new):
    nb = solution(nn_id)
    hits = 0
    for cell in nb.cells:
        if old in cell.source:
            cell.source = cell.source.replace(old, new, 1)
            hits += 1
    assert hits == 1, (f"{nn_id}: {old!r} found in {hits} cells of {SOLUTIONS[nn_id].relative_to(ROOT)}, not 1: "
                       f"edit the case in tests/wrong_answers/ex{nn_id}.py")
    return nb


def test_every_exercise_has_three_parts():
    # that each exercise has its solution, notebook and wrong answers: tests/test_course_layout.py
    for nn_id in MODULES:
        ex = exercise(nn_id)
        assert len(ex.parts) >= 3, f"exercise {nn_id} needs at least three graded parts (course_utils/grading/ex{nn_id}.py)"


@pytest.mark.parametrize("nn_id", sorted(MODULES))
def test_solution_full_marks_untouched_zero(nn_id):
    got = grade(solution(nn_id), nn_id)
    assert all(r.passed for r in got.values()), {k: r.message for k, r in got.items() if not r.passed}
    stub = grade(make_exercise(solution(nn_id)), nn_id)
    for key, r in stub.items():
        assert not r.passed
        assert r.message.startswith("not implemented yet: replace `raise NotImplementedError()`"), (key, r.message)


#: typical wrong answers, one file per exercise: tests/wrong_answers/exNN.py defines WRONG, a list of
#: (what, text in the solution, replacement, the parts that must fail)
WRONG_DIR = ROOT / "tests" / "wrong_answers"
WRONG = {p.stem[2:]: runpy.run_path(str(p))["WRONG"] for p in sorted(WRONG_DIR.glob("ex[0-9][0-9].py"))}


CASES = [(nn, *case) for nn, cases in sorted(WRONG.items()) for case in cases]


@pytest.mark.parametrize("nn_id,what,old,new,failing", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_typical_wrong_answer_fails_its_part(nn_id, what, old, new, failing):
    got = grade(edited(nn_id, old, new), nn_id, keys=failing)
    for key in failing:
        assert not got[key].passed, f"{nn_id} {what}: part {key} passed"
        assert len(got[key].message) > 20 and "not implemented" not in got[key].message


def test_every_exercise_has_a_wrong_answer_and_wrong_answers_cover_key_parts():
    for nn_id in MODULES:
        assert WRONG.get(nn_id), (
            f"exercise {nn_id} has no typical wrong answer: tests/wrong_answers/ex{nn_id}.py must define WRONG = "
            "[(what, text in the solution, its replacement, [parts that must fail]), ...] "
            f"(`python -m course_utils.scaffold {nn_id}` writes the file with one case to edit)")
    assert not set(WRONG) - set(MODULES), (
        f"tests/wrong_answers/ex{sorted(set(WRONG) - set(MODULES))[0]}.py has no exercise module: remove it")
    assert {"dc_values", "up_values"} <= {k for c in WRONG["01"] for k in c[3]}


# -- answers appear nowhere a learner reads -------------------------------------------------------
def test_secret_parts_never_show_the_expected_value():
    # 03's naive estimate for N=50 is 13,000,000 bytes; its formula at N=8 is 22,528
    got = grade(edited("03", "return 26 * n**3 * 4", "return 1"), "03", keys=["naive"])
    assert "13,000,000" not in got["naive"].message and "13000000" not in got["naive"].message
    got = grade(edited("03", "return 11 * n**3 * 4", "return 1"), "03", keys=["formula"])
    assert "22,528" not in got["formula"].message and "11" not in got["formula"].message
    got = grade(edited("05", '"Sigmoid": False', '"Sigmoid": True'), "05", keys=["answers"])
    assert "Sigmoid" not in got["answers"].message  # which op is wrong would give the answer
    got = grade(edited("07", "return min((s for s in range(1, n + 1) if n % s == 0), key=peak)", "return n"),
                "07", keys=["segments"])
    assert not re.search(r"expected|best is", got["segments"].message)


def test_exercise_text_gives_no_answer():
    """Hints and markdown of the exercises: no formula, no count, no winning configuration."""
    text = {nn: "\n".join(c.source for c in make_exercise(solution(nn)).cells) for nn in MODULES}
    assert "26" not in text["03"] and "11 *" not in text["03"] and "13 conv" not in text["03"]
    assert "(s - 1)" not in text["07"] and "2 * n / s" not in text["07"]
    assert "every level" not in text["10"] and '"level"' not in text["10"] and "inplace_relu=True" not in text["10"]
    assert "element_size()" not in text["00"] and "math.prod" not in text["00"].split("import math")[1]
    assert "did not save its OUTPUT" not in text["05"]
    for nn, t in text.items():
        assert "BEGIN SOLUTION" not in t and "HINT:" not in t, nn


# -- a failing part's feedback: the cause named, kept whole, what is missing explained -----------
def test_05_nets_cover_both_phases_and_both_answers():
    # a part whose expected answers are all alike passes a constant answer: the CI run that found
    # "always backward" passing had three backward peaks and no forward one
    from course_utils.grading import ex05

    phases = [ex05.peak_of(name, False)[1] for name in ex05.NETS]
    lowers = [ex05.peak_of(name, True)[2] < ex05.peak_of(name, False)[2] for name in ex05.NETS]
    assert set(phases) == {"forward", "backward"}, phases
    assert set(lowers) == {True, False}, lowers


def test_06_wrong_backward_names_the_error_not_an_attribute_error():
    got = grade(edited("06", "dx = g * dy\n", "dx = g * dy * 2\n"), "06", keys=["eval"])
    assert not got["eval"].passed
    assert "GradcheckError" not in got["eval"].message and "AttributeError" not in got["eval"].message
    assert "dx" in got["eval"].message and "values differ" in got["eval"].message


def test_08_failed_rank_reports_the_root_cause():
    from course_utils.grading.ex08 import root_cause

    text = ("rank 1 of source_worker failed:\nTraceback (most recent call last):\n  File \"<learner>\", line 3, "
            "in ddp_step\nValueError: my shapes are wrong\n(ranks 0 failed as a consequence)")
    assert root_cause(text) == "ValueError: my shapes are wrong"
    got = grade(edited("08", "ddp = DDP(model)", "raise ValueError('my shapes are wrong')"), "08", keys=["runs"])
    assert "ValueError: my shapes are wrong" in got["runs"].message, got["runs"].message


def test_long_reasons_are_kept():
    got = grade(edited("00", "return math.prod(shape) * torch.empty((), dtype=dtype).element_size()",
                       "raise ValueError('a long reason ' + 'x' * 400)"), "00", keys=["float"])
    assert len(got["float"].message) > 300 and got["float"].message.count("x") >= 300


def test_missing_and_imported_objects_are_explained():
    nb = solution("01")
    nb.cells = [c for c in nb.cells if "class Up" not in c.source]
    imports = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith(("import", "from")))
    imports.source += "\nfrom course_utils.unet import Up"
    got = grade(nb, "01", keys=["up_values"])
    assert "not written in the notebook" in got["up_values"].message and "course_utils.unet" in got["up_values"].message
    nb.cells = [c for c in nb.cells if "class DoubleConv" not in c.source]
    imports.source = imports.source.replace("from course_utils.unet import Up", "")
    got = grade(nb, "01", keys=["dc_params"])
    assert got["dc_params"].message.startswith("DoubleConv is not defined in the notebook: write `def DoubleConv`")
