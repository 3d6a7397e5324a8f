"""The kit's tasks (``plan.TASKS`` and the notebooks), each a function of the run's ``Kit``, and
the ``Kit`` itself: where the run writes, and how it saves everything the moment a task ends.

Every task runs on a GPU, and in a dry run on a CPU through the same code at tiny sizes with the
CUDA readings left out, so that the kit cannot rot between GPU runs (``tests/test_gpu_report.py``).
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..checks import RecordError, guard
from ..files import atomic_write, read_json, skipped
from .. import benchmark, recorded
from ..densenet import densenet169, seed004_step_args
from ..fit import variant
from ..fit_examples import conv1d_net, resnet18_2d
from ..limit_test import run_limit_test
from ..memory import MiB, measure_step, predict_step
from . import diagnose, plan, record
from .budget import CUT, DRY, FAILED, PASSED, Clock, Record, run_bounded

LIMIT_NS = (128, 256, 384)  # seed 003's N on a GPU (the 2026-11-24 run's)


@dataclass
class Kit:
    """One run of the kit: ``out`` (what comes back from a GPU call, ``record.OUTPUTS``), ``work``
    (everything else: logs, raw figures, executed notebooks), the state written to ``kit.json``."""

    out: Path
    work: Path
    dry_run: bool
    log: record.Log
    state: dict[str, Any]
    root: Path = plan.ROOT
    details: dict[str, bytes] = field(default_factory=dict)
    summary: Callable[[dict[str, Any]], str] | None = None
    _packed: dict[str, tuple] = field(default_factory=dict, init=False, repr=False)  # archive -> its members' names and CRCs
    _dropped: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)  # archive -> what pack left out

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)

    @property
    def raw(self) -> Path:
        """Where ``recorded.record`` writes figures during the run (``$COURSE_RECORD_DIR``)."""
        return self.work / "recorded-raw"

    def detail(self, name: str, data: Any) -> None:
        """Keep ``data`` (bytes, text or JSON data) as ``name`` in ``details.tar.gz``."""
        if isinstance(data, bytes):
            self.details[name] = data
        elif isinstance(data, str):
            self.details[name] = data.encode()
        else:
            self.details[name] = (json.dumps(data, indent=1, default=str) + "\n").encode()

    def save(self, rec: Record | None = None) -> None:
        """Write every output file again (each atomically): the state with ``rec`` in it, the
        summary, the recorded figures, both archives."""
        if rec is not None:
            tasks = [t for t in self.state["tasks"] if t["name"] != rec.name]
            self.state["tasks"] = tasks + [rec.as_dict()]
        if torch.cuda.is_available() and not self.dry_run:
            self.state["allocated after the last task MiB"] = round(torch.cuda.memory_allocated() / MiB, 1)
        nb_dir = self.work / "notebooks"
        notebooks = {p.name: p.read_bytes() for p in sorted(nb_dir.glob("*")) if p.is_file() and not p.name.startswith(".")}
        for name, members in ((record.DETAILS, self.details), (record.NOTEBOOKS, notebooks)):
            key = tuple((n, zlib.crc32(data)) for n, data in sorted(members.items()))
            if self._packed.get(name) != key:  # an archive whose members did not change is not compressed again
                self._dropped[name] = record.pack(self.out / name, members)
                self._packed[name] = key
        if any(self._dropped.values()):
            self.state["left out of the archives"] = [d for v in self._dropped.values() for d in v]
        if self.raw.exists() and any(self.raw.glob("*.json")):
            try:  # a figure file that cannot be read is skipped, with a warning naming it
                atomic_write(self.out / record.RECORDED, json.dumps(recorded.merged(self.raw), indent=1) + "\n")
            except RecordError as err:
                self.log(f"recorded figures not collected: {err}")
        atomic_write(self.out / record.STATE, json.dumps(self.state, indent=1, default=str) + "\n")
        if self.summary is not None:
            atomic_write(self.out / record.SUMMARY, self.summary(self.state))

    def env(self, size: str | None = None) -> dict[str, str]:
        """The environment of a command the kit starts: the checkout first on ``PYTHONPATH``,
        figures recorded into ``raw``, plots without a display."""
        env = dict(os.environ)
        env.update({"PYTHONPATH": os.pathsep.join(filter(None, [str(self.root), env.get("PYTHONPATH")])),
                    recorded.ENV_VAR: str(self.raw), "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"})
        if size:
            env["COURSE_SIZE"] = size
        return env


class _Tee(io.TextIOBase):
    """``sys.stdout`` during a task: what the task prints goes to the call's output (if the log
    echoes) and to the kit's log."""

    def __init__(self, log: record.Log, real: Any):
        self.log, self.real = log, real

    def write(self, s: str) -> int:
        if self.log.echo:
            self.real.write(s)
        self.log.write(s, echo=False)
        return len(s)

    def flush(self) -> None:
        self.real.flush()


def tee_stdout(log: record.Log) -> contextlib.AbstractContextManager:
    """A context in which ``sys.stdout`` writes to the kit's ``log`` and, when the log echoes, to the
    call's output too (``_Tee``)."""
    return contextlib.redirect_stdout(_Tee(log, sys.stdout))


def _free_gpu() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _mib(n: float) -> float:
    return round(n / MiB, 1)


def _miss(pred: int, meas: int) -> float:
    return round(100 * (pred - meas) / meas, 1)


# --------------------------------------------------------------------------------------------
# The tasks
# --------------------------------------------------------------------------------------------
def diagnose_case(kit: Kit, name: str) -> dict[str, Any]:
    """Task ``diagnose/<name>``: one step predicted and measured op by op (``diagnose.step_case``);
    the result goes to kit.json, every op's row to ``diagnose-<name>.json`` in the details."""
    result, detail = diagnose.step_case(name, kit.dry_run, kit.log)
    kit.detail(f"diagnose-{name}.json", detail)
    return result


def _pytest(*args: str) -> list[str]:
    """A pytest command the kit starts: one process, no cache, none of pyproject's options."""
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=", *args]


def gpu_tests(kit: Kit, clock: Clock) -> dict[str, Any]:
    """The ``gpu``-marked tests, with the printed values of the passing ones (``-rP``) in the log."""
    xml = kit.work / "gpu-tests.xml"
    cmd = _pytest("-rP", "-m", "gpu", str(kit.root / "tests"), f"--junitxml={xml}")
    if kit.dry_run:
        return {"status": DRY, "command": " ".join(cmd), "summary": "not run: the gpu-marked tests need a GPU "
                "(make test collects them and says why each is skipped)"}
    log = kit.work / "gpu-tests.log"
    done = run_bounded(cmd, clock.remaining() - 2, log, env=kit.env(), cwd=kit.root, echo=kit.log.write)
    text = log.read_text(errors="replace")
    kit.detail("gpu-tests.log", text)
    if xml.exists():
        kit.detail("gpu-tests.xml", xml.read_bytes())
    last = ([ln for ln in text.splitlines() if ln.strip()] or ["(no output)"])[-1]
    status = CUT if done.timed_out else PASSED if done.returncode == 0 else FAILED
    failed = [ln.split(" ", 1)[1].split(" - ")[0] for ln in text.splitlines() if ln.startswith("FAILED ")]
    return {"status": status, "summary": last.strip("= "), "returncode": done.returncode, "failed": failed}


def run_benchmark(kit: Kit, net: str) -> dict[str, Any]:
    """Task ``benchmark/<net>``: ``benchmark.run`` on one net (measured unless a dry run); its files
    go to the details. Returns its table and, measured, the largest miss (%) and the rows beyond 5 %."""
    folder = kit.work / f"benchmark-{net}"
    results = benchmark.run(folder, nets=(net,), measure=not kit.dry_run,
                            techniques=kit.state["options"].get("techniques"), progress=True)
    for p in sorted(folder.glob("*")):
        kit.detail(f"benchmark-{net}-{p.name}", p.read_bytes())
    rows = results["rows"]
    out: dict[str, Any] = {"rows": len(rows), "table": [{k: r.get(k) for k in (
        "technique", "predicted peak MiB", "measured peak MiB", "measured reserved MiB", "miss %", "step s",
        "largest batch in 8 GiB (predicted)", "largest batch in 8 GiB (measured)")} for r in rows]}
    misses = [r["miss %"] for r in rows if "miss %" in r]
    if misses:
        out["largest miss %"] = max(misses, key=abs)
        out["rows beyond 5 %"] = [r["technique"] for r in rows if abs(r.get("miss %", 0)) > 5]
        ratios = sorted(r["measured reserved MiB"] / r["measured peak MiB"] for r in rows if r.get("measured peak MiB"))
        by_net = kit.state.setdefault("reserved over allocated", {})
        by_net[net] = {"max": round(ratios[-1], 3), "median": round(ratios[len(ratios) // 2], 3)}
        recorded.record("gpu/reserved_over_allocated", record.ratio_figure(by_net), folder=kit.raw)
    return out


def seed003(kit: Kit) -> dict[str, Any]:
    """Seed 003's net: the prediction against the CUDA allocator at three N."""
    rows = []
    for n in ((16, 24, 32) if kit.dry_run else LIMIT_NS):
        pred = run_limit_test(n)
        row = {"N": n, "predicted peak MiB": _mib(pred.peak), "predicted after forward MiB": _mib(pred.after_forward)}
        if not kit.dry_run:
            meas = run_limit_test(n, device="cuda")
            row.update({"measured peak MiB": _mib(meas.peak), "measured after forward MiB": _mib(meas.after_forward),
                        "miss %": _miss(pred.peak, meas.peak),
                        "(measured - predicted) / (N^3 x 4 B)": round((meas.peak - pred.peak) / (4 * n**3), 2)})
            _free_gpu()
        rows.append(row)
    return {"rows": rows}


def _predicted_and_measured(kit: Kit, label: str, build: Callable, **kw: Any) -> dict[str, Any]:
    pred = predict_step(build, module_peaks=False, **kw)
    row = {"case": label, "predicted peak MiB": _mib(pred.peak), "predicted peak in": "{} ({})".format(
        *pred.log.peak_location)}
    if not kit.dry_run:
        meas = measure_step(build, **kw)
        row.update({"measured peak MiB": _mib(meas.peak_allocated), "measured reserved MiB": _mib(meas.peak_reserved),
                    "miss %": _miss(pred.peak, meas.peak_allocated)})
        _free_gpu()
    kit.log(f"{label}: {row}")
    return row


def densenet(kit: Kit) -> dict[str, Any]:
    """Seed 004's DenseNet-169 step (512 x 512, batch 8, Adam, fp32), naive and memory-efficient."""
    args = seed004_step_args(batch=2, image=(64, 64)) if kit.dry_run else seed004_step_args()
    rows = [_predicted_and_measured(kit, f"DenseNet-169, {'memory-efficient' if eff else 'naive'}, "
                                    f"{args['input_shape']}", lambda eff=eff: densenet169(memory_efficient=eff), **args)
            for eff in (False, True)]
    return {"rows": rows}


#: fit's example networks at notebook 11's shapes (dry run: small ones), with their classes
FIT_EXAMPLES = {"resnet18_2d": (resnet18_2d, (32, 3, 224, 224), (2, 3, 32, 32), 10),
                "vit_tiny": diagnose.VIT_TINY,
                "conv1d_net": (conv1d_net, (64, 1, 4096), (2, 1, 256), 5)}


def fit_examples(kit: Kit) -> dict[str, Any]:
    """``course_utils.fit``'s example networks: the plain step (fp32, Adam, steady state) and
    under autocast fp16, predicted and measured; each built as ``fit`` builds it (``fit_model.variant``:
    ``nn.TransformerEncoder``'s copied layers made tensors of the active fake mode)."""
    rows = []
    for name, (build, full, tiny, classes) in FIT_EXAMPLES.items():
        shape = tiny if kit.dry_run else full
        for label, ac in (("fp32", None), ("autocast fp16", torch.float16)):
            if kit.dry_run and ac is not None:
                continue  # reduced precision on a CPU is the slow path; the fp32 row runs the code
            rows.append(_predicted_and_measured(kit, f"{name} {shape}, {label}", variant(build, "plain"),
                                                input_shape=shape,
                                                target_shape=(shape[0],), n_classes=classes, autocast_dtype=ac))
    return {"rows": rows}


def _cells_outcomes(path: Path) -> list[dict[str, Any]]:
    """The cells' outcomes ``nbval_record`` wrote to ``path`` ([] if none, or with a warning
    naming the file if it cannot be read)."""
    if not path.exists():
        return []
    try:
        cells = read_json(path, "the cells' outcomes (nbval_record's)", "run the notebook's task again", kind=list)
        if all(isinstance(c, dict) and "code cell" in c and isinstance(c.get("outcome"), str)
               and isinstance(c.get("seconds"), (int, float)) and isinstance(c.get("error", ""), str) for c in cells):
            return cells
        raise RecordError(f"{path}: a cell's outcome without its outcome, seconds or error.", "run the notebook's task again")
    except RecordError as err:
        skipped(err)
        return []


def notebook(kit: Kit, nn: str, clock: Clock) -> dict[str, Any]:
    """Notebook ``nn`` under nbval at full size (tiny in a dry run), executed copy kept
    (``nbval_record``), its figures recorded."""
    path = next((kit.root / "notebooks").glob(f"{nn}_*.ipynb"))
    keep = kit.work / "notebooks"
    remaining = clock.remaining() - 2
    cmd = _pytest("--nbval-lax", f"--nbval-cell-timeout={max(1, int(remaining))}", "-p",
                  "course_utils.gpu_kit.nbval_record", str(path))
    env = kit.env("tiny" if kit.dry_run else "full")
    env["COURSE_NBVAL_KEEP"] = str(keep)
    log = keep / f"{path.stem}.log"
    done = run_bounded(cmd, remaining, log, env=env, cwd=kit.root, echo=kit.log.write)
    cells_path = keep / f"{path.stem}.cells.json"
    cells = _cells_outcomes(cells_path)
    failed = [c for c in cells if c["outcome"] == "failed"]
    status = CUT if done.timed_out else PASSED if done.returncode == 0 else FAILED
    out: dict[str, Any] = {"status": status, "notebook": path.name, "cells run": len(cells),
                           "failed cells": [{"code cell": c["code cell"], "error": c["error"][-600:]} for c in failed],
                           "slowest cells": sorted(({"code cell": c["code cell"], "seconds": c["seconds"]} for c in cells),
                                                   key=lambda c: -c["seconds"])[:3],
                           "size": "tiny" if kit.dry_run else "full"}
    if not kit.dry_run and status != CUT:  # each notebook's time at full size: the site's pages show it
        seconds = kit.state.setdefault("notebook seconds", {})
        seconds[path.name] = round(done.seconds, 1)
        recorded.record("gpu/notebook_seconds", seconds, folder=kit.raw)
    if nn in plan.MULTI_GPU and torch.cuda.device_count() < plan.MULTI_GPU[nn]:
        out["note"] = (f"{torch.cuda.device_count()} GPU(s): its NCCL parts need {plan.MULTI_GPU[nn]}; "
                       "its ranks ran with gloo on the CPU, and its multi-GPU figures show as recorded or absent")
    return out


def build(kit: Kit, name: str) -> Callable[[Clock], dict[str, Any]]:
    """The function that runs task ``name`` (a name of ``plan.planned``), run with ``clock``."""
    group, _, what = name.partition("/")
    simple: dict[str, Callable[[], dict[str, Any]]] = {
        "diagnose/cublas": lambda: diagnose.cublas(kit.dry_run),
        "diagnose/allocator": lambda: diagnose.allocator_case(kit.dry_run),
        "examples/seed003": lambda: seed003(kit),
        "examples/densenet": lambda: densenet(kit),
        "examples/fit": lambda: fit_examples(kit),
    }
    if name in simple:
        fn: Callable[[Clock], dict[str, Any]] = lambda _clock: simple[name]()  # noqa: E731
    elif group == "diagnose":
        fn = lambda _clock: diagnose_case(kit, what)  # noqa: E731
    elif group == "benchmark":
        fn = lambda _clock: run_benchmark(kit, what)  # noqa: E731
    elif name == "tests":
        fn = lambda clock: gpu_tests(kit, clock)  # noqa: E731
    elif group == "notebook":
        fn = lambda clock: notebook(kit, what, clock)  # noqa: E731
    else:
        raise ValueError(f"no task {name!r}")

    def run(clock: Clock) -> dict[str, Any]:
        try:
            with tee_stdout(kit.log):
                return fn(clock)
        finally:
            _free_gpu()

    return run


guard(globals(), RecordError)
