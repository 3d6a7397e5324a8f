"""The grader's containment pieces, fast (seconds): every process of a contained run ends with it,
its /dev/shm is its own, files a submission plants are read safely, and deadlines and disk use are
the grader's own measurements. The whole grader on such submissions: tests/test_grading_robust.py."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from course_utils.grading import grade, limits
from course_utils.grading.grader import _load_observation, _read_json

CONTAIN = Path(grade.__file__).with_name("contain.py")
CONTAINED = sys.platform.startswith("linux") and grade.containment()[0]
needs_namespaces = pytest.mark.skipif(not CONTAINED, reason=f"no user namespaces here: {grade.containment()[1]}")

# a program that outlives its parent: a chain of processes, each forking the next and exiting (its
# own deadline ends the chain REFORKER_LIFE seconds after it started, should a test's kill lose
# the race with it on a loaded machine)
REFORKER_LIFE = 60
REFORKER = f"""
import os, sys, time
marker = sys.argv[1]
open("/dev/shm/left-by-the-run", "w").write("a message for the next submission")
deadline = time.monotonic() + {REFORKER_LIFE}
if os.fork() == 0:
    os.setsid()
    while time.monotonic() < deadline:   # a new process every ~2 ms, its parent gone each time
        if os.fork():
            os._exit(0)
        time.sleep(0.002)
        try:
            with open(marker, "a") as f:
                f.write(".")
        except OSError:
            pass
    os._exit(0)
time.sleep(0.5)
sys.exit(7)
"""


def _still_written(marker: Path, wait: float = 1.0) -> bool:
    marker.unlink(missing_ok=True)
    time.sleep(wait)
    return marker.exists()


@needs_namespaces
def test_a_contained_run_takes_every_process_with_it_and_its_shm(tmp_path):
    script, marker = tmp_path / "reforker.py", tmp_path / "alive"
    script.write_text(REFORKER)
    Path("/dev/shm/left-by-the-run").unlink(missing_ok=True)
    p = subprocess.run([sys.executable, str(CONTAIN), "--shm-bytes", str(2**20), "--", sys.executable, str(script),
                        str(marker)], timeout=60)
    assert p.returncode == 7  # the program's own exit code
    assert not _still_written(marker), "a re-forking process outlived its contained run"
    assert not os.path.exists("/dev/shm/left-by-the-run")  # the run's /dev/shm was its own


SYSV_AND_TCP = """
import ctypes, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
assert libc.shmget(int(sys.argv[1]), 4096, 0o1666) >= 0          # IPC_CREAT | 0666: a System V segment
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[2])))                           # the port the test holds outside
s.listen()
socket.create_connection(s.getsockname(), timeout=5).close()      # its own loopback is up
"""


@needs_namespaces
def test_a_contained_run_has_its_own_ipc_and_network(tmp_path):
    import ctypes
    import socket

    script = tmp_path / "ipc.py"
    script.write_text(SYSV_AND_TCP)
    key = 0x5EED0000 + os.getpid() % 0xFFFF
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        p = subprocess.run([sys.executable, str(CONTAIN), "--shm-bytes", str(2**20), "--", sys.executable, str(script),
                            str(key), str(port)], timeout=60, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert ctypes.CDLL(None, use_errno=True).shmget(key, 0, 0) == -1  # the segment died with its run


def test_without_namespaces_the_same_process_survives(tmp_path):
    """The reason for contain.py: the same program, not contained, leaves its re-forker running
    (the test kills it afterwards through its session)."""
    script, marker = tmp_path / "reforker.py", tmp_path / "alive"
    script.write_text(REFORKER.replace("/dev/shm/left-by-the-run", str(tmp_path / "shm-file")))
    subprocess.run([sys.executable, str(script), str(marker)], timeout=60)
    try:
        assert _still_written(marker)
    finally:
        for _ in range(200):  # stop it: kill every process whose command line names the marker
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit()
                    and str(marker).encode() in _cmdline(int(p))]
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            if not pids and not _still_written(marker, 0.05):
                break


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@needs_namespaces
def test_a_contained_run_dies_with_the_grader(tmp_path):
    """The grader is SIGKILLed mid-run: its launcher, the namespace's init and every process in it
    follow (PR_SET_PDEATHSIG chain), nothing is orphaned."""
    script, marker = tmp_path / "reforker.py", tmp_path / "alive"
    script.write_text(REFORKER.replace("time.sleep(0.5)", "time.sleep(600)"))
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        from course_utils.grading import limits
        def child():
            limits.set_pdeathsig()
        subprocess.Popen([sys.executable, {str(CONTAIN)!r}, "--shm-bytes", "1048576", "--", sys.executable,
                          {str(script)!r}, {str(marker)!r}], preexec_fn=child, start_new_session=True)
        time.sleep(600)
    """)
    grader = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the contained program never started"
    grader.kill()
    grader.wait()
    time.sleep(0.5)
    assert not _still_written(marker), "the run outlived its grader"


def test_probe_says_why_not(monkeypatch):
    ok, why = grade.containment()
    assert isinstance(ok, bool) and why


# -- files a submission controls ------------------------------------------------------------------
def test_planted_links_devices_and_fifos_are_refused_not_read(tmp_path):
    import torch

    good = tmp_path / "good.pt"
    torch.save([1, 2], good)
    assert _load_observation(good) == [1, 2]
    (tmp_path / "zero.pt").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.pt")
    t0 = time.monotonic()
    for name in ("zero.pt", "fifo.pt"):
        got = _load_observation(tmp_path / name)
        assert got["__raised__"] and "could not be read" in got["message"], got
    with pytest.raises(limits.Unsafe, match="not a regular file"):
        limits.read_regular("/dev/zero", 100)
    with pytest.raises(limits.Unsafe, match="is a link"):
        limits.read_regular(tmp_path / "zero.pt", 100)
    (tmp_path / "big.json").write_text("[" + "1," * 3_000_000 + "1]")
    assert _read_json(tmp_path / "big.json") is None  # over 4 MiB: not read
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    assert _read_json(tmp_path / "deep.json") is None  # RecursionError is the file's problem, not the grader's
    (tmp_path / "rebuild.json").symlink_to("/dev/zero")
    assert _read_json(tmp_path / "rebuild.json") is None
    assert time.monotonic() - t0 < 10


def test_disk_usage_counts_bytes_and_stops_counting_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x" * 100_000)
    for i in range(50):
        (tmp_path / f"e{i}").touch()
    (tmp_path / "link").symlink_to("/usr")  # not followed
    used, files = limits.disk_usage(tmp_path, 1000)
    assert files == 53 and 100_000 <= used < 2_000_000
    assert limits.disk_usage(tmp_path, 10)[1] == 11  # stopped past the limit


def test_options_refuse_bad_limits():
    with pytest.raises(ValueError, match="disk-gib must be > 0"):
        grade.Options(disk_gib=0)
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        grade.Options(jobs=0)


def test_class_seeds_one_per_exercise_unless_asked(tmp_path):
    nbs = [Path(n) for n in ("01_a.ipynb", "01_b.ipynb", "03_a.ipynb", "x.ipynb")]
    s = grade.class_seeds(nbs, grade.Options())
    assert s[0] == s[1] and s[3] is None and isinstance(s[2], int)
    assert grade.class_seeds(nbs, grade.Options(seed=5)) == [5] * 4
    assert grade.class_seeds(nbs, grade.Options(seed_per_submission=True)) == [None] * 4
