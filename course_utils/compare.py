"""Baseline vs technique: one table, the same training step measured or predicted for each
variant, and the step's time."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from torch import nn

from .checks import MeasureError, guard
from .memory import catch_oom, default_dtype, measure_step, mib, predict_step
from .train import training_step

COLUMNS = ["variant", "peak MiB", "peak vs baseline %", "kept after forward MiB",
           "kept vs baseline %", "saved MiB", "saved vs baseline %", "activations at peak MiB",
           "params MiB", "gradients MiB", "optimizer MiB", "temporaries MiB", "peak in", "method"]
#: what a peak is made of, in the order the stacked bars draw it
PARTS = ("params MiB", "gradients MiB", "optimizer MiB", "activations at peak MiB", "temporaries MiB")


def technique_table(
    builds: dict[str, Callable[[], nn.Module]],
    input_shape: tuple[int, ...],
    *,
    n_classes: int = 5,
    dtype: torch.dtype = torch.float32,
    fake: bool = True,
    device: str | torch.device = "cpu",
    autocast: dict[str, torch.dtype | None] | None = None,
    dtypes: dict[str, torch.dtype] | None = None,
    steady_state: bool = True,
    target: str | None = None,
):
    """One training step (``train.training_step``: forward, backward, Adam) per variant; the
    first is the baseline. Memory in MiB; every row names its method.

    * ``device='cuda'``: measured with the CUDA allocator (``measure_step``:
      ``max_memory_allocated`` of the steady-state step; saved bytes through the hooks).
    * otherwise the MemTracker log: predicted under ``FakeTensorMode`` (``fake=True``; for a CUDA
      GPU unless ``target='cpu'``) or measured on real CPU tensors (``fake=False``).

    Columns: ``peak``; ``kept after forward`` (activation bytes alive when the forward returns:
    everything kept for backward, checkpoint inputs and selectively saved outputs included, and
    the logits); ``saved`` (saved-for-backward bytes seen by ``saved_tensors_hooks``: outside
    checkpointed blocks only); ``activations at peak``; ``params``; ``optimizer`` state;
    ``peak in`` (module and phase of the peak, predictions only).

    ``autocast`` maps a variant's name to the dtype its forward runs under ``torch.autocast``;
    ``dtypes`` maps a name to the dtype its model and input are built in (default ``dtype``).
    """
    import pandas as pd

    autocast, dtypes = autocast or {}, dtypes or {}
    unknown = (set(autocast) | set(dtypes)) - set(builds)
    if unknown:
        raise ValueError(f"autocast/dtypes name variants that are not in builds: {sorted(unknown)}")
    rows = []
    for name, build in builds.items():
        ac, dt = autocast.get(name), dtypes.get(name, dtype)
        if torch.device(device).type == "cuda":
            with catch_oom(verbose=False) as oom:
                m = measure_step(build, input_shape, n_classes=n_classes, dtype=dt, autocast_dtype=ac,
                                 steady_state=steady_state, device=device)
            params = sum(p.numel() * p.element_size() for p in _params_of(build, dt))
            if not oom.ok:  # a smaller GPU than the preset assumes: say so, keep the other rows
                total = torch.cuda.get_device_properties(torch.device(device)).total_memory
                rows.append({"variant": name, "peak MiB": None, "kept after forward MiB": None,
                             "saved MiB": None, "activations at peak MiB": None, "params MiB": mib(params),
                             "gradients MiB": None, "optimizer MiB": None, "temporaries MiB": None,
                             "peak in": "", "method": f"out of memory on this {mib(total) / 1024:.0f} GiB GPU "
                             "(COURSE_SIZE=tiny, or a larger GPU)"})
                continue
            rows.append({"variant": name, "peak MiB": mib(m.peak_allocated),
                         "kept after forward MiB": mib(m.kept_after_forward),
                         "saved MiB": mib(m.saved_peak), "activations at peak MiB": None,
                         "params MiB": mib(params), "gradients MiB": None,
                         "optimizer MiB": 2 * mib(params), "temporaries MiB": None,
                         "peak in": "", "method": m.method})
            continue
        p = predict_step(build, input_shape, n_classes=n_classes, dtype=dt, fake=fake,
                         autocast_dtype=ac, steady_state=steady_state, target=target)
        module, phase = p.log.peak_location
        rows.append({"variant": name, "peak MiB": mib(p.peak),
                     "kept after forward MiB": mib(p.kept_after_forward),
                     "saved MiB": mib(p.saved_peak),
                     "activations at peak MiB": mib(p.breakdown["Activation"]),
                     "params MiB": mib(p.breakdown["Parameter"] + p.breakdown["Buffer"]),
                     "gradients MiB": mib(p.breakdown["Gradient"]),
                     "optimizer MiB": mib(p.breakdown["Optstate"]),
                     "temporaries MiB": mib(p.breakdown["Temp"] + p.breakdown["Other"]),
                     "peak in": f"{module} ({phase})", "method": p.method})
    df = pd.DataFrame(rows)
    for c in ("peak MiB", "kept after forward MiB", "saved MiB", *PARTS):
        df[c] = pd.to_numeric(df[c])
    for col, rel in (("peak MiB", "peak vs baseline %"), ("kept after forward MiB", "kept vs baseline %"),
                     ("saved MiB", "saved vs baseline %")):
        base = df[col].iloc[0]
        df[rel] = (100 * (df[col] - base) / base).round(1) if base else 0.0
    for c in ("peak MiB", "kept after forward MiB", "saved MiB", *PARTS):
        df[c] = df[c].astype(float).round(1)
    return df[COLUMNS]


def relative_to(table, base: str, label: str | None = None):
    """``table`` (a ``technique_table``) indexed by variant, with two columns more: its saved bytes
    and its peak in % against the ``base`` row's, named ``saved vs <label> %`` and ``peak vs
    <label> %`` (``label`` defaults to ``base``). Unlike the table's "vs baseline" columns, the
    reference row need not be the first one."""
    label = base if label is None else label
    t = table.set_index("variant")
    for col, what in (("saved MiB", "saved"), ("peak MiB", "peak")):
        t[f"{what} vs {label} %"] = (100 * (t[col] / t.loc[base, col] - 1)).round(1)
    return t


PART_COLORS = {"params MiB": "#4c72b0", "gradients MiB": "#55a868", "optimizer MiB": "#c44e52",
               "activations at peak MiB": "#8172b2", "temporaries MiB": "#ccb974"}


def plot_techniques(table, ax=None, title: str = "", budget_mib: float | None = None):
    """Stacked bars, one per variant of a ``technique_table``: what the peak is made of
    (parameters, gradients, optimizer state, activations, temporaries). Predicted rows only
    (a CUDA measurement has the total, not the parts: drawn as a plain bar)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.5 * len(table) + 1.4))
    names = list(table["variant"])
    for i, (_, row) in enumerate(table.iterrows()):
        left = 0.0
        if row[PARTS[3]] is None or row[PARTS[3]] != row[PARTS[3]]:  # measured: no parts
            ax.barh(i, row["peak MiB"], color="#999999", label="measured peak" if i == 0 else None)
            continue
        for part in PARTS:
            v = float(row[part])
            ax.barh(i, v, left=left, color=PART_COLORS[part],
                    label=part.replace(" MiB", "").replace(" at peak", "") if i == 0 else None)
            left += v
        ax.text(left, i, f" {row['peak MiB']:,.0f}", va="center", fontsize=8)
    if budget_mib:
        ax.axvline(budget_mib, color="k", ls="--", lw=1)
        ax.text(budget_mib, 1.0, f" {budget_mib:,.0f} MiB", fontsize=7, va="bottom",
                transform=ax.get_xaxis_transform())
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    right = max(float(table["peak MiB"].max()), budget_mib or 0)
    ax.set_xlim(0, right * 1.45)  # room for the legend, right of the bars
    ax.set_xlabel("MiB at the step's peak")
    ax.set_title(title or str(table["method"].iloc[0]), fontsize=9)
    ax.legend(fontsize=7, loc="center right", frameon=False)
    return ax


def _params_of(build: Callable[[], nn.Module], dtype: torch.dtype):
    with default_dtype(dtype), torch.device("meta"):
        return list(build().parameters())


def step_time(build: Callable[[], nn.Module], input_shape: tuple[int, ...], *, n_classes: int = 5,
              device: str | torch.device = "cpu", reps: int = 3,
              autocast_dtype: torch.dtype | None = None,
              dtype: torch.dtype = torch.float32) -> float:
    """Median seconds of one real ``training_step`` (forward, backward, Adam), after one
    warm-up step. The model is built in ``dtype`` and the input made in it (a model built in
    fp16 gets fp16 input). On CUDA the clock stops after ``torch.cuda.synchronize()``. For
    notebooks and benchmarks; tests never assert on time."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    dev = torch.device(device)
    torch.manual_seed(0)
    with default_dtype(dtype):
        model = build().to(dev)
    x = torch.randn(input_shape, device=dev, dtype=dtype)
    y = torch.randint(0, n_classes, (input_shape[0], *input_shape[2:]), device=dev)
    opt = torch.optim.Adam(model.parameters())
    times = []
    for i in range(reps + 1):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        training_step(model, x, y, opt, autocast_dtype=autocast_dtype)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def plot_timelines(logs: dict, ax=None, title: str = "", window: tuple[int, int] | None = None):
    """Live tensor bytes at every hook of several ``MemoryLog``s of the same net (the events
    line up), each with its true peak as a dashed line; ``window`` zooms to events [a, b)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.4))
    for (name, log), color in zip(logs.items(), ("#4c72b0", "#dd8452", "#55a868", "#c44e52"), strict=False):  # at most four logs
        rows = log.rows[slice(*window)] if window else log.rows
        ax.plot([r.event for r in rows], [mib(r.tracked) for r in rows], color=color, label=name)
        module, phase = log.peak_location
        ax.axhline(mib(log.peak), color=color, ls="--", lw=0.8)
        ax.text(0.01, mib(log.peak), f" peak {mib(log.peak):,.0f} MiB, {module} ({phase})", color=color,
                fontsize=7, va="bottom", transform=ax.get_yaxis_transform())
    first = next(iter(logs.values()))
    bw = next((r.event for r in first.rows if r.hook.startswith("bwd")), None)
    if bw is not None:
        ax.axvline(bw, color="grey", lw=0.8)
        ax.text(bw, 0.02, " backward starts", fontsize=8, transform=ax.get_xaxis_transform())
    ax.set_xlabel("hook event")
    ax.set_ylabel("live tensors, MiB")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    return ax


guard(globals(), MeasureError)
