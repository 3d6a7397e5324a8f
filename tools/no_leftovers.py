#!/usr/bin/env python3
"""Run a command and fail if it leaves work behind: a process still running, a file in /dev/shm,
or anything in its temporary folder.

    python tools/no_leftovers.py [--grace SECONDS] -- COMMAND [ARG ...]

``make test`` runs pytest through it (the Makefile), so CI checks it at the end of every run.

* **Processes.** This process becomes a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``):
  a process the command starts and orphans -- a double fork, a ``setsid`` daemon, a re-forking
  loop whose parent is gone -- is re-parented to it instead of to init, so every process the
  command started is still its descendant when the command ends (and each that exits meanwhile is
  reaped at once). After ``--grace`` seconds (kernels and ranks finishing their exit), every
  descendant still running is listed and killed. (``course_utils.grading.limits.subreaper`` does
  the same for a graded run; this tool imports nothing of the course, so that it checks any
  command.)
* **/dev/shm.** Names there that were not there before the command and still are after it: listed
  and removed (POSIX shared memory and semaphores a process forgot; they hold RAM until reboot).
* **Temporary files.** The command runs with ``TMPDIR`` (``TEMP``, ``TMP``) set to a fresh folder;
  whatever is still in it at the end (a file, or a folder with a file in it) is listed, and the
  folder is removed; a folder is shown with a few of its files, to tell whose it is. They fail
  the run only with ``--strict-temp``, which make test and make test-ci pass (a clean-clone
  ``.ci/run`` of 2026-11-27 left none).

The exit status is the command's own when it failed; else 1 when a process or a /dev/shm file
was left behind (or, with ``--strict-temp``, a temporary file), 0 when nothing was. On a system without ``prctl`` (macOS) only the temporary folder is checked.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
SHM = Path("/dev/shm")


def become_subreaper() -> bool:
    """Orphans of our descendants come to us instead of init. False where the system has no such
    call (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and ')'
    return int(fields[1]), fields[0]


def descendants(root: int) -> dict[int, str]:
    """Every live (not zombie) process below ``root``, with its command line."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) and st[1] != "Z":
            parent[int(entry)] = st[0]
    found = {}
    for pid in parent:
        p, seen = parent.get(pid), 0
        while p is not None and p != root and seen < 4096:
            p, seen = parent.get(p), seen + 1
        if p == root and pid != root:
            found[pid] = _cmdline(pid)
    return found


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200] or "?"


def reap() -> None:
    """Collect every child that has exited (orphans re-parented to us become our children)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def wait_reaping(proc: subprocess.Popen) -> int:
    """Wait for ``proc``, reaping every orphan re-parented to us meanwhile: a subreaper that only
    waits for its own child collects the command's exited orphans as zombies (a re-forking test
    makes thousands a second)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # no child left at all
            return proc.wait()
        except KeyboardInterrupt:  # Ctrl-C reached the command too (same process group): let it end
            continue
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode


def kill_all(pids) -> None:
    """SIGKILL a set of processes until none is left (a re-forking one makes new ones meanwhile)."""
    for _ in range(200):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap()
        pids = descendants(os.getpid())
        if not pids:
            return
        time.sleep(0.01)


def _holds_a_file(path: Path) -> bool:
    """A file, or a folder with a file somewhere below it (pytest's empty numbered folders are not
    work left behind)."""
    if not path.is_dir() or path.is_symlink():
        return True
    return any(not d.is_dir() or d.is_symlink() for d in path.rglob("*"))


def _sample(folder: Path, n: int = 3) -> str:
    """A few of the files in ``folder``, to tell whose it is (a folder named by ``tempfile`` alone
    says nothing)."""
    if not folder.is_dir() or folder.is_symlink():
        return ""
    files = sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if not f.is_dir())
    return f" (holds {', '.join(files[:n])}{', ...' if len(files) > n else ''})"


def shm_names() -> set[str]:
    try:
        return set(os.listdir(SHM))
    except OSError:
        return set()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grace", type=float, default=15.0,
                    help="seconds a process may take to finish exiting after the command ends (default 15)")
    ap.add_argument("--strict-temp", action="store_true",
                    help="fail on temporary files left behind too (default: list them and remove them)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command: tools/no_leftovers.py -- COMMAND [ARG ...]")
    if args.grace < 0:
        ap.error(f"--grace must be >= 0 seconds, not {args.grace}")

    reaper = become_subreaper()
    shm_before = shm_names()
    tmp = Path(tempfile.mkdtemp(prefix="course-run-"))
    env = {**os.environ, "TMPDIR": str(tmp), "TEMP": str(tmp), "TMP": str(tmp)}
    proc = subprocess.Popen(command, env=env)
    rc = wait_reaping(proc) if reaper else proc.wait()
    left = []
    if reaper:
        deadline = time.monotonic() + args.grace
        while (alive := descendants(os.getpid())) and time.monotonic() < deadline:
            reap()
            time.sleep(0.2)
        reap()
        if alive := descendants(os.getpid()):
            left += [f"process {pid} still running: {cmd}" for pid, cmd in sorted(alive.items())]
            kill_all(alive)
        for name in sorted(shm_names() - shm_before):
            left.append(f"/dev/shm/{name} left behind")
            try:
                (SHM / name).unlink()
            except OSError:
                pass
    temporary = [f"temporary {'folder' if p.is_dir() else 'file'} left behind: {p.name}{_sample(p)}"
                 for p in sorted(tmp.iterdir()) if _holds_a_file(p)]
    shutil.rmtree(tmp, ignore_errors=True)
    if args.strict_temp:
        left += temporary
    elif temporary:
        print(f"no_leftovers: `{' '.join(command)}` left {len(temporary)} temporary file(s) or folder(s) "
              "(removed now; they fail the run with --strict-temp):", file=sys.stderr)
        for line in temporary:
            print(f"  {line}", file=sys.stderr)
    if left:
        print(f"no_leftovers: `{' '.join(command)}` left work behind ({len(left)}); "
              "removed now. Fix: end what a test starts (a deadline of its own and a kill "
              "in `finally`), and clean what it writes (pytest's tmp_path is removed when the test passes):",
              file=sys.stderr)
        for line in left[:50]:
            print(f"  {line}", file=sys.stderr)
        if len(left) > 50:
            print(f"  ... and {len(left) - 50} more", file=sys.stderr)
    return rc if rc else (1 if left else 0)


if __name__ == "__main__":
    sys.exit(main())
