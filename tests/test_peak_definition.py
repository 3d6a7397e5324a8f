"""One definition of "where the peak is": ``MemoryLog.peak_location`` -- the module
running at the moment of the step's peak and its phase -- used by the notebooks, the log and
exercise 05's grader; and one total per exercise in a notebook's check cells."""

import torch
from torch import nn

import course_utils as cu
from course_utils.grading import ex05
from course_utils.memory import predict_step
from course_utils.memory import LOSS, OPTIMIZER


def _small():
    return predict_step(lambda: cu.UNet3D(levels=3, channels=4), (1, 1, 16, 16, 16), n_classes=5,
                        optimizer=None)


def test_a_peak_outside_every_module_is_named_after_what_runs():
    """The small U-Net peaks while autograd differentiates the loss, before the first module's
    backward hook: the old log called that "(between modules: the loss or the engine)"."""
    pred = _small()
    assert pred.log.peak_location == (LOSS, "backward")
    rows, k = pred.log.rows, pred.log.peak_event
    # the peak lies between the last forward row and the first backward row, above both
    assert rows[k - 1].hook == "fwd" and rows[k].hook == "bwd_pre"
    assert max(r.tracked for r in rows) < pred.peak
    assert rows[k - 1].tracked < pred.peak and rows[k].tracked < pred.peak


def test_the_optimizer_step_is_named():
    def param_heavy():
        return nn.Sequential(nn.Conv3d(1, 64, 1), nn.Conv3d(64, 256, 1), nn.Conv3d(256, 5, 1))

    pred = predict_step(param_heavy, (2, 1, 2, 2, 2), n_classes=5, steady_state=False)
    assert pred.log.peak_location == (OPTIMIZER, "optimizer/other")


def test_exercise05_grades_the_definition_the_notebooks_teach():
    """The reference is peak_location (the old reference, the hook table's largest row, gave
    'outc.conv' for the first net and 'forward' where the step peaked in backward), and the three
    nets cover a peak outside every module, a recomputation in backward and a forward peak."""
    where = {}
    for name, (plain, _, shape) in ex05.NETS.items():
        module, phase = predict_step(plain, shape, n_classes=5, optimizer=None).log.peak_location
        assert ex05.peak_of(name, False)[:2] == (module, phase)
        where[name] = (phase, module)
    phases = {p for p, _ in where.values()}
    assert phases == {"forward", "backward"}
    assert any(m == LOSS for _, m in where.values())
    ckpt = where["U-Net, 3 levels, every level checkpointed"]
    assert ckpt[0] == "backward" and not ckpt[1].startswith("(")
    lowers = [ex05.peak_of(n, True)[2] < ex05.peak_of(n, False)[2] for n in ex05.NETS]
    assert True in lowers and False in lowers


def _peak_answer(build, shape):
    return predict_step(build, shape, n_classes=5, optimizer=None).log.peak_location


def _lowers(plain, inplace, shape):
    return (predict_step(inplace, shape, n_classes=5, optimizer=None).peak
            < predict_step(plain, shape, n_classes=5, optimizer=None).peak)


def test_one_total_per_exercise_across_its_check_cells():
    """Each check cell showed its own "x/y points", two totals per exercise; now each shows the
    exercise's total so far, with this cell's share and the parts not checked yet."""
    ex05.EX.latest.clear()

    def answers():
        return {op: ex05.inplace_relu_is_safe_after(op) for op in ex05.PRECEDING_OPS}

    def fixed(x):
        return torch.sigmoid(x) * 2

    first = ex05.check_inplace(answers, fixed, verbose=False)
    assert float(first) == 4  # nbgrader's partial credit stays the cell's own
    text = first._repr_markdown_()
    assert text.startswith("**Exercise 05: 4/7 points**") and "this check: 4/4" in text
    assert "not checked yet: where_is_the_peak, inplace_lowers_peak" in text
    second = ex05.check_peak(_peak_answer, _lowers, verbose=False)
    assert float(second) == 3
    assert second._repr_markdown_() == "**Exercise 05: 7/7 points -- all parts pass** (this check: 3/3)"
    # a later failing run of a part replaces its earlier result
    third = ex05.check_inplace(answers, lambda x: torch.sigmoid(x).mul_(2), verbose=False)
    assert third._repr_markdown_().startswith("**Exercise 05: 5/7 points**")
    ex05.EX.latest.clear()
