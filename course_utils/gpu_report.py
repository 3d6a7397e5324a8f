"""The GPU kit: one command runs the course on a CUDA GPU and records what the GPU showed.

    python -m course_utils.gpu_report OUTDIR            # on a machine with CUDA (no network needed)
    python -m course_utils.gpu_report OUTDIR --dry-run  # on a CPU: every step but the CUDA measurements

Steps (``--only`` picks some, e.g. ``--only tests benchmark``, to fit a time limit per command):

1. ``tests``     -- the ``gpu``-marked tests (predictor vs allocator, CUDA autocast vs its
                    emulation, allocator demos, OOM handling);
2. ``notebooks`` -- every notebook executed at ``COURSE_SIZE=full`` with nbclient (a per-cell
                    timeout), kept executed; the cells' ``recorded.record`` figures are collected;
3. ``benchmark`` -- ``course_utils.benchmark`` on both seed 000 nets: every technique predicted
                    and measured (steady-state ``max_memory_allocated``, reserved, step time, the
                    largest batch in an 8 GiB card), with the prediction's miss in %;
4. ``limit``     -- seed 003's net at three N, predicted vs measured;
5. ``peaks``     -- where a prediction misses, why: for seed 003's net and seed 000's small net
                    in fp16 (the first GPU run's misses, 16 % and 6 %) and the large net in fp32
                    (its control, 0.3 %), the step measured with ``cudnn.benchmark`` off and on,
                    and the blocks live at the measured peak with the C++ and Python frames that
                    made them (``allocator.peak_blocks``): a cuDNN workspace names itself;
6. the summary (``summary.md``, ``summary.json``), the recorded figures as the repository keeps
   them (``repo/recorded/<gpu>.json``, ``repo/benchmarks/results/<gpu>.*``: copy ``repo/`` over
   the repository root to commit them), and one archive of everything, ``gpu-report.tar.gz``.

``--dry-run`` runs the same code path on a CPU with tiny sizes and without CUDA measurements; the
test suite runs it (``tests/test_gpu_report.py``), so the kit cannot rot between GPU runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import torch

from . import recorded
from .memory import MiB

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("tests", "notebooks", "benchmark", "limit", "peaks")
LIMIT_NS = (128, 256, 384)


def _log(msg: str) -> None:
    print(f"[gpu_report {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tests_command(out: Path) -> list[str]:
    """The pytest command of the ``tests`` step: the gpu-marked tests, with the printed values of
    the passing ones (-rP) in the log and a JUnit XML beside it."""
    return [sys.executable, "-m", "pytest", "-q", "-rP", "-m", "gpu", "-p", "no:cacheprovider",
            "-p", "no:xdist", "-o", "addopts=", str(ROOT / "tests"), f"--junitxml={out / 'gpu-tests.xml'}"]


def run_tests(out: Path, dry_run: bool = False) -> dict[str, Any]:
    """The gpu-marked tests. A dry run only records the command: on a CPU every one of them is
    skipped, and ``make test`` already collects them (and says why each is skipped)."""
    cmd = tests_command(out)
    if dry_run:
        return {"returncode": None, "summary": "dry run: not run (gpu-marked tests need a GPU)",
                "seconds": 0.0, "ok": True, "command": " ".join(cmd)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    (out / "gpu-tests.log").write_text(proc.stdout + proc.stderr)
    last = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] or ["(no output)"]
    return {"returncode": proc.returncode, "summary": last[0], "seconds": round(time.perf_counter() - t0, 1),
            "ok": proc.returncode in (0, 5) and ("failed" not in last[0] and "error" not in last[0])}


def run_notebooks(out: Path, dry_run: bool, timeout: int, names: list[str] | None) -> dict[str, Any]:
    """Execute every notebook (full size on a GPU, tiny in a dry run), recording figures."""
    import nbformat
    from nbclient import NotebookClient

    raw = out / "recorded-raw"
    env = {"COURSE_SIZE": "tiny" if dry_run else "full", recorded.ENV_VAR: str(raw),
           "MPLBACKEND": "Agg", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    results = {}
    try:
        for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
            if names and path.name[:2] not in names:
                continue
            nb = nbformat.read(path, as_version=4)
            client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                    resources={"metadata": {"path": str(path.parent)}})
            t0 = time.perf_counter()
            try:
                client.execute()
                errors = [f"code cell {i}: {o.get('ename')}: {str(o.get('evalue', ''))[:300]}"
                          for i, c in enumerate(c for c in nb.cells if c.cell_type == "code")
                          for o in c.get("outputs", []) if o.get("output_type") == "error"]
            except Exception as err:  # a dead kernel, a timeout the client could not recover
                errors = [f"execution stopped: {type(err).__name__}: {str(err)[:300]}"]
            secs = round(time.perf_counter() - t0, 1)
            (out / "notebooks").mkdir(exist_ok=True)
            nbformat.write(nb, out / "notebooks" / path.name)
            results[path.name] = {"seconds": secs, "errors": errors}
            _log(f"{path.name}: {secs} s, {len(errors)} error(s)")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if not dry_run and results:  # each notebook's time at full size: the site's banners show it
        recorded.record("gpu/notebook_seconds", {n: r["seconds"] for n, r in results.items()}, folder=raw)
    return results


def run_limit(dry_run: bool) -> list[dict[str, Any]]:
    """Seed 003's net: the prediction against the CUDA allocator at three N."""
    from .limit_test import run_limit_test

    rows = []
    for n in ((16, 24, 32) if dry_run else LIMIT_NS):
        pred = run_limit_test(n)
        row = {"N": n, "predicted peak MiB": round(pred.peak / MiB, 1),
               "predicted after forward MiB": round(pred.after_forward / MiB, 1)}
        if not dry_run:
            meas = run_limit_test(n, device="cuda")
            row.update({"measured peak MiB": round(meas.peak / MiB, 1),
                        "measured after forward MiB": round(meas.after_forward / MiB, 1),
                        "miss %": round(100 * (pred.peak - meas.peak) / meas.peak, 1)})
        rows.append(row)
    return rows


def peak_cases() -> dict[str, tuple]:
    """The steps the ``peaks`` step opens up: name -> (build, input shape, keyword arguments of
    ``predict_step`` / ``measure_step``)."""
    from . import explorer as ex
    from .benchmark import configs
    from .limit_test import LimitTestNet

    cube = (1, 1, 128, 128, 128)
    cases = {"seed 003 net, N=128, first step": (LimitTestNet, cube, dict(target_shape=cube, optimizer=None,
                                                                          steady_state=False))}
    for net, technique in (("small", "fp16 model (seed 000)"), ("large", "baseline fp32")):
        cfg = configs(net)[technique]
        dtype, ac = ex.PRECISIONS[cfg.precision]
        cases[f"seed 000 {net} net, {technique}"] = (
            (lambda cfg=cfg: ex.build(cfg)), (cfg.batch, 1, *cfg.volume),
            dict(n_classes=5, dtype=dtype, autocast_dtype=ac))
    return cases


def run_peaks(out: Path, dry_run: bool) -> list[dict[str, Any]]:
    """Predicted vs measured peak for each of ``peak_cases``, with cuDNN's autotuner off and on,
    and (on a GPU) the largest blocks live at the measured peak, written to ``peaks.json``."""
    from . import allocator
    from .memory import measure_step, predict_step

    rows, detail = [], {}
    for name, (build, shape, kw) in peak_cases().items():
        pred = predict_step(build, shape, module_peaks=False, **kw)
        row: dict[str, Any] = {"case": name, "predicted peak MiB": round(pred.peak / MiB, 1),
                               "predicted peak in": "{} ({})".format(*pred.log.peak_location)}
        if not dry_run:
            saved, measured = torch.backends.cudnn.benchmark, {}
            try:
                torch.backends.cudnn.benchmark = False  # the step recorded: its blocks at the peak
                torch.cuda.empty_cache()
                peak, blocks = allocator.peak_blocks(
                    lambda: measured.__setitem__(False, measure_step(build, shape, **kw)))
                torch.backends.cudnn.benchmark = True
                torch.cuda.empty_cache()
                measured[True] = measure_step(build, shape, **kw)
            finally:
                torch.backends.cudnn.benchmark = saved
            for bench, m in measured.items():
                row[f"measured MiB, cudnn.benchmark={bench}"] = round(m.peak_allocated / MiB, 1)
            row["miss %"] = round(100 * (pred.peak - measured[False].peak_allocated) / measured[False].peak_allocated, 1)
            row["largest at the peak"] = "; ".join(f"{b.size / MiB:.1f} MiB {b.where(1)}" for b in blocks[:4])
            detail[name] = {"peak over the recording MiB": round(peak / MiB, 1),
                            "blocks": [{"MiB": round(b.size / MiB, 3), "frames": b.frames[:24]} for b in blocks[:20]]}
        rows.append(row)
        _log(f"peaks: {row}")
    (out / "peaks.json").write_text(json.dumps({"rows": rows, "blocks at the measured peak": detail}, indent=1) + "\n")
    return rows


def record_overheads(raw: Path) -> dict[str, Any]:
    """The CUDA context and the reserved/allocated ratio, which the explorer's Overheads use."""
    from .benchmark import cuda_context_bytes

    ctx = cuda_context_bytes()
    recorded.record("00/cuda_context", {"context_MiB": round(ctx / MiB, 1),
                                         "method": "mem_get_info used - memory_reserved, after a first conv"},
                    folder=raw)
    return {"context MiB": round(ctx / MiB, 1)}


def summarize(report: dict[str, Any]) -> str:
    lines = [f"# GPU report: {report['machine']['gpu']}",
             f"{report['machine']['date']}, torch {report['machine']['torch']} (CUDA "
             f"{report['machine']['cuda']}), {'DRY RUN on CPU' if report['dry_run'] else 'measured'}; "
             f"total {report['seconds']:.0f} s.", ""]
    if "tests" in report:
        t = report["tests"]
        lines += [f"## gpu tests: {'ok' if t['ok'] else 'FAILED'} ({t['summary']}, {t['seconds']} s)", ""]
    if "notebooks" in report:
        lines += ["## notebooks", "", "| notebook | seconds | errors |", "|---|---|---|"]
        for name, r in report["notebooks"].items():
            lines.append(f"| {name} | {r['seconds']} | {'; '.join(r['errors']) or 'none'} |")
        lines.append("")
    if "benchmark" in report:
        rows = report["benchmark"]["rows"]
        worst = [r for r in rows if "miss %" in r]
        lines += ["## predicted vs measured (steady-state max_memory_allocated)", ""]
        if worst:
            over = [r for r in worst if abs(r["miss %"]) > 5]
            lines.append(f"{len(worst)} rows; largest miss {max(abs(r['miss %']) for r in worst):.1f} %; "
                         f"{len(over)} row(s) beyond 5 %.")
        lines += ["", "| net | technique | predicted MiB | measured MiB | reserved MiB | miss % | step s |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['net']} | {r['technique']} | {r['predicted peak MiB']:,} | "
                         f"{r.get('measured peak MiB', '-')} | {r.get('measured reserved MiB', '-')} | "
                         f"{r.get('miss %', '-')} | {r.get('step s', '-')} |")
        lines.append("")
    if "limit" in report:
        lines += ["## seed 003's net", "", "| " + " | ".join(report["limit"][0]) + " |",
                  "|" + "---|" * len(report["limit"][0])]
        lines += ["| " + " | ".join(str(v) for v in r.values()) + " |" for r in report["limit"]]
    if "peaks" in report:
        lines += ["", "## what is live at the measured peaks (peaks.json has the frames)", ""]
        cols = list(dict.fromkeys(k for r in report["peaks"] for k in r))
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(str(r.get(c, "-")).replace("|", "/") for c in cols) + " |" for r in report["peaks"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course_utils.gpu_report",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder for the report (created)")
    ap.add_argument("--dry-run", action="store_true", help="CPU: every step but the CUDA measurements")
    ap.add_argument("--only", nargs="+", choices=STEPS, help="run only these steps")
    ap.add_argument("--notebooks", nargs="+", metavar="NN", help="only these notebooks (e.g. 00 02)")
    ap.add_argument("--cell-timeout", type=int, default=600, help="seconds per notebook cell")
    ap.add_argument("--nets", nargs="+", default=["large", "small"])
    ap.add_argument("--techniques", nargs="+", help="only these benchmark techniques")
    args = ap.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("error: no CUDA GPU (torch.cuda.is_available() is False). Fix: run on a GPU machine, "
              "or pass --dry-run to exercise the kit on a CPU.", file=sys.stderr)
        return 2
    if args.cell_timeout <= 0:
        ap.error("--cell-timeout must be > 0")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps = args.only or STEPS
    report: dict[str, Any] = {"machine": recorded.machine(), "dry_run": args.dry_run, "steps": list(steps)}
    t0 = time.perf_counter()
    raw = out / "recorded-raw"
    if not args.dry_run:
        report["overheads"] = record_overheads(raw)
    if "tests" in steps:
        _log("gpu-marked tests")
        report["tests"] = run_tests(out, args.dry_run)
    if "notebooks" in steps:
        _log("notebooks")
        report["notebooks"] = run_notebooks(out, args.dry_run, args.cell_timeout, args.notebooks)
    if "benchmark" in steps:
        from . import benchmark

        _log("benchmark")
        bench = benchmark.run(out / "repo" / "benchmarks" / "results", nets=tuple(args.nets),
                              measure=not args.dry_run, techniques=args.techniques, progress=True)
        report["benchmark"] = bench
        ratios = [r["measured reserved MiB"] / r["measured peak MiB"] for r in bench["rows"]
                  if r.get("measured peak MiB")]
        if ratios:
            recorded.record("gpu/reserved_over_allocated", {"max": round(max(ratios), 3),
                                                           "median": round(sorted(ratios)[len(ratios) // 2], 3)},
                            folder=raw)
    if "limit" in steps:
        _log("seed 003 limit test")
        report["limit"] = run_limit(args.dry_run)
    if "peaks" in steps:
        _log("what is live at the measured peaks")
        report["peaks"] = run_peaks(out, args.dry_run)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if raw.exists() and any(raw.glob("*.json")):
        name = recorded.file_stem(report["machine"]["gpu"]) + ".json"
        report["recorded"] = str(recorded.collect(raw, out / "repo" / "recorded" / name).relative_to(out))
    (out / "summary.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "summary.md").write_text(summarize(report))
    archive = out / "gpu-report.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for p in sorted(out.rglob("*")):
            if p.is_file() and p != archive:
                tar.add(p, arcname=str(p.relative_to(out)))
    _log(f"done in {report['seconds']:.0f} s: {out / 'summary.md'}, {archive}")
    failed = ("tests" in report and not report["tests"]["ok"]) or any(
        r["errors"] for r in report.get("notebooks", {}).values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
