"""How long the grader takes on a class: a benchmark, not a test (the figure depends on the machine).

    python tools/grading_benchmark.py OUT.json [--repo PATH] [--label TEXT] [-- GRADER OPTIONS...]
    python tools/grading_benchmark.py --render     # docs/teaching.md's table from benchmarks/results/grading-*.json

builds a mixed class from this repository -- every exercise's solution, its first typical wrong
answer from ``tests/wrong_answers/``, and the untouched exercise of 00-07 (32 submissions with
12 exercises) -- and times ``python -m course_utils.grading.grade`` on it, run from ``--repo``
(default: this checkout; give an older checkout to measure the grader before a change), with the
options after ``--``. It writes the wall time, the CPU-seconds of the grader and every process it
started (``getrusage(RUSAGE_CHILDREN)``: each process is waited for by its parent, the namespaced
runs' by their init, so all are counted), the machine (cores, load before and after), the
grader's own summary line and every row's score and seconds to OUT.json, and checks the scores:
every solution full marks, every untouched exercise 0, every wrong answer below full marks.
CPU-seconds are the figure to compare across machines and loads: on a loaded machine wall time
stretches, and CPU-seconds stretch less (shared cores and caches still slow each instruction).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
UNTOUCHED = ("00", "01", "02", "03", "04", "05", "06", "07")
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "teaching.md"
BEGIN, END = "<!-- BEGIN grading-benchmark -->", "<!-- END grading-benchmark -->"


def _wrong(nn: str):
    spec = importlib.util.spec_from_file_location(f"wrong{nn}", ROOT / "tests" / "wrong_answers" / f"ex{nn}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.WRONG[0]


def build_class(folder: Path) -> dict[str, str]:
    """The 30 notebooks, and what each is (solution / wrong / untouched)."""
    kinds = {}
    for sol in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nn = sol.name[:2]
        text = sol.read_text()
        (folder / f"{nn}_solution.ipynb").write_text(text)
        kinds[f"{nn}_solution.ipynb"] = "solution"
        what, old, new, _parts = _wrong(nn)
        nb = nbformat.reads(text, as_version=4)
        for cell in nb.cells:
            if old in cell.source:
                cell.source = cell.source.replace(old, new, 1)
                break
        else:
            raise SystemExit(f"{sol.name}: the wrong answer {what!r} does not apply")
        nbformat.write(nb, folder / f"{nn}_wrong.ipynb")
        kinds[f"{nn}_wrong.ipynb"] = "wrong"
        if nn in UNTOUCHED:
            ex = next((ROOT / "exercises").glob(f"{nn}_*.ipynb"))
            (folder / f"{nn}_untouched.ipynb").write_text(ex.read_text())
            kinds[f"{nn}_untouched.ipynb"] = "untouched"
    return kinds


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog="python tools/grading_benchmark.py")
    ap.add_argument("out", nargs="?", help="the JSON file to write")
    ap.add_argument("--repo", default=str(ROOT), help="the checkout whose grader runs (default: this one)")
    ap.add_argument("--label", default="", help="what this grader is, for the table")
    ap.add_argument("--render", action="store_true", help="rewrite docs/teaching.md's table from the results")
    args = ap.parse_args(argv)
    if args.render:
        text = DOC.read_text()
        DOC.write_text(text[:text.index(BEGIN)] + render() + text[text.index(END) + len(END):])
        return 0
    if not args.out:
        ap.error("give OUT.json (or --render)")
    with tempfile.TemporaryDirectory(prefix="grading-benchmark-") as tmp:
        folder = Path(tmp) / "class"
        folder.mkdir()
        kinds = build_class(folder)
        report = Path(tmp) / "class.json"
        load_before = os.getloadavg()[0]
        t0 = time.monotonic()
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-m", "course_utils.grading.grade", str(folder), "--json", str(report),
                               "--no-progress", *extra], cwd=args.repo, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=args.repo))
        wall = time.monotonic() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        if proc.returncode != 0 or not report.exists():
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            return 1
        rows = json.loads(report.read_text())
    problems = []
    for r in rows:
        kind = kinds[r["submission"]]
        if kind == "solution" and r["score"] != r["max_score"]:
            problems.append(f"{r['submission']}: {r['score']}/{r['max_score']}")
        if kind == "untouched" and r["score"] != 0:
            problems.append(f"{r['submission']}: {r['score']}/{r['max_score']}")
        if kind == "wrong" and r["score"] >= r["max_score"]:
            problems.append(f"{r['submission']}: full marks")
    git = subprocess.run(["git", "-C", args.repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out = {"label": args.label, "date": datetime.date.today().isoformat(), "commit": git.stdout.strip(),
           "options": extra, "submissions": len(rows),
           "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cores": len(os.sched_getaffinity(0)), "cpu": platform.processor() or platform.machine(),
           "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
           "grader_says": proc.stdout.strip().splitlines()[-1], "wrong_scores": problems,
           "rows": [{k: r[k] for k in ("submission", "score", "max_score", "seconds")} for r in rows]}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"{len(rows)} submissions in {wall:.0f} s ({wall / 60:.1f} min), {cpu / len(rows):.1f} CPU-s a submission, "
          f"on {out['cores']} cores, load "
          f"{out['load_before']} -> {out['load_after']}; commit {out['commit']} {' '.join(extra)}")
    if problems:
        print("unexpected scores:", *problems, sep="\n  ")
        return 1
    return 0


def render() -> str:
    """The block of docs/teaching.md: one row per recorded benchmark, the slowest first."""
    runs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("grading-*.json"))]
    lines = [BEGIN]
    if runs:
        lines += ["Measured by `python tools/grading_benchmark.py`: a mixed class (each exercise's solution and its first "
                  f"typical wrong answer, and the untouched exercises {UNTOUCHED[0]}-{UNTOUCHED[-1]}: 30 submissions "
                  "with 11 exercises, 32 with 12) on a 2-core x86_64 machine; in every run every solution scored full "
                  "marks, every untouched exercise 0, every wrong answer less than full. CPU-seconds count the grader "
                  "and every process it started.", "",
                  "| grader | date, load before -> after | submissions | class | per submission | CPU-s per submission |",
                  "|---|---|---|---|---|---|"]
        for r in sorted(runs, key=lambda r: r["wall_s"], reverse=True):
            options = f" `{' '.join(r['options'])}`" if r["options"] else ""
            cpu = f"{r['cpu_s'] / r['submissions']:.1f}" if "cpu_s" in r else "not measured"
            lines.append(f"| {r['label'] or r['commit']}{options} | {r['date']}, {r['load_before']} -> {r['load_after']} "
                         f"| {r['submissions']} | {r['wall_s'] / 60:.1f} min | {r['wall_s'] / r['submissions']:.1f} s | "
                         f"{cpu} |")
        lines += ["", "Compare runs made under the same load: the load says how much of the machine the grader had "
                  "(at load 10 on 2 cores it shares them with about ten runnable processes, and its CPU-seconds grow "
                  "too, as the cores and caches are shared). The 2026-11-24 runs ran side by side at load 10; the "
                  "2026-11-28 runs one after the other with no other job on the machine (a load above 1 is the decaying "
                  "average of the job before, and the grader's own two workers)."]
    lines.append(END)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
