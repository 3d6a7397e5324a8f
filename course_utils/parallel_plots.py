"""Drawings for notebooks 08 and 09: what each rank holds, and a pipeline schedule with its bubble.

* ``plot_rank_memory`` -- one stacked bar per rank (or per strategy): parameters, gradients,
  optimizer state, DDP's gradient buckets, parameters gathered for the running unit and
  prefetched for the next, activations;
* ``plot_memory_timeline`` -- what one rank holds at each moment of a step, in time order (one
  stacked column a moment): FSDP2's resting shards and the units gathered in forward and backward;
* ``plot_schedule``    -- one row per pipeline stage: forward and backward ops of each
  micro-batch on a time axis, the idle time (the bubble) shaded;
* ``plot_layouts``     -- per-GPU memory of data x pipeline parallel layouts.
"""

from __future__ import annotations

from typing import Sequence

from .checks import ParallelError, guard

#: category -> (colour, hatch); the order is the stacking order
CATEGORIES: dict[str, tuple[str, str]] = {
    "params": ("tab:blue", ""),
    "grads": ("tab:orange", ""),
    "optimizer": ("tab:green", ""),
    "DDP buckets": ("peachpuff", ".."),
    "gathered params": ("lightsteelblue", "//"),
    "prefetched params": ("lavender", "\\\\"),
    "all-gather buffer": ("thistle", "xx"),
    "unsharded grads": ("navajowhite", "//"),
    "activations": ("tab:red", ""),
}


#: MemTracker's categories (``Prediction.breakdown``) -> the categories drawn here
_TRACKER = {"Parameter": "params", "Buffer": "params", "Gradient": "grads", "Optstate": "optimizer",
            "Activation": "activations", "Temp": "activations", "Other": "activations", "Inputs": "activations"}


def breakdown_parts(breakdown: dict[str, float]) -> dict[str, float]:
    """A predicted breakdown (MemTracker's categories) in the categories of ``plot_rank_memory``:
    activations include temporaries and the input."""
    parts: dict[str, float] = {}
    for key, nbytes in breakdown.items():
        if key in _TRACKER:
            parts[_TRACKER[key]] = parts.get(_TRACKER[key], 0) + nbytes
    return parts


def _unit(largest: float) -> tuple[str, float]:
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= size:
            return name, size
    return "B", 1


def plot_rank_memory(bars: Sequence[tuple[str, dict[str, float]]], ax=None, title: str | None = None):
    """Horizontal stacked bars, one per ``(label, {category: bytes})``, categories from
    ``CATEGORIES`` (missing ones are 0). The total is written at the end of each bar."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.6 * len(bars) + 1.6))
    largest = max(sum(parts.values()) for _, parts in bars)
    unit, size = _unit(largest)
    labels = [label for label, _ in bars]
    left = [0.0] * len(bars)
    for cat, (colour, hatch) in CATEGORIES.items():
        widths = [parts.get(cat, 0) / size for _, parts in bars]
        if not any(widths):
            continue
        ax.barh(labels, widths, left=left, color=colour, hatch=hatch, edgecolor="k", linewidth=0.5, label=cat)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in enumerate(left):
        ax.text(total + 0.01 * largest / size, y, f"{total:,.1f} {unit}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.45 * largest / size)
    ax.set_xlabel(unit)
    ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_memory_timeline(moments: Sequence[tuple[str, dict[str, float]]], ax=None, title: str | None = None,
                         phases: Sequence[tuple[str, int, int]] = ()):
    """One stacked column per ``(label, {category: bytes})`` moment, left to right in time order,
    categories from ``CATEGORIES``; a dashed line at the first moment's total (what is held at
    rest), the largest total written above its column. ``phases``: ``(name, first, last)``
    index ranges of ``moments`` shaded and named (e.g. forward, backward)."""
    import matplotlib.pyplot as plt

    if not moments:
        raise ValueError("plot_memory_timeline needs at least one moment")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(moments) + 2), 3.4))
    totals = [sum(parts.values()) for _, parts in moments]
    unit, size = _unit(max(totals))
    xs = range(len(moments))
    bottom = [0.0] * len(moments)
    for cat, (colour, hatch) in CATEGORIES.items():
        heights = [parts.get(cat, 0) / size for _, parts in moments]
        if not any(heights):
            continue
        ax.bar(xs, heights, bottom=bottom, width=0.85, color=colour, hatch=hatch, edgecolor="k", linewidth=0.4,
               label=cat)
        bottom = [a + b for a, b in zip(bottom, heights, strict=True)]
    top = max(xs, key=lambda i: totals[i])
    ax.axhline(totals[0] / size, color="k", linestyle="--", linewidth=0.8,
               label=f"{moments[0][0]}: {totals[0] / size:,.1f} {unit}")
    ax.text(top, totals[top] / size, f"{totals[top] / size:,.1f} {unit}", ha="center", va="bottom", fontsize=8)
    for k, (name, first, last) in enumerate(phases):
        ax.axvspan(first - 0.5, last + 0.5, color=("#e8f0fa", "#fbefe2")[k % 2], zorder=0)
        ax.text((first + last) / 2, 1.22 * max(totals) / size, name, ha="center", fontsize=9)
    ax.set_xticks(list(xs), [label for label, _ in moments], rotation=60, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(moments) - 0.4)
    ax.set_ylim(0, 1.32 * max(totals) / size)
    ax.set_ylabel(unit)
    ax.legend(loc="upper left", fontsize=7, framealpha=0.9)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def _idle(ops: list[tuple[str, int, float, float]], end: float) -> list[tuple[float, float]]:
    """The gaps between a stage's ops, from 0 to ``end``."""
    gaps, t = [], 0.0
    for _, _, start, stop in sorted(ops, key=lambda o: o[2]):
        if start > t:
            gaps.append((t, start))
        t = max(t, stop)
    if end > t:
        gaps.append((t, end))
    return gaps


def plot_schedule(panels: Sequence[tuple[str, list[list[tuple[str, int, float, float]]]]],
                  xlabel: str = "seconds", axes=None):
    """One panel per ``(title, ops)``, ``ops[s]`` = stage s's ``(kind, micro-batch, start, end)``.
    Forwards blue, backwards orange, labelled F0, B0, ...; idle time shaded grey: the bubble."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(len(panels), 1, figsize=(10, 1.0 + 1.1 * sum(len(o) for _, o in panels)),
                               squeeze=False)
        axes = axes[:, 0]
    for ax, (title, ops) in zip(axes, panels, strict=True):
        end = max(stop for stage in ops for *_, stop in stage)
        labelled = False
        for s, stage in enumerate(ops):
            for start, stop in _idle(stage, end):
                ax.barh(s, stop - start, left=start, color="0.9", hatch="xx", edgecolor="0.6", linewidth=0.3,
                        label=None if labelled else "idle (bubble)")
                labelled = True
            for kind, i, start, stop in stage:
                ax.barh(s, stop - start, left=start, color="tab:blue" if kind == "F" else "tab:orange",
                        edgecolor="k", linewidth=0.5)
                if stop - start > 0.025 * end:
                    ax.text((start + stop) / 2, s, f"{kind}{i}", ha="center", va="center", fontsize=7)
        ax.barh(0, 0, color="tab:blue", label="forward F(micro-batch)")
        ax.barh(0, 0, color="tab:orange", label="backward B(micro-batch)")
        ax.set_yticks(range(len(ops)), [f"stage {s + 1} (rank {s})" for s in range(len(ops))])
        ax.invert_yaxis()
        ax.set_xlim(0, end * 1.3)
        ax.set_title(title, fontsize=10)
        ax.legend(loc="center right", fontsize=7, framealpha=0.9)
    axes[-1].set_xlabel(xlabel)
    axes[0].figure.tight_layout()
    return axes


def plot_layouts(rows: Sequence[dict], ax=None, title: str | None = None):
    """Per-GPU memory of each data x pipeline layout (rows of ``parallel.pipeline_layouts``):
    parameters + gradients + Adam state, and activations under GPipe and under 1F1B."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.8))
    largest = max(r["total (GPipe)"] for r in rows)
    unit, size = _unit(largest)
    labels = [f"{r['dp']} x {r['pp']}: {r['GPU holds']}" for r in rows]
    xs = range(len(rows))
    static = [r["params + grads + Adam"] / size for r in rows]
    ax.bar(xs, static, color="tab:green", label="params + grads + Adam")
    piped = [x for x, r in zip(xs, rows, strict=True) if r["pp"] > 1]
    shift = [0.2 if r["pp"] > 1 else 0.0 for r in rows]
    ax.bar([x - d for x, d in zip(xs, shift, strict=True)], [r["activations (GPipe)"] / size for r in rows],
           width=[0.4 if d else 0.8 for d in shift], bottom=static, color="tab:red",
           label="activations (no pipeline, or GPipe)")
    ax.bar([x + 0.2 for x in piped], [rows[x]["activations (1F1B)"] / size for x in piped], width=0.4,
           bottom=[static[x] for x in piped], color="salmon", hatch="//", edgecolor="k", linewidth=0.3,
           label="activations, 1F1B")
    ax.set_xticks(list(xs), labels, rotation=20, ha="right", fontsize=8)
    ax.set_xlabel("layout: data-parallel replicas x pipeline stages, and what the GPU holds")
    ax.set_ylabel(f"{unit} per GPU (estimate)")
    ax.legend(loc="upper right", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


guard(globals(), ParallelError)
