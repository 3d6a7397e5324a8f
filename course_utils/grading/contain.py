"""Run one program of a submission (the notebook run, the sandbox) so that **every process it
starts provably ends with it**, and nothing it leaves in shared memory reaches another run.

``python contain.py --shm-bytes N -- PROGRAM ARG...`` (started by the grader by path, before
anything imports torch; standard library only). Where Linux lets an unprivileged user create
namespaces (most distributions; see ``probe``), it

1. asks to be SIGKILLed when the grader dies (``PR_SET_PDEATHSIG``);
2. enters new **user, mount, PID, IPC and network namespaces** (``unshare``), mapping the user
   to itself: System V shared memory, message queues and sockets (``localhost`` included, with
   its own loopback, up) are the run's own, and nothing outside the machine is reachable;
3. mounts a private, size-limited ``tmpfs`` on ``/dev/shm`` (shared memory, POSIX semaphores:
   what ``multiprocessing`` and ``torch.multiprocessing`` use) -- invisible to every other run,
   and gone with the run;
4. forks the namespace's **init** (PID 1), which mounts its own ``/proc``, drops every
   capability from its bounding set (the program runs without privileges, even as root), is
   SIGKILLed when this launcher dies, starts ``PROGRAM``, reaps orphans, and exits when
   ``PROGRAM`` does.

When the init of a PID namespace exits, the kernel kills every process in it: a double fork,
``setsid``, a process that re-forks itself every millisecond -- all end with the run, or when
the grader kills the launcher, or when the grader itself is killed (the ``PDEATHSIG`` chain
grader -> launcher -> init -> namespace). Where namespaces are unavailable the grader falls back
to its subreaper sweep (``limits.kill_new_descendants``) and says so.

The launcher exits the way ``PROGRAM`` did (its exit code, or the same signal).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import struct
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
CLONE_NEWIPC, CLONE_NEWNET = 0x08000000, 0x40000000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP = 1, 24
LAST_CAP = 63


_LIBC: list = []


def _libc():
    if not _LIBC:  # loaded once: find_library may start a subprocess (ldconfig), not in PID 1
        try:
            _LIBC.append(ctypes.CDLL("libc.so.6", use_errno=True))
        except OSError:
            _LIBC.append(ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True))
    return _LIBC[0]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enter(shm_bytes: int) -> None:
    """Steps 2-3: new user, mount, PID, IPC and network namespaces and a private /dev/shm (this
    process stays in the parent PID namespace; its next child is the new one's init)."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(NAMESPACES), "unshare")
    try:
        _write("/proc/self/setgroups", "deny")
    except FileNotFoundError:
        pass
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    opts = f"size={max(int(shm_bytes), 1 << 20)},mode=1777".encode()
    _check(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mount tmpfs /dev/shm")
    loopback_up()


def loopback_up() -> None:
    """A new network namespace has a loopback interface, down: bring it up (a kernel's channels
    and a DDP process group connect through 127.0.0.1)."""
    import fcntl
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _init(argv: list[str], report_fd: int) -> None:
    """PID 1 of the new namespace: start ``argv``, reap everything, exit with it."""
    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # its own /proc (os.getpid() and /proc/<pid> agree); best effort: some containers forbid it
    libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    for cap in range(LAST_CAP + 1):  # no privilege survives exec, even for root
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    child = os.fork()
    if child == 0:
        os.close(report_fd)
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    status = 0
    while True:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            status = st
            break
    os.write(report_fd, struct.pack("i", status))
    os._exit(0)  # PID 1 exits: the kernel kills what is left in the namespace


def run(argv: list[str], shm_bytes: int) -> int:
    """The launcher: enter the namespaces (``enter``), fork their init, which runs ``argv``, and
    return the way ``argv`` ended (its exit code; killed by a signal: the same signal, or 128 + it)."""
    libc = _libc()
    parent = os.getppid()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the grader died before we could ask
        os._exit(137)
    enter(shm_bytes)
    r, w = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(r)
        _init(argv, w)
    os.close(w)
    data = b""
    while len(data) < 4:
        chunk = os.read(r, 4 - len(data))
        if not chunk:
            break
        data += chunk
    os.waitpid(init, 0)
    if len(data) < 4:
        return 137  # init was killed
    status = struct.unpack("i", data)[0]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


def probe() -> tuple[bool, str]:
    """Can this user contain a run here? Tries every step in a throw-away child process."""
    if not sys.platform.startswith("linux"):
        return False, "not Linux"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            enter(1 << 20)
            inner = os.fork()
            if inner == 0:
                os._exit(0 if os.getpid() == 1 else 3)
            _, st = os.waitpid(inner, 0)
            os.write(w, b"ok" if os.waitstatus_to_exitcode(st) == 0 else b"no PID namespace")
        except OSError as err:
            os.write(w, str(err).encode()[:500])
        finally:
            os._exit(0)
    os.close(w)
    msg = b""
    while chunk := os.read(r, 512):
        msg += chunk
    os.close(r)
    os.waitpid(pid, 0)
    text = msg.decode(errors="replace")
    return text == "ok", text or "the probe died"


def main(argv: list[str] | None = None) -> int:
    """``contain.py --shm-bytes N -- PROGRAM ARG...`` (or ``--probe``: can this user contain a run?);
    returns the exit status, 2 on a wrong command line."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"]:
        ok, why = probe()
        print(why)
        return 0 if ok else 1
    if len(argv) < 4 or argv[0] != "--shm-bytes" or argv[2] != "--":
        print("usage: contain.py --shm-bytes N -- PROGRAM ARG...", file=sys.stderr)
        return 2
    return run(argv[3:], int(argv[1]))


if __name__ == "__main__":
    sys.exit(main())
