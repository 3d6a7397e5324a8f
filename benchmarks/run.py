"""Benchmark every technique of the course on seed 000's U-Net. Not a test: it measures.

    python benchmarks/run.py            # writes benchmarks/results/<device>.json and .png

On a CUDA GPU (full size, 26 x 150 x 320, batch 2): peak allocated and reserved
(torch.cuda.max_memory_allocated / max_memory_reserved over two training steps), median step
time, and the largest batch that fits the budget (measured under
torch.cuda.set_per_process_memory_fraction). On CPU: the predicted steady-state peak at full
size (course_utils.explorer), the predicted saved-for-backward bytes (for checkpointed variants
only what is saved outside checkpointed blocks: inside, torch.utils.checkpoint's own hooks take
over), the step time measured at the tiny preset, and the predicted largest batch. Every figure
is labelled with its method. Also writes a Markdown table for the README.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import course_utils as cu  # noqa: E402
from course_utils import explorer as ex  # noqa: E402
from course_utils.compare import step_time  # noqa: E402
from course_utils.memory import GiB, MiB, catch_oom, cuda_peak, largest_that_fits  # noqa: E402

TECHNIQUES = {
    "baseline fp32": dict(precision="fp32"),
    "fp16 model (seed 000)": dict(precision="fp16 model (seed 000)"),
    "autocast fp16": dict(precision="autocast fp16"),
    "autocast bf16": dict(precision="autocast bf16"),
    "in-place ReLU": dict(precision="fp32", inplace_relu=True),
    "In-Place ABN": dict(precision="fp32", inplace_abn=True),
    "checkpointing": dict(precision="fp32", checkpointing="every level"),
    "selective checkpointing": dict(precision="fp32", checkpointing="selective (save convs)"),
    "autocast fp16 + in-place ReLU + checkpointing": dict(precision="autocast fp16", inplace_relu=True,
                                                          checkpointing="every level"),
    "autocast fp16 + In-Place ABN": dict(precision="autocast fp16", inplace_abn=True),
}


def cuda_row(cfg: ex.Config, budget: int) -> dict:
    dtype, ac = ex.PRECISIONS[cfg.precision]

    def steps(batch: int, n: int = 2):
        torch.manual_seed(0)
        net = ex.build(cfg).cuda().to(dtype)
        opt = torch.optim.Adam(net.parameters())
        x = torch.randn(batch, 1, *cfg.volume, device="cuda", dtype=dtype)
        y = torch.randint(0, 5, (batch, *cfg.volume), device="cuda")
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=ac or torch.float16, enabled=ac is not None):
                out = net(x)
            torch.nn.functional.cross_entropy(out.float(), y).backward()
            opt.step()

    peak = cuda_peak(lambda: steps(cfg.batch))
    t = step_time(lambda: ex.build(cfg).to(dtype), (cfg.batch, 1, *cfg.volume), device="cuda",
                  autocast_dtype=ac, dtype=dtype)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget * GiB / total))

    def fits(b):
        with catch_oom(verbose=False) as r:
            steps(b, n=2)
        torch.cuda.empty_cache()
        return r.ok

    largest = largest_that_fits(fits, start=1, limit=256)
    torch.cuda.set_per_process_memory_fraction(1.0)
    return {"peak allocated MiB": round(peak.peak_allocated / MiB), "peak reserved MiB": round(peak.peak_reserved / MiB),
            "step s": round(t, 4), f"largest batch in {budget} GiB": largest,
            "method": "measured: cuda allocator, 2 steps; step time median of 3"}


def cpu_row(cfg: ex.Config, budget: int) -> dict:
    est = ex.estimate(replace(cfg, budget_gib=budget))
    dtype, ac = ex.PRECISIONS[cfg.precision]
    saved = cu.predict_step(lambda: ex.build(cfg), (cfg.batch, 1, *cfg.volume), n_classes=5, dtype=dtype,
                            optimizer=None, autocast_dtype=ac, module_peaks=False).saved_peak
    tiny = cu.PRESETS["tiny"]
    small = replace(cfg, base_channels=tiny.base_channels, levels=4, volume=tiny.volume, seed000=False)
    t = step_time(lambda: ex.build(small), (tiny.batch, 1, *tiny.volume),
                  autocast_dtype=torch.bfloat16 if ac is not None else None)
    return {"predicted peak MiB": round(est.total / MiB), "predicted saved MiB": round(saved / MiB),
            f"step s (tiny preset, {torch.get_num_threads()} threads)": round(t, 4),
            f"largest batch in {budget} GiB": est.largest_batch,
            "method": "predicted (explorer: MemTracker under FakeTensorMode, steady state); "
                      "step time measured on CPU at the tiny preset (bf16 for autocast)"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=8, help="GiB (default 8)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if cuda else f"cpu-{platform.machine()}"
    base = ex.Config(volume=cu.config.SEED000_VOLUME, batch=2)
    rows = []
    for name, kw in TECHNIQUES.items():
        cfg = replace(base, **kw)
        row = {"technique": name, **(cuda_row(cfg, args.budget) if cuda else cpu_row(cfg, args.budget))}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = device.replace(" ", "_").replace("/", "_")
    meta = {"device": device, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "model": "seed 000 large U-Net (40,158,853 params), 26x150x320, batch 2, Adam",
            "budget_gib": args.budget}
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    plot(rows, meta, out / f"{stem}.png")
    (out / f"{stem}.md").write_text(markdown(rows, meta))
    print(f"wrote {out / stem}.json, .md and .png")
    return 0


def markdown(rows, meta) -> str:
    cols = [c for c in rows[0] if c != "method"]
    lines = [f"Measured on **{meta['device']}**, {meta['date']}, torch {meta['torch']}; {meta['model']}.",
             f"Method: {rows[0]['method']}.", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(f"{r[c]:,}" if isinstance(r[c], int) else str(r[c]) for c in cols) + " |"
              for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows, meta, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = "peak allocated MiB" if "peak allocated MiB" in rows[0] else "predicted peak MiB"
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh([r["technique"] for r in rows], [r[key] for r in rows])
    ax.axvline(meta["budget_gib"] * 1024, color="k", ls="--", label=f"{meta['budget_gib']} GiB")
    ax.invert_yaxis()
    ax.set_xlabel(f"{key} ({meta['device']}, {meta['date']})")
    ax.legend()
    plt.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
