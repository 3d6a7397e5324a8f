"""The GPU kit: the course on a CUDA GPU within a budget of seconds, recorded as it goes, resumed
where a recorded run stopped.

    tools/gpu_kit.sh --budget 540                        # on the GPU machine: the wheels, then the kit into $OUT
    python -m course_utils.gpu_report OUT --budget 540   # the same, with the wheels already importable
    python -m course_utils.gpu_report OUT --dry-run      # on a CPU: every task at tiny sizes, no CUDA readings
    python -m course_utils.gpu_report --plan             # the order, the estimates, what a resume skips
    python -m course_utils.gpu_report --import FILES_AT  # back home: docs/gpu-runs/, recorded/, benchmarks/results/

The tasks (``gpu_kit.plan``, in this order): the diagnosis of the first GPU run's misses, op by op
(``diagnose/*``); the ``gpu``-marked tests; the benchmark on both seed 000 nets; seed 003's net,
seed 004's DenseNet-169 and ``fit``'s example networks, predicted and measured (``examples/*``);
every notebook at full size under nbval, most GPU cells first (``notebook/NN``).

* **Budget**: a task starts only if its expected seconds fit what is left of ``--budget``; a task
  still running when the budget ends is stopped (its partial results kept: "cut (budget)"); a
  task that would not fit is "not run (budget)" and a shorter one after it may still run.
* **Recorded as it goes**: after every task the output folder is rewritten (each file whole):
  ``kit.json``, ``summary.md``, ``kit.log``, ``recorded.json``, ``details.tar.gz``,
  ``notebooks.tar.gz`` -- six files, within a GPU call's return limits (``gpu_kit.record``).
* **Resume**: a task a recorded run completed (``docs/gpu-runs/*/kit.json``, put there by
  ``--import``) is skipped; tasks that failed before run after the rest. ``--fresh`` runs
  everything, ``--redo TASK`` one task again.

The dry run is tested on every ``make test`` (``tests/test_gpu_report.py``), so the kit cannot rot
between GPU runs.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from . import recorded
from .benchmark import TECHNIQUES, cuda_context_bytes
from .checks import RecordError, guard
from .files import cannot_make, read_json
from .gpu_kit import budget, plan, record, summary, tasks, workspace_check
from .gpu_kit.budget import RECORDED, Clock, Record, Task
from .gpu_kit.importer import import_run
from .memory import MiB


def machine(dry_run: bool, raw: Path) -> dict[str, Any]:
    """What the run ran on; on a GPU, the CUDA context measured (and recorded, for the budgets)."""
    m: dict[str, Any] = {**recorded.machine(), "python": platform.python_version(), "cores": os.cpu_count(),
                         "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    if not dry_run:
        m["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        m["gpus"] = torch.cuda.device_count()
        ctx = cuda_context_bytes()
        m["context MiB"] = round(ctx / MiB, 1)
        recorded.record("00/cuda_context", {"context_MiB": m["context MiB"],
                                             "method": "mem_get_info used - memory_reserved, after a first conv"},
                        folder=raw)
        try:
            m["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            m["driver"] = None
        torch.cuda.empty_cache()
    return m


def checkout() -> dict[str, Any]:
    """Which code ran: the git commit where there is one, and whether the tree had changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=plan.ROOT, capture_output=True, text=True,
                              timeout=20)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=plan.ROOT,
                               capture_output=True, text=True, timeout=20)
        if head.returncode == 0:
            return {"commit": head.stdout.strip(), "changed files": len(dirty.stdout.splitlines())}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": None}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m course_utils.gpu_report", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", help="the output folder (created; on the GPU machine: $OUT)")
    ap.add_argument("--budget", type=float, default=plan.DEFAULT_BUDGET_S,
                    help=f"seconds the tasks may take in all (default {plan.DEFAULT_BUDGET_S}: a 15-minute loan less "
                         "the machine's start and a margin)")
    ap.add_argument("--dry-run", action="store_true", help="on a CPU: every task at tiny sizes, no CUDA readings")
    ap.add_argument("--only", nargs="+", metavar="TASK", help="only these tasks or groups (e.g. diagnose notebook/07)")
    ap.add_argument("--skip", nargs="+", metavar="TASK", help="not these tasks or groups")
    ap.add_argument("--fresh", action="store_true", help="ignore recorded runs: run every selected task")
    ap.add_argument("--redo", nargs="+", metavar="TASK", default=[], help="run these again even if recorded")
    ap.add_argument("--runs", help="the folder of recorded runs (default docs/gpu-runs)")
    ap.add_argument("--work", help="a folder for what does not come back (default: a new temporary folder)")
    ap.add_argument("--techniques", nargs="+", help="only these benchmark techniques")
    ap.add_argument("--plan", action="store_true", help="print the plan, with what a resume skips, and stop")
    ap.add_argument("--import", dest="import_from", metavar="FILES_AT",
                    help="put a returned run's files into docs/gpu-runs/, recorded/ and benchmarks/results/")
    return ap


def resolve(args: argparse.Namespace) -> tuple[list[plan.Planned], dict[str, str]]:
    """The selected tasks in the order they will run, and those a recorded run completed."""
    runs = [] if args.fresh else record.recordings(Path(args.runs) if args.runs is not None else record.RUNS)
    every = plan.planned(plan.ROOT, record.measured_seconds(runs, args.dry_run))
    redo = {t.name for t in plan.select(every, args.redo)} if args.redo else set()
    done = {k: v for k, v in record.completed(runs, args.dry_run).items() if k not in redo}
    chosen = plan.select(every, args.only, args.skip)
    failed = record.failed_before(runs, args.dry_run)
    return [t for t in chosen if t.name not in failed] + [t for t in chosen if t.name in failed], done


def print_plan(chosen: list[plan.Planned], done: dict[str, str], budget_s: float) -> None:
    """Print ``--plan``: each chosen task's expected seconds and the kit call (of ``budget_s``
    seconds) it would run in, or the recorded run that already has it; then what is left."""
    todo = [t for t in chosen if t.name not in done]
    call = dict(zip((t.name for t in todo), plan.calls(todo, budget_s), strict=True))
    print(f"{'task':<22} {'expected s':>10}  call  from")
    for t in chosen:
        where = f"recorded in {done[t.name]}" if t.name in done else f"{call[t.name] or 'too long'}"
        print(f"{t.name:<22} {t.estimate_s:>10g}  {where:<5} {t.source}{'; ' + t.note if t.note else ''}")
    left = sum(t.estimate_s for t in todo)
    print(f"\n{len(todo)} tasks left, expected {left:,.0f} s: {max(call.values(), default=0)} call(s) of "
          f"--budget {budget_s:g}")


#: the longest --budget: a week (the kit's deadlines are ``signal.setitimer`` timers, which overflow
#: past about 1e9 s; no lent machine is held that long)
MAX_BUDGET_S = 7 * 24 * 3600


def _is_folder(text: str) -> bool:
    try:
        return bool(text) and "\0" not in text and Path(text).is_dir()
    except OSError:  # a name too long
        return False


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse, before any work, what the kit would fail on later: a budget that is not a finite
    number of seconds > 0, an output or work folder that cannot be made, a ``--runs`` that is no
    folder, a technique the benchmark does not have. Each a ``RecordError`` naming the fix."""
    if not (math.isfinite(args.budget) and 0 < args.budget <= MAX_BUDGET_S):
        raise RecordError(f"--budget {args.budget:g} is not a number of seconds > 0 and <= {MAX_BUDGET_S} (a week).",
                          f"give the seconds the tasks may take in all, e.g. --budget {plan.DEFAULT_BUDGET_S}.")
    for option, value in (("OUT", args.out), ("--work", args.work)):
        why = cannot_make(value, folder=True) if value is not None else None
        if why:
            raise RecordError(f"{option} {value!r} cannot be the kit's folder: {why}.",
                              f"give {option} as a folder that exists or can be made" + (
                                  " (on the GPU machine: $OUT)." if option == "OUT" else
                                  ", or leave --work out for a new temporary folder."))
    if args.runs is not None and not _is_folder(args.runs):
        raise RecordError(f"--runs {args.runs!r} is not a folder: it would read as no recorded run.",
                          f"give the folder of recorded runs (default {record.RUNS}), or --fresh to run every task.")
    unknown = [t for t in args.techniques or () if t not in TECHNIQUES]
    if unknown:
        raise RecordError(f"--techniques: {', '.join(map(repr, unknown))} not techniques of the benchmark.",
                          f"name techniques of benchmark.TECHNIQUES (quoted): {', '.join(map(repr, TECHNIQUES))}.")


def check_workspaces(run: Path) -> None:
    """After an import: a GPU run (not a dry run) with an op-by-op diagnosis refits the
    convolution-workspace model and checks every recorded peak against it
    (``gpu_kit.workspace_check``, about 80 CPU-s), its page written beside the newest diagnosis."""
    diagnosed = any((run / "details").glob("diagnose-*.json"))
    if not diagnosed or read_json(run / "kit.json", "the imported run's kit.json",
                                  "import the run again").get("dry_run", True):
        return
    print("the workspace model against the runs (python -m course_utils.gpu_kit.workspace_check) ...")
    result, page = workspace_check.check(run.parent, log=lambda line: print(f"  {line}"))
    print(f"wrote {page / 'workspaces.md'}: {result['summary']['model within 5 %']} of {result['summary']['rows']} "
          f"rows within 5 % with the workspaces ({result['summary']['plain within 5 %']} predicted plain)")


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils.gpu_report``: import a returned run, print the plan, or run the kit.
    Returns the exit status (0: done, 1: a task failed or a return limit was passed, 2: an error)."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.import_from:
        try:
            imported = import_run(args.import_from)
            check_workspaces(imported)
        except RecordError as err:  # NotARun, or a file of the repository it cannot read or write
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    try:
        check_arguments(args)
    except RecordError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        chosen, done = resolve(args)
    except ValueError as err:
        ap.error(str(err))
    if args.plan:
        print_plan(chosen, done, args.budget)
        return 0
    if not args.out:
        ap.error("give the output folder (on the GPU machine: $OUT), or --plan / --import")
    if not args.dry_run and not torch.cuda.is_available():
        print("error: no CUDA GPU (torch.cuda.is_available() is False). Fix: run on a GPU machine, "
              "or pass --dry-run to exercise the kit on a CPU.", file=sys.stderr)
        return 2
    return run(args, chosen, done)


def run(args: argparse.Namespace, chosen: list[plan.Planned], done: dict[str, str]) -> int:
    """Run the ``chosen`` tasks not in ``done`` within ``args.budget`` seconds, saving the output
    folder after each; returns 1 if a task failed or the folder breaks a GPU call's return limits."""
    clock = Clock(args.budget)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="gpu-kit-"))
    work.mkdir(parents=True, exist_ok=True)
    log = record.Log(out / record.LOG)
    state: dict[str, Any] = {"kit": 1, "started": datetime.datetime.now().isoformat(timespec="seconds"),
                             "dry_run": args.dry_run, "budget_s": args.budget, "checkout": checkout(),
                             "options": {"techniques": args.techniques}, "tasks": []}
    kit = tasks.Kit(out, work, args.dry_run, log, state, summary=summary.render)
    state["machine"] = machine(args.dry_run, kit.raw)
    log(f"{state['machine']['gpu']}, torch {state['machine']['torch']}; budget {args.budget:g} s; work folder {work}")
    todo = []
    for p in chosen:
        if p.name in done:
            state["tasks"].append(Record(p.name, p.estimate_s, p.source, RECORDED, note=f"in {done[p.name]}").as_dict())
        else:
            todo.append(Task(p.name, p.estimate_s, p.source, tasks.build(kit, p.name), p.note))

    def on_record(rec: Record) -> None:
        state["elapsed_s"] = round(clock.elapsed(), 1)
        kit.save(rec)

    kit.save()
    try:
        records = budget.run_tasks(todo, clock, on_record, log)
    finally:
        state["elapsed_s"], state["finished"] = round(clock.elapsed(), 1), True
        kit.save()
    problems = record.check_limits(out)
    for p in problems:
        log(f"return limits: {p}")
    log(f"done in {clock.elapsed():.0f} s: {out / record.SUMMARY}")
    bad = [r.name for r in records if r.status in (budget.FAILED, budget.ERROR)]
    if bad:
        log(f"failed: {', '.join(bad)}")
    return 1 if bad or problems else 0


guard(globals(), RecordError)


if __name__ == "__main__":
    raise SystemExit(main())
