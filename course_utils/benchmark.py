"""Every technique of the course on seed 000's U-Net, predicted and (on a GPU) measured.

``python benchmarks/run.py`` calls ``run()``; the GPU kit (``gpu_report``) calls it too. One row
per technique and net:

* **predicted** (any machine): the steady-state step's ``max_memory_allocated`` for a CUDA GPU
  (``explorer.estimate``), what the card needs with context and slack, the largest batch for
  the budget card, activations kept after forward, where the peak is, and the step's FLOPs
  counted by ``torch.utils.flop_counter.FlopCounterMode`` under FakeTensorMode (forward,
  backward and any recomputation; convolutions and matrix products only) and the estimated step
  time for ``cost.DEFAULT_CARD`` (``explorer.step_cost``: those FLOPs, the element-wise ops'
  bytes and any host copies at the card's spec-sheet rates);
* **measured** (CUDA only): the same step's ``max_memory_allocated`` / ``max_memory_reserved``
  (``memory.measure_step``), the driver's used memory, the median step time, the largest batch
  under an allocator cap of (budget - measured CUDA context), and the prediction's miss in %.
"""

from __future__ import annotations

import datetime
import json
import platform
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from . import budget, cost, recorded
from . import explorer
from .checks import RecordError, TechniqueError, guard
from .compare import step_time
from .config import SEED000_VOLUME
from .files import make_folder, replacing
from .memory import GiB, MiB, catch_oom, largest_that_fits, measure_step, memory_cap, predict_step

TECHNIQUES: dict[str, dict[str, Any]] = {
    "baseline fp32": dict(precision="fp32"),
    "fp16 model (seed 000)": dict(precision="fp16_model"),
    "autocast fp16": dict(precision="autocast_fp16"),
    "autocast bf16": dict(precision="autocast_bf16"),
    "in-place ReLU": dict(precision="fp32", inplace_relu=True),
    "In-Place ABN": dict(precision="fp32", inplace_abn=True),
    "checkpointing": dict(precision="fp32", checkpointing="level"),
    "checkpointing every DoubleConv": dict(precision="fp32", checkpointing="double_conv"),
    "checkpointing every conv": dict(precision="fp32", checkpointing="conv"),
    "offload to host": dict(precision="fp32", offload=True),
    "selective checkpointing": dict(precision="fp32", checkpointing="selective"),
    "autocast fp16 + in-place ReLU + checkpointing": dict(precision="autocast_fp16", inplace_relu=True,
                                                          checkpointing="level"),
    "autocast fp16 + In-Place ABN": dict(precision="autocast_fp16", inplace_abn=True),
    "autocast fp16 + In-Place ABN + checkpointing": dict(precision="autocast_fp16", inplace_abn=True,
                                                         checkpointing="level"),
    "autocast fp16 + lean Up": dict(precision="autocast_fp16", lean_up=True),
    "autocast fp16 + lean Up + In-Place ABN + checkpointing": dict(
        precision="autocast_fp16", lean_up=True, inplace_abn=True, checkpointing="level"),
    "autocast fp16 + lean Up + In-Place ABN + offload": dict(
        precision="autocast_fp16", lean_up=True, inplace_abn=True, offload=True),
}
NETS = {"large": 5, "small": 4}


def configs(net: str = "large", batch: int = 2, budget_gib: int = 8) -> dict[str, explorer.Config]:
    """One explorer ``Config`` per technique of ``TECHNIQUES`` for the ``net`` ("large" or "small")
    at seed 000's volume, ``batch`` and a ``budget_gib`` card."""
    base = explorer.Config(levels=NETS[net], volume=SEED000_VOLUME, batch=batch, budget_gib=budget_gib)
    return {name: replace(base, **kw) for name, kw in TECHNIQUES.items()}


def predicted_row(cfg: explorer.Config) -> dict[str, Any]:
    """The predicted half of a benchmark row for ``cfg`` (any machine): peak and card needs in MiB,
    the largest batch, activations kept after forward, where the peak is, GFLOP and seconds per step."""
    est, step = explorer.estimate(cfg), explorer.step_cost(cfg)  # step: FLOPs counted (FlopCounterMode), time estimated
    if cfg.batch == explorer.PROBE_BATCH:  # the explorer's cached prediction is this very step
        p = explorer.probe(cfg)
        peak, kept, (module, phase) = p["peak"], p["kept"], p["location"]
    else:
        dtype, ac = explorer.PRECISIONS[cfg.precision]
        pr = predict_step(lambda: explorer.build(cfg), (cfg.batch, 1, *cfg.volume), n_classes=5, dtype=dtype,
                          autocast_dtype=ac, module_peaks=False)
        peak, kept, (module, phase) = pr.peak, pr.kept_after_forward, pr.log.peak_location
    return {"predicted peak MiB": round(peak / MiB),
            "card needs MiB": round(est.overheads.needed(peak) / MiB),
            f"largest batch in {cfg.budget_gib} GiB (predicted)": est.largest_batch,
            "kept after forward MiB": round(kept / MiB),
            "peak in": f"{module} ({phase})",
            "GFLOP per step": round(step.flops / 1e9),
            "est. step s": round(step.seconds, 3)}


def cuda_context_bytes() -> int:
    """What the CUDA context and libraries take on the device, measured: driver-used memory
    minus the allocator's reserved memory, after a first convolution (cuDNN loaded)."""
    x = torch.randn(1, 1, 8, 8, 8, device="cuda")
    torch.nn.functional.conv3d(x, torch.randn(2, 1, 3, 3, 3, device="cuda")).sum().item()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def measured_row(cfg: explorer.Config, context: int, reps: int = 5, hint: int | None = None) -> dict[str, Any]:
    """The step measured on the GPU (``module docstring``); ``hint``: the predicted largest batch,
    which the search tries first (with the batch after it)."""
    dtype, ac = explorer.PRECISIONS[cfg.precision]
    shape = (cfg.batch, 1, *cfg.volume)
    m = measure_step(lambda: explorer.build(cfg), shape, n_classes=5, dtype=dtype, autocast_dtype=ac)
    secs = step_time(lambda: explorer.build(cfg), shape, device="cuda", autocast_dtype=ac, dtype=dtype, reps=reps)
    torch.cuda.empty_cache()

    def fits(b: int) -> bool:
        with catch_oom(verbose=False) as r:
            measure_step(lambda: explorer.build(cfg), (b, 1, *cfg.volume), n_classes=5, dtype=dtype,
                         autocast_dtype=ac)
        torch.cuda.empty_cache()
        return r.ok

    with memory_cap((cfg.budget_gib * GiB - context) / GiB):
        largest = largest_that_fits(fits, start=1, limit=64, at_limit="return",
                                    hint=hint if hint and hint < 64 else None)
    return {"measured peak MiB": round(m.peak_allocated / MiB),
            "measured reserved MiB": round(m.peak_reserved / MiB),
            "driver used MiB": round(m.driver_used / MiB),
            "step s": round(secs, 4),
            f"largest batch in {cfg.budget_gib} GiB (measured)": largest}


def _time_method() -> str:
    """How "est. step s" is estimated, with the default card's rate for each precision."""
    gpu = cost.card()
    rates = ", ".join(f"{k} {gpu.flops(k) / 1e12:.1f}" for k in ("fp32", "fp16_model", "autocast_bf16"))
    return (f"estimate for a {gpu.name} ({gpu.source.split(':')[0]}): counted FLOPs at its peak rate for the "
            f"precision (TFLOP/s: {rates}), element-wise bytes at {gpu.memory_bytes_per_s / 1e9:.0f} GB/s, "
            f"offload's host copies at {gpu.pcie_bytes_per_s / 1e9:.2f} GB/s (PCIe {gpu.pcie}); spec-sheet "
            "peaks, terms added, not overlapped (explorer.step_cost)")


#: more memory than any GPU has (an H200 has 141 GB, an MI355X 288 GB): a budget past it is a typo
MAX_BUDGET_GIB = 1024


def _refuse_bad_arguments(out: str | Path, nets: tuple[str, ...], budget_gib: int, measure: bool | None,
                          techniques: list[str] | None) -> None:
    """Everything ``run`` can tell is wrong before its first prediction, each a TechniqueError
    that names the argument, the value and the fix."""
    names = ", ".join(map(repr, TECHNIQUES))
    unknown = [t for t in techniques or () if t not in TECHNIQUES]
    if unknown:
        raise TechniqueError(f"benchmark.run: techniques={unknown!r}: not techniques of the benchmark.",
                             f"pass names of benchmark.TECHNIQUES: {names} (or techniques=None: all of them).")
    if techniques is not None and not techniques:
        raise TechniqueError("benchmark.run: techniques=[] asks for no row.",
                             f"name at least one of {names}, or pass techniques=None for all of them.")
    bad_nets = [n for n in nets if n not in NETS]
    if bad_nets or not nets:
        raise TechniqueError(f"benchmark.run: nets={tuple(nets)!r}: " + (f"{bad_nets!r} not nets of the benchmark."
                             if bad_nets else "no net to benchmark."),
                             f"pass nets as a tuple of {', '.join(map(repr, NETS))}, e.g. nets=('large',).")
    if budget_gib > MAX_BUDGET_GIB:
        raise TechniqueError(f"benchmark.run: budget_gib={budget_gib} GiB is more than any GPU has "
                             f"(at most {MAX_BUDGET_GIB} GiB here).", "pass the card's memory in GiB, e.g. budget_gib=8.")
    if measure and not torch.cuda.is_available():
        raise TechniqueError("benchmark.run: measure=True, but this machine has no CUDA GPU "
                             "(torch.cuda.is_available() is False).",
                             "pass measure=None (measured where there is a GPU, predicted elsewhere) or "
                             "measure=False, or run on a machine with a CUDA GPU.")
    if not str(out):
        raise TechniqueError("benchmark.run: out='' names no folder.",
                             "pass out as the folder for the results, e.g. 'benchmarks/results'.")


def _output_folder(out: str | Path) -> Path:
    """``out`` created (the run's first write, before its work), or a TechniqueError naming why not."""
    try:
        return make_folder(out)
    except RecordError as why:
        raise TechniqueError(f"benchmark.run: out={str(out)!r} cannot be the results' folder: {why.problem}",
                             f"{why.fix.rstrip('.')}, e.g. out='benchmarks/results'.") from None


def run(out: str | Path, nets: tuple[str, ...] = ("large",), budget_gib: int = 8,
        measure: bool | None = None, techniques: list[str] | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Benchmark ``techniques`` (default: all) on ``nets``; write ``<device>.json``, ``.md`` and
    ``.png`` under ``out`` (each whole or not at all); return the results. Every argument is
    checked, and the folder made, before the first prediction (``TechniqueError``)."""
    _refuse_bad_arguments(out, nets, budget_gib, measure, techniques)
    out = _output_folder(out)
    measure = torch.cuda.is_available() if measure is None else measure
    device = torch.cuda.get_device_name(0) if measure else f"cpu-{platform.machine()}"
    context = cuda_context_bytes() if measure else None
    over = budget.overheads()
    rows = []
    for net in nets:
        for name, cfg in configs(net, budget_gib=budget_gib).items():
            if techniques is not None and name not in techniques:
                continue
            row: dict[str, Any] = {"net": net, "technique": name, **predicted_row(cfg)}
            if measure:
                row.update(measured_row(cfg, context, hint=row[f"largest batch in {budget_gib} GiB (predicted)"]))
                row["miss %"] = round(100 * (row["predicted peak MiB"] - row["measured peak MiB"])
                                      / row["measured peak MiB"], 1)
            rows.append(row)
            if progress:
                print(json.dumps(row), flush=True)
    meta = {"device": device, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "budget_gib": budget_gib,
            "model": "seed 000 U-Nets (large 40,158,853 / small 14,496,517 params), 26x150x320, "
                     "batch 2, Adam, steady-state step",
            "predicted": "MemTracker under FakeTensorMode, CUDA autocast rules, steady state; card "
                         f"needs = predicted x (1 + slack) + context; overheads {over.source}; "
                         f"est. step s: {_time_method()}",
            "measured": ("cuda max_memory_allocated / max_memory_reserved of the steady-state step; "
                         f"largest batch under an allocator cap of {budget_gib} GiB - measured "
                         f"context ({context / MiB:.0f} MiB); step time median of 5 after warm-up"
                         if measure else "not measured: no CUDA GPU")}
    results = {"meta": meta, "rows": rows}
    stem = recorded.file_stem(device)
    # all three written to temporary files first, renamed at the end: a failed plot leaves none
    with replacing(out / f"{stem}.json") as js, replacing(out / f"{stem}.md") as md, \
            replacing(out / f"{stem}.png") as png:
        js.write_text(json.dumps(results, indent=2) + "\n")
        md.write_text(markdown(results))
        plot(results, png)
    return results


def markdown(results: dict[str, Any]) -> str:
    """``run``'s results as markdown: the device line, then one table per net (a row per technique)."""
    meta, rows = results["meta"], results["rows"]
    cols = [c for c in rows[0] if c not in ("net",)] if rows else []
    lines = [f"Device **{meta['device']}**, {meta['date']}, torch {meta['torch']}; {meta['model']}.",
             f"Predicted: {meta['predicted']}.", f"Measured: {meta['measured']}.", ""]
    for net in dict.fromkeys(r["net"] for r in rows):
        lines += [f"**{net} net**", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(f"{r[c]:,}" if isinstance(r[c], int) else str(r[c]) for c in cols) + " |"
                  for r in rows if r["net"] == net]
        lines.append("")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str | Path) -> None:
    """Save ``run``'s results as a bar chart at ``path``: the predicted peak per technique (MiB),
    the measured peak beside it when there is one, the budget card as a dashed line; one panel per net."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta, rows = results["meta"], results["rows"]
    nets = list(dict.fromkeys(r["net"] for r in rows))
    fig, axes = plt.subplots(1, len(nets), figsize=(8 * len(nets), 0.45 * len(rows) / len(nets) + 1.6),
                             squeeze=False)
    for ax, net in zip(axes[0], nets, strict=True):
        sub = [r for r in rows if r["net"] == net]
        names = [r["technique"] for r in sub]
        ax.barh(names, [r["predicted peak MiB"] for r in sub], color="#8172b2", label="predicted peak")
        if "measured peak MiB" in sub[0]:
            ax.plot([r["measured peak MiB"] for r in sub], names, "k|", ms=14, mew=2,
                    label="measured peak (cuda)")
        ax.axvline(meta["budget_gib"] * 1024, color="k", ls="--", label=f"{meta['budget_gib']} GiB card")
        ax.invert_yaxis()
        ax.set_xlabel("MiB, steady-state training step")
        ax.set_title(f"{net} net, batch 2, 26x150x320 ({meta['device']}, {meta['date']})", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    plt.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


guard(globals(), TechniqueError)
