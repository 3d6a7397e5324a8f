"""The convolution-workspace model (``memory.workspaces``) against a GPU run's records.

``python -m course_utils.gpu_kit.workspace_check [--runs DIR]`` reads the GPU runs under DIR
(default: docs/gpu-runs/) and writes ``workspaces.md`` and ``workspaces.json`` beside the records
of the newest run with a diagnosis:

1. **The rule, op by op.** Each diagnosed step (``diagnose/<case>``: every op of the step on the
   GPU between two readings of the allocator) is predicted again here, op by op on fake tensors,
   which gives every convolution's operand bytes (``OpMemory.conv_operands``); the two
   recordings are paired op by op (``memory.align_ops``) and each convolution's measured transient
   is set against its operands. The factors are the median ratio, forward and backward, over the
   convolutions whose operands are at least ``SHARE`` of the step's peak (the ones that can move
   a peak): the rule *fitted* on this GPU.
2. **Every recorded peak against the model.** Every row the run measured -- the benchmark's
   techniques on both of seed 000's nets, seed 003's net at three N, seed 004's DenseNet-169,
   ``fit``'s example networks -- predicted plain and with the fitted rule's workspaces (and, where
   the step runs a matrix product, the cuBLAS workspaces ``fit`` adds), beside the measured peak.
   A row still beyond ``TOLERANCE`` says which way it misses and where the model puts its peak.

About 80 CPU-s: one full-size prediction per row and a few per largest batch (each batch predicted
once for both rules), each row printed as it finishes.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import torch

from .. import benchmark, explorer, recorded
from ..budget import CUBLAS_OPS, cublas_workspaces
from ..checks import RecordError, guard
from ..densenet import densenet169, seed004_step_args
from ..files import atomic_write
from ..fit import variant
from ..limit_test import LimitTestNet
from ..memory import (
    CONV_OPS,
    NO_WORKSPACE,
    GiB,
    MiB,
    OpMemory,
    WorkspaceRule,
    align_ops,
    exception,
    largest_that_fits,
    peak_with_workspaces,
    predict_ops,
    recorded_ops,
)
from . import diagnose
from .tasks import FIT_EXAMPLES, LIMIT_NS

#: a convolution enters the fit when its operands are at least this share of its step's peak
SHARE = 0.05
#: a row whose model misses its measurement by more than this (a fraction) is named
TOLERANCE = 0.05
_LB, _RA = "largest batch", "reserved / allocated at batch 2"
_RULE_THERE = "rule's workspace there MiB"
_KINDS = {True: "fp32", False: "16-bit"}
_FIX = "run the GPU kit (python -m course_utils.gpu_report) on a GPU, then import its files (--import)"


#: row prefix -> the cause stated where the model misses by more than 5 % (the figures they rest on
#: are in the page: the ratios table, the rows' own columns)
CAUSES = {
    "small net: autocast": "over: the model peaks at the top Up's first convolution (192 input channels), where the "
    "fp16 model's step took its full activations (diagnose/small-fp16: 1,234 MiB, ratio 1.013); under autocast "
    "the measured peak leaves room for less there (the figure above), if the prediction's live bytes before that "
    "op are right. Not recorded op by op: `diagnose/small-autocast-lean` records it on the next GPU run. In these "
    "rows the measured peak lies between the plain prediction and the model.",
    "seed 003's net": "under by about the same number of input volumes at every N (the line under the table): its "
    "convolution with one *output* channel took 1.33 x its activations (diagnose/seed003, op 25; with TF32 off "
    "its convolutions took none), which the rule's 1 x leaves out -- about 3 of those volumes; notebook 03 "
    "models the step's excess as recorded (`limit_test.recorded_backward_excess`).",
    "fit's vit_tiny": "under: no convolution moves its peak (its patch embedding is small), so the miss is other "
    "memory (attention's kernels, the allocator's blocks); not recorded op by op: `diagnose/vit-tiny` records it "
    "on the next GPU run.",
}


def _ratio_rows(measured: list[OpMemory], predicted: list[OpMemory], peak: int) -> list[dict[str, Any]]:
    """The convolutions of two recordings of one step paired (``align_ops``), each with its
    measured transient over its activations; a pair whose new outputs differ by more than 1 % is
    taken as mispaired and left out, and a measured ``exception`` is marked (it is not fitted)."""
    rows = []
    for m, p in align_ops(measured, predicted):
        if m.op in CONV_OPS and p.conv_operands and abs(m.new_outputs - p.new_outputs) <= 0.01 * max(p.new_outputs, 1):
            rows.append({"op": m.op, "phase": m.phase, "index": m.index, "dtype": _KINDS[p.conv_itemsize >= 4],
                         "operands MiB": round(p.conv_operands / MiB, 2),
                         "transient MiB": round(m.transient / MiB, 2), "ratio": round(m.transient / p.conv_operands, 3),
                         "large": p.conv_operands >= SHARE * peak, "exception": exception(p)})
    return rows


def diagnosed_ratios(runs: Path | None = None, log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """Case -> ``{"run": its run's label, "folder": its run's folder, "rows": its convolutions'
    rows (``_ratio_rows``)}`` for every case diagnosed under ``runs``, each from the newest run
    that diagnosed it (``recorded.diagnosis``); its prediction is run again here op by op."""
    out = {}
    for case, (build, shape, kw) in diagnose.cases(dry_run=False).items():
        found = recorded_ops(case, runs)
        if found is None:
            continue
        measured, label, path = found
        t = time.process_time()
        predicted, _ = predict_ops(build, shape, kw.pop("target_shape", None), **kw)
        out[case] = {"run": label, "folder": path.parent.parent.name,
                     "start above the prediction MiB": round((measured[0].before - predicted[0].before) / MiB, 1),
                     "rows": _ratio_rows(measured, predicted, max(r.peak for r in measured))}
        log(f"diagnose/{case} ({label}): {len(out[case]['rows'])} convolutions paired "
            f"({time.process_time() - t:.1f} CPU-s)")
    return out


def _large(ratios: dict[str, dict[str, Any]], op: str, dtype: str) -> list[float]:
    return sorted(r["ratio"] for case in ratios.values() for r in case["rows"]
                  if r["large"] and not r["exception"] and r["op"] == op and r["dtype"] == dtype)


def fitted_rule(ratios: dict[str, dict[str, Any]], source: str) -> WorkspaceRule:
    """The median ratio over the large convolutions of every case, for each of forward and
    backward, 16-bit and fp32 (an fp32 factor without a convolution of its own is the 16-bit one)."""
    med: dict[str, float | None] = {}
    for op, family in CONV_OPS.items():
        for dtype in ("16-bit", "fp32"):
            values = _large(ratios, op, dtype)
            med[f"{family} {dtype}"] = round(statistics.median(values), 3) if values else None
        if med[f"{family} 16-bit"] is None:
            med[f"{family} 16-bit"] = med[f"{family} fp32"]
        if med[f"{family} 16-bit"] is None:
            raise RecordError(f"no {op} large enough to fit the rule in the run's diagnosis.", _FIX)
    n = sum(r["large"] and not r["exception"] for case in ratios.values() for r in case["rows"])
    return WorkspaceRule(med["forward 16-bit"], med["backward 16-bit"],
                         f"fitted on {source}: the median transient / activations of its {n} convolutions "
                         f"with activations >= {SHARE:.0%} of their step's peak, the measured exceptions left out", med["forward fp32"], med["backward fp32"])


def _benchmark_rows(runs: Path | None) -> list[dict[str, Any]]:
    rows = []
    for net in benchmark.NETS:
        rec = explorer.recorded_benchmark(net, runs)
        if rec is None:
            continue
        cfgs = benchmark.configs(net)
        table = explorer.benchmark_table(rec, cfgs)  # the budget's largest batch under the context the cap left out
        for r in rec.rows:
            cfg = cfgs.get(r.get("technique"))
            if cfg is None:
                continue
            batches = {k: int(table.loc[cfg.describe(), f"largest batch in {cfg.budget_gib} GiB, {k}"])
                       for k in ("predicted", "measured")}
            step = batch_steps(cfg)
            rows.append({"row": f"{net} net: {r['technique']}", "measured": r["measured peak MiB"],
                         "predict": lambda step=step, b=cfg.batch: step(b), "step": step, "batches": batches,
                         "reserved / allocated": round(r["measured reserved MiB"] / r["measured peak MiB"], 2)
                         if r.get("measured reserved MiB") else None,
                         "cap": None if rec.context_mib is None else cfg.budget_gib * GiB - rec.context_mib * MiB})
    return rows


def batch_steps(cfg: explorer.Config) -> Callable[[int], tuple[list[OpMemory], int]]:
    """``cfg``'s step at a batch, predicted op by op (``predict_ops``: ``(rows, plain peak)``),
    once per batch: every rule's peak at that batch reads the same rows."""
    dtype, ac = explorer.PRECISIONS[cfg.precision]

    @functools.cache
    def at(b: int) -> tuple[list[OpMemory], int]:
        c = replace(cfg, batch=b)
        return predict_ops(lambda: explorer.build(c), (b, 1, *c.volume), n_classes=5, dtype=dtype, autocast_dtype=ac)

    return at


def largest_batch(step: Callable[[int], tuple[list[OpMemory], int]], cap: float, rule: WorkspaceRule, held: int,
                  hint: int | None = None) -> int:
    """The largest batch whose step (``batch_steps``), with ``rule``'s workspaces, plus the
    ``held`` bytes, fits ``cap`` bytes of allocator (the benchmark's cap: the card less the
    context its process measured); ``memory.largest_that_fits``, ``hint`` tried first."""
    def fits(b: int) -> bool:
        return peak_with_workspaces(*step(b), rule).peak + held <= cap

    return largest_that_fits(fits, start=1, limit=64, at_limit="return", hint=hint if hint and hint < 64 else None)


def _example_rows(runs: Path | None) -> list[dict[str, Any]]:
    rows = []
    found = recorded.kit_results("examples/seed003", runs)
    for r in found[-1][1].get("rows", []) if found else []:
        if r.get("N") in LIMIT_NS and r.get("measured peak MiB"):
            cube = (1, 1, r["N"], r["N"], r["N"])
            rows.append({"row": f"seed 003's net, N = {r['N']}", "measured": r["measured peak MiB"], "volume": 4 * r["N"] ** 3,
                         "predict": lambda cube=cube: predict_ops(LimitTestNet, cube, cube, optimizer=None,
                                                                  steady_state=False)})
    found = recorded.kit_results("examples/densenet", runs)
    args = seed004_step_args()
    shape = args.pop("input_shape")
    for r in found[-1][1].get("rows", []) if found else []:
        eff = "memory-efficient" in str(r.get("case"))
        if r.get("measured peak MiB"):
            rows.append({"row": f"seed 004's {r['case']}", "measured": r["measured peak MiB"],
                         "predict": lambda eff=eff: predict_ops(lambda: densenet169(memory_efficient=eff), shape, **args)})
    found = recorded.kit_results("examples/fit", runs)
    for r in found[-1][1].get("rows", []) if found else []:
        name = str(r.get("case", "")).split(" ")[0]
        if name in FIT_EXAMPLES and r.get("measured peak MiB"):
            build, full, _, classes = FIT_EXAMPLES[name]
            ac = torch.float16 if "autocast" in r["case"] else None
            rows.append({"row": f"fit's {r['case']}", "measured": r["measured peak MiB"],
                         "predict": lambda build=build, full=full, classes=classes, ac=ac: predict_ops(
                             variant(build, "plain"), full, (full[0],), n_classes=classes, autocast_dtype=ac)})
    return rows


def _pct(predicted: float, measured: float) -> float:
    return round(100 * (predicted - measured) / measured, 1)


def cublas_held(runs: Path | None = None) -> tuple[int, tuple[int, int] | None]:
    """``(bytes, capability)``: the cuBLAS workspaces the newest run's ``diagnose/cublas`` task
    left allocated in the kit's process -- kept by their handles for the process's life, so held
    before every later task's step -- and the card's compute capability (0 and None without it)."""
    found = recorded.kit_results("diagnose/cublas", runs)
    if not found:
        return 0, None
    result, path = found[-1][1], found[-1][2]
    phases = result.get("phases") if isinstance(result.get("phases"), dict) else {}
    kept = [r for rows in phases.values() for r in recorded.checked_rows(rows, {"kept MiB"}, path, "cuBLAS's phases")]
    cap = result.get("capability")
    return round(sum(r["kept MiB"] for r in kept) * MiB), (tuple(cap) if isinstance(cap, list) and len(cap) == 2 else None)


def model_rows(rule: WorkspaceRule, held: int, capability: tuple[int, int] | None, runs: Path | None = None,
               log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every recorded peak of the newest runs under ``runs``: measured, predicted plain and with
    ``rule``'s workspaces plus cuBLAS's -- the ``held`` bytes the kit's process kept from earlier
    tasks (``cublas_held``), or ``fit``'s own cuBLAS term for a step with a matrix product if that
    is larger (the same handles: never both) --, both misses in %."""
    out = []
    for r in _benchmark_rows(runs) + _example_rows(runs):
        t = time.process_time()
        ops, plain = r["predict"]()
        w = peak_with_workspaces(ops, plain, rule)
        own = cublas_workspaces(capability, 2)[0] if any(o.op in CUBLAS_OPS for o in ops) else 0
        cublas = max(held, own)
        model = w.peak + cublas
        m = r["measured"]
        row = {"row": r["row"], "measured peak MiB": m, "predicted MiB": round(plain / MiB, 1), "miss %": _pct(plain / MiB, m),
               "plain + cuBLAS miss %": _pct((plain + cublas) / MiB, m),
               "with workspaces MiB": round(model / MiB, 1), "model miss %": _pct(model / MiB, m),
               "cuDNN workspace MiB": round(w.added / MiB, 1), "cuBLAS workspaces MiB": round(cublas / MiB, 1),
               "peak at": w.where()}
        if r.get("volume"):  # seed 003: the model's miss in input volumes (4 N^3 bytes)
            row["model miss, input volumes"] = round((m * MiB - model) / r["volume"], 2)
        if r.get("cap") and r["batches"]["measured"] is not None:  # the benchmark's largest batch, three ways
            hint = r["batches"]["predicted"]
            row["largest batch"] = {"measured": r["batches"]["measured"], "budget's prediction": hint,
                                    "tensors only": largest_batch(r["step"], r["cap"], NO_WORKSPACE, held, hint),
                                    "with workspaces": largest_batch(r["step"], r["cap"], rule, held, hint),
                                    "reserved / allocated at batch 2": r["reserved / allocated"]}
        if w.at is not None and row["model miss %"] > 100 * TOLERANCE:  # what the measurement leaves for it
            row[_RULE_THERE] = round(w.workspace / MiB, 1)
            row["workspace the measurement allows MiB"] = round(max(0.0, m - (model - w.workspace) / MiB), 1)
        out.append(row)
        batches = "".join(f"; largest batch {k} {v}" for k, v in row.get("largest batch", {}).items())
        log(f"{r['row']}: measured {m:,.0f}, predicted {plain / MiB:,.0f} ({row['miss %']:+}%), "
            f"model {model / MiB:,.0f} ({row['model miss %']:+}%){batches} [{time.process_time() - t:.1f} CPU-s]")
    return out


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def within(key: str) -> int:
        return sum(abs(r[key]) <= 100 * TOLERANCE for r in rows)

    batches = [r["largest batch"] for r in rows if "largest batch" in r]
    ways = ("budget's prediction", "tensors only", "with workspaces")
    return {"rows": len(rows), "plain within 5 %": within("miss %"), "plain + cuBLAS within 5 %": within("plain + cuBLAS miss %"),
            "model within 5 %": within("model miss %"),
            "largest batches": len(batches),
            "largest batch as measured": {k: sum(b[k] == b["measured"] for b in batches) for k in ways},
            "largest batch above the measured": {k: sum(b[k] > b["measured"] for b in batches) for k in ways},
            "model over by more than 5 %": [r["row"] for r in rows if r["model miss %"] > 100 * TOLERANCE],
            "model under by more than 5 %": [r["row"] for r in rows if r["model miss %"] < -100 * TOLERANCE]}


def _largest_batch_lines(result: dict[str, Any]) -> list[str]:
    """workspaces.md's section on the largest batch under the benchmark's cap ([] without one)."""
    batched = [r for r in result["rows"] if "largest batch" in r]
    if not batched:
        return []
    s, lines = result["summary"], []
    ways = ("budget's prediction", "tensors only", "with workspaces")
    lines += ["", "## The largest batch under the benchmark's cap", "",
              "The benchmark searched each technique's largest batch on the GPU under an allocator cap of the "
              "card less the CUDA context its process measured. Beside it: the batch the course's budget "
              "predicts (the plain prediction + 10 % slack, under the same context: `explorer.benchmark_table`, "
              "notebook 10), and the largest batch "
              "whose peak fits the cap predicted op by op, tensors only and with the workspaces (both with the "
              "cuBLAS workspaces the process held). "
              + "; ".join(f"{k}: {s['largest batch as measured'][k]} of {s['largest batches']} as measured, "
                          f"{s['largest batch above the measured'][k]} above it" for k in ways) + ".", "",
              "| row | measured | " + " | ".join(ways) + " |", "|---|---|---|---|---|"]
    for r in batched:
        b = r["largest batch"]
        lines.append(f"| {r['row']} | {b['measured']} | " + " | ".join(str(b[k]) for k in ways) + " |")
    above = [r for r in batched if r["largest batch"]["with workspaces"] > r["largest batch"]["measured"]]
    ratios = sorted(r["largest batch"]["reserved / allocated at batch 2"] or 0 for r in batched)
    if above:
        listed = "; ".join(f"{r['row']}: {r[_LB][_RA]}" for r in above)
        lines += ["", "Not explained, where the model's batch is above the measured one: the step's allocated "
                  "peak fits the cap, yet the GPU could not run it under the cap. The cap limits what the allocator "
                  "reserves, and what a step reserves beyond what it allocates depends on how its blocks fragment, "
                  "which the model does not simulate (reserved / allocated at batch 2, measured without a cap: "
                  f"{listed}; the median over the {len(batched)} rows: {statistics.median(ratios)}). The model "
                  "carries no slack; the budget carries 10 %. The allocator model (notebook 02, section 6) is "
                  "the tool for this; it does not take the workspaces yet."]
    return lines


def markdown(result: dict[str, Any]) -> str:
    """``workspaces.md``: the rule's fit op by op, then every recorded peak against the model."""
    rule, s = result["rule"], result["summary"]
    lines = [f"# cuDNN's convolution workspaces: the model against {result['run']}", "",
             "Generated by `python -m course_utils.gpu_kit.workspace_check` from this run's records "
             "(`memory.workspaces` says what the model is). Predicted: fake tensors, op by op, CUDA's rules, "
             "the step as the kit measured it.", "",
             "## The rule, op by op", "",
             "Each convolution's transient (the memory it took and gave back before it returned) over its two "
             "activations (input + output in forward, input + output gradient in backward), for the convolutions "
             "whose activations are at least 5 % of their step's peak: min / median / max (how many; the measured "
             "exceptions that took nothing, `memory.workspaces.exception`, are counted here and left out of the fit).", "",
             "| case | run | convolutions paired | forward | backward | allocated before the step, above the prediction's, MiB |",
             "|---|---|---|---|---|---|"]
    for case, found in result["ratios"].items():
        rows, cells = found["rows"], []
        for op in CONV_OPS:
            v = sorted(r["ratio"] for r in rows if r["large"] and r["op"] == op)
            cells.append(f"{v[0]} / {statistics.median(v)} / {v[-1]} ({len(v)})" if v else "none")
        lines.append(f"| {case} | {found['run']} | {len(rows)} | {cells[0]} | {cells[1]} "
                     f"| {found['start above the prediction MiB']:,} |")
    lines += ["", "The last column is memory the GPU held before the step's first op that the prediction does not. "
              f"{result['cuBLAS held MiB']:,} MiB of it are the cuBLAS workspaces the kit's `diagnose/cublas` task "
              "left in its process (kept by their handles for the process's life, so held before every later task's "
              "step): the model below adds them to every row; a learner's own process holds them only once its step "
              "runs a matrix product. The rest, a few MiB, is not modelled (the allocator's rounding of large "
              "blocks is a part of it).", "",
              f"Fitted: workspace = factor x activations, the factor {rule['forward']} forward / {rule['backward']} backward "
              f"for 16-bit convolutions, {rule['forward_fp32']} / {rule['backward_fp32']} for fp32 ones ({rule['source']}).", "",
              "## Every recorded peak against the model", "",
              f"Within 5 %: {s['plain within 5 %']} of {s['rows']} rows predicted plain, {s['plain + cuBLAS within 5 %']} "
              f"with the cuBLAS workspaces added (what the kit's process held, or `fit`'s own term for a step with a "
              f"matrix product where larger), {s['model within 5 %']} with cuDNN's too, by the rule. The three diagnosed "
              "steps, whose convolutions the factors were fitted on, are among the rows. "
              "Miss % = (predicted - measured) / measured.", "",
              "| row | measured MiB | predicted MiB | miss % | with workspaces MiB | miss % | cuDNN + cuBLAS MiB "
              "| the model's peak |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['row']} | {r['measured peak MiB']:,} | {r['predicted MiB']:,} | {r['miss %']} "
                     f"| {r['with workspaces MiB']:,} | {r['model miss %']} "
                     f"| {r['cuDNN workspace MiB']:,} + {r['cuBLAS workspaces MiB']:,} | {r['peak at']} |")
    seed = [r for r in result["rows"] if "model miss, input volumes" in r]
    if seed:
        lines += ["", "Seed 003's net, measured - model, in input volumes (4 N^3 bytes): "
                  + "; ".join(f"{r['row'].split(', ')[1]}: {r['model miss, input volumes']}" for r in seed) + "."]
    lines += _largest_batch_lines(result)
    over = [r for r in result["rows"] if r["model miss %"] > 100 * TOLERANCE]
    lines += ["", "**Over by more than 5 %** (the measured peak leaves the op the model peaks at less workspace than "
              "the rule gives it; its predicted live bytes before the op taken as right): "
              + ("; ".join(f"{r['row']}: the rule {r[_RULE_THERE]:,.0f} MiB, at most "
                           f"{r['workspace the measurement allows MiB']:,.0f} MiB allowed" for r in over) or "none") + "."]
    under = s["model under by more than 5 %"]
    lines += ["", "**Under by more than 5 %**: " + (", ".join(under) if under else "none") + "."]
    lines += ["", "## Causes of the rows the model leaves beyond 5 %", ""] + [
        f"* **{prefix}**: {cause}" for prefix, cause in CAUSES.items()
        if any(r["row"].startswith(prefix) for r in result["rows"] if abs(r["model miss %"]) > 100 * TOLERANCE)]
    return "\n".join(lines) + "\n"


def check(runs: Path | None = None, log: Callable[[str], None] = print) -> tuple[dict[str, Any], Path]:
    """The whole check on the GPU runs under ``runs``: the rule fitted on the newest diagnosis of
    each case, every recorded row (the newest run's of each task) against it. Writes
    ``workspaces.md`` and ``workspaces.json`` into the newest run that diagnosed a case; returns
    what they hold and that folder."""
    ratios = diagnosed_ratios(runs, log)
    if not ratios:
        raise RecordError(f"{recorded.runs_folder(runs)} holds no run with a diagnosis "
                          "(details/diagnose-<case>.json).", _FIX)
    run = recorded.runs_folder(runs) / max(case["folder"] for case in ratios.values())
    _, machine, _ = recorded.read_kit(run / "kit.json")
    rule = fitted_rule(ratios, " and ".join(sorted({case["run"] for case in ratios.values()})))
    held, cap = cublas_held(runs)
    rows = model_rows(rule, held, cap, runs, log)
    result = {"run": recorded.run_label(machine), "rule": asdict(rule), "cuBLAS held MiB": round(held / MiB, 1),
              "ratios": ratios, "rows": rows, "summary": _summary(rows)}
    atomic_write(run / "workspaces.json", json.dumps(result, indent=1) + "\n")
    atomic_write(run / "workspaces.md", markdown(result))
    return result, run


def main(argv: list[str] | None = None) -> int:
    """The command line (the module docstring); exit 2 with the fix on a bad --runs."""
    ap = argparse.ArgumentParser(prog="python -m course_utils.gpu_kit.workspace_check",
                                 description="the convolution-workspace model against a GPU run's records")
    ap.add_argument("--runs", default=None, help="the GPU runs' folder (default: docs/gpu-runs)")
    a = ap.parse_args(argv)
    try:
        if a.runs is not None and not Path(a.runs).is_dir():
            raise RecordError(f"--runs {a.runs}: no such folder.", "pass the folder that holds the GPU runs (docs/gpu-runs).")
        result, run = check(Path(a.runs) if a.runs else None)
    except RecordError as err:
        print(f"workspace_check: {err}", file=sys.stderr)
        return 2
    print(f"wrote {run / 'workspaces.md'}: {result['summary']['model within 5 %']} of {result['summary']['rows']} "
          f"rows within 5 % ({result['summary']['plain within 5 %']} predicted plain)")
    return 0


guard(globals(), RecordError)

if __name__ == "__main__":
    sys.exit(main())
