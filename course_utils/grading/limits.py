"""Limits for a submission's processes, with what the operating system offers without root or
cgroups (standard library only: this module runs before anything else in a sandboxed process).

* ``apply_rlimits`` -- address space (memory), file size, no core dumps (``resource.setrlimit``);
* ``landlock`` -- Linux's unprivileged sandbox (Landlock, kernel 5.13+): the process and its
  children may read the system, Python and its packages and their scratch folder, and write
  only the scratch folder; they cannot signal or ptrace processes outside it (ABI 6+).
  In ``/dev`` (RAM, outside the disk limit, and writable by root, as a grader in a container or
  a cloud VM runs): files are made and removed only in ``/dev/shm`` (shared memory and POSIX
  semaphores: ``multiprocessing``; contain.py makes it the run's own), and only the device files
  of ``DEVICE_FILES`` -- ``/dev/null`` and its kin, the terminal and pseudo-terminals, the GPUs --
  are opened for writing, by file-level rules (read, write, truncate, ioctl; nothing created,
  removed or renamed in ``/dev``); nothing else there is read or written (not a disk either);
* ``subreaper`` / ``descendants`` / ``kill_new_descendants`` -- while a submission runs, the
  grader becomes the parent of every orphan its children leave (``PR_SET_CHILD_SUBREAPER``), so
  a double-forked or ``setsid`` process is still found and killed before the submission's result
  is written;
* ``tree_rss`` -- the memory of a set of processes (the total limit across processes);
* ``disk_usage`` -- the bytes and files under a folder (the total disk limit of a run);
* ``read_regular`` -- read a file a submission could have planted, safely: a regular file only,
  never through a link, at most a given size (a link to ``/dev/zero`` is refused, not read);
* ``set_pdeathsig`` -- die with the parent (a run's processes never outlive a killed grader).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import glob
import os
import platform
import resource
import signal
import site
import sys
import time
from pathlib import Path

# -- resource limits ----------------------------------------------------------------------------


def apply_rlimits(memory_bytes: int | None, file_bytes: int | None = None) -> None:
    """Address space and file size limits for this process and the processes it starts."""
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if file_bytes:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


# -- Landlock -----------------------------------------------------------------------------------
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446  # the same on x86_64 and aarch64
_PR_SET_NO_NEW_PRIVS = 38
_RULE_PATH_BENEATH = 1
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_TRUNCATE, _IOCTL_DEV = 1 << 14, 1 << 15  # ABI 3, ABI 5
_FS_BITS_BY_ABI = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}  # number of fs access bits per ABI
_FILE_ONLY = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV  # rights valid on a file
# a device file's rights: open to read and write (O_TRUNC too: a shell's > /dev/null) and ioctl;
# on a folder of devices (/dev/pts), the same on the files in it and listing it, never make one
_DEVICE = _READ_FILE | _WRITE_FILE | _TRUNCATE | _IOCTL_DEV | _READ_DIR
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def landlock_abi() -> int:
    """Landlock's ABI version here, 0 if unavailable (not Linux, old kernel, disabled, seccomp)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"):
        return 0
    try:
        r = _libc().syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return max(int(r), 0)


def python_read_paths() -> list[str]:
    """Where this Python and its packages live (what a sandboxed Python must read): its prefixes,
    site-packages and the ``PYTHONPATH`` entries the grader passed on (``grader.package_paths``)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             str(Path(sys.executable).resolve().parent.parent),
             *os.environ.get("PYTHONPATH", "").split(os.pathsep)}
    try:
        paths.update(site.getsitepackages())
    except AttributeError:
        pass
    return sorted(p for p in paths if p and os.path.isdir(p))


SYSTEM_READ = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys"]
#: the only folder of /dev where a run makes and removes files (never all of /dev: a root run
#: would leave a file in the machine's RAM, outside the disk limit, after the class)
SYSTEM_WRITE = ["/dev/shm"]
#: device files a run opens for reading and writing (patterns; what exists when it starts), by
#: file-level rules: ``/dev/pts``, ``/dev/nvidia-caps`` and ``/dev/dri`` are folders whose rule
#: covers the device files in them, which no run can make (``_DEVICE`` has no right to make one).
#: ``/dev/pts`` is needed for a new pseudo-terminal (``os.openpty``, IPython's ``!command``): the
#: kernel opens its other end by path, so the rule also reaches the machine's other terminals
DEVICE_FILES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty",
                "/dev/ptmx", "/dev/pts", "/dev/nvidia*", "/dev/nvidia-caps", "/dev/kfd", "/dev/dri"]


def device_files(patterns: list[str] = DEVICE_FILES) -> list[str]:
    """The paths of ``patterns`` that exist here (``/dev/nvidia0``, ``/dev/nvidiactl``, ...)."""
    return sorted({p for pattern in patterns for p in glob.glob(pattern)})


def landlock(read: list[str], write: list[str], scope: bool = True, devices: list[str] = ()) -> str:
    """Restrict this process (and what it starts) to reading ``read``, writing ``write`` (files
    and folders made and removed there too) and reading and writing the device files ``devices``
    (file-level rights: nothing made, removed or renamed there).

    Returns a description of what is enforced; raises OSError if Landlock fails midway."""
    abi = landlock_abi()
    if abi < 1:
        return "not available (no Landlock on this system)"
    libc = _libc()
    all_fs = (1 << _FS_BITS_BY_ABI.get(abi, 16)) - 1
    attr = _RulesetAttr(all_fs, 0, (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if scope and abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    fd = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        read_rights = _EXECUTE | _READ_FILE | _READ_DIR
        for paths, rights in ((read, read_rights), (write, all_fs), (devices, _DEVICE)):
            for p in paths:
                if not os.path.exists(p):
                    continue
                pfd = os.open(p, os.O_PATH | os.O_CLOEXEC)
                try:
                    allowed = rights if os.path.isdir(p) else rights & _FILE_ONLY
                    rule = _PathBeneath(allowed & all_fs, pfd)
                    if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH),
                                    ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule({p}): "
                                      f"{os.strerror(ctypes.get_errno())}")
                finally:
                    os.close(pfd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_SYS_RESTRICT, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
    scoped = " and cannot signal processes outside it" if scope and abi >= 6 else ""
    return f"Landlock ABI {abi}: writes only to its scratch folder, /dev/shm and device files such as /dev/null{scoped}"


def sandbox_self(scratch: str, memory_bytes: int | None, file_bytes: int | None,
                 extra_read: list[str] = (), use_landlock: bool = True) -> str:
    """Everything a submission's process applies to itself first: rlimits, then Landlock."""
    apply_rlimits(memory_bytes, file_bytes)
    if not use_landlock:
        return "not used (switched off)"
    read = SYSTEM_READ + python_read_paths() + list(extra_read) + [scratch]
    try:
        return landlock(read, SYSTEM_WRITE + [scratch], devices=device_files())
    except OSError as err:
        return f"not enforced ({err})"


# -- processes ----------------------------------------------------------------------------------
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def is_subreaper() -> bool:
    """Whether orphans of this process's descendants become its children (Linux)."""
    if platform.system() != "Linux":
        return False
    try:
        flag = ctypes.c_int(0)
        if _libc().prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
            return False
        return bool(flag.value)
    except (OSError, AttributeError):
        return False


def set_subreaper(enable: bool = True) -> bool:
    """Orphans of our descendants become our children (Linux) -- or, with ``enable=False``, go to
    init again; True where the call took effect, False where unsupported."""
    if platform.system() != "Linux":
        return False
    try:
        return _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1 if enable else 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def subreaper():
    """Be a subreaper inside the block only, then put the flag back as it was and reap the
    orphans adopted meanwhile that have exited: a process that stays a subreaper after grading
    collects zombies of everything its other code starts later (pytest did, running the
    parallel-launch tests after the grader's)."""
    was, children = is_subreaper(), _children()
    ok = set_subreaper(True)
    try:
        yield ok
    finally:
        if ok and not was:
            set_subreaper(False)
        reap_exited_children(exclude=children)


def _children() -> set[int]:
    me = os.getpid()
    return {pid for pid, ppid in _ppids().items() if ppid == me}


def reap_exited_children(exclude: set[int] = frozenset()) -> int:
    """waitpid every direct child of this process that has exited (a zombie) and is not in
    ``exclude`` (children that other code, e.g. a ``subprocess.Popen``, will wait for itself);
    returns how many were reaped."""
    n = 0
    for pid in _children() - set(exclude):
        if _is_zombie(pid):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    n += 1
            except ChildProcessError:
                pass
    return n


def _ppids() -> dict[int, int]:
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            out[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def descendants(root: int | None = None) -> set[int]:
    """Every process below ``root`` (default: this process)."""
    root = os.getpid() if root is None else root
    if not os.path.isdir("/proc"):
        return set()
    children: dict[int, list[int]] = {}
    for pid, ppid in _ppids().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _reap(pids) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def kill_new_descendants(before: set[int], timeout_s: float = 10.0) -> int:
    """SIGKILL every descendant of this process that was not in ``before``, until none is left
    (a process may fork while we kill); returns how many were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        alive = {p for p in descendants() - before if not _is_zombie(p)}
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        _reap(killed)
        kill_orphans_fast(before, rounds=500)  # a re-forking process's orphans come to us
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    _reap(killed)
    return len(killed)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return stat[stat.rindex(")") + 2:].split()[0] in ("Z", "X")
    except (OSError, ValueError):
        return True


def _direct_children() -> set[int]:
    """This process's children, from ``/proc/self/task/*/children`` (fast: no scan of /proc)."""
    out: set[int] = set()
    try:
        for task in os.scandir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task.name}/children") as f:
                    out.update(int(p) for p in f.read().split())
            except (OSError, ValueError):
                continue
    except OSError:
        pass
    return out


def kill_orphans_fast(before: set[int], rounds: int = 2000) -> None:
    """A process that re-forks itself every millisecond (its parent exits each time) lives for
    less than a scan of /proc; as a subreaper its orphans become our direct children, which we
    can list in microseconds: kill those until none comes back (before the full sweep)."""
    quiet = 0
    for _ in range(rounds):
        new = {p for p in _direct_children() - before if not _is_zombie(p)}
        if not new:
            quiet += 1
            if quiet > 20:
                return
            time.sleep(0.001)
            continue
        quiet = 0
        for pid in new:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(new)


def tree_rss(pids) -> int:
    """Resident bytes of ``pids`` together."""
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


# -- files and disk -------------------------------------------------------------------------------


class Unsafe(OSError):
    """A file a submission controls is not something the grader reads (a link, a device, too large)."""


def read_regular(path, cap: int) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``cap`` bytes, opened without
    following a link and without blocking (a FIFO or a device is refused, never read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK):
            raise Unsafe(err.errno, f"{os.path.basename(path)} is a link, not a file") from None
        raise
    try:
        import stat

        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unsafe(errno.EINVAL, f"{os.path.basename(path)} is not a regular file")
        if st.st_size > cap:
            raise Unsafe(errno.EFBIG, f"{os.path.basename(path)} is larger than {cap:,} bytes")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > cap:  # grew while we read
                raise Unsafe(errno.EFBIG, f"{os.path.basename(path)} is larger than {cap:,} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def disk_usage(root, max_files: int) -> tuple[int, int]:
    """(bytes, files) under ``root``, links not followed; stops counting past ``max_files``
    entries (a run that made a million empty files is over its limit: no need to count them all)."""
    total, files = 0, 0
    todo = [str(root)]
    while todo:
        try:
            it = os.scandir(todo.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                files += 1
                if files > max_files:
                    return total, files
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
    return total, files


_PR_SET_PDEATHSIG = 1


def set_pdeathsig(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (thread) dies (Linux)."""
    if platform.system() != "Linux":
        return False
    try:
        return _libc().prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
