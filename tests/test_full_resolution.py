"""Seed 004 at full resolution (course_utils.full_resolution): the pixel model's line, the largest
side as a boundary, accumulation's gradients, BatchNorm at batch 1; README's partial recompute.
The full-size predictions (DenseNet-169 at 2000 x 2000) run in notebook 07, which asserts them."""

import pytest
import torch

from course_utils import densenet as dn
from course_utils import full_resolution as fr
from course_utils.budget import steady_state, usable_bytes
from course_utils.memory import predict_step

TINY = dict(growth_rate=8, block_config=(2, 3, 2, 2), num_init_features=16, bn_size=2)


def _tiny_prediction(batch, side, **kw):
    return predict_step(lambda: dn.DenseNet(**TINY, **kw), **dn.seed004_step_args(batch, (side, side)),
                        module_peaks=False)


@pytest.fixture(scope="module")
def line():
    return fr.from_prediction(_tiny_prediction(1, 256), 1, 256, "tiny", "fp32")


def test_the_line_through_batch_1_predicts_another_batch_and_size(line):
    # the notebook's check, on a small DenseNet: a line drawn at (1, 256^2) lands on (4, 128^2)
    direct = steady_state(_tiny_prediction(4, 128).breakdown)["Total"]
    assert abs(line.peak(4, 128) / direct - 1) < 0.01
    # and the line is not trivially right: leaving out the fixed part misses it
    assert abs((line.peak(4, 128) - line.fixed) / direct - 1) > 0.01


def test_largest_side_is_the_boundary(line):
    budget = line.peak(8, 1000)
    side = line.largest_side(budget, batch=8)
    assert side % fr.SIDE_STEP == 0 and 900 < side <= 1000
    assert line.peak(8, side) <= budget < line.peak(8, side + fr.SIDE_STEP)
    assert line.largest_side(line.fixed * 0.5) == 0  # not even the parameters fit


def test_accumulation_keeps_every_gradient(line):
    assert line.all_gradients >= line.gradient_at_peak
    assert line.peak(1, 512, accumulate=True) - line.peak(1, 512) == line.all_gradients - line.gradient_at_peak
    # the side shrinks (or stays) when all gradients stay alive
    budget = line.peak(1, 2000)
    assert line.largest_side(budget, 1, accumulate=True) <= line.largest_side(budget, 1)


def test_per_gpu_divides_only_the_activations(line):
    one, eight = line.per_gpu(1, 2048, 2000, 1), line.per_gpu(1, 2048, 2000, 8)
    assert one == pytest.approx(line.peak(1, 0) + 2048 * 2000 * line.per_pixel)
    assert eight - line.fixed == pytest.approx((one - line.fixed) / 8)


def test_bad_variant_and_precision_name_the_choices():
    with pytest.raises(ValueError, match="choose one of"):
        fr._step("nave", "fp32", 1, 64)
    with pytest.raises(ValueError, match="choose one of"):
        fr._step("naive", "fp8", 1, 64)
    with pytest.raises(ValueError, match="'batch', 'frozen' or 'group'"):
        fr.tiny_densenet("layer")


def test_tiny_densenet_norms():
    group = fr.tiny_densenet("group")
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in group.modules())
    frozen = fr.tiny_densenet("frozen")
    bns = [m for m in frozen.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns)


def test_where_labels():
    assert fr._where("stem.1") == "stem"
    assert fr._where("stages.2.0.layers.5.norm1") == "dense block 3"
    assert fr._where("stages.0.1.0") == "transition 1"
    assert fr._where("norm5") == "final BatchNorm"


def test_running_statistics_move_more_with_micro_batches():
    w = fr.running_stat_weight(8, 0.1)
    assert w["one batch"] == 0.1 and w["8 micro-batches"] == pytest.approx(1 - 0.9**8)


def test_readme_only_recomputes_the_rows_it_names():
    from course_utils.readme import HEADLINES, merge_figures

    keys = [k for k, *_ in HEADLINES]
    old = {"meta": {"date": "old"}, "rows": [{"key": k, "course": "old"} for k in keys]}
    new = {"meta": {"date": "new"}, "rows": [{"key": "seed004_full", "course": "new"}]}
    merged = merge_figures(old, new)
    assert [r["key"] for r in merged["rows"]] == keys
    assert {r["key"]: r["course"] for r in merged["rows"]} == {k: "new" if k == "seed004_full" else "old" for k in keys}


def test_smallest_card_is_the_first_that_holds_the_peak():
    # the card model is budget.usable_bytes (budget.Overheads), as in every budget of the course
    sixteen = usable_bytes(16)
    assert fr.smallest_card(sixteen) == 16
    assert fr.smallest_card(sixteen + 1) == 24
    assert fr.smallest_card(usable_bytes(80) + 1) is None
