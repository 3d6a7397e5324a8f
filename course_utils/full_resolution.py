"""Seed 004 at the X-rays' own resolution: what training DenseNet-169 on 2000 x 2000 takes.

Seed 004 downsampled its 2000 x 2000 X-rays to 512 x 512 only because batch 8 ran out of memory,
and asked for "approaches to avoid downsampling". This module answers with the course's
predictor (``predict_step``: fake tensors, Adam's steady state, CUDA's rules) and one stated
model.

**The pixel model.** In a fully convolutional trunk every activation has a fixed number of
channels per pixel of the input, so the bytes that grow with the image grow with
``batch x height x width``; parameters, gradients, Adam's state and buffers do not::

    peak(batch, side) = fixed + batch x side^2 x per_pixel

One prediction per technique (batch 1, 2000 x 2000) gives ``fixed`` (parameters + buffers +
the gradients alive at the peak + Adam's state) and ``per_pixel`` (everything else: activations,
temporaries, the input). The model is checked, not assumed: notebook 07 compares the lines
drawn at (1, 2000 x 2000) with its direct predictions at (8, 512 x 512) (the pooling layers
round odd sizes down, so sides that are not multiples of 32 differ by a fraction of a percent).
Largest sides are multiples of 32 (DenseNet halves the image five times).

**Gradient accumulation** (batch 1, ``k`` backward passes, one optimizer step): the gradients are
summed into from the second micro-batch on, so *all* of them stay alive through every forward and
backward: ``fixed`` holds the whole gradient instead of the part alive at the plain step's peak.

**The card** is ``budget.usable_bytes`` (``budget.Overheads``): the card less the CUDA
context, divided by 1 + the slack for workspaces and the allocator -- the same stated assumptions
(or GPU-measured figures) as every other budget of the course.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from . import densenet as dn
from .budget import fixed_bytes, steady_state, usable_bytes
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

    @property
    def label(self) -> str:
        return f"{self.variant}, {self.precision}"

    def peak(self, batch: int, side: int, accumulate: bool = False) -> float:
        """Predicted peak of a step of ``batch`` images of ``side`` x ``side``; with
        ``accumulate``, of each micro-batch of a gradient-accumulation loop."""
        fixed = self.fixed + (self.all_gradients - self.gradient_at_peak if accumulate else 0)
        return fixed + batch * side * side * self.per_pixel

    def per_gpu(self, batch: int, height: int, width: int, world: int) -> float:
        """Predicted peak per GPU when each of ``world`` GPUs holds a strip of ``height / world``
        rows of every image (``densenet_spatial``): the per-pixel part divides, parameters,
        gradients and Adam's state are replicated. The halo rows each layer receives are not
        counted (checked against a direct prediction of a strip in notebook 07)."""
        return self.fixed + batch * height * width / world * self.per_pixel

    def largest_side(self, budget_bytes: float, batch: int = dn.SEED004_BATCH,
                     accumulate: bool = False) -> int:
        """The largest side (a multiple of ``SIDE_STEP``) whose predicted peak fits
        ``budget_bytes``; 0 if not even 32 x 32 does."""
        free = budget_bytes - self.peak(batch, 0, accumulate)
        if free <= 0:
            return 0
        side = int((free / (batch * self.per_pixel)) ** 0.5) // SIDE_STEP * SIDE_STEP
        while side and self.peak(batch, side, accumulate) > budget_bytes:  # float rounding
            side -= SIDE_STEP
        return side


def _step(variant: str, precision: str, batch: int, side: int):
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: choose one of {list(VARIANTS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: choose one of {list(PRECISIONS)}")
    kw = VARIANTS[variant]
    return predict_step(lambda: dn.densenet169(**kw), **dn.seed004_step_args(batch, (side, side)),
                        autocast_dtype=PRECISIONS[precision], module_peaks=False)


def from_prediction(prediction, batch: int, side: int, variant: str = "", precision: str = "",
                    seconds: float = 0.0) -> PixelModel:
    """``PixelModel`` from any ``predict_step`` result of seed 004's step at ``(batch, 1, side,
    side)`` (e.g. section 1's 512 x 512, batch 8)."""
    b = steady_state(prediction.breakdown)
    fixed = fixed_bytes(b)
    return PixelModel(variant=variant, precision=precision, fixed=fixed,
                      per_pixel=(b["Total"] - fixed) / (batch * side * side),
                      all_gradients=b["Parameter"], gradient_at_peak=b["Gradient"], side=side,
                      seconds=seconds, method=prediction.method)


@lru_cache(maxsize=None)
def pixel_model(variant: str, precision: str = "fp32", side: int = FULL_SIDE) -> PixelModel:
    """``PixelModel`` from one prediction of ``variant`` in ``precision`` at batch 1,
    ``side`` x ``side`` (cached: each takes several CPU-seconds of fake-tensor dispatch)."""
    t0 = time.process_time()
    p = _step(variant, precision, 1, side)
    return from_prediction(p, 1, side, variant, precision, time.process_time() - t0)


def pixel_models(variants: Sequence[str] = tuple(VARIANTS),
                 precisions: Sequence[str] = tuple(PRECISIONS)) -> dict[str, PixelModel]:
    """One ``PixelModel`` per (variant, precision), keyed by its label."""
    out = {}
    for v in variants:
        for p in precisions:
            m = pixel_model(v, p)
            out[m.label] = m
    return out


def peaks_table(models: dict[str, PixelModel], batches: Sequence[int] = (1, 2, 8),
                side: int = FULL_SIDE):
    """Predicted steady-state peak (GiB) at ``side`` x ``side`` per technique and batch, and
    with batch-1 gradient accumulation."""
    import pandas as pd

    rows = []
    for m in models.values():
        row = {"technique": m.variant, "precision": m.precision}
        row.update({f"batch {b} GiB": round(m.peak(b, side) / 2**30, 2) for b in batches})
        row["batch 1 + accumulation GiB"] = round(m.peak(1, side, accumulate=True) / 2**30, 2)
        row["prediction CPU-s"] = round(m.seconds, 1)
        rows.append(row)
    return pd.DataFrame(rows)


def smallest_card(peak_bytes: float, cards: Sequence[float] = CARDS_GIB) -> float | None:
    """The smallest of ``cards`` (GiB) that holds a predicted peak of ``peak_bytes``
    (``budget.usable_bytes``: ``budget.Overheads``), or None if none does."""
    return next((c for c in cards if peak_bytes <= usable_bytes(c)), None)


def sides_table(models: dict[str, PixelModel], cards: Sequence[float] = CARDS_GIB,
                batch: int = dn.SEED004_BATCH, accumulate: bool = False):
    """The largest trainable side per technique (rows) and card (columns): ``batch`` images per
    step, or with ``accumulate`` one image per micro-batch (any effective batch). A card holds
    ``budget.usable_bytes`` of predicted peak (``budget.Overheads``)."""
    import pandas as pd

    budgets = {c: usable_bytes(c) for c in cards}
    return pd.DataFrame({f"{c} GB": [m.largest_side(budgets[c], 1 if accumulate else batch, accumulate)
                                     for m in models.values()] for c in cards},
                        index=list(models))


def plot_sides(models: dict[str, PixelModel], cards: Sequence[float] = CARDS_GIB, axes=None):
    """Resolution against card size: the largest side that trains at batch 8 (left) and at
    batch 1 with gradient accumulation (right), one line per technique; the X-rays' 2000 and the
    seed's 512 marked."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (title, acc) in zip(axes, ((f"batch {dn.SEED004_BATCH}", False),
                                       ("batch 1 + gradient accumulation", True)), strict=True):
        sides = sides_table(models, cards, accumulate=acc)
        for label, m in models.items():
            ax.plot(cards, list(sides.loc[label]), marker="o", ls="-" if m.precision == "fp32" else "--",
                    label=label)
        for y, txt in ((FULL_SIDE, "the X-rays: 2000"), (dn.SEED004_IMAGE[0], "seed 004: 512")):
            ax.axhline(y, color="grey", lw=0.8, ls=":")
            ax.annotate(txt, (cards[0], y), textcoords="offset points", xytext=(2, 3), fontsize=8)
        ax.set(xscale="log", xticks=list(cards), xticklabels=[str(c) for c in cards],
               xlabel="card memory (GB)", title=f"DenseNet-169, {title} (predicted)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("largest image side that trains (pixels)")
    axes[1].legend(fontsize=7, loc="upper left")
    return axes


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
        for parent in list(net.modules()):
            for key, child in list(parent.named_children()):
                if isinstance(child, nn.BatchNorm2d):
                    setattr(parent, key, nn.GroupNorm(child.num_features // 4, child.num_features).double())
    elif norm == "frozen":
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
                # "pre-trained" statistics: not the defaults, so that freezing is seen to matter
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.9, 1.1)
    elif norm != "batch":
        raise ValueError(f"norm must be 'batch', 'frozen' or 'group', got {norm!r}")
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
    in float64 (so the difference is the normalisation's, not rounding)."""
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
    return {"one batch": momentum, f"{micro} micro-batches": 1 - (1 - momentum) ** micro,
            "last micro-batch alone": momentum}
