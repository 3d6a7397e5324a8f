"""Running the plan within a budget of seconds: start a task only if its estimate fits what is
left, stop a running one at the budget's end, and hand each task's record on the moment it ends.
Python's standard library only.

* ``run_tasks`` -- in order: a task whose estimate would pass the budget is ``NOT_RUN`` (and the
  next is considered: a shorter one may still fit); a task that is running when the budget ends
  is stopped (``BudgetExceeded`` raised in it by ``deadline``) and is ``CUT``; an exception in a
  task is its ``ERROR``, and the plan goes on.
* ``deadline`` -- ``BudgetExceeded`` raised in the main thread after so many seconds
  (``signal.setitimer``): Python code between two CUDA calls is interrupted; a kernel that is
  running finishes first.
* ``run_bounded`` -- a command with a deadline whose whole process tree (a kernel started in its
  own session by nbval included) is killed when the deadline passes or the kit is stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..checks import RecordError, guard

DONE, PASSED, FAILED, ERROR = "done", "passed", "failed", "error"
CUT, NOT_RUN, RECORDED, DRY = "cut (budget)", "not run (budget)", "skipped (recorded)", "dry run"
#: what a later run does not do again
COMPLETE = (DONE, PASSED)


class BudgetExceeded(BaseException):
    """The kit's budget ended while a task ran. A ``BaseException``, so that a task's own
    ``except Exception`` (an OOM caught and explained, say) cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise ``BudgetExceeded`` in this (the main) thread when ``seconds`` have passed."""
    if seconds <= 0:
        raise BudgetExceeded(f"no time left (deadline {seconds:.1f} s)")

    def fire(signum: int, frame: Any) -> None:  # noqa: ARG001 - signal handler (signum, frame)
        raise BudgetExceeded(f"the budget ended ({seconds:.0f} s after the task started)")

    t0 = time.monotonic()
    old = signal.signal(signal.SIGALRM, fire)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if old_delay:  # a timer set before (pytest-timeout's, say) goes on with what it had left
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - t0), 0.001), old_interval)


@dataclass
class Clock:
    """The kit's budget: ``budget_s`` seconds from ``start`` (``time.monotonic``)."""

    budget_s: float
    start: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return self.budget_s - self.elapsed()


@dataclass
class Task:
    """A task to run: ``run(clock)`` returns its result (JSON data). A result with a ``status``
    (``PASSED``, ``FAILED``, ``DRY``) sets the task's status; otherwise a task that returns is ``DONE``."""

    name: str
    estimate_s: float
    source: str
    run: Callable[[Clock], dict[str, Any]]
    note: str = ""


@dataclass
class Record:
    """What became of a task: its status, seconds, result and error (a traceback's last lines)."""

    name: str
    estimate_s: float
    source: str
    status: str
    seconds: float = 0.0
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "estimate_s": self.estimate_s, "source": self.source, "status": self.status,
                "seconds": round(self.seconds, 1), "result": self.result, "error": self.error, "note": self.note}


def _short_traceback(err: BaseException, lines: int = 12) -> str:
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run_tasks(tasks: Sequence[Task], clock: Clock, on_record: Callable[[Record], None],
              log: Callable[[str], None] = print) -> list[Record]:
    """Run ``tasks`` in order within ``clock``'s budget; ``on_record`` gets each task's record as
    soon as it is known (the kit writes its files there, so a call cut short keeps it)."""
    records = []
    for task in tasks:
        rec = Record(task.name, task.estimate_s, task.source, NOT_RUN, note=task.note)
        left = clock.remaining()
        if task.estimate_s > left:
            rec.error = f"expected {task.estimate_s:g} s, {max(left, 0):.0f} s left"
            log(f"{task.name}: {NOT_RUN} ({rec.error})")
        else:
            log(f"{task.name}: starting (expected {task.estimate_s:g} s, {left:.0f} s left)")
            t0 = time.monotonic()
            try:
                with deadline(left):
                    rec.result = task.run(clock) or {}
                rec.status = rec.result.pop("status", DONE)
            except BudgetExceeded as err:
                rec.status, rec.error = CUT, str(err)
            except Exception as err:  # the plan goes on: one broken task must not cost the others
                rec.status, rec.error = ERROR, _short_traceback(err)
            rec.seconds = time.monotonic() - t0
            log(f"{task.name}: {rec.status} in {rec.seconds:.1f} s" + (f"\n{rec.error}" if rec.error else ""))
        records.append(rec)
        on_record(rec)
    return records


# --------------------------------------------------------------------------------------------
# A command with a deadline, its whole process tree killed at the end
# --------------------------------------------------------------------------------------------
def _descendants(pid: int) -> dict[int, str]:
    """Every descendant of ``pid``, as pid -> its start time (from /proc; a pid reused later has
    another), or {} where /proc cannot tell."""
    parents: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = entry.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        parents.setdefault(int(fields[1]), []).append((int(entry.parent.name), fields[19]))
    out: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child, started in parents.get(todo.pop(), []):
            out[child] = started
            todo.append(child)
    return out


def _kill_same(pid: int, started: str) -> None:
    """SIGKILL ``pid`` if it is still the process that started at ``started``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return
    if text[text.rfind(")") + 2:].split()[19] == started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kill_tree(proc: subprocess.Popen, seen: dict[int, str] | None = None) -> None:
    """Kill ``proc``, its process group and every descendant -- those alive now and those in
    ``seen`` (descendants noticed earlier, which may have been orphaned since: a kernel in a
    session of its own) -- then reap ``proc``."""
    victims = {**(seen or {}), **_descendants(proc.pid)}
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        proc.kill()
    for pid, started in victims.items():
        _kill_same(pid, started)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@dataclass
class Finished:
    """A bounded command's end: its exit code (None: killed at the deadline) and seconds."""

    returncode: int | None
    seconds: float
    timed_out: bool


def run_bounded(cmd: Sequence[str], timeout_s: float, log_path: Path, *, env: dict[str, str] | None = None,
                cwd: str | Path | None = None, echo: Callable[[str], None] | None = None) -> Finished:
    """Run ``cmd`` with its output appended to ``log_path`` (and each line to ``echo``), for at
    most ``timeout_s`` seconds; at the deadline, or if the kit is interrupted meanwhile
    (``BudgetExceeded``, Ctrl-C), the command's whole process tree is killed."""
    t0 = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    seen: dict[int, str] = {}
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        timed_out, looked = False, 0.0
        try:
            os.set_blocking(proc.stdout.fileno(), False)
            while True:
                chunk = proc.stdout.read(65536)
                if chunk:
                    out.write(chunk)
                    out.flush()
                    if echo is not None:
                        echo(chunk.decode(errors="replace"))
                elif proc.poll() is not None:
                    break
                elif time.monotonic() - t0 > timeout_s:
                    timed_out = True
                    break
                else:
                    time.sleep(0.05)
                if time.monotonic() - looked > 0.5:  # who it started, in case they outlive it
                    seen.update(_descendants(proc.pid))
                    looked = time.monotonic()
        finally:
            kill_tree(proc, seen)  # at the deadline, on BudgetExceeded or Ctrl-C, and what an ended command left
            proc.stdout.close()
    return Finished(None if timed_out else proc.returncode, time.monotonic() - t0, timed_out)


guard(globals(), RecordError)
