"""What a confined run may write under ``/dev``, as root (containers, cloud VMs).

Landlock once allowed writes anywhere under ``/dev`` (``limits.SYSTEM_WRITE = ["/dev"]``), and
only ``/dev/shm`` is a run's own (contain.py's private tmpfs): a root run could plant a file in
the machine's ``/dev`` -- RAM, outside the disk limit -- that outlived the class (or open the
machine's disk, ``/dev/vda``, for writing). A run as another user cannot write in ``/dev`` at all,
so the test needs root; it confines a process as the grader does (``limits.sandbox_self``, the
notebook run's limits), with and without contain.py's namespaces."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from course_utils.grading import grade, limits

CONTAIN = Path(grade.__file__).with_name("contain.py")

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root can write in /dev"),
    pytest.mark.skipif(limits.landlock_abi() < 1, reason="no Landlock here"),
]

DISKS = ("/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/xvda")
CONFINED = r"""
import json, os, sys
from course_utils.grading import limits

scratch, name, memory, disk = sys.argv[1:5]
status = limits.sandbox_self(scratch, int(memory), 2**30)   # the notebook run's limits (grader.py)
out = {"status": status}

def attempt(key, fn):
    try:
        fn()
        out[key] = "ok"
    except OSError as err:
        out[key] = type(err).__name__

def plant():
    with open(f"/dev/{name}", "w") as f:
        f.write("left by a submission")

def null():
    with open("/dev/null", "w") as f:   # O_TRUNC, as a shell's > /dev/null
        f.write("x")
    fd = os.open("/dev/null", os.O_RDWR)   # subprocess.DEVNULL
    os.close(fd)

def shm():
    import multiprocessing as mp
    from multiprocessing import shared_memory
    with open(f"/dev/shm/{name}", "w") as f:
        f.write("x")
    os.remove(f"/dev/shm/{name}")
    seg = shared_memory.SharedMemory(create=True, size=4096)   # /dev/shm/psm_*
    seg.buf[0] = 7
    seg.close()
    seg.unlink()
    lock = mp.get_context("spawn").Lock()   # a POSIX semaphore: /dev/shm/sem.*
    with lock:
        pass

def pty():
    a, b = os.openpty()   # /dev/ptmx and /dev/pts/N (IPython's !command)
    os.write(b, b"x")
    os.close(a)
    os.close(b)

def urandom():
    with open("/dev/urandom", "rb") as f:
        assert len(f.read(8)) == 8

attempt("plant", plant)
attempt("mkdir", lambda: os.mkdir(f"/dev/{name}.d"))
attempt("symlink", lambda: os.symlink("/tmp", f"/dev/{name}.l"))
attempt("mkfifo", lambda: os.mkfifo(f"/dev/{name}.p"))
if disk:
    attempt("disk", lambda: os.close(os.open(disk, os.O_RDWR)))   # opened, never written
attempt("null", null)
attempt("shm", shm)
attempt("pty", pty)
attempt("urandom", urandom)
print(json.dumps(out))
"""


def _leftovers(name: str) -> list[str]:
    return sorted(p for p in os.listdir("/dev") if p.startswith(name))


@pytest.mark.parametrize("contained", [False, True], ids=["landlock", "landlock+namespaces"])
def test_a_confined_root_run_cannot_write_in_dev_but_in_shm_and_null(tmp_path, contained):
    if contained and not grade.containment()[0]:
        pytest.skip(f"no user namespaces here: {grade.containment()[1]}")
    name = f"planted-{uuid.uuid4().hex[:12]}"
    script = tmp_path / "confined.py"
    script.write_text(CONFINED)
    disk = next((p for p in DISKS if Path(p).is_block_device()), "")
    argv = [sys.executable, str(script), str(tmp_path), name, str(grade.Options().memory_bytes), disk]
    if contained:
        argv = [sys.executable, str(CONTAIN), "--shm-bytes", str(2**26), "--", *argv]
    env = dict(os.environ, PYTHONPATH=str(Path(grade.__file__).parents[2]))
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        left = _leftovers(name)
    finally:
        for p in _leftovers(name):
            path = Path("/dev", p)
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        if not os.path.exists("/dev/null") or not Path("/dev/null").is_char_device():
            pytest.fail("/dev/null was replaced")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"].startswith("Landlock ABI"), out
    assert left == [], f"the confined run left {left} in the machine's /dev ({out})"
    refused = ("plant", "mkdir", "symlink", "mkfifo") + (("disk",) if disk else ())
    assert {k: out[k] for k in refused} == dict.fromkeys(refused, "PermissionError"), out
    assert {k: out[k] for k in ("null", "shm", "pty", "urandom")} == dict.fromkeys(("null", "shm", "pty", "urandom"), "ok"), out
