"""Starting the ranks and saying which one failed: ``launch`` and ``launch_many``.

Each rank is a spawned process (``_entry``) in its own process group, its output in files that
``_Output`` prints line by line, a Python stack dump on SIGUSR1 (``_dump_stacks``); when a rank
fails or the deadline passes, ``_stop`` kills every rank's group and ``_diagnose`` names the rank
that caused it (``LaunchError``, ``LaunchTimeout``). Workers are sent by (module, qualified name)
(``_worker_ref``) and imported again in each rank (``_resolve``). ``compared`` runs a worker
under ``exact_fp32()``.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import functools
import importlib
import multiprocessing.connection as mp_connection
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing

from ..checks import ParallelError, guard
from ..files import replacing
from ..tf32 import emulated_if_asked, exact_fp32

COLLECTIVE_TIMEOUT_S = 60
# process groups and SIGUSR1 stack dumps (Linux, macOS); elsewhere launch only kills the ranks
_POSIX = hasattr(os, "setsid") and hasattr(signal, "SIGUSR1")

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


def rendezvous_store(collective_timeout_s: float = COLLECTIVE_TIMEOUT_S) -> dist.TCPStore:
    """The key-value store where a launch's ranks meet, hosted by the launching process as
    torchrun's agent hosts its own: it listens on a port of 127.0.0.1 that it binds itself
    (port 0, ``.port`` says which), and the ranks connect to it as clients. Picking a free port
    first and letting rank 0 bind it later leaves a gap in which another process can take it
    (EADDRINUSE in rank 0: seen in CI on a loaded machine, 2026-11-28)."""
    return dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=collective_timeout_s),
                         wait_for_workers=False)


def backend_for(world_size: int) -> tuple[str, str]:
    """For ``launch`` (all ranks on this machine): NCCL with one GPU per rank when there are
    enough GPUs, else gloo on CPU. (Under torchrun, ``torchrun_backend`` decides.)"""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl", "cuda"
    return "gloo", "cpu"


def _init(rank: int, world_size: int, port: int,
          collective_timeout_s: float = COLLECTIVE_TIMEOUT_S) -> torch.device:
    """Join the process group of a ``launch``, through the ``rendezvous_store`` listening on
    ``port``. On GPUs the rank's device is set *before* ``init_process_group`` and passed as
    ``device_id`` (the documented order: NCCL then binds this rank's communicator to its own GPU
    instead of guessing)."""
    backend, dev = backend_for(world_size)
    device = torch.device("cuda", rank) if dev == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # two processes on two cores: one thread each
    timeout = datetime.timedelta(seconds=collective_timeout_s)
    store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout)  # a client
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout,
                            device_id=device if device.type == "cuda" else None)
    return device


_NOT_IMPORTABLE = (
    "workers must be importable. Fix: define it in a module (a .py file, e.g. my_workers.py next to "
    "the notebook), import it from there and pass the imported function. Each rank is a fresh "
    "Python process that imports the worker by name; it cannot see a function defined in a "
    "notebook cell, a lambda or a nested function.")


def _resolve(module: str, qualname: str) -> Callable:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _worker_ref(worker: Callable) -> tuple[str, str]:
    """(module, qualified name) of an importable worker; a ParallelError naming the fix otherwise
    (``worker`` is callable: guard checked it)."""
    name = getattr(worker, "__name__", repr(worker))
    module, qualname = getattr(worker, "__module__", None), getattr(worker, "__qualname__", None)
    if not module or not qualname or "<" in qualname:  # <lambda>, <locals>
        raise ParallelError(f"launch({name}): {_NOT_IMPORTABLE}")
    if module == "__main__" and getattr(sys.modules.get("__main__"), "__file__", None) is None:
        raise ParallelError(f"launch({name}): {name} is defined in __main__ (a notebook cell or an "
                         f"interactive session). {_NOT_IMPORTABLE}")
    try:
        found = _resolve(module, qualname)
    except Exception:
        found = None
    if found is not worker:
        raise ParallelError(f"launch({name}): {module}.{qualname} does not lead back to this function. "
                         f"{_NOT_IMPORTABLE}")
    return module, qualname


def _save(path: Path, record: dict) -> None:
    with replacing(path) as tmp:  # a reader never sees half a file; a full disk: RecordError with the fix
        torch.save(record, tmp)


def leave_without_teardown(code: int) -> None:
    """End a rank whose work is done, with exit status ``code``, skipping the interpreter's
    teardown. Under load, gloo's background threads can still be running when C++ static
    destructors run, and the process then aborts ("terminate called without an active
    exception", SIGABRT) after its work is done and its output printed: torchrun and ``launch``
    would report a rank that succeeded as failed. Call it after ``destroy_process_group``."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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
    leave_without_teardown(code)  # the result is on disk


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
    """'in stuck_worker (cli.py, line 65)' and whether the rank waits in a collective."""
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
    ref = _worker_ref(worker)  # world_size, timeout_s, collective_timeout_s, config: guard's checks
    try:
        blob = pickle.dumps(config or {})
    except Exception as err:
        raise ParallelError(f"launch: config cannot be sent to the ranks ({err}).",
                            "keep it to numbers, strings, lists, dicts and tensors.") from None
    store = rendezvous_store(collective_timeout_s)
    try:
        return _run_ranks(ref, blob, world_size, store.port, timeout_s, collective_timeout_s)
    finally:
        del store  # the server stops now, not when a traceback that holds this frame is dropped


def _run_ranks(ref: tuple[str, str], blob: bytes, world_size: int, port: int,
               timeout_s: float, collective_timeout_s: float) -> list[Any]:
    """``launch``'s work once its arguments are checked and its store listens on ``port``."""
    name = ref[1]
    ctx = torch.multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as out:
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
                              "exiting; the results are complete.", RuntimeWarning,
                              stacklevel=4)  # at the line that called launch (under guard's check), not at launch
            return [records[r]["result"] for r in range(world_size)]
        raise _diagnose(_RunEnd(name, out, records, codes, ended, stopped, stacks, timed_out, timeout_s,
                               collective_timeout_s))


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


@dataclass
class _RunEnd:
    """How a launch ended, rank by rank: what ``_diagnose`` reads to name the cause."""

    name: str  # the worker's name
    out: str  # the run's folder (rankN.pt results, rankN.err outputs)
    records: dict[int, dict | None]  # each rank's record: {"ok", "result" or "error"}, None if it wrote none
    codes: dict[int, int | None]  # each rank's exit code (negative: the signal)
    ended: dict[int, float]  # when each rank that ended was seen ending (monotonic clock)
    stopped: set[int]  # the ranks launch stopped
    stacks: dict[int, list[str]]  # the stopped ranks' stacks, most recent call first
    timed_out: bool  # launch's deadline passed
    timeout_s: float
    collective_timeout_s: float


def _rank_statuses(run: _RunEnd) -> tuple[dict[int, str], dict[str, list[int]]]:
    """Each rank's status in words, and the ranks by kind of candidate cause: ``real`` (failed on
    its own or ended without a result), ``peer_gone`` (failed because a peer closed its
    connection), ``waited`` (waited in a collective), ``hung`` (stopped outside a collective),
    ``unstarted`` (stopped before its worker started)."""
    status: dict[int, str] = {}
    kinds: dict[str, list[int]] = {k: [] for k in ("real", "peer_gone", "waited", "hung", "unstarted")}
    for r in range(len(run.codes)):
        rec, code = run.records[r], run.codes[r]
        if rec is not None and not rec["ok"]:
            last = rec["error"].strip().splitlines()[-1]
            status[r] = f"failed: {_short(last)}"
            if any(s in rec["error"] for s in _PEER_GONE):
                status[r] = "failed as a consequence (a peer closed its connection)"
                kinds["peer_gone"].append(r)
            elif any(s in last for s in _TIMED_OUT):
                kinds["waited"].append(r)
            else:
                kinds["real"].append(r)
        elif r in run.stopped and rec is None and not run.stacks.get(r):
            status[r] = "was stopped by launch before its worker started"
            kinds["unstarted"].append(r)
        elif r in run.stopped and rec is None:
            where, in_collective = _where(run.stacks[r])
            status[r] = f"was stopped by launch while {where}" if in_collective else \
                f"was stopped by launch while running {where}"
            kinds["waited" if in_collective else "hung"].append(r)
        elif rec is not None:
            status[r] = f"returned its result ({_how_ended(code)})"
        else:
            status[r] = f"ended without a result ({_how_ended(code)})"
            kinds["real"].append(r)
    return status, kinds


def _timeout_error(run: _RunEnd, status: dict[int, str], kinds: dict[str, list[int]], first, others) -> LaunchTimeout:
    """Past the deadline: the rank that hung outside a collective, else why none did."""
    culprit = first(kinds["hung"]) if kinds["hung"] else None
    if culprit is not None:
        cause = f"rank {culprit} hung {_where(run.stacks.get(culprit, []))[0]}"
    elif kinds["unstarted"] and not kinds["waited"]:
        cause = ("no rank had started its worker: starting the processes (each imports torch) "
                 "took longer than timeout_s on this machine; raise timeout_s")
    else:
        cause = ("every rank that started was waiting in a collective: the ranks called different "
                 "collectives, or in a different order")
    details = "\n".join(f"rank {r} (most recent call first):\n  " + "\n  ".join(run.stacks[r][:8])
                        for r in sorted(run.stacks) if run.stacks[r])
    msg = (f"{run.name}: workers did not finish within {run.timeout_s:g} s and were stopped: {cause}. "
           f"({others(culprit)})" + (f"\n{details}" if details else ""))
    return LaunchTimeout(msg, culprit, cause, details, status)


def _failure_error(run: _RunEnd, cause_rank: int, status: dict[int, str], others) -> LaunchError:
    """A rank that failed on its own: its traceback, or how its process ended."""
    rec = run.records[cause_rank]
    if rec is not None:
        details = rec["error"].rstrip()
        cause = details.splitlines()[-1]
        head = f"rank {cause_rank} of {run.name} failed"
    else:
        how = _how_ended(run.codes[cause_rank])
        hint = _SIGNAL_HINTS.get(how.rsplit(" ", 1)[-1], "")
        details = _crash_report(Path(run.out) / f"rank{cause_rank}.err")
        cause = f"rank {cause_rank} was {how}" if how.startswith("killed") else \
            f"rank {cause_rank} ended without a result ({how})"
        head = f"rank {cause_rank} of {run.name} was {how}" + (f" ({hint})" if hint else "") \
            if how.startswith("killed") else \
            f"rank {cause_rank} of {run.name} ended without a result ({how}) before returning"
    msg = f"{head}; {others(cause_rank)}." + (f"\n{details}" if details else "")
    return LaunchError(msg, cause_rank, cause, details, status)


def _diagnose(run: _RunEnd) -> Exception:
    """The exception that names the rank that caused a failure, and how."""
    world = len(run.codes)
    status, kinds = _rank_statuses(run)
    order = {r: i for i, r in enumerate(sorted(run.ended, key=run.ended.get))}

    def first(ranks):  # the rank seen ending first (ranks never seen ending last, by number)
        return min(ranks, key=lambda r: order.get(r, world + r))

    def others(cause: int | None) -> str:  # every rank's status but the cause's (all of them for None)
        return "; ".join(f"rank {r} {status[r]}" for r in range(world) if r != cause)

    if run.timed_out:
        return _timeout_error(run, status, kinds, first, others)
    if kinds["real"]:
        return _failure_error(run, first(kinds["real"]), status, others)
    hung, waited = kinds["hung"], kinds["waited"]
    if hung and waited:  # a rank gave up waiting in a collective for a rank that was still running
        culprit, waiter = first(hung), first(waited)
        where = _where(run.stacks.get(culprit, []))[0]
        cause = f"rank {culprit} hung {where}"
        details = "\n".join([f"rank {culprit} (most recent call first):"]
                            + ["  " + f for f in run.stacks.get(culprit, [])[:8]]
                            + [f"rank {waiter} gave up after {run.collective_timeout_s:g} s: "
                               + status[waiter].removeprefix("failed: ")])
        msg = (f"rank {culprit} of {run.name} hung: it was still running {where} when rank {waiter} gave "
               f"up waiting for it in a collective after {run.collective_timeout_s:g} s.\n{details}")
        return LaunchError(msg, culprit, cause, details, status)
    candidates = waited + kinds["peer_gone"] + hung + kinds["unstarted"]
    cause_rank = first(candidates) if candidates else 0
    rec = run.records[cause_rank]
    details = rec["error"].rstrip() if rec is not None and not rec["ok"] else ""
    cause = details.splitlines()[-1] if details else status[cause_rank]
    msg = f"rank {cause_rank} of {run.name} failed; {others(cause_rank)}." + (f"\n{details}" if details else "")
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


guard(globals(), ParallelError)
