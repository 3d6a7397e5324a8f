"""Data, model and pipeline parallelism with ``torch.distributed``: the same code on CPU (gloo,
processes on one machine, as in CI) and on GPUs (NCCL, one process per GPU).

Words used here (the notebooks define them at first use): a *rank* is one process of the job
(0 .. world size - 1), the *world size* the number of ranks; *all-reduce* leaves on every rank the
sum (or mean) of a tensor over all ranks, *all-gather* leaves on every rank the concatenation of
every rank's tensor, *reduce-scatter* sums over ranks and leaves each rank one slice of the sum.

From a notebook, ``launch(worker, world_size, config)`` spawns the processes (workers must live
in an importable module, so they live here) and returns each rank's result; ``launch_many`` runs
several workers in one start. Every collective has a timeout and ``launch`` a deadline, so a
failed, killed or stuck rank becomes a clear error naming that rank, never a hang. Under
``torchrun`` the same workers run through ``main()``::

    torchrun --nproc-per-node=2 -m course_utils.parallel --mode ddp --steps 3

Workers:

* ``ddp_worker``      -- DistributedDataParallel on the U-Net: gradients, per-rank memory;
* ``fsdp_worker``     -- FSDP2 ``fully_shard``: per-rank parameter/gradient/optimizer bytes, at
  rest and while a unit runs (``FSDPMemTracker``);
* ``pipeline_worker`` -- the U-Net split in two stages, one per rank, micro-batches scheduled
  GPipe or 1F1B; per-rank timelines (the bubble) and saved-for-backward peaks;
* ``pipelining_worker`` -- the same with ``torch.distributed.pipelining``'s own schedules;
* ``norm_worker``     -- ``CrossReplicaBatchNorm3d`` against one BatchNorm on the whole batch.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import faulthandler
import functools
import importlib
import math
import numbers
import multiprocessing.connection as mp_connection
import operator
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing
from torch import nn

from .memory import SavedTensorMeter
from .tf32 import emulate_tf32, emulated_if_asked, exact_fp32
from .unet import UNet3D

COLLECTIVE_TIMEOUT_S = 60
# process groups and SIGUSR1 stack dumps (Linux, macOS); elsewhere launch only kills the ranks
_POSIX = hasattr(os, "setsid") and hasattr(signal, "SIGUSR1")

# --------------------------------------------------------------------------------------------
# Launching
# --------------------------------------------------------------------------------------------
# Words for the ranks' errors that mean "a peer went away" (a consequence, not a cause) and
# "a collective gave up waiting" (the peer it waited for may be the cause: it may have hung).
_PEER_GONE = ("closed by peer", "Connection reset", "Broken pipe", "Connection refused",
              "ECONNRESET", "EPIPE")
_TIMED_OUT = ("Timed out waiting", "timed out", "Watchdog caught collective operation timeout")
_SIGNAL_HINTS = {
    "SIGKILL": "the kernel's out-of-memory killer sends SIGKILL when the machine runs out of "
               "RAM; so does `kill -9`",
    "SIGSEGV": "a crash in native code (a C++/CUDA extension, a bad pointer), not a Python error",
    "SIGBUS": "a crash in native code, often shared memory (/dev/shm) running full",
    "SIGABRT": "native code aborted (a failed C++ check, 'terminate called ...')",
    "SIGTERM": "something asked the process to stop (a scheduler, `kill`)",
}


class LaunchError(RuntimeError):
    """A launched worker failed. ``rank``: the rank that caused the failure; ``cause``: one line
    saying what happened to it; ``details``: its traceback (or the end of its stderr);
    ``ranks``: one line per rank on how it ended."""

    def __init__(self, message: str, rank: int, cause: str, details: str, ranks: dict[int, str]):
        super().__init__(message)
        self.rank, self.cause, self.details, self.ranks = rank, cause, details, ranks


class LaunchTimeout(TimeoutError):
    """The workers ran past ``launch``'s deadline and were stopped; attributes as LaunchError
    (``rank`` is the rank that was not waiting in a collective, or None if every rank was)."""

    def __init__(self, message: str, rank: int | None, cause: str, details: str, ranks: dict[int, str]):
        super().__init__(message)
        self.rank, self.cause, self.details, self.ranks = rank, cause, details, ranks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(world_size: int) -> tuple[str, str]:
    """For ``launch`` (all ranks on this machine): NCCL with one GPU per rank when there are
    enough GPUs, else gloo on CPU. (Under torchrun, ``torchrun_backend`` decides.)"""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl", "cuda"
    return "gloo", "cpu"


def _init(rank: int, world_size: int, port: int,
          collective_timeout_s: float = COLLECTIVE_TIMEOUT_S) -> torch.device:
    """Join the process group of a ``launch``. On GPUs the rank's device is set *before*
    ``init_process_group`` and passed as ``device_id`` (the documented order: NCCL then binds
    this rank's communicator to its own GPU instead of guessing)."""
    backend, dev = backend_for(world_size)
    device = torch.device("cuda", rank) if dev == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # two processes on two cores: one thread each
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=collective_timeout_s),
                            device_id=device if device.type == "cuda" else None)
    return device


_NOT_IMPORTABLE = (
    "workers must be importable: define it in a module (a .py file, e.g. my_workers.py next to "
    "the notebook), import it from there and pass the imported function. Each rank is a fresh "
    "Python process that imports the worker by name; it cannot see a function defined in a "
    "notebook cell, a lambda or a nested function.")


def _resolve(module: str, qualname: str) -> Callable:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _worker_ref(worker: Callable) -> tuple[str, str]:
    """(module, qualified name) of an importable worker; a clear ValueError otherwise."""
    if not callable(worker):
        raise TypeError(f"launch: worker must be a function, got {type(worker).__name__}")
    name = getattr(worker, "__name__", repr(worker))
    module, qualname = getattr(worker, "__module__", None), getattr(worker, "__qualname__", None)
    if not module or not qualname or "<" in qualname:  # <lambda>, <locals>
        raise ValueError(f"launch({name}): {_NOT_IMPORTABLE}")
    if module == "__main__" and getattr(sys.modules.get("__main__"), "__file__", None) is None:
        raise ValueError(f"launch({name}): {name} is defined in __main__ (a notebook cell or an "
                         f"interactive session). {_NOT_IMPORTABLE}")
    try:
        found = _resolve(module, qualname)
    except Exception:
        found = None
    if found is not worker:
        raise ValueError(f"launch({name}): {module}.{qualname} does not lead back to this function. "
                         f"{_NOT_IMPORTABLE}")
    return module, qualname


def _positive(name: str, value: Any) -> float:
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    v = float(value) if real else float("nan")
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"launch: {name} must be a positive number of seconds, got {value!r}")
    return v


def _save(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(record, tmp)
    os.replace(tmp, path)  # a reader never sees half a file


def _exit_with_parent(parent_pid: int) -> None:
    """A rank whose notebook kernel died takes its process group with it (no orphans)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def _entry(rank: int, world_size: int, port: int, worker_ref: tuple[str, str], config_blob: bytes,
           out: str, collective_timeout_s: float, parent_pid: int) -> None:
    """One rank: its own process group (so ``launch`` can stop it and whatever it started),
    stdout/stderr into files (``launch`` prints them, one line at a time, prefixed with the rank),
    a Python stack dump on SIGUSR1 (to say where a hung rank is), the result or the traceback
    saved for ``launch``."""
    if _POSIX:
        os.setsid()
    base = Path(out) / f"rank{rank}"
    for fd, suffix in ((1, ".out"), (2, ".err")):
        f = os.open(f"{base}{suffix}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    faulthandler.enable(file=sys.stderr)  # SIGSEGV & co: the Python stack goes to the rank's stderr
    stack_file = open(f"{base}.stack", "w")
    if _POSIX:
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
        threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    result_path = base.with_suffix(".pt")
    code = 0
    try:
        config = pickle.loads(config_blob)
        worker = _resolve(*worker_ref)
        device = _init(rank, world_size, port, collective_timeout_s)
        with emulated_if_asked():  # COURSE_EMULATE_TF32=1: compute as a TF32 GPU would (CI)
            result = worker(rank, world_size, device, config)
        _save(result_path, {"ok": True, "result": result})
        dist.barrier()  # no collective may still be in flight when the process group goes
        # config["exit_code_after_result"] lets the tests play a crash at exit (see launch)
        code = int(config.get("exit_code_after_result", 0))
    except BaseException:
        _save(result_path, {"ok": False, "error": traceback.format_exc()})
        code = 1
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    # The result is on disk. Leave now, without the interpreter's teardown: under load, gloo's
    # background threads can still be running when C++ static destructors run, and the process
    # then aborts ("terminate called without an active exception") after its work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class _Output:
    """Prints what the ranks write, whole lines only, each prefixed with its rank: two ranks'
    output never shares a line, and nothing reaches the notebook's stderr (no pink box)."""

    def __init__(self, out: str, world_size: int):
        self.paths = [Path(out) / f"rank{r}.out" for r in range(world_size)]
        self.offsets = [0] * world_size
        self.partial = [""] * world_size

    def pump(self, final: bool = False) -> None:
        for r, path in enumerate(self.paths):
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(self.offsets[r])
                data = f.read()
            self.offsets[r] += len(data)
            text = self.partial[r] + data.decode("utf-8", "replace")
            *lines, self.partial[r] = text.split("\n")
            if final and self.partial[r]:
                lines, self.partial[r] = lines + [self.partial[r]], ""
            for line in lines:
                print(f"[rank {r}] {line}", flush=True)


def _stack_of(text: str) -> list[str]:
    """From a faulthandler dump: the frames of the thread that runs the worker (the one with
    ``_entry``), innermost first, up to the worker's own call."""
    for block in text.split("\n\n"):
        frames = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("File ")]
        names = [ln.rsplit(" in ", 1)[-1] for ln in frames]
        if "_entry" in names:
            return frames[:names.index("_entry")]
    return []


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _crash_report(path: Path) -> str:
    """What a rank killed by a signal left on its stderr: faulthandler's 'Fatal Python error'
    line and the worker's frames, else the last lines."""
    text = _read(path)
    fatal = [ln for ln in text.splitlines() if ln.startswith("Fatal Python error")]
    frames = _stack_of(text)
    if fatal or frames:
        return "\n".join(fatal[:1] + ["  " + f for f in frames[:8]])
    return "\n".join(text.splitlines()[-15:])


def _where(frames: list[str]) -> tuple[str, bool]:
    """'in stuck_worker (parallel.py, line 612)' and whether the rank waits in a collective."""
    if not frames:
        return "at an unknown place (no stack)", False
    in_dist = [f for f in frames if f"{os.sep}distributed{os.sep}" in f and "torch" in f]
    user = next((f for f in frames if f not in in_dist), frames[0])
    file, line = user.split('"')[1], user.split("line ")[1].split(" ")[0]
    here = f"in {user.rsplit(' in ', 1)[-1]} ({Path(file).name}, line {line})"
    if frames[0] in in_dist:  # innermost frame inside torch.distributed: a collective
        op = next((f.rsplit(" in ", 1)[-1] for f in in_dist if "distributed_c10d" in f),
                  frames[0].rsplit(" in ", 1)[-1])
        return f"waiting in a collective ({op}) called {here}", True
    return here, False


def _dump_stacks(procs: list, out: str) -> dict[int, list[str]]:
    """Ask each live rank for its Python stack (SIGUSR1 -> faulthandler) and read it."""
    asked: dict[int, Path] = {}
    for r, p in enumerate(procs):
        if not _POSIX:
            break
        if p.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGUSR1)
                asked[r] = Path(out) / f"rank{r}.stack"
    end = time.monotonic() + 1.0
    while time.monotonic() < end and any(  # a rank still starting dies of SIGUSR1: stop waiting for it
            procs[r].exitcode is None and not (path.exists() and path.stat().st_size)
            for r, path in asked.items()):
        time.sleep(0.02)
    time.sleep(0.05)
    return {r: _stack_of(_read(path)) for r, path in asked.items()}


def _stop(procs: list) -> set[int]:
    """SIGKILL every rank's process group (the rank and anything it started), then reap every
    rank: no zombies, no orphans. Returns the ranks that were still running."""
    running = {r for r, p in enumerate(procs) if p.exitcode is None}
    for p in procs:
        if p.pid is None:
            continue
        # the group p.pid exists only if the rank made it (os.setsid), and a pid stays reserved
        # while it names a group: this never reaches another process's group
        if _POSIX:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        if p.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
    for p in procs:
        if p.pid is not None:
            p.join(timeout=10)
    return running


def launch(worker: Callable, world_size: int = 2, config: dict | None = None,
           timeout_s: float = 180, collective_timeout_s: float = COLLECTIVE_TIMEOUT_S) -> list[Any]:
    """Run ``worker(rank, world_size, device, config)`` in ``world_size`` spawned processes
    (gloo on CPU, NCCL when there is a GPU per rank) and return the results, rank by rank.

    The worker must be importable (defined in a module, not in a notebook cell). What the ranks
    print comes back here line by line, prefixed ``[rank r]``. If a rank fails, the others are
    stopped at once and a ``LaunchError`` names the rank that *caused* it: its traceback, or the
    signal that killed it; a rank that hangs is blamed, not the peer that timed out waiting for
    it (collectives give up after ``collective_timeout_s``). Past ``timeout_s`` every rank is
    stopped and ``LaunchTimeout`` says where each one was. Every rank's process group is killed
    and reaped when ``launch`` returns: nothing a worker started outlives it."""
    ref = _worker_ref(worker)
    try:
        world_size = None if isinstance(world_size, bool) else operator.index(world_size)
    except TypeError:
        world_size = None
    if world_size is None or world_size < 1:
        raise ValueError(f"launch: world_size must be a positive integer (the number of ranks), "
                         f"got {world_size!r}")
    timeout_s = _positive("timeout_s", timeout_s)
    collective_timeout_s = _positive("collective_timeout_s", collective_timeout_s)
    if config is not None and not isinstance(config, dict):
        raise TypeError(f"launch: config must be a dict, got {type(config).__name__}")
    try:
        blob = pickle.dumps(config or {})
    except Exception as err:
        raise ValueError(f"launch: config cannot be sent to the ranks ({err}); keep it to numbers, "
                         "strings, lists, dicts and tensors") from None
    name = ref[1]
    ctx = torch.multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as out:
        port = free_port()
        procs = [ctx.Process(target=_entry, name=f"{name}-rank{r}", args=(
            r, world_size, port, ref, blob, out, collective_timeout_s, os.getpid()))
            for r in range(world_size)]
        output = _Output(out, world_size)
        ended: dict[int, float] = {}
        records: dict[int, dict | None] = {}  # a rank's result file is final once it has exited
        stacks: dict[int, list[str]] = {}
        stopped: set[int] = set()
        timed_out = failed = False
        try:
            for p in procs:
                p.start()
            deadline = time.monotonic() + timeout_s
            while len(ended) < world_size and not failed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                mp_connection.wait([p.sentinel for r, p in enumerate(procs) if r not in ended],
                                   timeout=min(remaining, 0.2))
                output.pump()
                for r, p in enumerate(procs):
                    if r not in ended and p.exitcode is not None:
                        ended[r] = time.monotonic()
                        records[r] = rec = _load(Path(out) / f"rank{r}.pt")
                        failed |= p.exitcode != 0 or rec is None or not rec["ok"]
            if timed_out or failed:
                stopped = {r for r, p in enumerate(procs) if p.exitcode is None}
                stacks = _dump_stacks(procs, out)
        finally:
            stopped |= _stop(procs)
            output.pump(final=True)
        records = {r: records[r] if r in records else _load(Path(out) / f"rank{r}.pt")
                   for r in range(world_size)}
        codes = {r: p.exitcode for r, p in enumerate(procs)}
        if not timed_out and all(rec is not None and rec["ok"] for rec in records.values()):
            for r in range(world_size):  # a worker's warnings: shown, line by line, after the run
                for line in _read(Path(out) / f"rank{r}.err").splitlines():
                    print(f"[rank {r}] {line}", file=sys.stderr)
            crashed = {r: c for r, c in codes.items() if c and r not in stopped}
            if crashed:  # every rank delivered its result, then a process died on its way out
                bad = ", ".join(f"rank {r} ({_how_ended(c)})" for r, c in crashed.items())
                warnings.warn(f"{name}: every rank returned its result, but {bad} crashed while "
                              "exiting; the results are complete.", RuntimeWarning, stacklevel=2)
            return [records[r]["result"] for r in range(world_size)]
        raise _diagnose(name, out, records, codes, ended, stopped, stacks, timed_out, timeout_s,
                        collective_timeout_s)


def _load(path: Path) -> dict | None:
    try:
        return torch.load(path, weights_only=False)
    except Exception:
        return None


def _short(line: str, n: int = 160) -> str:
    return line if len(line) <= n else line[:n - 3] + "..."


def _how_ended(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _diagnose(name, out, records, codes, ended, stopped, stacks, timed_out, timeout_s,
              collective_timeout_s) -> Exception:
    """The exception that names the rank that caused a failure, and how."""
    world = len(codes)
    status: dict[int, str] = {}
    real, peer_gone, waited, hung, unstarted = [], [], [], [], []  # candidate causes, by kind
    for r in range(world):
        rec, code = records[r], codes[r]
        if rec is not None and not rec["ok"]:
            last = rec["error"].strip().splitlines()[-1]
            status[r] = f"failed: {_short(last)}"
            if any(s in rec["error"] for s in _PEER_GONE):
                status[r] = "failed as a consequence (a peer closed its connection)"
                peer_gone.append(r)
            elif any(s in last for s in _TIMED_OUT):
                waited.append(r)
            else:
                real.append(r)
        elif r in stopped and rec is None and not stacks.get(r):
            status[r] = "was stopped by launch before its worker started"
            unstarted.append(r)
        elif r in stopped and rec is None:
            where, in_collective = _where(stacks[r])
            status[r] = f"was stopped by launch while {where}" if in_collective else \
                f"was stopped by launch while running {where}"
            (waited if in_collective else hung).append(r)
        elif rec is not None:
            status[r] = f"returned its result ({_how_ended(code)})"
        else:
            status[r] = f"ended without a result ({_how_ended(code)})"
            real.append(r)
    by_time = sorted(ended, key=ended.get)
    order = {r: i for i, r in enumerate(by_time)}

    def first(ranks):
        return min(ranks, key=lambda r: order.get(r, world + r))

    def others(cause: int | None) -> str:  # every rank's status but the cause's (all of them for None)
        return "; ".join(f"rank {r} {status[r]}" for r in range(world) if r != cause)

    if timed_out:
        culprit = first(hung) if hung else None
        if culprit is not None:
            where = _where(stacks.get(culprit, []))[0]
            cause = f"rank {culprit} hung {where}"
        elif unstarted and not waited:
            cause = ("no rank had started its worker: starting the processes (each imports torch) "
                     "took longer than timeout_s on this machine; raise timeout_s")
        else:
            cause = ("every rank that started was waiting in a collective: the ranks called different "
                     "collectives, or in a different order")
        details = "\n".join(f"rank {r} (most recent call first):\n  " + "\n  ".join(stacks[r][:8])
                            for r in sorted(stacks) if stacks[r])
        msg = (f"{name}: workers did not finish within {timeout_s:g} s and were stopped: {cause}. "
               f"({others(culprit)})"
               + (f"\n{details}" if details else ""))
        return LaunchTimeout(msg, culprit, cause, details, status)
    if real:
        cause_rank = first(real)
        rec = records[cause_rank]
        if rec is not None:
            details = rec["error"].rstrip()
            cause = details.splitlines()[-1]
            head = f"rank {cause_rank} of {name} failed"
        else:
            how = _how_ended(codes[cause_rank])
            hint = _SIGNAL_HINTS.get(how.rsplit(" ", 1)[-1], "")
            details = _crash_report(Path(out) / f"rank{cause_rank}.err")
            cause = f"rank {cause_rank} was {how}" if how.startswith("killed") else \
                f"rank {cause_rank} ended without a result ({how})"
            head = f"rank {cause_rank} of {name} was {how}" + (f" ({hint})" if hint else "") \
                if how.startswith("killed") else \
                f"rank {cause_rank} of {name} ended without a result ({how}) before returning"
        msg = f"{head}; {others(cause_rank)}." + (f"\n{details}" if details else "")
        return LaunchError(msg, cause_rank, cause, details, status)
    if hung and waited:  # a rank gave up waiting in a collective for a rank that was still running
        culprit = first(hung)
        where = _where(stacks.get(culprit, []))[0]
        waiter = first(waited)
        cause = f"rank {culprit} hung {where}"
        details = "\n".join(["rank {} (most recent call first):".format(culprit)]
                            + ["  " + f for f in stacks.get(culprit, [])[:8]]
                            + [f"rank {waiter} gave up after {collective_timeout_s:g} s: "
                               + status[waiter].removeprefix("failed: ")])
        msg = (f"rank {culprit} of {name} hung: it was still running {where} when rank {waiter} gave "
               f"up waiting for it in a collective after {collective_timeout_s:g} s.\n{details}")
        return LaunchError(msg, culprit, cause, details, status)
    candidates = waited + peer_gone + hung + unstarted
    cause_rank = first(candidates) if candidates else 0
    rec = records[cause_rank]
    details = rec["error"].rstrip() if rec is not None and not rec["ok"] else ""
    cause = details.splitlines()[-1] if details else status[cause_rank]
    msg = f"rank {cause_rank} of {name} failed; {others(cause_rank)}." + (f"\n{details}" if details else "")
    return LaunchError(msg, cause_rank, cause, details, status)



def _job_worker(rank: int, world: int, device: torch.device, config: dict) -> list[Any]:
    """Runs several workers one after the other in the same processes (see ``launch_many``)."""
    results = []
    for ref, cfg in config["jobs"]:
        results.append(_resolve(*ref)(rank, world, device, cfg))
        dist.barrier()
    return results


def launch_many(jobs: Sequence[tuple[Callable, dict | None]], world_size: int = 2,
                timeout_s: float = 300, collective_timeout_s: float = COLLECTIVE_TIMEOUT_S) -> list[list[Any]]:
    """Like ``launch``, for several ``(worker, config)`` jobs run one after the other by the same
    ranks: the processes start once (a start costs seconds: each rank imports torch). Returns,
    job by job, the list of the ranks' results."""
    refs = [(_worker_ref(w), dict(cfg or {})) for w, cfg in jobs]
    per_rank = launch(_job_worker, world_size, {"jobs": refs}, timeout_s, collective_timeout_s)
    return [[per_rank[r][j] for r in range(world_size)] for j in range(len(refs))]

def compared(worker: Callable) -> Callable:
    """For a worker whose numbers are compared with an fp32 reference (a single process on the
    CPU, a float64 computation): it runs under ``exact_fp32()``. On an Ampere-or-newer GPU
    convolutions otherwise run in TF32 (10 mantissa bits), and a gradient through BatchNorm moves
    by about 1e-2 relative: the comparison would measure TF32, not the parallel scheme. Training
    (``train_worker``) keeps TF32 on."""

    @functools.wraps(worker)
    def run(rank: int, world: int, device: torch.device, config: dict) -> Any:
        with exact_fp32():
            return worker(rank, world, device, config)

    return run


# --------------------------------------------------------------------------------------------
# BatchNorm across replicas
# --------------------------------------------------------------------------------------------
def _all_gather_autograd(t: torch.Tensor) -> torch.Tensor:
    """Every rank's ``t`` concatenated along dim 0, with a backward (a reduce-scatter of the
    gradient). torch 2.13 renamed ``all_gather_tensor_autograd`` (2.11, 2.12) to
    ``all_gather_single_autograd`` and deprecated the old name: take whichever this torch has."""
    from torch.distributed import _functional_collectives as fc

    gather = getattr(fc, "all_gather_single_autograd", None) or fc.all_gather_tensor_autograd
    return gather(t, 0, dist.group.WORLD)


class CrossReplicaBatchNorm3d(nn.BatchNorm3d):
    """BatchNorm3d whose training statistics are those of the *global* batch, on CPU (gloo).

    Each rank computes, per channel, its count, mean and sum of squared deviations ``M2`` -- in
    fp32 at least (an fp16 count overflows past 65,504 values per channel, and fp16 sums lose the
    mean) -- then the ranks **all-gather** these triples with the autograd-aware
    ``all_gather_single_autograd`` of ``torch.distributed._functional_collectives`` and combine them
    with Chan et al.'s pairwise formula (``M2 = sum M2_r + n_r (mean_r - mean)^2``), which has no
    ``E[x^2] - E[x]^2`` cancellation. Gradients flow back through the all-gather (its backward
    is a reduce-scatter), so each rank's input gradient includes its effect on the global
    statistics. Outside a process group, or in eval mode, it is BatchNorm3d.

    ``nn.SyncBatchNorm`` does the same job on accelerators (torch 2.13, ``nn/modules/_functions.py``):
    forward all-gathers each rank's (mean, invstd, count) and combines them with
    ``torch.batch_norm_gather_stats_with_counts``; backward all-reduces two per-channel sums. In
    training under a process group it refuses CPU tensors (``ValueError: SyncBatchNorm expected
    input tensor to be on GPU or XPU ...``); outside one, or in eval mode, it is plain BatchNorm.
    On GPUs convert a model with ``nn.SyncBatchNorm.convert_sync_batchnorm`` instead.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1):
            return super().forward(x)
        self._check_input_dim(x)
        c, world = x.shape[1], dist.get_world_size()
        shape = (1, c) + (1,) * (x.dim() - 2)
        dims = [0, *range(2, x.dim())]
        xf = x.float() if x.element_size() < 4 else x  # statistics in fp32 at least
        mean_r = xf.mean(dims)
        m2_r = (xf - mean_r.view(shape)).square().sum(dims)
        count_r = torch.full((1,), float(x.numel() // c), dtype=mean_r.dtype, device=x.device)
        stats = _all_gather_autograd(torch.cat([count_r, mean_r, m2_r]))
        stats = stats.view(world, 2 * c + 1)
        counts, means, m2s = stats[:, :1], stats[:, 1:c + 1], stats[:, c + 1:]
        n = counts.sum()
        mean = (counts * means).sum(0) / n
        var = (m2s + counts * (means - mean).square()).sum(0) / n  # biased: what BN normalises with
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                unbiased = var.detach() * n / (n - 1)
                self.running_mean.mul_(1 - m).add_(mean.detach().to(self.running_mean.dtype), alpha=m)
                self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
        y = (xf - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)


@compared
def norm_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """``CrossReplicaBatchNorm3d`` on this rank's shard of ``config["x"]`` (the global batch):
    its output, the gradients of ``(y * config["w"]).sum()`` and the running statistics, to
    compare with one BatchNorm3d on the whole batch. With ``config["try_sync_bn"]`` it also runs
    ``nn.SyncBatchNorm`` on this rank's device and reports what happened."""
    x, w = config["x"], config["w"]
    c = x.shape[1]
    bn = CrossReplicaBatchNorm3d(c).to(device)
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, c))
        bn.bias.copy_(torch.linspace(-1.0, 1.0, c))
    xs = x.chunk(world)[rank].to(device).requires_grad_()
    y = bn(xs)
    (y.double() * w.chunk(world)[rank].to(device)).sum().backward()
    out = {"rank": rank, "y": y.detach().cpu(), "x_grad": xs.grad.cpu(),
           "weight_grad": bn.weight.grad.cpu(), "bias_grad": bn.bias.grad.cpu(),
           "running_mean": bn.running_mean.cpu(), "running_var": bn.running_var.cpu()}
    if config.get("try_sync_bn"):
        sync = nn.SyncBatchNorm(c).to(device)
        try:
            sync(xs.detach().float())
            out["sync_bn"] = "ran"
        except Exception as err:
            out["sync_bn"] = f"{type(err).__name__}: {err}"
    return out


def cross_replica_bn_relu(channels: int) -> list[nn.Module]:
    """``norm_act`` for UNet3D: BatchNorm with global statistics (CPU/gloo), then ReLU."""
    return [CrossReplicaBatchNorm3d(channels), nn.ReLU(inplace=True)]


def gn_relu(channels: int) -> list[nn.Module]:
    """``norm_act`` with GroupNorm: statistics per sample, independent of batch size and of how
    the batch is split (replicas, micro-batches, accumulation)."""
    return [nn.GroupNorm(min(4, channels), channels), nn.ReLU(inplace=True)]


def relu_only(channels: int) -> list[nn.Module]:
    """``norm_act`` without normalisation (notebook 08 compares TF32's error with and without)."""
    return [nn.ReLU(inplace=True)]


#: ``config["norm"]`` -> the U-Net's ``norm_act`` (None: BatchNorm3d + ReLU). ``"sync_bn"`` is
#: BatchNorm3d converted to ``nn.SyncBatchNorm`` (GPUs; plain BatchNorm outside a process group).
NORMS: dict[str, Callable | None] = {"bn": None, "cross_replica_bn": cross_replica_bn_relu,
                                     "gn": gn_relu, "sync_bn": None, "none": relu_only}


def build_net(config: dict) -> UNet3D:
    """The small U-Net every parallel demo uses, identically initialised on every rank
    (``config``: ``norm``, ``levels``, ``channels``, ``seed``)."""
    norm = config.get("norm", "bn")
    if norm not in NORMS:
        raise ValueError(f"norm={norm!r}: choose one of {', '.join(sorted(NORMS))}")
    torch.manual_seed(config.get("seed", 0))
    net = UNet3D(levels=config.get("levels", 3), channels=config.get("channels", 4), norm_act=NORMS[norm])
    if norm == "sync_bn":
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    return net


def global_batch(config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch on every rank (each then takes its shard); ``config["seed"]``
    changes it together with the net's initialisation, ``config["data_seed"]`` the batch alone."""
    g = torch.Generator().manual_seed(1234 + config.get("data_seed", config.get("seed", 0)))
    b, vol = config.get("global_batch", 4), tuple(config.get("volume", (8, 16, 16)))
    return torch.randn(b, 1, *vol, generator=g), torch.randint(0, 5, (b, *vol), generator=g)


def relative_error(got: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> float:
    """Largest difference between two lists of tensors, relative to the largest reference value.
    (Per-tensor ratios would blow up on conv biases in front of BatchNorm, whose true gradient is
    zero and whose computed one is rounding noise.) Works across devices."""
    got, ref = list(got), list(ref)
    if len(got) != len(ref):
        raise ValueError(f"relative_error: {len(got)} tensors vs {len(ref)} reference tensors")
    diff = max((a.detach().cpu().double() - b.detach().cpu().double()).abs().max().item()
               for a, b in zip(got, ref))
    return diff / max(b.detach().abs().max().item() for b in ref)


def single_process_grads(config: dict, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """The reference: one process, the whole global batch, one backward, on ``device`` (the
    gradients come back on the CPU)."""
    net = build_net(config).to(device)
    x, y = global_batch(config)
    nn.functional.cross_entropy(net(x.to(device)), y.to(device)).backward()
    return [p.grad.detach().cpu().clone() for p in net.parameters()]


# Branches: a ReLU's kink and a max-pool window's winner. Where a value sits within rounding of
# one, two computations that round differently take different branches, and the gradient of what
# the branch touches moves by a whole step, not by a rounding.
_BRANCHES = (nn.ReLU, nn.MaxPool3d)


def _branch_inputs(net: nn.Module, x: torch.Tensor, force: list | None = None) -> tuple[list, torch.Tensor]:
    """Run ``net(x)``; returns the input of every ReLU and MaxPool3d call (in call order, with
    the module's kind) and the output. With
    ``force`` (such a list from another run), each of those modules takes the other run's branch:
    ReLU keeps the values that were positive there, max-pool takes the winner it took there."""
    seen: list[tuple[str, torch.Tensor]] = []
    stash: dict[int, torch.Tensor] = {}

    def pre(module, inputs):
        kind = type(module).__name__
        seen.append((kind, inputs[0].detach().clone()))
        if force is not None:
            stash[id(module)] = inputs[0].clone()  # an in-place ReLU overwrites its input

    def post(module, inputs, output):
        if force is None:
            return None
        i = len(seen) - 1
        kind, ref = force[i]
        x = stash.pop(id(module))
        if kind == "ReLU":
            return x * (ref > 0).to(x.dtype)
        _, idx = nn.functional.max_pool3d(ref, module.kernel_size, module.stride, module.padding,
                                          module.dilation, module.ceil_mode, return_indices=True)
        return x.flatten(2).gather(2, idx.flatten(2)).view_as(output)

    handles = [h for m in net.modules() if isinstance(m, _BRANCHES)
               for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    try:
        out = net(x)
    finally:
        for h in handles:
            h.remove()
    return seen, out


def _decisions(kind: str, t: torch.Tensor) -> torch.Tensor:
    """A ReLU's branch per value; a max-pool's winner per window (the course's nets pool by 2)."""
    if kind == "ReLU":
        return t > 0
    return nn.functional.max_pool3d(t, 2, 2, return_indices=True)[1]


def tf32_branches(config: dict) -> dict:
    """How TF32 (emulated) changes the branches of ``build_net(config)``'s forward pass on its
    global batch, and what its gradient error is once they are held. ``decisions``: ReLU and
    max-pool decisions of one forward pass; ``changed``: how many TF32 takes differently from
    fp32; ``error``: TF32's gradient error (``relative_error`` vs fp32); ``error, branches
    held``: the same with every ReLU and max-pool taking fp32's branch."""
    x, y = global_batch(config)

    def step(force=None):
        net = build_net(config)
        seen, out = _branch_inputs(net, x, force)
        nn.functional.cross_entropy(out, y).backward()
        return seen, [p.grad.clone() for p in net.parameters()]

    ref_seen, ref = step()
    with emulate_tf32():
        seen, grads = step()
        _, held = step(ref_seen)
    changed = sum(int((_decisions(k, a) != _decisions(k, b)).sum()) for (k, a), (_, b) in zip(ref_seen, seen))
    return {"decisions": sum(_decisions(k, a).numel() for k, a in ref_seen), "changed": changed,
            "error": relative_error(grads, ref), "error, branches held": relative_error(held, ref)}


def branch_margin(config: dict) -> float:
    """How far the forward pass of ``build_net(config)`` stays from changing a branch in another
    fp32 computation: the smallest distance of a ReLU input from the kink, or of a max-pool
    window's winner from its runner-up, in units of the largest amount fp32 moves that layer's
    values (fp32 against float64). Above 1, this CPU's fp32 takes float64's branches; a GPU's
    fp32, whose kernels round differently but by the same order, takes them too while the margin
    is several times 1. Ties among a ReLU's zeros are left out: no gradient goes through them."""
    x, _ = global_batch(config)
    with torch.no_grad():
        fp32, _ = _branch_inputs(build_net(config), x)
        exact, _ = _branch_inputs(build_net(config).double(), x.double())
    margin = math.inf
    for (kind, a), (_, b) in zip(fp32, exact):
        moved = (a.double() - b).abs().max().item()
        if kind == "ReLU":
            gap = b.abs()
        else:
            top = b.unfold(2, 2, 2).unfold(3, 2, 2).unfold(4, 2, 2).flatten(-3).topk(2, -1).values
            gap = torch.where(top[..., 0] > 0, top[..., 0] - top[..., 1], math.inf)
        if moved > 0:
            margin = min(margin, gap.min().item() / moved)
    return margin


def reference_grads(config: dict, factor: float = 4, floor: float = 1e-4) -> dict:
    """One process on the whole global batch in float64 (on the CPU): ``grads``; what fp32 itself
    is off by on this net (``single_process_grads`` against them): ``fp32_error``; and the
    ``tolerance`` a computation of the same step in fp32 on another device should meet:
    ``max(floor, factor * fp32_error)`` -- an assumption, not a bound: fp32 computations that sum
    in other orders are typically off by the same order of magnitude (tested with the CPU's two
    convolution implementations).

    Why not a fixed tolerance: where a value lies within rounding of a ReLU's kink or of a tie in
    a max-pool window, fp32 and float64 take different branches, and the gradient of what that
    branch touches moves by a whole step, not by a rounding. Such a net (notebook 09's, seed 0) is
    off by 1e-4 in fp32 where another seed's is off by 1e-7. Two fp32 runs on the same CPU round
    alike and take the same branches; a GPU's kernels round differently, so a fixed 1e-4 between
    GPU and CPU fails on such a net. A pipeline that lost a micro-batch is off by far more than
    this tolerance (tests/test_tf32.py)."""
    net = build_net(config).double()
    x, y = global_batch(config)
    nn.functional.cross_entropy(net(x.double()), y).backward()
    grads = [p.grad.detach().clone() for p in net.parameters()]
    fp32_error = relative_error(single_process_grads(config), grads)
    return {"grads": grads, "fp32_error": fp32_error, "tolerance": max(floor, factor * fp32_error)}


def tf32_errors(config: dict, device: torch.device | str = "cpu") -> list[dict]:
    """How far TF32 convolutions move the gradient of ``build_net(config)`` on its global batch,
    against the fp32 reference (``single_process_grads`` on the CPU), beside the difference a
    comparison should see (``exact_fp32``) and the one SGD lives with (another batch).

    On any machine: TF32 emulated on this CPU (``tf32.emulate_tf32``; operands rounded to
    nearest, and truncated), and the same under ``exact_fp32()``. On a CUDA ``device``, also
    measured there: PyTorch's default (TF32 convolutions on Ampere and newer GPUs) and under
    ``exact_fp32()``. Each row: ``key`` (tf32, tf32 truncated, exact, gpu default, gpu exact,
    another batch), ``computation``, ``error`` (``relative_error`` vs the reference), ``method``."""
    device = torch.device(device)
    ref = single_process_grads(config)
    rows = []

    def row(key: str, computation: str, grads: list[torch.Tensor], method: str) -> None:
        rows.append({"key": key, "computation": computation, "error": relative_error(grads, ref),
                     "method": method})

    for rounding in ("nearest", "truncate"):
        with emulate_tf32(rounding):
            grads = single_process_grads(config)
        row("tf32" if rounding == "nearest" else "tf32 truncated",
            f"TF32 convolutions, operands rounded ({rounding})", grads, "emulated on this CPU")
    with emulate_tf32(), exact_fp32():
        grads = single_process_grads(config)
    row("exact", "the same under exact_fp32()", grads, "emulated on this CPU")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tf32_hw = torch.cuda.get_device_capability(device) >= (8, 0)
        row("gpu default", f"PyTorch's default on {name}" + ("" if tf32_hw else " (no TF32 before compute capability 8.0)"),
            single_process_grads(config, device), f"measured on {device}")
        with exact_fp32():
            grads = single_process_grads(config, device)
        row("gpu exact", f"exact_fp32() on {name}", grads, f"measured on {device}")
    seed = config.get("data_seed", config.get("seed", 0))
    row("another batch", "fp32, another batch of the same size (SGD's noise)",
        single_process_grads(dict(config, data_seed=seed + 1)), "computed on this CPU")
    return rows


def accumulated_grads(config: dict, micro_batches: int, use: int | None = None) -> list[torch.Tensor]:
    """Gradient accumulation on one device: the global batch in ``micro_batches`` pieces, each
    loss divided by their number, one optimizer step's worth of gradients. With BatchNorm this is
    also exactly what ``micro_batches`` DDP replicas compute (each normalises with its own
    shard's statistics; DDP averages their gradients). ``use``: only the first ``use`` pieces
    (what a pipeline that lost the others would compute)."""
    net = build_net(config)
    x, y = global_batch(config)
    for xs, ys in list(zip(x.chunk(micro_batches), y.chunk(micro_batches)))[:use]:
        (nn.functional.cross_entropy(net(xs), ys) / micro_batches).backward()
    return [p.grad.clone() for p in net.parameters()]


def per_replica_bn_errors(seeds: Sequence[int], world: int = 2, config: dict | None = None) -> list[float]:
    """For each seed (net and data), how far per-replica BatchNorm's DDP gradient on ``world``
    replicas is from the global batch's gradient (``relative_error``). Computed in one process
    (``accumulated_grads`` is what the replicas compute together)."""
    out = []
    for seed in seeds:
        cfg = dict(config or {}, norm="bn", seed=seed)
        out.append(relative_error(accumulated_grads(cfg, world), single_process_grads(cfg)))
    return out


def _state_bytes(params, optimizer) -> dict[str, int]:
    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    opt = sum(local(v) for s in optimizer.state.values() for v in s.values()
              if isinstance(v, torch.Tensor) and v.dim() > 0)
    return {"param_bytes": sum(local(p) for p in params),
            "grad_bytes": sum(local(p.grad) for p in params if p.grad is not None),
            "optimizer_bytes": opt}


# --------------------------------------------------------------------------------------------
# Data parallel
# --------------------------------------------------------------------------------------------
@compared
def ddp_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """One DDP step on this rank's shard of the global batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = build_net(config).to(device)
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    x, y = global_batch(config)
    xs, ys = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
    opt = torch.optim.Adam(model.parameters())
    with SavedTensorMeter(model.parameters()) as meter:
        loss = nn.functional.cross_entropy(model(xs), ys)
    loss.backward()
    grads = [p.grad.detach().cpu().clone() for p in model.parameters()]
    opt.step()
    return {"rank": rank, "local_batch": xs.shape[0], "loss": loss.item(), "grads": grads,
            "saved_bytes": meter.peak, **_state_bytes(list(model.parameters()), opt)}


def fsdp_units(net: UNet3D) -> list[nn.Module]:
    """The blocks the FSDP demos shard as units (each gathered while it runs): ``inc``, every
    ``Down`` and every ``Up``. What is left (``outc``) belongs to the root unit."""
    return [net.inc, *net.downs, *net.ups]


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def fsdp_rank_memory(net: nn.Module, units: Sequence[nn.Module], world: int,
                     bytes_per_value: int = 4, optimizer_states: int = 2) -> dict[str, float]:
    """Bytes a rank holds under FSDP2, computed from the model's units (not measured).

    At rest (between steps): a 1/world shard of the parameters, of the gradients and of the
    optimizer state (Adam: 2 values per parameter). While a unit runs, it is gathered: the rank
    holds the whole unit's parameters (and, in its backward, its whole gradient until the
    reduce-scatter) on top of its shards; the root unit's parameters stay gathered through the
    step. The largest unit sets the working peak. Activations and communication buffers are not
    included."""
    total, largest = _n_params(net), max(_n_params(u) for u in units)
    root = total - sum(_n_params(u) for u in units)
    b = bytes_per_value
    rest = {"params": total * b / world, "grads": total * b / world,
            "optimizer": optimizer_states * total * b / world}
    return {**{f"rest {k}": v for k, v in rest.items()},
            "resting": sum(rest.values()),
            "gathered params": (largest + root) * b, "unsharded grads": largest * b,
            "working": sum(rest.values()) + (2 * largest + root) * b,
            "working params": total * b / world + (largest + root) * b}


def _fsdp_peaks(tracker) -> dict[str, int]:
    """Largest bytes per FSDP category over every snapshot ``FSDPMemTracker`` took."""
    peaks = {"working_param_bytes": 0, "all_gather_bytes": 0}
    for stats in tracker.memory_tracking.values():
        for snaps in getattr(stats, "snapshots", {}).values():
            for snap in snaps:
                for per_kind in snap.values():
                    kinds = {str(getattr(k, "value", k)): v for k, v in per_kind.items()}
                    params = kinds.get("Sharded Param", 0) + kinds.get("Unsharded Param", 0)
                    peaks["working_param_bytes"] = max(peaks["working_param_bytes"], params)
                    peaks["all_gather_bytes"] = max(peaks["all_gather_bytes"], kinds.get("All Gather", 0))
    return peaks


@compared
def fsdp_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """One step with FSDP2: every parameter, its gradient and Adam's state sharded over ranks.
    ``FSDPMemTracker`` (torch's FSDP-aware MemTracker) records, unit by unit, what the rank
    holds: the resting shard and the parameters gathered while a unit runs."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import fully_shard

    net = build_net(config).to(device)
    for unit in fsdp_units(net):
        fully_shard(unit)
    fully_shard(net)
    x, y = global_batch(config)
    xs, ys = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
    opt = torch.optim.Adam(net.parameters())
    tracker = FSDPMemTracker(net, opt)
    with tracker:
        loss = nn.functional.cross_entropy(net(xs), ys)
        loss.backward()
        opt.step()
    full = [p.grad.full_tensor().detach().cpu() for p in net.parameters()]
    return {"rank": rank, "loss": loss.item(), "grads": full, **_fsdp_peaks(tracker),
            **_state_bytes(list(net.parameters()), opt)}


# --------------------------------------------------------------------------------------------
# Model and pipeline parallel
# --------------------------------------------------------------------------------------------
class EncoderStage(nn.Module):
    """Stage 1 of a split U-Net: ``inc`` and every ``Down``; returns all skip tensors."""

    def __init__(self, net: UNet3D):
        super().__init__()
        self.inc, self.downs = net.inc, net.downs

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        skips = [self.inc(x)]
        for d in self.downs:
            skips.append(d(skips[-1]))
        return skips


class DecoderStage(nn.Module):
    """Stage 2: every ``Up`` and ``outc``; takes the skip tensors (deepest last)."""

    def __init__(self, net: UNet3D):
        super().__init__()
        self.ups, self.outc = net.ups, net.outc

    def forward(self, skips: list[torch.Tensor]) -> torch.Tensor:
        skips = list(skips)
        x = skips.pop()
        for up in self.ups:
            x = up(x, skips.pop())
        return self.outc(x)


class TwoStageUNet(nn.Module):
    """The U-Net split across two devices. Every skip connection crosses the boundary: the
    encoder's outputs are moved to the second device, the gradients come back in backward."""

    def __init__(self, net: UNet3D, devices=("cpu", "cpu")):
        super().__init__()
        self.devices = [torch.device(d) for d in devices]
        self.encoder = EncoderStage(net).to(self.devices[0])
        self.decoder = DecoderStage(net).to(self.devices[1])
        self.boundary_bytes = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = self.encoder(x.to(self.devices[0]))
        self.boundary_bytes = sum(s.numel() * s.element_size() for s in skips)
        return self.decoder([s.to(self.devices[1]) for s in skips])


def stage_of(name: str) -> int:
    """0 for the encoder's modules (``inc``, ``downs``), 1 for the decoder's (``ups``, ``outc``)."""
    return 0 if name.split(".")[0] in ("inc", "downs") else 1


def split_and_reference(net: UNet3D, x: torch.Tensor, devices=("cpu", "cpu")) -> dict:
    """Runs ``net`` whole on ``devices[0]`` (the reference: same device, same precision), then
    split in two stages on ``devices``; returns both outputs and both gradient lists, and the
    bytes that crossed the boundary. Done under ``exact_fp32``."""
    devices = [torch.device(d) for d in devices]
    with exact_fp32():
        net.to(devices[0]).zero_grad(set_to_none=True)
        ref = net(x.to(devices[0]))
        ref.sum().backward()
        ref_grads = [p.grad.detach().clone() for p in net.parameters()]
        net.zero_grad(set_to_none=True)
        staged = TwoStageUNet(net, devices)
        out = staged(x)
        out.sum().backward()
    return {"out": out.detach(), "ref": ref.detach(), "grads": [p.grad for p in net.parameters()],
            "ref_grads": ref_grads, "boundary_bytes": staged.boundary_bytes}


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The idle share of each device for S balanced stages and M micro-batches,
    (S - 1) / (M + S - 1): the same for GPipe and 1F1B (1F1B saves memory, not time)."""
    return (stages - 1) / (micro_batches + stages - 1)


SCHEDULES = ("gpipe", "1f1b")


def schedule_order(kind: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The ops one stage runs, in order: ("F", i) forward of micro-batch i, ("B", i) backward.

    * ``gpipe`` (``torch.distributed.pipelining.ScheduleGPipe``): every forward, then every
      backward; a stage holds the activations of all M micro-batches.
    * ``1f1b`` (``torch.distributed.pipelining.Schedule1F1B``): S - 1 - stage forwards to fill
      the pipe, then one forward / one backward alternately; a stage holds at most S - stage.
    """
    m = micro_batches
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if kind != "1f1b":
        raise ValueError(f"schedule {kind!r}: choose one of {SCHEDULES}")
    warm = min(stages - 1 - stage, m)
    order = [("F", i) for i in range(warm)]
    for i in range(warm, m):
        order += [("F", i), ("B", i - warm)]
    return order + [("B", i) for i in range(m - warm, m)]


def in_flight(order: list[tuple[str, int]]) -> int:
    """The most micro-batches whose activations a stage holds at once (forwarded, not yet
    backwarded) in this order of ops."""
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def replay_schedule(durations: Sequence[dict[tuple[str, int], float]], kind: str = "gpipe") -> dict:
    """Replay a pipeline schedule with given op durations and free communication: when each op
    would start and end, the step time, each stage's idle share (the bubble) and the most
    micro-batches in flight per stage. ``durations[s][("F", i)]``: stage s's forward of
    micro-batch i. Dependencies: F(s, i) after F(s-1, i); B(s, i) after B(s+1, i); each stage
    runs its ops one at a time in ``schedule_order``."""
    stages = len(durations)
    m = 1 + max(i for k, i in durations[0] if k == "F")
    orders = [schedule_order(kind, s, stages, m) for s in range(stages)]
    end: dict[tuple[int, str, int], float] = {}
    free, pos = [0.0] * stages, [0] * stages
    ops: list[list[tuple[str, int, float, float]]] = [[] for _ in range(stages)]
    progress = True
    while progress:
        progress = False
        for s in range(stages):
            while pos[s] < len(orders[s]):
                k, i = orders[s][pos[s]]
                dep = (s - 1, "F", i) if k == "F" and s > 0 else \
                      (s + 1, "B", i) if k == "B" and s < stages - 1 else None
                if dep is not None and dep not in end:
                    break
                start = max(free[s], end.get(dep, 0.0))
                free[s] = end[s, k, i] = start + durations[s][k, i]
                ops[s].append((k, i, start, free[s]))
                pos[s] += 1
                progress = True
    if any(p < len(o) for p, o in zip(pos, orders)):
        raise RuntimeError(f"the {kind} schedule deadlocks with these durations")  # cannot happen
    step = max(free)
    return {"ops": ops, "step_s": step,
            "idle": [1 - sum(e - b for _, _, b, e in o) / step for o in ops],
            "in_flight": [in_flight(o) for o in orders]}


def unit_durations(stages: int, micro_batches: int, forward: float = 1.0,
                   backward: float = 2.0) -> list[dict[tuple[str, int], float]]:
    """Equal stages, every forward ``forward`` and every backward ``backward`` long (a backward
    costs about two forwards): the durations of the textbook schedules."""
    one = {**{("F", i): forward for i in range(micro_batches)}, **{("B", i): backward for i in range(micro_batches)}}
    return [dict(one) for _ in range(stages)]


def replay_timelines(timelines: Sequence[list[tuple[str, int, float, float]]], kind: str = "gpipe") -> dict:
    """``replay_schedule`` with the op durations the ranks measured (their ``timeline``s)."""
    return replay_schedule([{(k, i): e - s for k, i, s, e in tl} for tl in timelines], kind)


class OpTimer:
    """Start and end of each op of one stage, in seconds since ``reset``. CUDA runs kernels
    asynchronously: on a GPU the clock is read after ``torch.cuda.synchronize(device)``, so an
    op's duration covers its kernels, not only their launch."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.reset()

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def reset(self) -> None:
        self.ops: list[tuple[str, int, float, float]] = []
        self.t0 = self.now()

    def run(self, kind: str, i: int, fn: Callable[[], Any]) -> Any:
        start = self.now() - self.t0
        out = fn()
        self.ops.append((kind, i, start, self.now() - self.t0))
        return out


def _pipeline_step(rank: int, stage: nn.Module, order, xs, ys, shapes, device, timer: OpTimer) -> None:
    """One pipelined step of a 2-stage U-Net: rank 0 runs the encoder and sends the skip
    tensors; rank 1 runs the decoder and the loss and sends their gradients back. Sends are
    asynchronous (isend), so neither schedule can deadlock on them."""
    m = len(xs)
    held: dict[int, Any] = {}
    sends: list[tuple[Any, torch.Tensor]] = []
    for kind, i in order:
        if rank == 0 and kind == "F":
            skips = timer.run("F", i, lambda i=i: stage(xs[i].to(device)))
            for s in skips:
                s_out = s.detach().contiguous()
                sends.append((dist.isend(s_out, dst=1), s_out))
            held[i] = skips
        elif rank == 0:
            grads = [torch.empty_like(s) for s in held[i]]
            for g in grads:
                dist.recv(g, src=1)
            timer.run("B", i, lambda i=i, grads=grads: torch.autograd.backward(held[i], grads))
            del held[i]
        elif kind == "F":
            skips = [torch.empty(sh, device=device) for sh in shapes]
            for s in skips:
                dist.recv(s, src=0)
                s.requires_grad_()
            loss = timer.run("F", i, lambda i=i, skips=skips:
                             nn.functional.cross_entropy(stage(skips), ys[i].to(device)) / m)
            held[i] = (skips, loss)
        else:
            skips, loss = held.pop(i)
            timer.run("B", i, loss.backward)
            for s in skips:
                g = s.grad.contiguous()
                sends.append((dist.isend(g, dst=0), g))
    for work, _ in sends:
        work.wait()


@compared
def pipeline_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """The U-Net in 2 stages, one per rank: rank 0 the encoder, rank 1 the decoder and the loss.
    ``config["runs"]``: a list of ``{"micro_batches": M, "schedule": "gpipe" | "1f1b"}`` (default:
    one run from ``config``'s own keys). Each run: one warm-up step (first calls set up kernels)
    under a ``SavedTensorMeter`` (the peak bytes this stage holds for backward: its micro-batches
    in flight), then a timed step recording (kind, micro-batch, start, end) per op."""
    if world != 2:
        raise ValueError(f"pipeline_worker splits the U-Net in 2 stages: run it with 2 ranks, not {world}")
    runs = config.get("runs") or [{"micro_batches": config.get("micro_batches", 4),
                                  "schedule": config.get("schedule", "gpipe")}]
    net = build_net(config)
    x, y = global_batch(config)
    stage = (EncoderStage(net) if rank == 0 else DecoderStage(net)).to(device)
    params = list(stage.parameters())
    timer = OpTimer(device)
    results = []
    enc = EncoderStage(build_net(config)).to("meta")  # the boundary's shapes, per micro-batch size
    for run in runs:
        m, kind = run["micro_batches"], run.get("schedule", "gpipe")
        if x.shape[0] % m:
            raise ValueError(f"global batch {x.shape[0]} does not split into {m} equal micro-batches")
        xs, ys = x.chunk(m), y.chunk(m)
        shapes = [s.shape for s in enc(torch.empty(xs[0].shape, device="meta"))]
        order = schedule_order(kind, rank, 2, m)
        with SavedTensorMeter(params) as meter:  # warm-up step
            _pipeline_step(rank, stage, order, xs, ys, shapes, device, timer)
        stage.zero_grad(set_to_none=True)
        dist.barrier()
        timer.reset()
        _pipeline_step(rank, stage, order, xs, ys, shapes, device, timer)
        step_s = timer.now() - timer.t0
        dist.barrier()
        results.append({"micro_batches": m, "schedule": kind, "timeline": list(timer.ops),
                        "step_s": step_s, "busy_s": sum(e - s for _, _, s, e in timer.ops),
                        "saved_peak": meter.peak,
                        "grads": [p.grad.detach().cpu().clone() for p in params]})
        stage.zero_grad(set_to_none=True)
    return {"rank": rank, "runs": results, "param_bytes": sum(p.numel() * p.element_size() for p in params)}


class _TupleEncoder(nn.Module):
    """EncoderStage returning a tuple (``torch.distributed.pipelining`` sends tuples of tensors)."""

    def __init__(self, net: UNet3D):
        super().__init__()
        self.stage = EncoderStage(net)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.stage(x))


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose gradient is made contiguous: the gradient of a concatenated skip tensor is
    a strided slice, and gloo sends and receives only contiguous tensors."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class _ArgsDecoder(nn.Module):
    """DecoderStage taking the skip tensors as separate arguments."""

    def __init__(self, net: UNet3D):
        super().__init__()
        self.stage = DecoderStage(net)

    def forward(self, *skips: torch.Tensor) -> torch.Tensor:
        return self.stage([_ContiguousGrad.apply(s) for s in skips])


@compared
def pipelining_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """The 2-stage U-Net run by ``torch.distributed.pipelining`` itself: a ``PipelineStage`` per
    rank and ``ScheduleGPipe`` or ``Schedule1F1B`` (``config["schedules"]``) over
    ``config["micro_batches"]``. For each schedule: the peak saved-for-backward bytes of this
    stage over one step (``SavedTensorMeter``) and the stage's gradients."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    if world != 2:
        raise ValueError(f"pipelining_worker splits the U-Net in 2 stages: run it with 2 ranks, not {world}")
    classes = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    m = config.get("micro_batches", 4)
    x, y = global_batch(config)
    results = {}
    for kind in config.get("schedules", ("gpipe", "1f1b")):
        net = build_net(config)
        module = (_TupleEncoder(net) if rank == 0 else _ArgsDecoder(net)).to(device)
        stage = PipelineStage(module, rank, 2, device)
        schedule = classes[kind](stage, n_microbatches=m, loss_fn=nn.functional.cross_entropy)
        with SavedTensorMeter(module.parameters()) as meter:
            if rank == 0:
                schedule.step(x.to(device))
            else:
                schedule.step(target=y.to(device))
        results[kind] = {"saved_peak": meter.peak,
                         "grads": [p.grad.detach().cpu().clone() for p in module.parameters()]}
    return {"rank": rank, "micro_batches": m, "schedules": results}


def stage_parameters(model: UNet3D) -> dict[int, int]:
    """Number of parameters of each stage (0: encoder, 1: decoder) of a split U-Net."""
    params = {0: 0, 1: 0}
    for name, p in model.named_parameters():
        params[stage_of(name)] += p.numel()
    return params


def stage_saved_bytes(prediction) -> dict[int, int]:
    """Saved-for-backward bytes of each stage of a split U-Net, from a ``predict_step`` result:
    its modules' share (``per_module_saved``); what no module saved (the loss) goes to the last
    stage, which computes the loss."""
    saved = {0: 0, 1: 0}
    for name, nbytes in prediction.log.per_module_saved().items():
        saved[stage_of(name)] += nbytes
    saved[1] += max(0, prediction.saved_peak - saved[0] - saved[1])
    return saved


def pipeline_layouts(build: Callable[[], UNet3D], volume: Sequence[int], global_batch: int,
                     layouts: Sequence[tuple[int, int]], dtype: torch.dtype = torch.float16,
                     n_classes: int = 5) -> list[dict]:
    """Per-GPU memory of data-parallel x pipeline-parallel layouts ``(dp, pp)``, pp in (1, 2):
    an ESTIMATE from the predictor's parts, each counted once.

    A GPU holds (a) the parameters, gradients and Adam's two moments of the modules it runs:
    4 values per parameter in ``dtype``, from the parameter counts; (b) the saved-for-backward
    bytes of those modules for the batch it sees (``predict_step``'s per-module log, batch =
    global_batch / dp). With GPipe a stage keeps every micro-batch of its pipeline's batch; with
    1F1B and micro-batches of one sample, stage s keeps at most S - s of them. Not counted:
    temporaries of backward, the CUDA context, the allocator's slack, communication buffers."""
    from .memory import predict_step

    with torch.device("meta"):
        params = stage_parameters(build())
    value_bytes = torch.empty((), dtype=dtype).element_size()
    static = {s: 4 * n * value_bytes for s, n in params.items()}
    saved_by_batch: dict[int, dict[int, int]] = {}
    rows = []
    for dp, pp in layouts:
        if pp not in (1, 2) or global_batch % dp:
            raise ValueError(f"layout ({dp}, {pp}): pp must be 1 or 2 and dp must divide {global_batch}")
        b = global_batch // dp
        if b not in saved_by_batch:
            pred = predict_step(build, (b, 1, *volume), n_classes=n_classes, dtype=dtype)
            saved_by_batch[b] = stage_saved_bytes(pred)
        saved = saved_by_batch[b]
        if pp == 1:
            gpus = {"whole net": (static[0] + static[1], saved[0] + saved[1], saved[0] + saved[1])}
        else:
            gpus = {f"stage {s + 1}": (static[s], saved[s], saved[s] * min(2 - s, b) / b) for s in (0, 1)}
        for gpu, (st, gpipe, one_f_one_b) in gpus.items():
            rows.append({"dp": dp, "pp": pp, "GPUs": dp * pp, "batch per pipeline": b, "GPU holds": gpu,
                         "params + grads + Adam": st, "activations (GPipe)": gpipe,
                         "activations (1F1B)": one_f_one_b, "total (GPipe)": st + gpipe,
                         "total (1F1B)": st + one_f_one_b})
    return rows


def train_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """A few DDP (or FSDP) training steps on synthetic volumes; the script entry point."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .data import SyntheticVolumes

    net = build_net(config).to(device)
    if config.get("mode") == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(net)
        model = net
    else:
        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    per_rank = config.get("global_batch", 4) // world
    ds = SyntheticVolumes(per_rank * world * config.get("steps", 3), config.get("volume", (8, 16, 16)))
    losses = []
    for step in range(config.get("steps", 3)):
        idx = [step * per_rank * world + rank * per_rank + k for k in range(per_rank)]
        x = torch.stack([ds[i][0] for i in idx]).to(device)
        y = torch.stack([ds[i][1] for i in idx]).to(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"rank": rank, "losses": losses}


def failing_worker(rank: int, world: int, device: torch.device, config: dict) -> None:
    """For the demo of failures: rank 1 raises while rank 0 waits for it at a barrier."""
    if rank == 1:
        raise ValueError("rank 1 failed on purpose (a bad shape, a missing file, ...)")
    dist.barrier()


def stuck_worker(rank: int, world: int, device: torch.device, config: dict) -> None:
    """For the demo of hangs: rank 1 never reaches the barrier rank 0 waits at."""
    if rank == 1:
        time.sleep(config.get("sleep_s", 600))
    dist.barrier()


@compared
def source_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """Runs a learner's ``ddp_step(model, x, y, rank, world) -> grads`` given as source code
    (a notebook's functions cannot be imported by spawned processes). The namespace has
    ``torch``, ``nn``, ``dist`` and ``DDP``. The model and the global batch are on this rank's
    device (``cuda:rank`` under NCCL). Records the batch size and device the model saw."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ns: dict[str, Any] = {"torch": torch, "nn": nn, "dist": dist, "DDP": DDP}
    exec(compile(config["source"], "<learner>", "exec"), ns)
    net = build_net(config).to(device)
    seen: list[int] = []
    devices: list[str] = []

    def record(module, args):
        seen.append(args[0].shape[0])
        devices.append(str(args[0].device))

    net.register_forward_pre_hook(record)
    x, y = global_batch(config)
    grads = ns[config["name"]](net, x.to(device), y.to(device), rank, world)
    return {"rank": rank, "grads": [g.detach().cpu() for g in grads], "batch_seen": seen,
            "devices_seen": devices}


def torchrun_backend(env: dict | None = None, backend: str = "auto") -> tuple[str, torch.device]:
    """Backend and device of this rank under ``torchrun``, from its environment: one GPU per
    process on this node (``LOCAL_RANK`` of ``LOCAL_WORLD_SIZE``), however many nodes. With
    CUDA present that is NCCL or an error, never a silent fall-back to the CPU; without CUDA
    (or with ``backend="gloo"``) gloo on CPU."""
    env = os.environ if env is None else env
    local_rank = int(env.get("LOCAL_RANK", 0))
    local_world = int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1)))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "gloo":
        return "gloo", torch.device("cpu")
    if backend != "nccl":
        raise ValueError(f"--backend {backend!r}: choose auto, nccl or gloo")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < local_world:
        raise RuntimeError(
            f"this node runs {local_world} ranks but has {gpus} GPU(s): start torchrun with "
            f"--nproc-per-node={max(gpus, 1)} (one process per GPU), or pass --backend gloo to "
            "train on the CPU")
    return "nccl", torch.device("cuda", local_rank)


def torchrun_command(nproc: int = 2, module: str = "course_utils.parallel") -> tuple[list[str], str]:
    """The command that starts ``nproc`` ranks of ``module`` with torchrun on this machine, and
    one line saying where they run. NCCL needs a GPU per rank: with fewer GPUs than ranks (one
    GPU, say) the ranks are told to use gloo on the CPU, instead of stopping at the error
    ``torchrun_backend`` raises for that case."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "-m", module]
    if gpus >= nproc:
        return cmd, f"{nproc} processes, NCCL, one GPU each"
    if gpus:
        return cmd + ["--backend", "gloo"], (f"{nproc} processes, gloo on the CPU: this machine has {gpus} "
                                             f"GPU(s), NCCL needs one per process")
    return cmd, f"{nproc} processes, gloo on the CPU (no GPU)"


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``torchrun --nproc-per-node=N -m course_utils.parallel``."""
    ap = argparse.ArgumentParser(description="DDP/FSDP training of the course U-Net")
    ap.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                    help="auto: NCCL when CUDA is present (one GPU per process), else gloo")
    args = ap.parse_args(argv)
    config = {"mode": args.mode, "steps": args.steps, "global_batch": args.global_batch}
    if "RANK" not in os.environ:
        print("not under torchrun: spawning 2 processes here instead")
        for r in launch(train_worker, 2, config):
            print(f"rank {r['rank']}: losses {[round(v, 4) for v in r['losses']]}")
        return 0
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend, device = torchrun_backend(os.environ, args.backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before init_process_group, as documented
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                            device_id=device if device.type == "cuda" else None)
    try:
        r = train_worker(rank, world, device, config)
        print(f"rank {rank}/{world} ({backend}): losses {[round(v, 4) for v in r['losses']]}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
