"""Seed 004 at full resolution (course_utils.full_resolution): the pixel model's line, the largest
side as a boundary, accumulation's gradients, BatchNorm at batch 1; README's partial recompute;
the hand count against the predicted slopes, the checked range and the 32-bit-index side.
Notebook 12 makes the full-size predictions (DenseNet-169 at 2000 x 2000) and asserts them."""

import json
from pathlib import Path

import pytest
import torch

from course_utils import densenet as dn
from course_utils import full_resolution as fr
from course_utils.budget import steady_state, usable_bytes
from course_utils.checks import NetworkError
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


def test_a_side_that_fills_the_budget_exactly_is_the_largest():
    """The square root in ``largest_side`` can land just below an exact side (per_pixel 0.1, batch 3,
    side 224 gave 192: found while exercise 12 was written); the search must step up as well as down."""
    m = fr.PixelModel("x", "fp32", fixed=0, per_pixel=0.1, all_gradients=0, gradient_at_peak=0, side=0,
                      seconds=0.0, method="")
    misses = [(b, s) for b in range(1, 9) for s in range(32, 4096, 32)
              if m.largest_side(m.peak(b, s), batch=b) != s]
    assert misses == []


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


def test_a_negative_peak_gets_no_card():
    """Issue 43's example: ``smallest_card(-5)`` answered 8 (GB): a negative peak fits anything."""
    with pytest.raises(NetworkError, match="peak_bytes=-5 .*Fix: "):
        fr.smallest_card(-5)


@pytest.mark.parametrize("cards", [(0, 8), (-16,), (float("nan"), 8), (1e-6,)])
def test_cards_that_are_no_card_are_refused(cards):
    """A card of 0 GiB, a negative one, NaN, one under a MiB (bytes where GiB are meant): refused,
    in this module's error type, rather than skipped or sent to budget raw."""
    with pytest.raises(NetworkError, match="Fix: "):
        fr.smallest_card(1e9, cards)


def test_a_card_smaller_than_the_cuda_context_holds_nothing_and_is_passed_over():
    assert fr.smallest_card(1e9, (0.25, 8)) == 8 and fr.smallest_card(1e9, (0.25,)) is None


def _hand_line(per_pixel=100.0):
    return fr.PixelModel("x", "fp32", fixed=10**9, per_pixel=per_pixel, all_gradients=10**8,
                         gradient_at_peak=5 * 10**7, side=1, seconds=0.0, method="given")


@pytest.mark.parametrize("call, match", [
    (lambda m: m.largest_side(float("nan")), "budget_bytes=nan"),  # "cannot convert float NaN to integer"
    (lambda m: m.largest_side(float("inf")), "budget_bytes=inf"),  # OverflowError
    (lambda m: m.largest_side(-1.0), "budget_bytes=-1.0"),  # 0 before: a negative budget is no budget
    (lambda m: m.largest_side(2**65), "2\\*\\*50"),  # past any card (the search could not end)
    (lambda m: m.largest_side(8e9, batch=0), "batch=0"),  # ZeroDivisionError
    (lambda m: m.largest_side(8e9, batch=-1), "batch=-1"),  # TypeError (a complex square root)
    (lambda m: m.largest_side(8e9, batch=2.5), "batch=2.5"),
    (lambda m: m.peak(-1, 100), "batch=-1"),  # a peak below the fixed part before
    (lambda m: m.per_gpu(1, 64, 64, 0), "world=0"),  # ZeroDivisionError
    (lambda m: fr.PixelModel(**{**vars(m), "per_pixel": 0.0}).largest_side(8e9), "per_pixel=0.0"),  # ZeroDivisionError
    (lambda m: fr.PixelModel(**{**vars(m), "per_pixel": 5e-324}).largest_side(8e9), "per_pixel=5e-324"),  # OverflowError
])
def test_a_line_refuses_numbers_out_of_its_domain(call, match):
    """``PixelModel``'s methods (which ``guard`` does not reach): each of these raised a raw error
    or answered out of its domain before."""
    with pytest.raises(NetworkError, match=match) as err:
        call(_hand_line())
    assert "Fix: " in str(err.value)


@pytest.mark.parametrize("call, match", [
    (lambda: fr.largest_int32_side(1, step=0), "step=0"),  # ZeroDivisionError
    (lambda: fr.running_stat_weight(8, 2.0), "momentum=2.0"),  # one batch moved the statistics 200 %
    (lambda: fr.accumulation_error("batch", batch=2, side=48), "side >= 61"),  # BatchNorm of 1 value
    (lambda: fr.accumulation_error("group", batch=2, side=16), "side >= 32"),  # densenet's ValueError
    (lambda: fr.with_group_norm(fr.tiny_densenet(), 3), "channels_per_group=3"),  # GroupNorm's ValueError
    (lambda: fr.pixel_model("naive", side=0), "side=0"),  # a prediction of an empty image
    (lambda: fr.pixel_model("nave"), "unknown variant"),
    (lambda: fr.weight_copy_bytes("nave"), "unknown variant"),  # answered a naive count
    (lambda: fr.peak_module("nave"), "unknown variant"),
])
def test_module_functions_refuse_what_they_cannot_answer(call, match):
    with pytest.raises(NetworkError, match=match) as err:
        call()
    assert "Fix: " in str(err.value)


def test_a_table_marks_a_side_of_zero_as_nothing_fits():
    """``sides_table`` answers 0 where not even a 32 x 32 image fits (1 GB holds less than the
    line's fixed GB); marking it must not trip the guard of ``side_mark`` (whose sides are >= 1)."""
    table = fr.sides_table({"hand": _hand_line()}, cards=(1, 80), marked=True)
    assert table.iloc[0, 0] == "0" and table.iloc[0, 1] != "0"


def test_smallest_card_is_the_first_that_holds_the_peak():
    # the card model is budget.usable_bytes (budget.Overheads), as in every budget of the course
    sixteen = usable_bytes(16)
    assert fr.smallest_card(sixteen) == 16
    assert fr.smallest_card(sixteen + 1) == 24
    assert fr.smallest_card(usable_bytes(80) + 1) is None


# -- the hand count, the checked range, 32-bit indexing (notebook 12, section 3) -----------------
@pytest.fixture(scope="module")
def full_models():
    # the eight DenseNet-169 predictions at 2000 x 2000: about 20 CPU-s alone; in make test they are
    # notebook 12's, shared through the session cache (course_utils.session_cache)
    return fr.pixel_models()


def test_hand_count_agrees_with_every_predicted_slope_and_needs_each_term(full_models):
    """Notebook 12's table rests on this: the count by hand from DenseNet-169's configuration lands
    on each predicted slope within the stated tolerance, at the peak the count assumes; and the
    agreement is not loose: leaving out any term larger than the tolerance breaks it."""
    small = []
    for label, m in full_models.items():
        terms = fr.hand_count(m.variant, m.precision, m.side)["B per pixel"]
        tolerance = fr.HAND_COUNT_TOLERANCE * m.per_pixel
        assert abs(terms.sum() - m.per_pixel) < tolerance, label
        assert m.peak_location == (fr.peak_module(m.variant), "backward"), label
        for i, term in terms.items():
            if abs(term) > 2 * tolerance:
                assert abs(terms.drop(index=i).sum() - m.per_pixel) > tolerance, (label, i)
            else:
                small.append((label, i))
    # every term is tested that way but the fp16 weight copies of the per-block nets (0.2 B/pixel)
    assert small == [("checkpoint per block, autocast fp16", small[0][1]),
                     ("memory-efficient + per block, autocast fp16", small[1][1])]
    assert all(fr.hand_count(*label.split(", "))["what"][i].startswith("fp16 copies") for label, i in small)


def test_hand_count_refuses_unknown_names():
    with pytest.raises(ValueError, match="choose from"):
        fr.hand_count("nave")
    with pytest.raises(ValueError, match="choose from"):
        fr.hand_count("naive", "fp8")


def _meta_shapes(side: int, batch: int = 1) -> list[tuple[str, tuple[int, ...]]]:
    """Every module output of DenseNet-169 for a ``batch x 1 x side x side`` input, on meta tensors."""
    seen = []
    with torch.device("meta"), torch.no_grad():
        net = dn.densenet169()
        for name, mod in net.named_modules():
            if name and not list(mod.children()):
                mod.register_forward_hook(lambda _m, _i, out, name=name: seen.append((name, tuple(out.shape))))
        net(torch.empty(batch, 1, side, side))
    return seen


@pytest.mark.parametrize("side", [2000, 512, 1001, 13088])
def test_stage_sides_are_the_networks_own(side):
    """The hand count's resolutions are the network's (the pools round odd sides down)."""
    shapes = dict(_meta_shapes(side))
    sides = fr.stage_sides(side)
    assert shapes["stem.0"][2:] == (sides["stem"],) * 2
    assert shapes["stem.3"][2:] == (sides["block 1"],) * 2
    for i in range(1, 4):
        assert shapes[f"stages.{i - 1}.1.3"][2:] == (sides[f"block {i + 1}"],) * 2  # transition i's pool


@pytest.mark.parametrize("batch", [1, dn.SEED004_BATCH])
def test_the_int32_side_is_where_the_largest_tensor_passes_2_to_the_31(batch):
    """Notebook 12 marks sides past this one: the stem's output, the step's largest tensor (with
    block 1's output), has more than 2^31 - 1 elements there, and 32 pixels less it has not."""
    side = fr.largest_int32_side(batch)
    assert side % fr.SIDE_STEP == 0
    assert fr.stem_output_elements(side, batch) <= fr.INT32_MAX < fr.stem_output_elements(side + fr.SIDE_STEP, batch)
    largest = max(torch.Size(s).numel() for _, s in _meta_shapes(side + fr.SIDE_STEP, batch))
    assert largest == fr.stem_output_elements(side + fr.SIDE_STEP, batch)
    assert {1: 11584, 8: 4064}[batch] == side  # 64 x 5792^2 and 8 x 64 x 2032^2: just below 2^31


def test_the_checked_range_is_what_line_check_spans(line):
    """The range notebook 12 states (512^2 to 2000^2) is the one its comparison spans: seed 004's
    512 x 512 at batch 8 against lines drawn through batch 1 at 2000 x 2000."""
    assert fr.CHECKED_SIDES == (dn.SEED004_IMAGE[0], fr.FULL_SIDE)
    at_full = fr.from_prediction(_tiny_prediction(1, fr.FULL_SIDE), 1, fr.FULL_SIDE, "tiny", "fp32")
    table = fr.line_check({"tiny": at_full}, {"tiny": (_tiny_prediction(8, 512), 8, 512)})
    assert table.attrs["checked sides"] == fr.CHECKED_SIDES
    assert abs(table["error %"].iloc[0]) < 1
    # another comparison spans another range: the attribute is read off the inputs, not a constant
    assert fr.line_check({"tiny": line}, {"tiny": (_tiny_prediction(4, 128), 4, 128)}).attrs["checked sides"] == (128, 256)
    text = "".join("".join(c["source"]) for c in json.loads(
        (Path(__file__).resolve().parents[1] / "notebooks" / "12_densenet_at_full_resolution.ipynb").read_text())["cells"])
    lo, hi = fr.CHECKED_SIDES
    assert f"checked**: for images from {lo}² to {hi}²" in text


def test_sides_are_marked_outside_the_checked_range_and_past_the_int32_side(line):
    lo, hi = fr.CHECKED_SIDES
    assert [fr.side_mark(s, 8) for s in (lo - fr.SIDE_STEP, lo, hi, hi + 16)] == ["*", "", "", "*"]
    past = fr.largest_int32_side(8) + fr.SIDE_STEP
    assert fr.side_mark(past, 8) == "**" and fr.side_mark(past, 1) == "*"
    assert fr.side_mark(0, 8) == ""  # not even 32 x 32 trains: nothing to mark
    models = {"tiny": line}
    plain, marked = fr.sides_table(models, accumulate=True), fr.sides_table(models, accumulate=True, marked=True)
    assert [f"{s:,}{fr.side_mark(s, 1)}" for s in plain.iloc[0]] == list(marked.iloc[0])
    assert fr.MARK_UNCHECKED in "".join(marked.iloc[0]) and str(fr.largest_int32_side(8)) in fr.marks_legend(8).replace(",", "")


def test_predicting_without_the_optimizer_step_keeps_the_slope():
    """full_resolution's predictions skip Adam's step and add its two moments: the per-pixel slope
    is the same to the byte, and ``fixed`` differs only by Adam's step counters (one 0-dim tensor
    per parameter, 512 bytes each in the predictor)."""
    def step(optimizer):
        p = predict_step(lambda: dn.DenseNet(**TINY), **dn.seed004_step_args(1, (256, 256)),
                         module_peaks=False, optimizer=optimizer)
        return fr.from_prediction(p, 1, 256)

    with_adam, without = step("adam"), step(None)
    assert without.per_pixel == with_adam.per_pixel
    n_tensors = len(list(dn.DenseNet(**TINY).parameters()))
    assert with_adam.fixed - without.fixed == 512 * n_tensors
    assert without.peak_location == ("DenseNet", "backward")


def test_group_norm_keeps_fp32_maps_under_autocast():
    """Notebook 12's GroupNorm row: under CUDA autocast ``group_norm`` runs in fp32 (its fp32
    list), so a DenseNet with GroupNorm keeps fp32 copies of the concatenations and stores more
    than with BatchNorm; in fp32 the two store the same. Before, the answer table gave GroupNorm
    BatchNorm's fp16 figure."""
    def tiny(norm):
        net = dn.DenseNet(growth_rate=4, block_config=(2, 2, 2, 2), num_init_features=8, bn_size=2)
        return fr.with_group_norm(net) if norm == "group" else net

    def peak(norm, ac):
        p = predict_step(lambda: tiny(norm), **dn.seed004_step_args(1, (256, 256)), autocast_dtype=ac,
                         module_peaks=False, optimizer=None)
        return steady_state(p.breakdown)["Total"] - steady_state(p.breakdown)["Parameter"]

    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fr.with_group_norm(tiny("batch")).modules())
    assert abs(peak("group", None) / peak("batch", None) - 1) < 0.02
    assert peak("group", torch.float16) > 1.3 * peak("batch", torch.float16)
    with pytest.raises(ValueError, match="unknown norm"):
        fr._step("naive", "fp32", 1, 64, norm="layer")


def test_extrapolation_report_marks_its_limits():
    """Notebook 12's sides per card (fr.extrapolation_report): the 32-bit side is the last whose
    stem output fits 2^31 - 1 elements, the shares count the sides outside the checked range, and
    the three printed lines carry the figures."""
    line = fr.PixelModel("naive", "fp32", fixed=2**30, per_pixel=3000.0, all_gradients=2**28,
                         gradient_at_peak=2**27, side=fr.FULL_SIDE, seconds=0.0, method="test")
    rep = fr.extrapolation_report({"naive, fp32": line})
    i8, i1 = rep["int32"]
    assert fr.stem_output_elements(i1, 1) <= fr.INT32_MAX < fr.stem_output_elements(i1 + fr.SIDE_STEP, 1)
    assert fr.stem_output_elements(i8, dn.SEED004_BATCH) <= fr.INT32_MAX < fr.stem_output_elements(
        i8 + fr.SIDE_STEP, dn.SEED004_BATCH)
    lo, hi = fr.CHECKED_SIDES
    for table, share in zip((rep["sides8"], rep["sides1"]), rep["extrapolated"], strict=True):
        assert share == ((table < lo) | (table > hi)).to_numpy().mean()
    assert rep["far"]["side"] == int(rep["sides1"].to_numpy().max()) and len(rep["lines"]) == 3
    assert f"{i1:,}" in rep["lines"][0] and f"{rep['far']['side']:,}" in rep["lines"][2]
