"""README's figures, computed: the course's headline answers to the seeds, and the benchmark.

    python -m course_utils.readme              # recompute results/figures.json, rewrite the generated blocks
    python -m course_utils.readme --render     # only rewrite the blocks from the committed JSON files
    python -m course_utils.readme --only seed004_full   # recompute one row, keep the others
    python -m course_utils.readme --timings    # also time every notebook (docs/teaching.md's table)
    python -m course_utils.readme --render --timings 11   # time notebook 11 and its solution only

Generated blocks lie between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` (``GENERATED``
says which file holds which): README.md's ``figures`` (from ``results/figures.json``, computed by
``headlines()``; a list, wrapped, so that no README line is long), docs/benchmark.md's
``benchmark`` (from ``benchmarks/results/*.md``, written by ``benchmarks/run.py`` and the GPU kit),
docs/gpu-kit.md's and docs/teaching.md's ``gpu-plan`` (the GPU kit's order and estimates,
``gpu_kit.plan``) and docs/teaching.md's ``timings``. A test checks that each file equals what the
committed JSON renders to, and recomputes the fast rows, so the documents cannot drift from the
code again.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from . import allocator, budget, cost, recorded, scaffold
from . import densenet as dn
from . import explorer
from . import full_resolution as fr
from .budget import batch_model, usable_bytes
from .checkpointing import peak_change_pct
from .checks import RecordError, guard
from .compare import technique_table
from .config import SEED000_VOLUME
from .files import atomic_write, read_json
from .gpu_kit.plan import checked_timings, plan_table
from .inplace_abn import bn_leaky_relu_inplace, inplace_abn
from .benchmark import configs as benchmark_configs
from .limit_test import input_bytes, run_limit_test
from .memory import GiB, largest_that_fits, predict_step
from .parallel import per_replica_bn_errors
from .tiling import largest_tiled_n
from .unet import SEED000_CHECKPOINT_HEADLINE, bn_relu, bn_relu_inplace, predict_seed000_unet, seed000_unet

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "results" / "figures.json"
TIMINGS = ROOT / "results" / "timings.json"
#: what README promises: every notebook at the tiny preset within this many seconds on an idle 2-core machine
NOTEBOOK_LIMIT_S = 120
README = ROOT / "README.md"
TEACHING = ROOT / "docs" / "teaching.md"
BENCHMARK_DOC = ROOT / "docs" / "benchmark.md"
GPU_KIT_DOC = ROOT / "docs" / "gpu-kit.md"
#: README's lines are at most this long (its figures are wrapped to it: tests/test_readme.py)
README_WIDTH = 100
#: a workshop slot per notebook: reading, discussing and the exercise (the teacher's plan)
SLOTS_MIN = {"00": 30, "01": 45, "02": 60, "03": 45, "04": 60, "05": 30, "06": 45, "07": 60,
             "08": 45, "09": 60, "10": 60}
BENCHMARKS = ROOT / "benchmarks" / "results"


def _mib(v: float) -> str:
    return f"{v / 2**20:,.0f}"


def _pct(new: float, old: float) -> str:
    return f"{100 * (new - old) / old:+.1f} %"


# --------------------------------------------------------------------------------------------
# Each headline: (key, question, the seed's figure, a function returning (figure, method))
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _seed000_fp16(variant: str):
    """The predicted steady-state step of seed 000's net at full size in fp16, batch 2 (shared by
    the two headlines that read it)."""
    return predict_step(lambda: seed000_unet(variant), (2, 1, *SEED000_VOLUME), n_classes=5, dtype=torch.float16)


def _seed000_peaks() -> tuple[str, str]:
    out = []
    for v in ("large", "small"):
        p = _seed000_fp16(v)
        res, ev, _ = allocator.trace_step(lambda v=v: seed000_unet(v), (2, 1, *SEED000_VOLUME), dtype=torch.float16)
        out.append((p.peak, allocator.simulate(ev, resident=res).peak_reserved))
    return (f"allocated {_mib(out[0][0])} / {_mib(out[1][0])} MiB, reserved {_mib(out[0][1])} / "
            f"{_mib(out[1][1])} MiB (+ the CUDA context in nvidia-smi)",
            "predicted allocated (steady state); reserved simulated (allocator model)")


def _seed000_param_share() -> tuple[str, str]:
    shares = []
    for v in ("large", "small"):
        p = _seed000_fp16(v)
        shares.append(100 * (p.breakdown["Parameter"] + p.breakdown["Optstate"]) / p.peak)
    return (f"{shares[0]:.1f} % / {shares[1]:.1f} %: activations are the rest",
            "predicted (weights + Adam state at the peak)")


def _seed000_tables() -> tuple[str, str]:
    def resident(net) -> int:
        blocks = [-(-t.numel() * (8 if t.dtype == torch.int64 else 2) // 512) * 512
                  for t in [*net.parameters(), *net.buffers()]]
        return sum(blocks) + -(-2 * 26 * 150 * 320 * 2 // 512) * 512

    small = resident(seed000_unet("small"))
    return (f"the 'larger' table starts at the small net's weights + buffers + input ({small:,} B vs "
            "34,027,520 B): labels swapped", "computed (fp16, 512-byte blocks)")


def _seed003_kept() -> tuple[str, str]:
    r = run_limit_test(350)
    return (f"{(r.saved - 2 * input_bytes(350)) / input_bytes(350):.0f} x the input (0.50 of naive)",
            "saved-tensor bytes, predicted, N = 350")


def _seed003_largest() -> tuple[str, str]:
    n = largest_that_fits(lambda k: run_limit_test(k).peak <= 8 * GiB, start=16, limit=4096)
    return (f"{n} (whole step); {largest_tiled_n(8 * GiB)} in slabs (tiling)", "predicted, fp32")


def _seed000_precision() -> tuple[str, str]:
    b, lean = (lambda: seed000_unet("large")), (lambda: seed000_unet("large", lean_up=True))
    t = technique_table({"fp32": b, "fp16": b, "ac": b, "lean": lean}, (2, 1, *SEED000_VOLUME),
                        dtypes={"fp16": torch.float16}, autocast={"ac": torch.float16, "lean": torch.float16})
    p = dict(zip(t.variant, t["peak MiB"], strict=True))
    return (f"{p['fp32']:,.0f} -> {p['fp16']:,.0f} (built in fp16) / {p['ac']:,.0f} (autocast fp16) / "
            f"{p['lean']:,.0f} (autocast + lean Up) MiB", "predicted, CUDA autocast rules, steady state")


def _seed002_inplace() -> tuple[str, str]:
    out = {}
    for v in ("large", "small"):
        t = technique_table({"plain": lambda v=v: seed000_unet(v, norm_act=bn_relu),
                             "inplace": lambda v=v: seed000_unet(v, norm_act=bn_relu_inplace)},
                            (2, 1, *SEED000_VOLUME), dtype=torch.float16)
        out[v] = (t["saved vs baseline %"].iloc[1], t["peak vs baseline %"].iloc[1])
    return (f"saved bytes {out['large'][0]:+.1f} %; peak {out['large'][1]:+.1f} % (large: peak in backward) / "
            f"{out['small'][1]:+.1f} % (small: peak at the end of forward)", "predicted, fp16, full size")


def _seed002_abn() -> tuple[str, str]:
    # notebook 06's baseline: the same activation, in place (seed 002 asks about in-place
    # activations; out of place, LeakyReLU saves its input and the comparison flatters In-Place ABN)
    t = technique_table({"BN + LeakyReLU(inplace=True)": lambda: seed000_unet("large", norm_act=bn_leaky_relu_inplace),
                         "In-Place ABN": lambda: seed000_unet("large", norm_act=inplace_abn)},
                        (2, 1, *SEED000_VOLUME), dtype=torch.float16)
    return (f"kept after forward {t['kept vs baseline %'].iloc[1]:+.1f} %, peak {t['peak vs baseline %'].iloc[1]:+.1f} %",
            "predicted, large net, fp16, full size")


def _seed004_checkpointing() -> tuple[str, str]:
    # notebook 07's configuration (autocast fp16 + lean Up), through the same function
    peaks = {k: predict_seed000_unet(**kw).peak for k, kw in SEED000_CHECKPOINT_HEADLINE.items()}
    p = peak_change_pct(peaks)
    return (f"peak {p['level']:+.1f} % per level, {p['selective']:+.1f} % selective (save convs)",
            "predicted for a CUDA GPU, large net with lean Up, autocast fp16, full size (notebook 07)")


def _seed004_densenet() -> tuple[str, str]:
    out = {}
    for name, kw in (("naive", {}), ("memory-efficient", {"memory_efficient": True})):
        pred = dn.predict_seed004(lambda kw=kw: dn.densenet169(**kw))
        out[name] = batch_model(pred, dn.SEED004_BATCH)
    six, eight = usable_bytes(6), usable_bytes(8)
    return (f"batch 8 at 512^2, fp32: {_mib(out['naive'].peak(8))} MiB; largest batch on a 6 GB card "
            f"{out['naive'].largest_batch(six)} naive -> {out['memory-efficient'].largest_batch(six)} "
            f"memory-efficient (8 GB: {out['naive'].largest_batch(eight)} -> "
            f"{out['memory-efficient'].largest_batch(eight)})",
            "predicted, DenseNet-169 (1 channel, 14 outputs), Adam, steady state; card overheads as the explorer's")


def _seed004_full_resolution() -> tuple[str, str]:
    naive, best = fr.pixel_model("naive"), fr.pixel_model("memory-efficient + per block", "autocast fp16")
    side, gib = fr.FULL_SIDE, 2**30

    def smallest_card(m: fr.PixelModel, batch: int, accumulate: bool = False) -> str:
        card = fr.smallest_card(m.peak(batch, side, accumulate))
        return f"{card} GB card" if card is not None else f"no card up to {fr.CARDS_GIB[-1]} GB"

    lo, hi = fr.CHECKED_SIDES
    sides = [m.largest_side(usable_bytes(16)) for m in (naive, best)]
    outside = [s for s in sides if fr.side_mark(s, dn.SEED004_BATCH)]
    past = f" ({', '.join(map(str, outside))} lies past the checked {lo}-{hi}: the line extrapolated)" if outside else ""
    return (f"at {side}^2, batch 8: {naive.peak(8, side) / gib:.1f} GiB naive fp32 ({smallest_card(naive, 8)}), "
            f"{best.peak(8, side) / gib:.1f} GiB memory-efficient + checkpoint per block, autocast fp16 "
            f"({smallest_card(best, 8)}); batch 1 + gradient accumulation: "
            f"{naive.peak(1, side, True) / gib:.1f} GiB ({smallest_card(naive, 1, True)}) -> "
            f"{best.peak(1, side, True) / gib:.1f} GiB ({smallest_card(best, 1, True)}); largest side at batch 8 "
            f"on 16 GB: {sides[0]} -> {sides[1]}{past}",
            "predicted, DenseNet-169, Adam steady state, CUDA rules, one 2000^2 prediction per technique and "
            f"peak linear in batch x pixels (checked from {lo}^2 to {hi}^2, notebook 12); card overheads as the "
            "explorer's")


def _seed004_data_parallel() -> tuple[str, str]:
    from dataclasses import replace

    one = explorer.estimate(explorer.Config(batch=8))
    eight = explorer.estimate(replace(explorer.Config(batch=8), dp_ranks=8))
    return (f"{_mib(one.total)} MiB on 1 GPU -> {_mib(eight.total)} MiB per GPU on 8",
            "predicted (explorer), large net, fp16 model, global batch 8")


def _seed004_bn() -> tuple[str, str]:
    errors = per_replica_bn_errors(range(8))
    return (f"{100 * min(errors):.0f}-{100 * max(errors):.0f} % relative gradient error with per-replica "
            "BatchNorm, 2 replicas, 8 seeds; cross-replica BatchNorm: equal to one process",
            "measured (CPU, the global batch in 2 halves, as DDP computes it)")


def _capstone() -> tuple[str, str]:
    from dataclasses import replace

    base = explorer.Config()
    safe = explorer.all_combinations(base, precisions=["fp32", "autocast_fp16"], lean_up=(False, True))
    best = max(safe, key=lambda c: explorer.estimate(c).largest_batch)
    frontier = [replace(base, precision="autocast_fp16", lean_up=True, inplace_abn=abn, checkpointing=ck, offload=off)
                for abn in (False, True) for ck in explorer.CHECKPOINTING for off in (False, True)
                if not (abn and ck == "selective")]
    top = max(frontier, key=lambda c: (explorer.estimate(c).largest_batch,
                                       -explorer.step_cost(replace(c, batch=8)).seconds))
    n_top = explorer.estimate(top).largest_batch
    # the winner's room under the assumed context, and its answer under the context seed 000 implies
    assumed, seed = (explorer.margin(replace(top, batch=n_top), o)
                     for o in (budget.overheads(), budget.seed000_overheads()))
    return (f"{explorer.estimate(base).largest_batch} (fp16 model, as seed 000) -> "
            f"{explorer.estimate(best).largest_batch} "
            f"({best.describe()}) -> {n_top} ({top.describe()}; margin {assumed['margin MiB']:,} MiB "
            f"({assumed['margin % of card']:.1f} % of the card) under a {assumed['context MiB']:,} MiB context, "
            f"{seed[f'largest batch in {top.budget_gib} GiB']} under the {seed['context MiB']:,} MiB seed 000 "
            f"implies; estimated {explorer.step_cost(replace(top, batch=8)).seconds:.2f} s per step at batch 8 on an "
            f"{cost.DEFAULT_CARD} vs {explorer.step_cost(replace(best, batch=8)).seconds:.2f} s){_measured_on_gpu(top)}",
            f"predicted for an 8 GiB card (context + slack included: {budget.overheads().source.split(':')[0]}); "
            "time estimated from spec-sheet rates (notebook 10)")


def _measured_on_gpu(cfg) -> str:
    """What the newest recorded GPU benchmark measured for ``cfg``'s technique on the large net: its
    largest batch in the card, with the GPU, date and torch; "" where no run measured it."""
    from dataclasses import replace

    rec = explorer.recorded_benchmark("large")
    names = {name for name, c in benchmark_configs("large").items() if replace(c, batch=cfg.batch) == cfg}
    row = next((r for r in (rec.rows if rec else []) if r["technique"] in names), None)
    if row is None:
        return ""
    wm = recorded.workspace_model()  # the recorded check of the convolution-workspace model
    modelled = next((r["largest batch"]["with workspaces"] for r in (wm[0]["rows"] if wm else [])
                     if r["row"] == f"large net: {row['technique']}" and "largest batch" in r), None)
    return (f"; measured on {rec.label}: largest batch {row[f'largest batch in {cfg.budget_gib} GiB (measured)']}, "
            f"batch-2 peak {row['measured peak MiB']:,} MiB"
            + ("" if modelled is None else f"; predicted with cuDNN's convolution workspaces under that run's cap "
                                           f"(no slack): {modelled}"))


HEADLINES: list[tuple[str, str, str, Callable[[], tuple[str, str]], bool]] = [
    # key, question, the seed's figure, compute, fast (recomputed by the test suite)
    ("seed000_peaks", "seed 000: peak of the 40.2 M / 14.5 M-parameter nets, fp16, batch 2, 26x150x320",
     "~7000 / ~7000 MiB (nvidia-smi)", _seed000_peaks, True),
    ("seed000_share", "seed 000: share of parameters and Adam state in that peak (large / small)", "-",
     _seed000_param_share, True),
    ("seed000_tables", "seed 000: the two hook tables", "labelled 'smaller' / 'larger'", _seed000_tables, True),
    ("seed003_kept", "seed 003: intermediates kept after forward", "26 x the input naive; 31.7 x measured (2017, N = 350)",
     _seed003_kept, True),
    ("seed003_largest", "seed 003: largest N in 8 GiB (budget inferred from the seed)",
     "350 forward only; 200 for a whole step (backward failed from 256)", _seed003_largest, False),
    ("seed000_precision", "seed 000 large net: fp32 -> 16-bit", "fp16 model (seed 000)", _seed000_precision, False),
    ("seed002_inplace", "seed 002: in-place ReLU", '"no extra memory needed"', _seed002_inplace, False),
    ("seed002_abn", "seed 002: In-Place ABN vs BN + LeakyReLU(inplace=True)", "up to 50 % less (paper)", _seed002_abn, False),
    ("seed004_checkpointing", "seed 004: checkpointing, seed 000 U-Net", "O(sqrt(n)) memory", _seed004_checkpointing, False),
    ("seed004_densenet", "seed 004: DenseNet-169 on 512 x 512 X-rays, batch 8", "out of memory at batch 8",
     _seed004_densenet, False),
    ("seed004_full", "seed 004: DenseNet-169 at the X-rays' own 2000 x 2000", '"approaches to avoid downsampling"',
     _seed004_full_resolution, False),
    ("seed004_dp", "seed 004: data parallel, seed 000 U-Net", '"each GPU gets fewer images"', _seed004_data_parallel, False),
    ("seed004_bn", "seed 004: BatchNorm under DDP", '"unstable training"', _seed004_bn, False),
    ("capstone", "capstone: seed 000 large net, largest batch in an 8 GiB card, fp32 master weights",
     "batch 2 (~7000 MiB)", _capstone, False),
]


def headlines(only: set[str] | None = None) -> dict[str, Any]:
    """Compute the rows of ``HEADLINES`` (those in ``only``, or all): each question with the
    seed's figure, the course's and how it was obtained; dated, with the torch version."""
    rows = []
    for key, question, seed, fn, _fast in HEADLINES:
        if only and key not in only:
            continue
        figure, method = fn()
        rows.append({"key": key, "question": question, "seed": seed, "course": figure, "method": method})
    return {"meta": {"date": datetime.date.today().isoformat(), "torch": torch.__version__},
            "rows": rows}


def merge_figures(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old``'s rows with ``new``'s recomputed ones put in, in ``HEADLINES``' order; the date and
    torch version are the new run's."""
    rows = {r["key"]: r for r in old["rows"]} | {r["key"]: r for r in new["rows"]}
    return {"meta": new["meta"], "rows": [rows[k] for k, *_ in HEADLINES if k in rows]}


def fast_keys() -> set[str]:
    """The keys of the ``HEADLINES`` rows fast enough for the test suite to recompute."""
    return {k for k, *_, fast in HEADLINES if fast}


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------
#: words a wrapped line must not start with: markdown would read a list item, a heading, a quote or a table
_NOT_FIRST = re.compile(r"[-+*=]|\d+[.)]|[#>|].*")


def wrap(text: str, width: int = README_WIDTH, indent: str = "  ") -> list[str]:
    """``text`` as lines of at most ``width`` characters (a single longer word stays whole), the
    continuation lines indented by ``indent``; a word markdown would read as the start of a list
    item, heading, quote or table row never begins a line (it stays on the line before)."""
    lines: list[str] = []
    for word in text.split():
        if lines and (len(lines[-1]) + 1 + len(word) <= width or _NOT_FIRST.fullmatch(word)):
            lines[-1] += " " + word
        else:
            lines.append((indent if lines else "") + word)
    return lines


def render_figures(data: dict[str, Any]) -> str:
    """README's "What the course found": one list item per headline (its question, the seed's
    figure, the course's and its method), wrapped so that every line is short."""
    lines = [f"Computed by `python -m course_utils.readme` ({data['meta']['date']}, torch "
             f"{data['meta']['torch']}); every figure names its method.", ""]
    for r in data["rows"]:
        seed = f" Seed's figure: {r['seed']}." if r["seed"].strip() not in ("", "-") else ""
        lines += wrap(f"- **{r['question']}.**{seed} Course's figure: {r['course']}. Method: {r['method']}.")
    return "\n".join(lines)


def render_benchmarks(folder: Path = BENCHMARKS) -> str:
    """docs/benchmark.md's block: every recorded benchmark table in ``folder``, GPU runs before the
    CPU predictions, with a note when no GPU run is recorded yet."""
    parts = []
    gpus = sorted(p for p in folder.glob("*.md") if not p.name.startswith("cpu-"))
    cpus = sorted(p for p in folder.glob("cpu-*.md"))
    if not gpus:
        parts.append("**No GPU run has been recorded yet** (the GPU kit, `python -m course_utils.gpu_report`, "
                     "records one); the table below is predicted on a CPU for a CUDA GPU.")
    for p in gpus + cpus:
        parts.append(p.read_text().strip())
    return "\n\n".join(parts)


def replace_block(text: str, name: str, body: str, where: str = "README") -> str:
    """``text`` with the body of its ``<!-- BEGIN name -->`` ... ``<!-- END name -->`` block replaced
    by ``body``; ValueError naming ``where`` if it has no such block."""
    pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
    if not pattern.search(text):
        raise ValueError(f"{where} has no '<!-- BEGIN {name} -->' ... '<!-- END {name} -->' block")
    return pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)


def render_readme(text: str, figures: dict[str, Any]) -> str:
    """README's generated block: the course's headline figures."""
    return replace_block(text, "figures", render_figures(figures))


def render_benchmark_doc(text: str, folder: Path = BENCHMARKS) -> str:
    """docs/benchmark.md's generated block: every recorded benchmark table, GPU runs first."""
    return replace_block(text, "benchmark", render_benchmarks(folder), "docs/benchmark.md")


def render_gpu_kit_doc(text: str) -> str:
    """docs/gpu-kit.md's generated block: the GPU kit's order and estimates."""
    return replace_block(text, "gpu-plan", plan_table(), "docs/gpu-kit.md")


def render_teaching(text: str, timings: dict[str, Any] | None) -> str:
    """docs/teaching.md's generated blocks: the notebooks' timings and the GPU kit's plan."""
    if timings is not None:
        text = replace_block(text, "timings", render_timings(timings), "docs/teaching.md")
    return replace_block(text, "gpu-plan", plan_table(), "docs/teaching.md")


def rendered(figures: dict[str, Any], timings: dict[str, Any] | None) -> dict[Path, str]:
    """Every file with generated blocks (``GENERATED``), its text with the blocks rendered from
    ``figures``, ``timings`` and the committed benchmark files and plan."""
    render = {README: lambda t: render_readme(t, figures), BENCHMARK_DOC: render_benchmark_doc,
              GPU_KIT_DOC: render_gpu_kit_doc, TEACHING: lambda t: render_teaching(t, timings)}
    return {path: render[path](path.read_text()) for path in GENERATED}


#: which file holds which generated blocks (``python -m course_utils.readme --render`` rewrites them)
GENERATED = {README: ("figures",), BENCHMARK_DOC: ("benchmark",), GPU_KIT_DOC: ("gpu-plan",),
             TEACHING: ("timings", "gpu-plan")}


def notebook_timings(only: list[str] | None = None) -> dict[str, Any]:
    """Execute every notebook and solution (or those of the numbers in ``only``) top to bottom at
    the tiny preset (nbclient, a fresh kernel each) and time it, with the machine's load noted."""
    import os
    import time

    import nbformat
    from nbclient import NotebookClient

    os.environ.update(COURSE_SIZE="tiny", MPLBACKEND="Agg")
    rows = {}
    load = os.getloadavg()[0]
    for folder in ("notebooks", "solutions"):
        for path in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb")):
            if only is not None and path.name[:2] not in only:
                continue
            nb = nbformat.read(path, as_version=4)
            t0 = time.perf_counter()
            NotebookClient(nb, timeout=900, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
            rows.setdefault(path.name[:2], {"name": path.stem[3:].replace("_", " ")})[folder] = \
                round(time.perf_counter() - t0)
    return {"meta": {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                     "cores": os.cpu_count(), "load average before": round(load, 1),
                     "load average after": round(os.getloadavg()[0], 1)},
            "rows": rows}


def merge_timings(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with the rows ``new`` measured replaced, each carrying its own ``measured`` meta
    (the table's header keeps the whole run's); rows of notebooks no longer present are dropped."""
    present = {e.nn for e in scaffold.entries(ROOT)}
    rows = {nn: r for nn, r in old["rows"].items() if nn in present}
    rows.update({nn: {**r, "measured": new["meta"]} for nn, r in new["rows"].items()})
    return {"meta": old["meta"], "rows": dict(sorted(rows.items()))}


def render_timings(data: dict[str, Any]) -> str:
    """docs/teaching.md's timings table: each notebook's and solution's run time on a CPU
    (seconds) and its suggested slot (minutes), with the machine and load they were measured at."""
    m = data["meta"]
    lines = [f"Measured by `python -m course_utils.readme --timings` on {m['date']} (torch {m['torch']}, "
             f"{m['cores']} cores, load average {m['load average before']} before and "
             f"{m['load average after']} after; nbclient, a fresh kernel per notebook, the `tiny` preset).",
             "", "| NN | notebook | run, CPU | solution run, CPU | suggested slot |", "|---|---|---|---|---|"]
    titles = {e.nn: scaffold.title(ROOT, e) for e in scaffold.entries(ROOT)}
    for nn, r in sorted(data["rows"].items()):
        if nn not in titles:
            raise RecordError(f"results/timings.json has a row for notebook {nn!r}, which notebooks/ does not hold.",
                              "delete that row, or time the notebooks again (`python -m course_utils.readme "
                              "--render --timings`)")
        lines.append(f"| {nn} | {titles[nn]} | {r.get('notebooks', '-')} s | {r.get('solutions', '-')} s | "
                     f"{SLOTS_MIN.get(nn, 45)} min |")
    apart = [(nn, r["measured"]) for nn, r in sorted(data["rows"].items()) if "measured" in r]
    if apart:
        lines += ["", "Measured on their own (`--timings NN`): " + "; ".join(
            f"{nn} on {a['date']} (torch {a['torch']}, {a['cores']} cores, load average "
            f"{a['load average before']} before and {a['load average after']} after)" for nn, a in apart) + "."]
    return "\n".join(lines)


def read_figures(path: Path | None = None) -> dict[str, Any]:
    """results/figures.json (``path``), checked: its meta's date and torch, and one row per
    headline (key, question, seed, course, method: strings); RecordError naming the file and the fix."""
    path = path or FIGURES
    fix = f"restore it (`git checkout -- {path}`), or compute it again (`python -m course_utils.readme`)"
    data = read_json(path, "the course's headline figures", fix)
    meta, rows = data.get("meta"), data.get("rows")
    if not isinstance(meta, dict) or not all(isinstance(meta.get(k), str) for k in ("date", "torch")):
        raise RecordError(f"{path}: its meta does not give the date and torch version (strings).", fix)
    cols = ("key", "question", "seed", "course", "method")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and all(isinstance(r.get(c), str) for c in cols)
                                             for r in rows):
        raise RecordError(f"{path}: its rows are not a list of headlines ({', '.join(cols)}: strings).", fix)
    return data


def read_timings(path: Path | None = None) -> dict[str, Any] | None:
    """results/timings.json (``path``), checked (``gpu_kit.plan.checked_timings``); None where it
    is absent; RecordError naming the file and the fix where it cannot be read."""
    return checked_timings(path or TIMINGS)


def write_timings(only: list[str] | None = None) -> None:
    """Time the notebooks (all, or those in ``only``, merged with the committed rows) and rewrite
    results/timings.json and docs/teaching.md's timings table, each whole or not at all."""
    old = read_timings() if only is not None else None  # a bad file is refused before the notebooks run
    data = notebook_timings(only)
    if old is not None:
        data = merge_timings(old, data)
    teaching = replace_block(TEACHING.read_text(), "timings", render_timings(data), "docs/teaching.md")
    atomic_write(TIMINGS, json.dumps(data, indent=1) + "\n")
    atomic_write(TEACHING, teaching)
    print(f"wrote {TIMINGS} and the timings table of {TEACHING}")


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils.readme``: recompute the figures (or ``--render`` the committed ones)
    and rewrite the generated blocks; ``--timings`` also times the notebooks. Returns 0."""
    ap = argparse.ArgumentParser(prog="python -m course_utils.readme", description=__doc__.splitlines()[0])
    ap.add_argument("--render", action="store_true",
                    help="do not recompute the figures: re-render the generated blocks from the committed JSON")
    ap.add_argument("--timings", nargs="*", metavar="NN",
                    help="also time every notebook and solution (minutes), or only those numbered NN, "
                         "merged into results/timings.json")
    ap.add_argument("--only", nargs="+", metavar="KEY", choices=[k for k, *_ in HEADLINES],
                    help="recompute only these rows of results/figures.json (the others are kept as committed)")
    args = ap.parse_args(argv)
    if args.timings:
        present = [e.nn for e in scaffold.entries(ROOT)]
        unknown = sorted(set(args.timings) - set(present))
        if unknown:
            ap.error(f"no notebook {', '.join(unknown)} in notebooks/ (there are {', '.join(present)})")
    if args.only and not args.render:
        old = read_figures()
        atomic_write(FIGURES, json.dumps(merge_figures(old, headlines(set(args.only))), indent=1) + "\n")
        print(f"recomputed {', '.join(args.only)} in {FIGURES}")
    elif not args.render:
        atomic_write(FIGURES, json.dumps(headlines(), indent=1) + "\n")
        print(f"wrote {FIGURES}")
    if args.timings is not None:
        write_timings(args.timings or None)
    texts = rendered(read_figures(), read_timings())
    for path, text in texts.items():
        atomic_write(path, text)
    print("rewrote the generated blocks of " + ", ".join(str(p.relative_to(ROOT)) for p in texts))
    return 0


guard(globals(), RecordError)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RecordError as err:  # a file it cannot read or write: the message names it and the fix
        sys.exit(f"error: {err}")
