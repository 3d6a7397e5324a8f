"""Exercise 12 -- DenseNet at full resolution: notebook 12's pixel model, written by the learner.

The pixel model (``course_utils.full_resolution``): the predicted peak of a step of ``batch``
images of ``side x side`` is ``fixed + batch x side^2 x per_pixel``, where ``fixed`` is what does
not grow with the image (parameters, buffers, gradients, Adam's state) and ``per_pixel`` the
bytes one input pixel of one image adds (activations, temporaries, the input). The learner writes

* ``pixel_line(point_a, point_b)``: ``fixed`` and ``per_pixel`` from two predicted (or measured)
  peaks ``(batch, side, peak_bytes)``;
* ``largest_side(fixed, per_pixel, budget_gib, batch)``: the largest side, a multiple of 32
  (DenseNet halves the image five times), whose step fits ``budget_gib`` GiB -- 0 if none does;
* ``per_gpu_bytes(fixed, per_pixel, batch, height, width, gpus)``: the peak per GPU when every
  image is split into ``gpus`` strips of rows (``densenet_spatial``): the image padded to a
  height whose strips are multiples of 32 rows, the per-pixel part divided, the fixed part on
  every GPU.

Each part observes the learner's function on lines, cards and images drawn from the seed and
compares with the course's own code (``PixelModel``, ``densenet_spatial.aligned_height``)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import torch

from .. import densenet as dn
from ..densenet_spatial import aligned_height
from ..full_resolution import CARDS_GIB, FULL_SIDE, SIDE_STEP, PixelModel
from .core import CheckFailed, Exercise, describe, drawn_int, expect_int, expect_list, reference, seeded

EX = Exercise("12", "DenseNet at full resolution", names=("pixel_line", "largest_side", "per_gpu_bytes"),
              refused={"course_utils.full_resolution": ("PixelModel",),
                       "course_utils.densenet_spatial": ("aligned_height", "check_alignment")})

GIB = 2**30
MIB = 2**20
#: the batches the cases draw from (seed 004 trained batch 8)
BATCHES = (1, 2, 4, 8, 16)


def _uniform(g: torch.Generator, lo: float, hi: float, digits: int) -> float:
    return round(lo + (hi - lo) * float(torch.rand(1, generator=g, dtype=torch.float64)), digits)


def densenet169_fixed() -> int:
    """DenseNet-169's (1 channel, 14 outputs) fixed bytes in fp32 with Adam: the weights, their
    gradients and Adam's two moments, 4 bytes each (the parameter count by formula)."""
    return 4 * 4 * dn.parameter_count(**dn.DENSENET169)


def _line(g: torch.Generator) -> tuple[int, float]:
    """A drawn line: fixed from 100 MiB to 2 GiB (whole 512-byte blocks), per_pixel from 200 to
    4,000 bytes (notebook 12's techniques, fp16 and fp32, lie in this range)."""
    return drawn_int(g, 100 * MIB // 512, 2 * GIB // 512) * 512, _uniform(g, 200.0, 4000.0, 3)


# -- pixel_line(point_a, point_b) -----------------------------------------------------------------
Point = tuple[int, int, int]


def line_cases(seed: int) -> list[tuple[Point, Point]]:
    """Pairs of points (batch, side, peak bytes) on a line: first notebook 12's check of its line
    (batch 1 at 2000 x 2000, batch 8 at 512 x 512) on DenseNet-169's fixed bytes, then drawn
    pairs (sides multiples of 32, batches from ``BATCHES``, never the same pixels per step)."""
    g = seeded(seed, int(EX.id), 0)
    lines = [(densenet169_fixed(), _uniform(g, 200.0, 4000.0, 3))] + [_line(g) for _ in range(4)]
    shapes = [((1, FULL_SIDE), (8, dn.SEED004_IMAGE[0]))]
    while len(shapes) < len(lines):
        a, b = [(BATCHES[drawn_int(g, 0, len(BATCHES))], SIDE_STEP * drawn_int(g, 8, 129)) for _ in range(2)]
        if a[0] * a[1] ** 2 != b[0] * b[1] ** 2:
            shapes.append((a, b))
    return [tuple((b, s, round(fixed + b * s * s * per_pixel)) for b, s in pair)
            for (fixed, per_pixel), pair in zip(lines, shapes, strict=True)]


@reference
def reference_line(point_a: Point, point_b: Point) -> tuple[float, float]:
    """The line through two points, in exact arithmetic: (fixed bytes, bytes per input pixel of
    one image)."""
    pixels_a, pixels_b = (Fraction(p[0] * p[1] ** 2) for p in (point_a, point_b))
    per_pixel = (Fraction(point_b[2]) - point_a[2]) / (pixels_b - pixels_a)
    return float(point_a[2] - pixels_a * per_pixel), float(per_pixel)


def _number(label: str, got: Any) -> float:
    """An int or a float (not a bool), finite."""
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise CheckFailed(f"{label}: expected a number (int or float), got {describe(got)}")
    if not math.isfinite(got):
        raise CheckFailed(f"{label}: {got} is not a finite number")
    return float(got)


LINE = EX.part("line", "pixel_line: fixed bytes and bytes per input pixel from two predictions", 1,
               ["pixel_line"])


@LINE.observe
def _(pixel_line, seed):
    return [list(pixel_line(a, b)) for a, b in line_cases(seed)]


@LINE.judge
def _(got, seed):
    cases = line_cases(seed)
    for (a, b), pair in zip(cases, expect_list("pixel_line", got, len(cases), "answers (one per pair of points)"),
                            strict=True):
        label = f"pixel_line({a}, {b})"
        pair = expect_list(label, pair, 2, "numbers (fixed, per_pixel)")
        fixed, per_pixel = (_number(f"{label}: {name}", v) for name, v in zip(("fixed", "per_pixel"), pair, strict=True))
        ref_fixed, ref_per_pixel = reference_line(a, b)
        if not math.isclose(per_pixel, ref_per_pixel, rel_tol=1e-9):
            per_batch = (b[2] - a[2]) / (b[1] ** 2 - a[1] ** 2) if a[1] != b[1] else None
            why = ("per input pixel of ONE image: a step of batch images of side x side holds batch x side^2 pixels"
                   if per_batch is not None and math.isclose(per_pixel, per_batch, rel_tol=1e-9) else
                   "the line's slope: what the peak grows by for each input pixel a step holds")
            raise CheckFailed(f"{label}: per_pixel = {per_pixel:,.4f} bytes, expected {ref_per_pixel:,.4f}: {why}")
        if not math.isclose(fixed, ref_fixed, rel_tol=1e-9, abs_tol=1.0):
            raise CheckFailed(f"{label}: fixed = {fixed:,.1f} bytes, expected {ref_fixed:,.1f}: what is left of a "
                              "peak once its pixels are paid for")


# -- largest_side(fixed, per_pixel, budget_gib, batch) ----------------------------------------------
SideCase = tuple[int, float, float, int]


def side_cases(seed: int) -> list[SideCase]:
    """(fixed, per_pixel, budget_gib, batch): drawn lines, each on a card of ``CARDS_GIB`` less a
    drawn 0.3-1.5 GiB (the context and slack of notebook 12's usable memory), for a drawn batch;
    the first on DenseNet-169's fixed bytes at seed 004's batch 8."""
    g = seeded(seed, int(EX.id), 1)
    lines = [(densenet169_fixed(), _uniform(g, 200.0, 4000.0, 3))] + [_line(g) for _ in range(4)]
    out = []
    for k, (fixed, per_pixel) in enumerate(lines):
        budget = round(CARDS_GIB[drawn_int(g, 0, len(CARDS_GIB))] - _uniform(g, 0.3, 1.5, 2), 2)
        if fixed >= budget * GIB:
            budget = round(CARDS_GIB[-1] - _uniform(g, 0.3, 1.5, 2), 2)
        out.append((fixed, per_pixel, budget, dn.SEED004_BATCH if k == 0 else BATCHES[drawn_int(g, 0, len(BATCHES))]))
    return out


def edge_cases(seed: int) -> list[SideCase]:
    """The edges: a step that fills the budget exactly (4 GiB fixed + batch 2 x 2^20 pixels x
    2,048 bytes = 8 GiB: powers of two, exact in floats), a fixed part larger than the budget, a
    budget that holds the fixed part but not one 32 x 32 image, then a drawn exact fit."""
    g = seeded(seed, int(EX.id), 2)
    cases: list[SideCase] = [(4 * GIB, 2048.0, 8.0, 2), (9 * GIB, 1000.0, 8.0, 1), (8 * GIB - 512, 300.0, 8.0, 1)]
    # drawn: fixed and per_pixel in whole bytes, batch x side^2 x per_pixel then a whole number of
    # KiB, so that the budget (the peak at that side, in GiB) is exact in floats
    batch, side, per_pixel = BATCHES[drawn_int(g, 0, len(BATCHES))], SIDE_STEP * drawn_int(g, 8, 65), drawn_int(g, 200, 4001)
    fixed = drawn_int(g, 100, 2048) * MIB
    cases.append((fixed, float(per_pixel), (fixed + batch * side * side * per_pixel) / GIB, batch))
    return cases


def _model(fixed: float, per_pixel: float) -> PixelModel:
    """Notebook 12's ``PixelModel`` of a given line (no gradient accumulation)."""
    return PixelModel(variant="the exercise's line", precision="", fixed=int(fixed), per_pixel=per_pixel,
                      all_gradients=0, gradient_at_peak=0, side=0, seconds=0.0, method="given")


@reference
def reference_side(fixed: int, per_pixel: float, budget_gib: float, batch: int) -> int:
    """``PixelModel.largest_side``: the largest multiple of 32 whose peak fits the budget, 0 if none."""
    return _model(fixed, per_pixel).largest_side(budget_gib * GIB, batch)


def _judge_sides(got: Any, cases: list[SideCase]) -> None:
    for (fixed, per_pixel, budget, batch), side in zip(
            cases, expect_list("largest_side", got, len(cases), "answers"), strict=True):
        label = f"largest_side({fixed:,}, {per_pixel}, {budget}, {batch})"
        expect_int(label, side)
        expected = reference_side(fixed, per_pixel, budget, batch)
        if side == expected:
            continue
        if side % SIDE_STEP:
            raise CheckFailed(f"{label} = {side:,} is not a multiple of {SIDE_STEP}: DenseNet halves the image "
                              "five times, so a side must divide by 2^5")
        if side < 0:
            raise CheckFailed(f"{label} = {side:,}: a side is never negative (0: not even a {SIDE_STEP} x "
                              f"{SIDE_STEP} image fits)")
        peak = _model(fixed, per_pixel).peak(batch, side)
        if peak > budget * GIB:
            raise CheckFailed(f"{label} = {side:,}: its step peaks at {peak / GIB:,.3f} GiB, over the budget of "
                              f"{budget} GiB (count the fixed part and every image of the batch)")
        raise CheckFailed(f"{label} = {side:,}, expected {expected:,}: a larger multiple of {SIDE_STEP} fits (the "
                          "budget is in GiB, 2^30 bytes; a step that fills it exactly fits)")


SIDE = EX.part("side", "largest_side: the largest side (a multiple of 32) a budget holds", 1, ["largest_side"])
EDGE = EX.part("edge", "largest_side: an exact fit, and budgets too small for any image", 1, ["largest_side"])


@SIDE.observe
def _(largest_side, seed):
    return [largest_side(*case) for case in side_cases(seed)]


@SIDE.judge
def _(got, seed):
    _judge_sides(got, side_cases(seed))


@EDGE.observe
def _(largest_side, seed):
    return [largest_side(*case) for case in edge_cases(seed)]


@EDGE.judge
def _(got, seed):
    _judge_sides(got, edge_cases(seed))


# -- per_gpu_bytes(fixed, per_pixel, batch, height, width, gpus) ---------------------------------------
SplitCase = tuple[int, float, int, int, int, int]
GPUS = (1, 2, 3, 4, 6, 8, 16)


def split_cases(seed: int, padded: bool) -> list[SplitCase]:
    """(fixed, per_pixel, batch, height, width, gpus). Not ``padded``: heights that ``gpus`` strips
    of whole multiples of 32 rows split as they are (first: notebook 12's 2048 x 2000 on 8 GPUs);
    ``padded``: heights that must be padded first (first: the X-rays' 2000 rows on 8 GPUs, then on
    one)."""
    g = seeded(seed, int(EX.id), 3 if padded else 4)
    fixed0, per_pixel0 = densenet169_fixed(), _uniform(g, 200.0, 4000.0, 3)
    if padded:
        out = [(fixed0, per_pixel0, 1, FULL_SIDE, FULL_SIDE, 8), (fixed0, per_pixel0, 1, FULL_SIDE, FULL_SIDE, 1)]
    else:
        step = SIDE_STEP * 8  # the inputs are made without aligned_height (refused in the sandbox)
        out = [(fixed0, per_pixel0, dn.SEED004_BATCH, -(-FULL_SIDE // step) * step, FULL_SIDE, 8)]
    while len(out) < 5:
        fixed, per_pixel = _line(g)
        gpus, batch, width = GPUS[drawn_int(g, 0, len(GPUS))], BATCHES[drawn_int(g, 0, len(BATCHES))], drawn_int(g, 256, 4097)
        step = SIDE_STEP * gpus
        height = drawn_int(g, 256, 4097) if padded else step * drawn_int(g, max(1, 256 // step), 4096 // step + 1)
        if (height % step != 0) == padded:
            out.append((fixed, per_pixel, batch, height, width, gpus))
    return out


@reference
def reference_per_gpu(fixed: int, per_pixel: float, batch: int, height: int, width: int, gpus: int) -> float:
    """``PixelModel.per_gpu`` of the image padded by ``densenet_spatial.aligned_height``."""
    return _model(fixed, per_pixel).per_gpu(batch, aligned_height(height, gpus), width, gpus)


def _judge_split(got: Any, cases: list[SplitCase]) -> None:
    for (fixed, per_pixel, batch, height, width, gpus), value in zip(
            cases, expect_list("per_gpu_bytes", got, len(cases), "answers"), strict=True):
        label = f"per_gpu_bytes({fixed:,}, {per_pixel}, {batch}, {height}, {width}, {gpus})"
        value = _number(label, value)
        expected = reference_per_gpu(fixed, per_pixel, batch, height, width, gpus)
        if math.isclose(value, expected, rel_tol=1e-9):
            continue
        divided = (fixed + batch * aligned_height(height, gpus) * width * per_pixel) / gpus
        if gpus > 1 and math.isclose(value, divided, rel_tol=1e-9):
            raise CheckFailed(f"{label} = {value:,.0f} bytes: every GPU holds the whole model, its gradients and "
                              "Adam's state; only what grows with the pixels divides")
        raise CheckFailed(f"{label} = {value:,.0f} bytes, expected {expected:,.0f}: the fixed part on every GPU, "
                          f"plus its strip's pixels -- and a strip is a whole multiple of {SIDE_STEP} rows (pad the "
                          "image's height)")


SPLIT = EX.part("split", "per_gpu_bytes: only what grows with the pixels divides", 1, ["per_gpu_bytes"])
PAD = EX.part("pad", "per_gpu_bytes: strips of whole multiples of 32 rows (the image padded)", 1,
              ["per_gpu_bytes"])


@SPLIT.observe
def _(per_gpu_bytes, seed):
    return [per_gpu_bytes(*case) for case in split_cases(seed, padded=False)]


@SPLIT.judge
def _(got, seed):
    _judge_split(got, split_cases(seed, padded=False))


@PAD.observe
def _(per_gpu_bytes, seed):
    return [per_gpu_bytes(*case) for case in split_cases(seed, padded=True)]


@PAD.judge
def _(got, seed):
    _judge_split(got, split_cases(seed, padded=True))


def check_pixel_line(pixel_line, verbose: bool = True):
    """Instant feedback on your ``pixel_line(point_a, point_b)``."""
    return EX.run(["line"], {"pixel_line": pixel_line}, verbose=verbose)


def check_largest_side(largest_side, verbose: bool = True):
    """Instant feedback on your ``largest_side(fixed, per_pixel, budget_gib, batch)``."""
    return EX.run(["side", "edge"], {"largest_side": largest_side}, verbose=verbose)


def check_per_gpu_bytes(per_gpu_bytes, verbose: bool = True):
    """Instant feedback on your ``per_gpu_bytes(fixed, per_pixel, batch, height, width, gpus)``."""
    return EX.run(["split", "pad"], {"per_gpu_bytes": per_gpu_bytes}, verbose=verbose)
