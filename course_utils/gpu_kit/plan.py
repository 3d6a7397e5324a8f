"""The GPU kit's plan: every task, in the order of what it is worth, with the time it is expected
to take on the GPU machine and where that figure comes from. Python's standard library only, so
that docs/gpu-kit.md's table and ``--plan`` cost nothing.

Order (``planned``):

1. ``diagnose/*`` -- the open misses of the first GPU run, opened up op by op (``diagnose``):
   cuBLAS's workspace, seed 003's net (+16 % in backward), the small net in fp16 (+6 %), the large
   net in fp32 (the control, -0.3 %), the allocator model's peak reserved (304 vs 374 MiB); and
   what the convolution-workspace model (``memory.workspaces``) leaves open on the H200: the small
   net under autocast with the lean Up (the model 8.6 % over), fit's ViT-tiny (6.9 % under);
2. ``tests`` -- the ``gpu``-marked tests;
3. ``benchmark/large``, ``benchmark/small`` -- every technique on seed 000's nets, predicted and
   measured;
4. ``examples/*`` -- seed 003's net at three N, seed 004's DenseNet-169 (naive and memory-efficient),
   ``course_utils.fit``'s example networks, each predicted and measured;
5. ``notebook/NN`` -- every notebook at full size under nbval, the ones with the most cells that
   only a GPU runs first (ties: the shorter first, so that more of them finish in a window).

An estimate is what a recording measured, where one did (``recorded_seconds``); else the
2026-11-24 run's figure; else a stated guess. A notebook's guess is its measured CPU time at the
tiny preset (``results/timings.json``) scaled to one idle core (x cores / load average of that
measurement: its predictions are single-threaded Python), plus ``KERNEL_S`` to start pytest and
a kernel, plus ``GPU_CELL_S`` for each cell with a GPU branch (full-size steps, searches under a
capped allocator). The first window's recording replaces them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checks import RecordError, guard
from ..files import read_json, read_notebook, skipped

ROOT = Path(__file__).resolve().parent.parent.parent
#: what each window runs by default: a 15-minute loan less the machine's start (1-2 min), the
#: wheels' install and the kit's start (~20 s) and a margin to re-run a call that fails at once
DEFAULT_BUDGET_S = 540
#: what a 15-minute window has left for a second call after the first: 900 s less the machine's
#: start (~120 s), the first call (540 s and ~40 s of install, start and transfers) and a margin
SECOND_CALL_S = 120
WINDOW_CALLS = (DEFAULT_BUDGET_S, SECOND_CALL_S)
KERNEL_S = 8  # pytest, nbval and a kernel importing torch and course_utils (a guess)
GPU_CELL_S = 5  # a cell with a GPU branch at full size: a model built and a few steps (a guess)
UNKNOWN_NOTEBOOK_S = 60  # a notebook without a CPU timing (a guess)
#: source words of a cell that has a GPU branch (or a figure only a GPU records)
GPU_MARKERS = ("is_cuda", "torch.cuda.", "recorded.record", "backend_for(", "device_count(")
#: notebooks whose NCCL parts need two GPUs; on one they run their ranks with gloo on the CPU
MULTI_GPU = {"08": 2, "09": 2}

_RUN_1 = "measured 2026-11-24 on one H100 (docs/gpu-runs/2026-11-24-h100.md)"
#: name -> (seconds, where the figure comes from), in the plan's order
TASKS: dict[str, tuple[float, str]] = {
    "diagnose/cublas": (10, "guess: a few matrix products, forward and backward"),
    "diagnose/seed003": (30, "guess: the step at N = 128 under four settings, cuDNN's autotuner among them"),
    "diagnose/small-fp16": (45, "guess: four full-size steps op by op, and the live blocks at the peak"),
    "diagnose/large-fp32": (60, "guess: as the small net's, with the large net (0.13 s a step, " + _RUN_1 + ")"),
    "diagnose/small-autocast-lean": (45, "guess: as the small net's in fp16 (the 2026-11-27 run: 6.1 s), autocast "
                                     "and the lean Up"),
    "diagnose/vit-tiny": (20, "guess: fit's ViT-tiny at notebook 11's shape, four steps op by op"),
    "diagnose/allocator": (20, "guess: two steps of a small U-Net, real and replayed through the allocator model"),
    "tests": (35, _RUN_1 + ": 24 s of pytest, 35 s in all"),
    "benchmark/large": (100, "guess from 91 s " + _RUN_1 + ", when every largest-batch search stopped at "
                        "its first try; each now tries the predicted batch and the next first"),
    "benchmark/small": (100, "guess: as the large net's (the same volume)"),
    "examples/seed003": (11, _RUN_1),
    "examples/densenet": (30, "guess: DenseNet-169 at 512 x 512, batch 8, two variants"),
    "examples/fit": (40, "guess: three networks, fp32 and autocast fp16, each predicted and measured"),
}
GROUPS = ("diagnose", "tests", "benchmark", "examples", "notebook")


@dataclass(frozen=True)
class Planned:
    """A task of the plan: its name (``group/what``), expected seconds, their source, a note."""

    name: str
    estimate_s: float
    source: str
    note: str = ""

    @property
    def group(self) -> str:
        return self.name.split("/", 1)[0]


def _cells(path: Path) -> list[dict]:
    return read_notebook(path)["cells"]


def checked_timings(path: Path) -> dict[str, Any] | None:
    """``results/timings.json`` at ``path``, checked (``timings_problem``): the one reader of the
    file (the plan, README's tables, the scaffold, the release). None where it is absent;
    RecordError naming the file and the fix where it cannot be read or is not a timings file."""
    if not path.exists() and not path.is_symlink():
        return None
    fix = (f"restore it (`git checkout -- {path}`), or time the notebooks again "
           "(`python -m course_utils.readme --render --timings`)")
    data = read_json(path, "the notebooks' timings", fix)
    problem = timings_problem(data)
    if problem:
        raise RecordError(f"{path}: {problem}.", fix)
    return data


def read_timings(root: Path = ROOT) -> dict[str, Any]:
    """``results/timings.json`` under ``root`` ({} where it is absent, or, with a warning naming it,
    where it cannot be read or a row's seconds are not numbers: the plan's estimates are then guesses)."""
    try:
        return checked_timings(root / "results" / "timings.json") or {}
    except RecordError as err:
        skipped(err)
        return {}


def timings_problem(data: dict[str, Any]) -> str:
    """What makes ``data`` not a timings file (``readme.notebook_timings``' form), or ''."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0

    def meta_ok(m: Any) -> bool:
        return isinstance(m, dict) and all(number(m.get(k)) for k in ("cores", "load average before", "load average after")
                                           ) and all(isinstance(m.get(k), str) for k in ("date", "torch"))
    rows = data.get("rows")
    if not meta_ok(data.get("meta")):
        return "its meta needs the date and torch (strings), the cores and load averages (numbers >= 0)"
    if not isinstance(rows, dict) or not all(isinstance(r, dict) for r in rows.values()):
        return "its rows are not an object of notebook number -> row"
    for nn, r in rows.items():
        if not all(number(r[k]) for k in ("notebooks", "solutions") if k in r) or not isinstance(r.get("name", ""), str):
            return f"row {nn}: its seconds (notebooks, solutions) are not numbers >= 0"
        if "measured" in r and not meta_ok(r["measured"]):
            return f"row {nn}: its measured meta needs the date, torch, cores and load averages"
    return ""


def gpu_cells(path: Path) -> int:
    """Code cells of a notebook with a GPU branch (``GPU_MARKERS`` in their source)."""
    count = 0
    for cell in _cells(path):
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        count += cell["cell_type"] == "code" and any(m in src for m in GPU_MARKERS)
    return count


def notebook_estimate(nn: str, cells: int, timings: dict) -> tuple[float, str]:
    """A notebook's expected seconds at full size on the GPU machine, and how it was reckoned."""
    row = timings.get("rows", {}).get(nn)
    if not row or "notebooks" not in row:
        return UNKNOWN_NOTEBOOK_S + GPU_CELL_S * cells, f"guess: no CPU timing; {cells} GPU cells"
    meta = row.get("measured", timings.get("meta", {}))
    load = (meta.get("load average before", 1.0) + meta.get("load average after", 1.0)) / 2
    share = min(1.0, meta.get("cores", 1) / load) if load > 0 else 1.0
    cpu = row["notebooks"] * share
    secs = round(KERNEL_S + cpu + GPU_CELL_S * cells)
    return secs, (f"guess: {row['notebooks']} s at tiny on {meta.get('cores', '?')} cores at load {load:.1f} "
                  f"({cpu:.0f} s of one core) + {KERNEL_S} s start + {cells} GPU cells x {GPU_CELL_S} s")


def notebooks(root: Path = ROOT) -> list[Planned]:
    """The notebook tasks, most GPU cells first, then the shorter first."""
    timings = read_timings(root)
    rows = []
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nn, cells = path.name[:2], gpu_cells(path)
        secs, source = notebook_estimate(nn, cells, timings)
        note = f"{cells} GPU cells"
        if nn in MULTI_GPU:
            note += f"; its NCCL parts need {MULTI_GPU[nn]} GPUs (on one: gloo ranks on the CPU)"
        rows.append((-cells, secs, nn, Planned(f"notebook/{nn}", secs, source, note)))
    return [p for *_, p in sorted(rows, key=lambda r: r[:3])]


def planned(root: Path = ROOT, recorded_seconds: dict[str, float] | None = None) -> list[Planned]:
    """Every task in order; where a recording measured a task, its seconds are the estimate."""
    tasks = [Planned(name, secs, source) for name, (secs, source) in TASKS.items()] + notebooks(root)
    out = []
    for p in tasks:
        if recorded_seconds and p.name in recorded_seconds:
            p = Planned(p.name, round(recorded_seconds[p.name], 1), "measured by a recorded run", p.note)
        out.append(p)
    return out


def select(tasks: list[Planned], only: list[str] | None = None, skip: list[str] | None = None) -> list[Planned]:
    """The tasks named in ``only`` (a name, or a group: ``diagnose``, ``notebook/07``), less those
    in ``skip``. An unknown name raises ``ValueError`` naming the known ones."""
    names = [t.name for t in tasks]

    def matches(pattern: str) -> set[str]:
        hit = {n for n in names if n == pattern or n.startswith(pattern.rstrip("/") + "/")}
        if not hit:
            raise ValueError(f"no task or group {pattern!r}. Fix: use one of {', '.join(GROUPS)} or a task "
                             f"name: {', '.join(names)}")
        return hit

    keep = set(names) if not only else set().union(*(matches(p) for p in only))
    drop = set().union(*(matches(p) for p in skip)) if skip else set()
    return [t for t in tasks if t.name in keep - drop]


def calls(tasks: list[Planned], budgets: float | list[float] = DEFAULT_BUDGET_S) -> list[int]:
    """Which call of the kit (1, 2, ...) each task is expected to run in: call k has budget
    ``budgets[(k - 1) % len(budgets)]`` (one number: every call the same) and starts, in order,
    every task left that still fits it -- what the kit does, with the estimates for times. A task
    longer than every budget gets 0 (it never fits: raise ``--budget`` for it)."""
    cycle = [budgets] if isinstance(budgets, (int, float)) else list(budgets)
    call_of = [0 if t.estimate_s > max(cycle) else -1 for t in tasks]
    call = 0
    while -1 in call_of:
        call, used = call + 1, 0.0
        for i, t in enumerate(tasks):
            if call_of[i] == -1 and used + t.estimate_s <= cycle[(call - 1) % len(cycle)]:
                call_of[i], used = call, used + t.estimate_s
    return call_of


def plan_table(root: Path = ROOT) -> str:
    """The plan as a Markdown table (docs/gpu-kit.md's and docs/teaching.md's ``gpu-plan`` block): each
    task's window and call when every window holds ``WINDOW_CALLS``."""
    tasks = planned(root)
    call = calls(tasks, list(WINDOW_CALLS))
    per = len(WINDOW_CALLS)
    total = sum(t.estimate_s for t in tasks)
    lines = [f"Expected {total:,.0f} s in all: {-(-max(call) // per)} windows, each with a call of "
             f"`--budget {WINDOW_CALLS[0]}` and a second of `--budget {WINDOW_CALLS[1]}` (what a 15-minute "
             "window has left), each call starting, in this order, every task left that still fits its budget. "
             "Rendered from `course_utils/gpu_kit/plan.py` by `python -m course_utils.readme`; when the kit "
             "resumes, a recorded run's measured seconds replace these estimates.", "",
             "| # | task | expected s | window, call | from | note |", "|---|---|---|---|---|---|"]
    for i, (t, c) in enumerate(zip(tasks, call, strict=True), 1):
        where = f"{(c - 1) // per + 1}, {(c - 1) % per + 1}" if c else "too long: raise --budget"
        lines.append(f"| {i} | `{t.name}` | {t.estimate_s:g} | {where} | {t.source} | {t.note} |")
    return "\n".join(lines)


def slug(text: str) -> str:
    """A file-name-safe form: letters, digits, '.', '_' and '-' (what a GPU call's files may be named)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower() or "x"


guard(globals(), RecordError)
