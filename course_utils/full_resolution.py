"""Seed 004 at the X-rays' own resolution: what training DenseNet-169 on 2000 x 2000 takes.

Seed 004 downsampled its 2000 x 2000 X-rays to 512 x 512 only because batch 8 ran out of memory,
and asked for "approaches to avoid downsampling". This module answers with the course's
predictor (``predict_step``: fake tensors, Adam's steady state, CUDA's rules), one stated model
and a count by hand (notebook 12).

**The pixel model.** In a fully convolutional trunk every activation has a fixed number of
channels per pixel of the input, so the bytes that grow with the image grow with
``batch x height x width``; parameters, gradients, Adam's state and buffers do not::

    peak(batch, side) = fixed + batch x side^2 x per_pixel

One prediction per technique (batch 1, 2000 x 2000) gives ``fixed`` (parameters + buffers +
the gradients alive at the peak + Adam's two moments) and ``per_pixel`` (everything else:
activations, temporaries, the input). The model is checked, not assumed: ``line_check`` compares
the lines drawn at (1, 2000 x 2000) with direct predictions at (8, 512 x 512), so the line is
checked for images of ``CHECKED_SIDES`` = 512 to 2000 pixels a side; a side outside that range is
the line's extrapolation, and ``sides_table(marked=True)`` says so. Past ``largest_int32_side``
the stem's output has more than 2^31 - 1 elements and needs 64-bit indexing in CUDA kernels,
which the predictor does not model. Largest sides are multiples of 32 (DenseNet halves the image
five times; the pooling layers round odd sizes down).

**The hand count** (``hand_count``): what is alive at the predicted peak, per input pixel, counted
from DenseNet-169's configuration -- the channels each layer keeps at each resolution, times the
pixel ratio of that resolution -- for each technique; it agrees with each prediction's slope
within ``HAND_COUNT_TOLERANCE``.

**The predictions** run without the optimizer's step (``optimizer=None``) and add Adam's two
moments as resident state (``budget.steady_state``): the peak of a step at this size is in
backward (checked), where Adam contributes only its state. That skips Adam's priming step and
its update, a fifth of each prediction's CPU time; the per-pixel part is the same to the byte,
and ``fixed`` leaves out Adam's step counters (one 0-dim tensor per parameter, which foreach Adam
keeps on the CPU on a CUDA machine). The eight predictions are also kept for a test session
(``session_cache``).

**Gradient accumulation** (batch 1, ``k`` backward passes, one optimizer step): the gradients are
summed into from the second micro-batch on, so *all* of them stay alive through every forward and
backward: ``fixed`` holds the whole gradient instead of the part alive at the plain step's peak.

**The card** is ``budget.usable_bytes`` (``budget.Overheads``): the card less the CUDA
context, divided by 1 + the slack for workspaces and the allocator -- the same stated assumptions
(or GPU-measured figures) as every other budget of the course.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from . import densenet as dn
from . import session_cache
from .budget import fixed_bytes, steady_state, usable_bytes
from .checks import NetworkError, guard
from .memory import predict_step

#: the X-rays' own size (seed 004: "downsampling image to 512 x 512" from about 2000 x 2000)
FULL_SIDE = 2000
#: the card sizes the answer is given for (GiB)
CARDS_GIB = (8, 16, 24, 40, 80)
#: DenseNet halves the image 5 times: sides are searched in multiples of 32
SIDE_STEP = 32
#: the techniques, as ``densenet169`` switches
VARIANTS = {
    "naive": {},
    "memory-efficient": {"memory_efficient": True},
    "checkpoint per block": {"checkpoint_blocks": True},
    "memory-efficient + per block": {"memory_efficient": True, "checkpoint_blocks": True},
}
#: the precisions: fp32, and CUDA autocast to fp16 (bf16 stores the same bytes)
PRECISIONS = {"fp32": None, "autocast fp16": torch.float16}
#: the image sides between which ``line_check`` compares the lines with direct predictions:
#: seed 004's 512 x 512 at batch 8 (notebook 12, section 1) and the X-rays' 2000 x 2000 at batch 1
CHECKED_SIDES = (dn.SEED004_IMAGE[0], FULL_SIDE)
#: the largest element count a 32-bit signed index reaches; a larger tensor needs 64-bit indexing
INT32_MAX = 2**31 - 1
#: what ``PixelModel.largest_side`` answers within: budgets up to 2^50 bytes (1 PiB, past any card),
#: lines whose 32 x 32 image costs at least a byte -- there a float counts every step of
#: ``SIDE_STEP`` (a larger budget or a thinner line: rounding hides the steps, the search cannot end)
MAX_BUDGET_BYTES, MIN_PER_PIXEL = 2**50, 1 / SIDE_STEP**2


def _whole(where: str, low: int = 0, **values: object) -> None:
    """Each of ``values`` a whole number >= ``low`` (``PixelModel``'s methods are not guarded)."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
            raise NetworkError(f"{where}: {name}={v!r} is not a whole number >= {low}.",
                               f"pass {name} as a whole number >= {low}.")


@dataclass(frozen=True)
class PixelModel:
    """Predicted steady-state peak of seed 004's step as ``fixed + batch x side^2 x per_pixel``
    (module docstring), from one prediction at ``(1, 1, side, side)``."""

    variant: str
    precision: str
    fixed: int  # parameters + buffers + gradients alive at the peak + Adam's state
    per_pixel: float  # bytes per input pixel of one image: activations, temporaries, the input
    all_gradients: int  # the whole gradient (what accumulation keeps alive)
    gradient_at_peak: int
    side: int
    seconds: float  # CPU time the prediction took
    method: str
    peak_location: tuple[str, ...] = ()  # (module, phase) of the predicted peak

    @property
    def label(self) -> str:
        return f"{self.variant}, {self.precision}"

    def peak(self, batch: int, side: int, accumulate: bool = False) -> float:
        """Predicted peak of a step of ``batch`` images of ``side`` x ``side``; with
        ``accumulate``, of each micro-batch of a gradient-accumulation loop."""
        _whole("PixelModel.peak", batch=batch, side=side)
        fixed = self.fixed + (self.all_gradients - self.gradient_at_peak if accumulate else 0)
        return fixed + batch * side * side * self.per_pixel

    def per_gpu(self, batch: int, height: int, width: int, world: int) -> float:
        """Predicted peak per GPU when each of ``world`` GPUs holds a strip of ``height / world``
        rows of every image (``densenet_spatial``): the per-pixel part divides, parameters,
        gradients and Adam's state are replicated. The halo rows each layer receives are not
        counted (checked against a direct prediction of a strip in notebook 12)."""
        _whole("PixelModel.per_gpu", batch=batch, height=height, width=width)
        _whole("PixelModel.per_gpu", 1, world=world)
        return self.fixed + batch * height * width / world * self.per_pixel

    def largest_side(self, budget_bytes: float, batch: int = dn.SEED004_BATCH,
                     accumulate: bool = False) -> int:
        """The largest side (a multiple of ``SIDE_STEP``) whose predicted peak fits
        ``budget_bytes``; 0 if not even 32 x 32 does."""
        _whole("PixelModel.largest_side", 1, batch=batch)
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, numbers.Real) or \
                not 0 <= budget_bytes <= MAX_BUDGET_BYTES:
            raise NetworkError(f"PixelModel.largest_side: budget_bytes={budget_bytes!r} is not a number of bytes "
                               "from 0 to 2**50 (1 PiB, past any card).",
                               "pass the bytes a card holds, e.g. budget.usable_bytes(16).")
        if not self.per_pixel >= MIN_PER_PIXEL:
            raise NetworkError(f"PixelModel.largest_side: per_pixel={self.per_pixel!r}: a peak that (almost) does not "
                               "grow with the image has no largest side.",
                               "build the line from a prediction (from_prediction, pixel_model): per_pixel is "
                               "the bytes of one input pixel, hundreds for DenseNet-169.")
        free = budget_bytes - self.peak(batch, 0, accumulate)
        if free <= 0:
            return 0
        side = int((free / (batch * self.per_pixel)) ** 0.5) // SIDE_STEP * SIDE_STEP
        # the square root is rounded either way: step to the boundary from whichever side it lands
        while side and self.peak(batch, side, accumulate) > budget_bytes:
            side -= SIDE_STEP
        while self.peak(batch, side + SIDE_STEP, accumulate) <= budget_bytes:
            side += SIDE_STEP
        return side


def with_group_norm(net: nn.Module, channels_per_group: int = 4) -> nn.Module:
    """``net`` with every ``BatchNorm2d`` replaced by a ``GroupNorm`` of ``channels_per_group``
    channels a group (in the BatchNorm's dtype): a normalisation of one image, which gradient
    accumulation leaves exact (notebook 12, section 4). Returns ``net``."""
    odd = sorted({m.num_features for m in net.modules()
                  if isinstance(m, nn.BatchNorm2d) and m.num_features % channels_per_group})
    if odd:
        raise NetworkError(f"with_group_norm: channels_per_group={channels_per_group} does not divide the "
                           f"channels of every BatchNorm ({odd[:5]}).",
                           "a common divisor of the net's widths (4 for DenseNet-169 and tiny_densenet).")
    for parent in list(net.modules()):
        for key, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                setattr(parent, key, nn.GroupNorm(child.num_features // channels_per_group, child.num_features,
                                                  device=child.weight.device, dtype=child.weight.dtype))
    return net


#: the normalisations a pixel model can be predicted with: seed 004's BatchNorm, or GroupNorm
NORMS = ("batch", "group")


def _check_names(**named: tuple[object, object]) -> None:
    """Each ``name=(value, choices)``: the value one of the choices (a dict's keys)."""
    for name, (value, choices) in named.items():
        if not isinstance(value, str) or value not in choices:
            raise NetworkError(f"unknown {name} {value!r}.", f"choose one of {list(choices)}.")


def _step(variant: str, precision: str, batch: int, side: int, optimizer: str | None = "adam",
          norm: str = "batch"):
    _check_names(variant=(variant, VARIANTS), precision=(precision, PRECISIONS), norm=(norm, NORMS))
    kw = VARIANTS[variant]

    def build():
        net = dn.densenet169(**kw)
        return with_group_norm(net) if norm == "group" else net

    return predict_step(build, **dn.seed004_step_args(batch, (side, side)),
                        autocast_dtype=PRECISIONS[precision], module_peaks=False, optimizer=optimizer)


def from_prediction(prediction, batch: int, side: int, variant: str = "", precision: str = "",
                    seconds: float = 0.0) -> PixelModel:
    """``PixelModel`` from any ``predict_step`` result of seed 004's step at ``(batch, 1, side,
    side)`` (e.g. section 1's 512 x 512, batch 8). A prediction without the optimizer's step
    gets Adam's two moments added (``budget.steady_state``)."""
    _whole("from_prediction", SIDE_STEP, side=side)
    b = steady_state(prediction.breakdown)
    fixed = fixed_bytes(b)
    location = tuple(prediction.log.peak_location) if prediction.log is not None else ()
    return PixelModel(variant=variant, precision=precision, fixed=fixed,
                      per_pixel=(b["Total"] - fixed) / (batch * side * side),
                      all_gradients=b["Parameter"], gradient_at_peak=b["Gradient"], side=side,
                      seconds=seconds, method=prediction.method, peak_location=location)


@lru_cache(maxsize=None)
def pixel_model(variant: str, precision: str = "fp32", side: int = FULL_SIDE, norm: str = "batch") -> PixelModel:
    """``PixelModel`` from one prediction of ``variant`` in ``precision`` at batch 1,
    ``side`` x ``side`` (cached, and shared by a test session's processes: each takes seconds of
    fake-tensor dispatch). Predicted without the optimizer's step, Adam's two moments added as
    resident state (module docstring); refused if the peak is not in backward, where that holds.
    ``norm="group"``: every BatchNorm replaced by GroupNorm (``with_group_norm``); the model's
    ``variant`` then ends in " + GroupNorm". Under CUDA autocast ``group_norm`` runs in fp32
    (autocast's fp32 list, ``amp_rules``): its input is cast up and kept in fp32."""
    # lru_cache hides the function from guard: its arguments are checked here
    _check_names(variant=(variant, VARIANTS), precision=(precision, PRECISIONS), norm=(norm, NORMS))
    _whole("pixel_model", SIDE_STEP, side=side)
    return _pixel_model(variant, precision, int(side), norm)


@session_cache.shared("full_resolution.pixel_model")
def _pixel_model(variant: str, precision: str, side: int, norm: str = "batch") -> PixelModel:
    t0 = time.process_time()
    p = _step(variant, precision, 1, side, optimizer=None, norm=norm)
    label = variant + (" + GroupNorm" if norm == "group" else "")
    model = from_prediction(p, 1, side, label, precision, time.process_time() - t0)
    if model.peak_location[-1:] != ("backward",):
        raise RuntimeError(f"{model.label} at {side} x {side}: the predicted peak is in "
                           f"{model.peak_location}, not in backward; Adam's step may set it there: "
                           "predict it with the optimizer (_step(..., optimizer='adam'))")
    return model


def pixel_models(variants: Sequence[str] = tuple(VARIANTS),
                 precisions: Sequence[str] = tuple(PRECISIONS),
                 progress: bool = False) -> dict[str, PixelModel]:
    """One ``PixelModel`` per (variant, precision), keyed by its label; ``progress=True`` shows a
    tqdm bar (each prediction costs seconds of CPU)."""
    from tqdm.auto import tqdm

    pairs = [(v, p) for v in variants for p in precisions]
    out = {}
    for v, p in tqdm(pairs, desc="predictions", unit="step", disable=not progress):
        m = pixel_model(v, p)
        out[m.label] = m
    return out


def peaks_table(models: dict[str, PixelModel], batches: Sequence[int] = (1, dn.SEED004_BATCH),
                side: int = FULL_SIDE):
    """Predicted steady-state peak (GiB) at ``side`` x ``side`` per technique (rows) and batch,
    and with batch-1 gradient accumulation."""
    import pandas as pd

    rows = {}
    for label, m in models.items():
        row = {f"batch {b} GiB": round(m.peak(b, side) / 2**30, 2) for b in batches}
        row["batch 1 + accumulation GiB"] = round(m.peak(1, side, accumulate=True) / 2**30, 2)
        rows[label] = row
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(f"{side} x {side} (predicted)")


def line_check(models: dict[str, PixelModel], direct: dict[str, tuple[object, int, int]]):
    """Each line of ``models`` against a direct prediction of the same technique at another
    batch and side: ``direct[label] = (prediction, batch, side)`` (a ``predict_step`` result, or
    anything with a steady-state ``breakdown``). Returns a DataFrame (technique, both peaks in
    MiB, the line's error in %); ``attrs["checked sides"]`` is the range of image sides the
    comparison spans (the lines' own and the direct predictions'), what ``CHECKED_SIDES`` states."""
    import pandas as pd

    rows, sides = [], set()
    for label, (prediction, batch, side) in direct.items():
        m = models[label]
        exact = steady_state(prediction.breakdown)["Total"]
        line = m.peak(batch, side)
        sides |= {side, m.side}
        rows.append({"technique": label, "direct MiB": round(exact / 2**20),
                     "from the line MiB": round(line / 2**20), "error %": round(100 * (line / exact - 1), 2)})
    table = pd.DataFrame(rows).set_index("technique")
    table.attrs["checked sides"] = (min(sides), max(sides)) if sides else ()
    return table


def smallest_card(peak_bytes: float, cards: Sequence[float] = CARDS_GIB) -> float | None:
    """The smallest of ``cards`` (GiB) that holds a predicted peak of ``peak_bytes``
    (``budget.usable_bytes``: ``budget.Overheads``), or None if none does."""
    budgets = _card_budgets(cards, "smallest_card")
    return next((c for c in cards if peak_bytes <= budgets[c]), None)


def _card_budgets(cards: Sequence[float], where: str) -> dict[float, int]:
    """{card: ``budget.usable_bytes(card)``} for every card in GiB (0 for one that does not even
    hold the CUDA context: it holds no step)."""
    for c in cards:
        if not (isinstance(c, numbers.Real) and not isinstance(c, bool) and 1 / 1024 <= c < math.inf):
            raise NetworkError(f"{where}: a card of {c!r} GiB.", "give each card's memory in GiB, e.g. (8, 16, 24).")
    return {c: usable_bytes(c) for c in cards}


# --------------------------------------------------------------------------------------------
# Where the line holds: the checked sides, and 32-bit indexing
# --------------------------------------------------------------------------------------------
def stage_sides(side: int, cfg: dict = dn.DENSENET169) -> dict[str, int]:
    """The side of every resolution of a ``DenseNet`` for an input of ``side`` x ``side``: the
    stem's 7 x 7 convolution (stride 2, padding 3), its 3 x 3 max-pool (stride 2, padding 1) --
    dense block 1 -- and each transition's 2 x 2 average pool, which rounds an odd side down
    (2000: 1000, 500, 250, 125, 62)."""
    conv = (side + 2 * 3 - 7) // 2 + 1
    h = (conv + 2 * 1 - 3) // 2 + 1
    out = {"input": side, "stem": conv, "block 1": h}
    for i in range(2, len(cfg["block_config"]) + 1):
        h //= 2
        out[f"block {i}"] = h
    return out


def stem_output_elements(side: int, batch: int = 1, cfg: dict = dn.DENSENET169) -> int:
    """Elements of the stem convolution's output, ``batch x 64 x (side / 2)^2``: with the output
    of dense block 1 (4 x the channels at a quarter of the pixels, as many elements) the largest
    tensor of the step."""
    return batch * cfg["num_init_features"] * stage_sides(side, cfg)["stem"] ** 2


def largest_int32_side(batch: int = 1, step: int = SIDE_STEP) -> int:
    """The largest side, a multiple of ``step``, whose stem output has at most ``INT32_MAX``
    elements: past it a CUDA kernel needs 64-bit indexing (some split the tensor, some fall back,
    some refuse), which the predictor does not model."""
    _whole("largest_int32_side", 1, step=step)
    side = int((INT32_MAX / batch / dn.DENSENET169["num_init_features"]) ** 0.5) * 2 // step * step + step
    while stem_output_elements(side, batch) > INT32_MAX:
        side -= step
    return side


#: the marks ``sides_table(marked=True)`` puts beside a side
MARK_UNCHECKED, MARK_INT64 = "*", "**"


def side_mark(side: int, batch: int) -> str:
    """"" inside ``CHECKED_SIDES``; ``MARK_UNCHECKED`` outside them (the line's extrapolation);
    ``MARK_INT64`` past ``largest_int32_side(batch)`` as well."""
    return _side_mark(side, batch)


def _side_mark(side: int, batch: int) -> str:
    """``side_mark``, and "" for a side of 0 (a table's "nothing fits")."""
    if side == 0 or CHECKED_SIDES[0] <= side <= CHECKED_SIDES[1]:
        return ""
    return MARK_INT64 if side > largest_int32_side(batch) else MARK_UNCHECKED


def marks_legend(batch: int) -> str:
    """What the marks of a ``sides_table(marked=True)`` at ``batch`` mean, with their numbers."""
    lo, hi = CHECKED_SIDES
    return (f"{MARK_UNCHECKED} outside {lo} to {hi}, where the line was checked: the line's extrapolation; "
            f"{MARK_INT64} also past {largest_int32_side(batch):,}, where the stem's output at batch {batch} "
            f"has more than 2^31 - 1 elements (64-bit indexing in CUDA kernels, not modelled)")


def mark_sides(table, batch: int):
    """``table`` of sides (``sides_table``'s) as text, each side with its ``side_mark`` at ``batch``."""
    return table.apply(lambda col: [f"{s:,}{_side_mark(s, batch)}" for s in col])


def sides_table(models: dict[str, PixelModel], cards: Sequence[float] = CARDS_GIB,
                batch: int = dn.SEED004_BATCH, accumulate: bool = False, marked: bool = False):
    """The largest trainable side per technique (rows) and card (columns): ``batch`` images per
    step, or with ``accumulate`` one image per micro-batch (any effective batch). A card holds
    ``budget.usable_bytes`` of predicted peak (``budget.Overheads``). ``marked``: each side as
    text with its ``side_mark`` (legend: ``marks_legend``)."""
    import pandas as pd

    step_batch = 1 if accumulate else batch
    budgets = _card_budgets(cards, "sides_table")
    table = pd.DataFrame({f"{c} GB": [m.largest_side(budgets[c], step_batch, accumulate)
                                      for m in models.values()] for c in cards},
                         index=list(models))
    return mark_sides(table, step_batch) if marked else table


def extrapolation_report(models: dict[str, PixelModel], cards: Sequence[float] = CARDS_GIB) -> dict:
    """Notebook 12's sides per card with their limits: ``sides8`` / ``sides1`` (``sides_table`` at
    batch 8, and batch 1 with accumulation), ``marked8`` / ``marked1`` (the same, marked, with a
    named axis), ``int32`` (``largest_int32_side`` at batch 8 and 1), ``extrapolated`` (the share
    of each table's sides outside ``CHECKED_SIDES``), ``far`` (the largest batch-1 side, its
    technique and the change of the hand count per pixel there against ``FULL_SIDE``, %) and
    ``lines`` (the three lines a notebook prints: the 32-bit sides, the shares, the far count)."""
    lo, hi = CHECKED_SIDES
    sides8, sides1 = sides_table(models, cards), sides_table(models, cards, accumulate=True)
    int32 = (largest_int32_side(dn.SEED004_BATCH), largest_int32_side(1))
    out8, out1 = (float(((t < lo) | (t > hi)).to_numpy().mean()) for t in (sides8, sides1))
    far_side = int(sides1.to_numpy().max())
    far_label = sides1.stack().idxmax()[0]
    m = models[far_label]
    far, here = (hand_count(m.variant, m.precision, s)["B per pixel"].sum() for s in (far_side, FULL_SIDE))
    change = 100 * (far / here - 1)
    lines = [f"stem output at most 2^31 - 1 = {INT32_MAX:,} elements: sides up to {int32[0]:,} at batch "
             f"{dn.SEED004_BATCH}, {int32[1]:,} at batch 1 [computed]",
             f"outside {lo}-{hi} (extrapolated): {100 * out8:.0f} % of the batch-{dn.SEED004_BATCH} sides, "
             f"{100 * out1:.0f} % of the batch-1 sides",
             f"{far_label}: the hand count per pixel at {far_side:,}² is {change:+.2f} % of that at "
             f"{FULL_SIDE}² (the pools' rounding) [counted]"]
    return {"sides8": sides8, "sides1": sides1,
            "marked8": mark_sides(sides8, dn.SEED004_BATCH).rename_axis(
                f"largest side, batch {dn.SEED004_BATCH} (predicted)"),
            "marked1": mark_sides(sides1, 1).rename_axis("largest side, batch 1 + accumulation (predicted)"),
            "int32": int32, "extrapolated": (out8, out1),
            "far": {"technique": far_label, "side": far_side, "change %": change}, "lines": lines}


def plot_sides(models: dict[str, PixelModel], cards: Sequence[float] = CARDS_GIB, axes=None):
    """Resolution against card size: the largest side that trains at batch 8 (left) and at
    batch 1 with gradient accumulation (right), one line per technique; the checked sides shaded,
    the X-rays' 2000, the seed's 512 and the 64-bit-indexing side marked."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (title, acc) in zip(axes, ((f"batch {dn.SEED004_BATCH}", False),
                                       ("batch 1 + gradient accumulation", True)), strict=True):
        sides = sides_table(models, cards, accumulate=acc)
        for label, m in models.items():
            ax.plot(cards, list(sides.loc[label]), marker="o", ls="-" if m.precision == "fp32" else "--",
                    label=label)
        ax.axhspan(*CHECKED_SIDES, color="C2", alpha=0.12, lw=0)
        int64 = largest_int32_side(1 if acc else dn.SEED004_BATCH)
        for y, txt, style in ((CHECKED_SIDES[1], f"checked {CHECKED_SIDES[0]}-{CHECKED_SIDES[1]} (shaded)", ":"),
                              (int64, f"stem output > 2^31 - 1 elements past side {int64:,}", "-.")):
            ax.axhline(y, color="grey", lw=0.8, ls=style)
            ax.annotate(txt, (cards[0], y), textcoords="offset points", xytext=(2, 3), fontsize=8)
        ax.set(xscale="log", xlabel="card memory (GB)", title=f"DenseNet-169, {title} (predicted)")
        ax.minorticks_off()
        ax.set_xticks(list(cards), [str(c) for c in cards])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("largest image side that trains (pixels)")
    axes[0].legend(fontsize=7, loc="upper left")  # the batch-8 panel's upper half is empty
    return axes


# --------------------------------------------------------------------------------------------
# The hand count: what is alive at the predicted peak, per input pixel
# --------------------------------------------------------------------------------------------
#: ``hand_count`` agrees with each prediction's per-pixel slope within this fraction of it. What
#: it leaves out does not grow with the image, but a line through one batch-1 prediction charges
#: it to the pixels: BatchNorm's saved per-channel statistics (two vectors per BatchNorm, in
#: 512-byte blocks) and the head's per-image tensors, at most 0.17 B per pixel at 2000 x 2000,
#: under 0.01 % of any slope there; the tolerance leaves twice that again
HAND_COUNT_TOLERANCE = 2e-4
KEPT, AT_PEAK = "kept after forward", "at the peak"


def _blocks(cfg: dict) -> list[dict]:
    g, out, c = cfg["growth_rate"], [], cfg["num_init_features"]
    for i, n in enumerate(cfg["block_config"]):
        c_out = c + g * n
        out.append({"name": f"block {i + 1}", "c_in": c, "n": n, "c_out": c_out,
                    "layers": [c + g * j for j in range(n)]})
        c = c_out // 2
    return out


def peak_module(variant: str, cfg: dict = dn.DENSENET169) -> str:
    """Where ``hand_count`` puts the peak (in backward), as a module name of ``DenseNet``: naive,
    the network's own tail (the final ReLU, before any module's backward); memory-efficient,
    the last dense layer's ReLU while its concatenation is rebuilt; checkpointed per block, the
    first transition's ReLU while the first block is rebuilt (the largest region recomputed)."""
    _check_names(variant=(variant, VARIANTS))
    if variant.endswith("per block"):
        return "stages.0.1.1"
    if variant.startswith("memory-efficient"):
        return f"stages.{len(cfg['block_config']) - 1}.0.layers.{cfg['block_config'][-1] - 1}.relu1"
    return "DenseNet"


def _block_rows(add, when: str, blk: dict, memory_efficient: bool, g: int, b: int, with_input: bool) -> None:
    name = blk["name"]
    if memory_efficient:
        if with_input:
            add(when, f"{name}: its input, kept by its layers' checkpoints", blk["c_in"], name)
        add(when, f"{name}: each layer's new maps but the last, kept by the later layers' checkpoints",
            g * (blk["n"] - 1), name)
    else:
        add(when, f"{name}: each layer's concatenation and its BN -> ReLU output", 2 * sum(blk["layers"]), name)
    add(when, f"{name}: each layer's bottleneck output and its BN -> ReLU output ({b} channels each)",
        2 * b * blk["n"], name)


def _kept_rows(add, variant: str, cfg: dict) -> None:
    """What autograd keeps when the forward returns (``hand_count``'s first part)."""
    me, per_block = variant.startswith("memory-efficient"), variant.endswith("per block")
    g, b, n0 = cfg["growth_rate"], cfg["growth_rate"] * cfg["bn_size"], cfg["num_init_features"]
    blocks = _blocks(cfg)
    add(KEPT, "stem: the convolution's output, kept by BatchNorm", n0, "stem")
    add(KEPT, "stem: BatchNorm -> ReLU output (in place), kept by the max-pool", n0, "stem")
    add(KEPT, "stem: the max-pool's indices (int64)", n0, "block 1", 8)
    for i, blk in enumerate(blocks):
        if per_block:
            add(KEPT, f"{blk['name']}: its input, kept by the block's checkpoint", blk["c_in"], blk["name"])
            continue
        _block_rows(add, KEPT, blk, me, g, b, with_input=True)
        if i < len(blocks) - 1:
            add(KEPT, f"transition {i + 1}: the block's output, its BN -> ReLU output, the convolution's "
                "output (kept by the average pool)", 2 * blk["c_out"] + blk["c_out"] // 2, blk["name"])
    add(KEPT, "final BatchNorm: its input and its ReLU output", 2 * blocks[-1]["c_out"], blocks[-1]["name"])


def _peak_rows(add, variant: str, cfg: dict) -> None:
    """What backward has added and freed at ``peak_module(variant)`` (``hand_count``'s second part)."""
    me, per_block = variant.startswith("memory-efficient"), variant.endswith("per block")
    g, b = cfg["growth_rate"], cfg["growth_rate"] * cfg["bn_size"]
    blocks = _blocks(cfg)
    first, last = blocks[0], blocks[-1]
    if not per_block and not me:
        add(AT_PEAK, "the final ReLU's backward: the gradients of its output and its input", 2 * last["c_out"], last["name"])
        return
    add(AT_PEAK, "freed: the final BatchNorm's two maps (its backward has run)", -2 * last["c_out"], last["name"])
    if not per_block:
        c_in = last["layers"][-1]
        add(AT_PEAK, "freed: the last layer's bottleneck maps (their backward has run)", -2 * b, last["name"])
        add(AT_PEAK, "rebuilt: the last layer's concatenation and its BN -> ReLU output", 2 * c_in, last["name"])
        add(AT_PEAK, "gradients: of those two, and of the block's output", 2 * c_in + last["c_out"], last["name"])
        return
    for blk in blocks[1:]:
        add(AT_PEAK, f"freed: the input of {blk['name']} (its backward has run)", -blk["c_in"], blk["name"])
    _block_rows(lambda _w, what, ch, at, e=None: add(AT_PEAK, "rebuilt: " + what, ch, at, e),
                AT_PEAK, first, me, g, b, with_input=False)
    add(AT_PEAK, "rebuilt: transition 1's input and its BN -> ReLU output", 2 * first["c_out"], first["name"])
    add(AT_PEAK, "transition 1's ReLU backward: the gradients of its output and its input", 2 * first["c_out"], first["name"])


def _blocks512(n: int) -> int:
    return -(-n // 512) * 512  # the caching allocator's blocks


def weight_copy_bytes(variant: str, cfg: dict = dn.DENSENET169) -> int:
    """Under autocast, the fp16 copies of the convolutions' weights alive at ``peak_module``:
    autocast casts each weight once per forward (and once per recomputation), and a convolution
    keeps its copy until its backward has run. Fixed bytes, but one batch-1 prediction charges
    them to the pixels. Naive: every convolution; memory-efficient: every 3 x 3 convolution but
    the last layer's, the transitions' and the stem's (the 1 x 1 convolutions run inside
    checkpoints); per block: the stem's and the first block's, rebuilt."""
    _check_names(variant=(variant, VARIANTS))
    me, per_block = variant.startswith("memory-efficient"), variant.endswith("per block")
    g, b = cfg["growth_rate"], cfg["growth_rate"] * cfg["bn_size"]
    blocks = _blocks(cfg)
    stem = _blocks512(cfg["num_init_features"] * 7 * 7 * 2)
    conv3 = _blocks512(b * g * 3 * 3 * 2)
    layers = (lambda blks: sum(_blocks512(c * b * 2) + conv3 for blk in blks for c in blk["layers"]))
    transitions = sum(_blocks512(blk["c_out"] * (blk["c_out"] // 2) * 2) for blk in blocks[:-1])
    if per_block:
        return stem + (conv3 * blocks[0]["n"] if me else layers(blocks[:1]))
    if me:
        return stem + conv3 * (sum(blk["n"] for blk in blocks) - 1) + transitions
    return stem + layers(blocks) + transitions


def hand_count(variant: str, precision: str = "fp32", side: int = FULL_SIDE, cfg: dict = dn.DENSENET169):
    """What is alive at the predicted peak of ``variant`` (``peak_module``), per input pixel of a
    ``side`` x ``side`` image, counted from the configuration: the channels each part keeps at
    each resolution (``stage_sides``), times that resolution's share of the input's pixels, times
    the bytes of an element (fp32: 4; autocast fp16: 2; the max-pool's indices: int64, 8). The
    input image stays fp32; under autocast the stem's convolution keeps an fp16 copy of it, and
    ``weight_copy_bytes`` are spread over the image. Per-channel vectors are left out
    (``HAND_COUNT_TOLERANCE``). Returns a DataFrame, one row per term: ``when`` (``KEPT`` or
    ``AT_PEAK``), ``what``, ``channels`` (negative: freed), ``at`` (resolution), ``bytes``
    (per element), ``B per pixel``; its sum is the count."""
    import pandas as pd

    _whole("hand_count", SIDE_STEP, side=side)
    if variant not in VARIANTS or precision not in PRECISIONS:
        raise NetworkError(f"hand_count({variant!r}, {precision!r}): unknown variant or precision.",
                           f"choose from {list(VARIANTS)} and {list(PRECISIONS)}.")
    element = 4 if PRECISIONS[precision] is None else torch.empty((), dtype=PRECISIONS[precision]).element_size()
    sides = stage_sides(side, cfg)
    rows = []

    def add(when: str, what: str, channels: int, at: str, size: int | None = None) -> None:
        size = element if size is None else size
        rows.append({"when": when, "what": what, "channels": channels, "at": f"{sides[at]} x {sides[at]}",
                     "bytes": size, "B per pixel": channels * size * sides[at] ** 2 / side ** 2})

    add(KEPT, "the input image (fp32, the batch; the stem's convolution reads it)", 1, "input", 4)
    if element != 4:
        add(KEPT, "its fp16 copy, kept by the stem's convolution", 1, "input")
    _kept_rows(add, variant, cfg)
    _peak_rows(add, variant, cfg)
    if element != 4:
        copies = weight_copy_bytes(variant, cfg)
        rows.append({"when": AT_PEAK, "what": f"fp16 copies of the weights ({copies / 2**20:.1f} MiB, fixed)",
                     "channels": 0, "at": "", "bytes": element, "B per pixel": copies / side ** 2})
    return pd.DataFrame(rows)


def hand_count_table(models: dict[str, PixelModel]):
    """Per technique: the hand count (``hand_count``, at each model's side) beside the predicted
    slope, in bytes per input pixel, with where the prediction puts the peak."""
    import pandas as pd

    rows = {}
    for label, m in models.items():
        count = hand_count(m.variant, m.precision, m.side)["B per pixel"].sum()
        rows[label] = {"hand count B/pixel": round(count, 1), "predicted slope B/pixel": round(m.per_pixel, 1),
                       "difference %": round(100 * (m.per_pixel / count - 1), 3),
                       "peak (predicted)": " ".join(m.peak_location)}
    return pd.DataFrame.from_dict(rows, orient="index")


# --------------------------------------------------------------------------------------------
# Batch 1 and BatchNorm
# --------------------------------------------------------------------------------------------
def _where(name: str) -> str:
    """``stages.2.0.layers.5.norm1`` -> "dense block 3"; ``stages.0.1.0`` -> "transition 1"."""
    parts = name.split(".")
    if parts[0] != "stages":
        return {"stem": "stem", "norm5": "final BatchNorm"}.get(parts[0], name)
    return f"{'dense block' if parts[2] == '0' else 'transition'} {int(parts[1]) + 1}"


def bn_values_per_channel(side: int = FULL_SIDE, batches: Sequence[int] = (1, dn.SEED004_BATCH)):
    """Per BatchNorm of DenseNet-169 at ``side`` x ``side``: where it is, its resolution, channels
    and the number of values each channel's statistics average over, per batch (read from a
    forward pass on ``meta`` tensors with forward hooks: shapes, no data)."""
    import pandas as pd

    _whole("bn_values_per_channel", SIDE_STEP, side=side)
    seen: list[tuple[str, tuple[int, ...]]] = []
    with torch.device("meta"), torch.no_grad():
        net = dn.densenet169()
        for name, m in net.named_modules():
            if isinstance(m, nn.BatchNorm2d):
                m.register_forward_hook(lambda mod, inp, out, name=name: seen.append((name, tuple(inp[0].shape))))  # noqa: ARG005 - forward hook
        net(torch.empty(1, 1, side, side))
    rows = []
    for name, shape in seen:
        rows.append({"BatchNorm": name, "where": _where(name), "resolution": f"{shape[2]} x {shape[3]}",
                     "channels": shape[1],
                     **{f"values per channel, batch {b}": b * shape[2] * shape[3] for b in batches}})
    return pd.DataFrame(rows)


def tiny_densenet(norm: str = "batch") -> dn.DenseNet:
    """A small DenseNet (growth 4, blocks 2-2-2-2) in float64 whose BatchNorms are kept
    (``"batch"``), frozen in eval mode (``"frozen"``: the running statistics, as when fine-tuning
    a pre-trained net) or replaced by GroupNorm with 4 channels per group (``"group"``)."""
    torch.manual_seed(0)
    net = dn.DenseNet(growth_rate=4, block_config=(2, 2, 2, 2), num_init_features=8, bn_size=2).double()
    if norm == "group":
        with_group_norm(net)
    elif norm == "frozen":
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
                # "pre-trained" statistics: not the defaults, so that freezing is seen to matter
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.9, 1.1)
    elif norm != "batch":
        raise NetworkError(f"norm must be 'batch', 'frozen' or 'group', got {norm!r}.",
                           "norm='batch', 'frozen' or 'group'.")
    return net


def _grads(net: nn.Module, x: torch.Tensor, y: torch.Tensor, micro: int) -> torch.Tensor:
    net.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro), y.chunk(micro), strict=True):
        (F.binary_cross_entropy_with_logits(net(xs), ys) / micro).backward()
    return torch.cat([p.grad.flatten() for p in net.parameters()])


def accumulation_error(norm: str = "batch", batch: int = dn.SEED004_BATCH, side: int = 64,
                       seed: int = 0) -> float:
    """Relative difference (L2) between the gradient of one step on ``batch`` images and the
    gradient accumulated over ``batch`` micro-batches of one image, for ``tiny_densenet(norm)``
    in float64 (so the difference is the normalisation's, not rounding). Each micro-batch is one
    image: with ``norm="batch"`` it must leave more than one pixel at the last block (BatchNorm in
    training needs two values per channel), ``side`` >= 61; else ``side`` >= 32."""
    low = next(s for s in range(SIDE_STEP, 4 * SIDE_STEP) if stage_sides(s)["block 4"] > 1) \
        if norm == "batch" else SIDE_STEP
    if side < low:
        raise NetworkError(f"accumulation_error: side={side} is too small for norm={norm!r} on one image "
                           "(DenseNet halves it five times; BatchNorm needs two values per channel).",
                           f"side >= {low}.")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 1, side, side, generator=g, dtype=torch.float64)
    y = (torch.rand(batch, dn.SEED004_CLASSES, generator=g) < 0.3).double()
    full = _grads(tiny_densenet(norm), x, y, 1)
    acc = _grads(tiny_densenet(norm), x, y, batch)
    return float((acc - full).norm() / full.norm())


def running_stat_weight(micro: int = dn.SEED004_BATCH, momentum: float = 0.1) -> dict[str, float]:
    """How far one optimizer step moves BatchNorm's running statistics: with one batch, by
    ``momentum`` toward its statistics; with ``micro`` accumulated micro-batches, by
    ``1 - (1 - momentum)^micro`` in all, most of it toward the last few single images."""
    if momentum > 1:
        raise NetworkError(f"running_stat_weight: momentum={momentum} moves the statistics past the batch's.",
                           "a momentum from 0 to 1 (BatchNorm's default: 0.1).")
    return {"one batch": momentum, f"{micro} micro-batches": 1 - (1 - momentum) ** micro,
            "last micro-batch alone": momentum}


guard(globals(), NetworkError, zero=("side",))
