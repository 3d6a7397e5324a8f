"""Numbers with relations between them: every public function of tiling, densenet_spatial,
full_resolution, explorer, budget, spatial and numerics that takes sizes, budgets, ranks, sides or
batches answers in its domain or refuses with its family's error and the fix.

``tests/test_properties_boundary.py`` checks each argument alone (the guard); here the generated
numbers are hostile and ordinary together -- zero, negative, NaN, inf, huge, fractional, a rank
past its world, a card below its CUDA context -- and each property says what a valid answer is:

* ``largest_tiled_n`` is at least its search's start and below its limit, the largest N the
  predictions fit (or a ``TilingError`` saying which end the budget lies past); ``plan_tiles``
  partitions the volume;
* ``check_alignment`` gives each rank a positive, aligned row count that times the world is the
  height; ``strip_rows`` stays inside the image;
* ``smallest_card`` returns a listed card that holds the peak, the first that does, or None;
* largest sides (``PixelModel.largest_side``), batches (``BatchModel.largest_batch``,
  ``explorer.estimate``) and usable bytes (``Overheads.usable``, ``usable_bytes``) fit their budget,
  one more does not, and they never shrink as the budget grows;
* explorer Configs and the spatial demos' configs are trainable or refused where they are made.

Each property costs milliseconds an example: predictions are replaced by a stated monotone peak
(the search is what is tested; the predictions have their own tests) and no network is built.
CPU budget (ci profile, 20 examples each): <= 6 CPU-s beyond the imports.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace
from unittest import mock

import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

from course_utils import budget, explorer as ex, full_resolution as fr
from course_utils import densenet_spatial as ds
from course_utils import spatial
from course_utils.checks import NetworkError, ParallelError, TechniqueError, TilingError
from course_utils.memory import GiB, MiB
from course_utils.tiling import plan_tiles
from course_utils.tiling import predict as tiling_predict

#: numbers no size, budget or count may be
HOSTILE = st.sampled_from([0, -1, -64, 2.5, float("nan"), float("inf"), float("-inf"), True, "8", None])
#: whole numbers around the edges, zero and negatives included
EDGY_INT = st.integers(-3, 70) | st.sampled_from([2**31, 2**62])


def mostly(valid: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` seven times in eight: with several arguments, both answers and refusals are drawn."""
    return st.integers(0, 7).flatmap(lambda i: hostile if i == 0 else valid)


#: what ``answer`` returns for a refusal
REFUSED = None


def answer(error: type, call, *args, **kwargs):
    """``call``'s result, or ``REFUSED`` where it raised ``error`` with the fix; any other
    exception, or ``error`` without "Fix: ", fails the property."""
    try:
        out = call(*args, **kwargs)
    except error as err:
        assert "Fix: " in str(err), f"{type(err).__name__} without a fix: {err}"
        event(f"{getattr(call, '__name__', call)}: refused")
        return REFUSED
    event(f"{getattr(call, '__name__', call)}: answered")
    return out


# -- tiling ---------------------------------------------------------------------------------------
def _fake_peaks(base: int, per: int):
    """A stated monotone peak in N (``base + per * N^2``), in place of ``predict_tiled_step``."""
    def predict(build, n, tiles, **kw):  # noqa: ARG001 - predict_tiled_step's signature
        return SimpleNamespace(peak=base + per * n * n)
    return predict


@given(budget_bytes=mostly(st.integers(10**5, 10**9), HOSTILE), base=st.integers(0, 10**5), per=st.integers(1, 100),
       start=mostly(st.integers(1, 40), st.integers(-1, 0)), span=mostly(st.integers(1, 4000), st.integers(-2, 0)),
       owned=mostly(st.integers(1, 4), st.integers(-1, 0)))
def test_largest_tiled_n_is_the_boundary_or_says_which_end_it_is_past(budget_bytes, base, per, start, span, owned):
    peak = _fake_peaks(base, per)
    limit = start + span
    with mock.patch.object(tiling_predict, "predict_tiled_step", peak):
        n = answer(TilingError, tiling_predict.largest_tiled_n, budget_bytes, owned=owned, start=start, limit=limit)
    if n is None:
        return
    assert isinstance(n, int) and 1 <= start <= n < limit and owned >= 1
    assert peak(None, n, 1).peak <= budget_bytes < peak(None, n + 1, 1).peak


@given(budgets=st.lists(st.integers(10**5, 10**9), min_size=2, max_size=2), per=st.integers(1, 10**4))
def test_largest_tiled_n_never_shrinks_as_the_budget_grows(budgets, per):
    small, large = sorted(budgets)
    with mock.patch.object(tiling_predict, "predict_tiled_step", _fake_peaks(10**5, per)):
        found = [answer(TilingError, tiling_predict.largest_tiled_n, b, start=1, limit=1 << 16) for b in (small, large)]
    assume(None not in found)
    assert found[0] <= found[1]


@given(shape=mostly(st.lists(st.integers(6, 12), min_size=3, max_size=3),
                    st.lists(st.integers(-1, 12), min_size=1, max_size=3) | st.just([2**20] * 3)),
       tiles=mostly(st.integers(1, 3) | st.lists(st.integers(1, 3), min_size=3, max_size=3),
                    st.integers(-1, 13) | st.lists(st.integers(-1, 5), min_size=1, max_size=3) | st.just([2**20] * 3)),
       halo=mostly(st.integers(0, 2), st.integers(-1, 3)), axis=mostly(st.integers(0, 2), st.integers(-4, 3)))
def test_a_plan_partitions_the_volume_or_names_the_fix(shape, tiles, halo, axis):
    plan = answer(TilingError, plan_tiles, shape, tiles, halo, axis)
    if plan is None:
        return
    for a, n in enumerate(shape):  # every voxel of every axis owned once; reads inside the volume
        cuts = sorted({(t.own[a].start, t.own[a].stop) for t in plan})
        assert cuts[0][0] == 0 and cuts[-1][1] == n and all(x[1] == y[0] for x, y in zip(cuts, cuts[1:], strict=False))
        assert all(0 <= t.read[a].start <= t.own[a].start < t.own[a].stop <= t.read[a].stop <= n for t in plan)
    assert sum(t.own_voxels for t in plan) == math.prod(shape)


# -- densenet_spatial, spatial --------------------------------------------------------------------
ALIGNED = st.integers(1, 9).flatmap(lambda w: st.tuples(st.integers(1, 10**4).map(lambda k: 32 * w * k), st.just(w)))


@given(split=mostly(ALIGNED, st.tuples(EDGY_INT | HOSTILE, st.integers(-1, 9) | HOSTILE)), rank=st.integers(-1, 9))
def test_strips_are_aligned_rows_that_add_up_to_the_height(split, rank):
    height, world = split
    t = answer(ParallelError, ds.check_alignment, height, world)
    if t is not None:
        assert t > 0 and t % ds.ALIGN == 0 and t * world == height
    rows = answer(ParallelError, ds.strip_rows, height, world, rank)
    if rows is not None:
        assert t is not None and 0 <= rows[0] < rows[1] <= height and rows[1] - rows[0] == t
    tall = answer(ParallelError, ds.aligned_height, height, world)
    if tall is not None:
        assert height <= tall < height + ds.ALIGN * world and ds.check_alignment(tall, world) * world == tall


@given(config=st.fixed_dictionaries({}, optional={
    "batch": mostly(st.integers(1, 2), st.integers(-1, 0) | HOSTILE),
    "volume": mostly(st.lists(st.integers(1, 4), min_size=3, max_size=3),
                     st.lists(st.integers(-1, 4), min_size=2, max_size=4)),
    "dtype": mostly(st.sampled_from(["float64", "float32"]), st.sampled_from(["int64", "nope", 64])),
    "net": mostly(st.sampled_from(spatial.NETS), st.just("resnet")),
    "dim": mostly(st.integers(2, 4), st.integers(0, 5) | HOSTILE)}))
def test_spatial_configs_give_the_volume_they_state_or_the_fix(config):
    made = answer(ParallelError, spatial.spatial_volume, config)
    if made is None:
        return
    x, target = made
    assert x.shape == target.shape == (config.get("batch", 1), 1, *config.get("volume", (16, 10, 10)))
    assert x.dtype.is_floating_point and config.get("dim", 2) in (2, 3, 4)


# -- full_resolution ------------------------------------------------------------------------------
@given(peak=st.floats(0, 100 * GiB) | HOSTILE,
       cards=st.lists(st.sampled_from([1, 6, 8, 16, 24, 0.25, 0, -8]), min_size=0, max_size=4))
def test_smallest_card_holds_the_peak_and_no_card_before_it_does(peak, cards):
    try:
        card = fr.smallest_card(peak, cards)
    except NetworkError as err:  # a peak that is no number of bytes, or a card that holds nothing
        assert "Fix: " in str(err)
        assert not (isinstance(peak, (int, float)) and not isinstance(peak, bool) and 0 <= peak < math.inf) or \
            min(cards) <= 0.25
        return
    held = [c for c in cards if peak <= budget.usable_bytes(c)]
    assert card == (held[0] if held else None)


_LINE = dict(fixed=st.integers(0, 2**34), per_pixel=mostly(st.floats(1e-2, 1e4), st.sampled_from([0.0, 5e-324])),
             batch=mostly(st.integers(1, 64), st.integers(-1, 0) | HOSTILE),
             budgets=st.lists(mostly(st.integers(0, 2**40), st.sampled_from([-1.0, float("nan"), float("inf"),
                                                                            2**50 + 1])), min_size=2, max_size=2))


@given(**_LINE)
def test_the_largest_side_fits_the_budget_the_next_does_not_and_grows_with_it(fixed, per_pixel, batch, budgets):
    line = fr.PixelModel("x", "fp32", fixed=fixed, per_pixel=per_pixel, all_gradients=0, gradient_at_peak=0,
                         side=0, seconds=0.0, method="given")
    sides = [answer(NetworkError, line.largest_side, b, batch) for b in budgets]
    for b, side in zip(budgets, sides, strict=True):
        if side is not None:
            assert side >= 0 and side % fr.SIDE_STEP == 0
            assert side == 0 or line.peak(batch, side) <= b
            assert line.peak(batch, side + fr.SIDE_STEP) > b
    if None not in sides and budgets[0] <= budgets[1]:
        assert sides[0] <= sides[1]


# -- budget ---------------------------------------------------------------------------------------
@given(fixed=st.integers(0, 2**40), per_sample=st.integers(0, 2**30),
       budgets=st.lists(st.integers(0, 2**50) | st.sampled_from([-1.0, float("nan"), float("inf")]),
                        min_size=2, max_size=2))
def test_the_largest_batch_fits_the_budget_the_next_does_not_and_grows_with_it(fixed, per_sample, budgets):
    line = budget.BatchModel(fixed=fixed, per_sample=per_sample, breakdown={}, batch=1)
    found = [answer(TechniqueError, line.largest_batch, b) for b in budgets]
    for b, n in zip(budgets, found, strict=True):
        if n is not None:
            assert isinstance(n, int) and n >= 0 and (n == 0 or line.peak(n) <= b) and line.peak(n + 1) > b
    if None not in found and budgets[0] <= budgets[1]:
        assert found[0] <= found[1]


@given(context=mostly(st.floats(0, 4096), HOSTILE), slack=mostly(st.floats(0, 1), HOSTILE),
       workspace=st.integers(0, 2**26), cards=st.lists(mostly(st.integers(2**28, 2**37), st.integers(0, 2**28) | HOSTILE),
                                                       min_size=2, max_size=2))
def test_usable_bytes_invert_what_a_card_needs(context, slack, workspace, cards):
    over = answer(TechniqueError, budget.Overheads, context, slack, "generated", workspace)
    if over is None:
        return
    held = [answer(TechniqueError, over.usable, c) for c in cards]
    outside = context * 2**20 + workspace
    for card, usable in zip(cards, held, strict=True):
        if usable is not None and card <= outside:  # the card does not even hold the context: no step
            assert usable == 0
        elif usable is not None:
            assert 0 < usable <= card and over.needed(usable) == pytest.approx(card, rel=1e-12)
    if None not in held and cards[0] <= cards[1]:
        assert held[0] <= held[1]


@given(cards=st.lists(st.floats(0.5, 200) | HOSTILE, min_size=2, max_size=2))
def test_a_larger_card_never_holds_less(cards):
    held = [answer(TechniqueError, budget.usable_bytes, c) for c in cards]
    for c, h in zip(cards, held, strict=True):
        if h is not None:
            assert 0 <= h < c * GiB
    if None not in held and cards[0] <= cards[1]:
        assert held[0] <= held[1]


# -- explorer -------------------------------------------------------------------------------------
SMALL = ex.Config(levels=3, base_channels=8, volume=(16, 32, 32), batch=2, precision="fp32", seed000=False)


@given(levels=mostly(st.integers(2, 5), st.integers(-1, 8) | HOSTILE),
       volume=mostly(st.lists(st.integers(16, 70), min_size=3, max_size=3),
                     st.lists(st.integers(-1, 70) | HOSTILE, min_size=2, max_size=4)),
       dp_ranks=mostly(st.integers(1, 4), st.integers(-1, 0)), batch=mostly(st.integers(1, 64), st.integers(-1, 0) | HOSTILE),
       budget_gib=mostly(st.integers(1, 80), st.integers(-1, 0) | HOSTILE))
def test_a_config_is_trainable_or_refused_when_made(levels, volume, dp_ranks, batch, budget_gib):
    cfg = answer(TechniqueError, ex.Config, levels=levels, volume=tuple(volume), dp_ranks=dp_ranks, batch=batch,
                 budget_gib=budget_gib, seed000=False)
    if cfg is not None:
        assert cfg.levels >= 2 and len(cfg.volume) == 3 and min(cfg.volume) >= 2 ** (cfg.levels - 1)
        assert cfg.dp_ranks >= 1 and cfg.batch >= 1 and cfg.budget_gib >= 1


@given(fixed=st.integers(0, 6 * GiB), per_sample=st.integers(1, GiB), context=st.floats(0, 2048),
       slack=st.floats(0, 0.5), cards=st.lists(st.integers(1, 80), min_size=2, max_size=2))
def test_the_explorers_largest_batch_fits_the_card_and_grows_with_it(fixed, per_sample, context, slack, cards):
    """``estimate``'s solve and rounding, on a stated line (fixed + batch x per sample) in place of
    the prediction: the largest batch's card needs fit the card, one more's do not."""
    over = budget.Overheads(context, slack, "generated")
    lines = {"params": (float(fixed), 0.0), "activations": (0.0, float(per_sample))}
    found = []
    with mock.patch.object(ex, "_per_sample_lines", lambda _key: lines):
        for gib in sorted(cards):
            est = answer(TechniqueError, ex.estimate, replace(SMALL, budget_gib=gib), over)
            found.append(None if est is None else est.largest_batch)
            if est is not None:
                n = est.largest_batch
                assert n >= 0 and over.needed(fixed + (n + 1) * per_sample) > gib * GiB
                assert n == 0 or over.needed(fixed + n * per_sample) <= gib * GiB
            else:  # only a card that does not hold the context is refused
                assert gib * GiB <= context * MiB
    if None not in found:
        assert found[0] <= found[1]
