"""launch() under faults: the rank that caused a failure is named with its cause (traceback,
signal, hang), bad arguments are refused before anything starts, nothing outlives a launch
(no zombies, no orphaned grandchildren), output arrives one whole line at a time, and nothing
lands on the notebook's stderr. Workers: tests/launch_workers.py."""

import math
import os
import re
import socket
import sys
import time
import types
from pathlib import Path

import pytest

import launch_workers as lw
from course_utils.parallel import LaunchError, LaunchTimeout, failing_worker, launch, stuck_worker
from course_utils.parallel.launcher import _diagnose, _RunEnd


LINUX = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


def _children_state() -> dict[int, str]:
    """pid -> state of every process whose parent is this one (Z: a zombie nobody reaped)."""
    me, out = os.getpid(), {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                out[int(entry.name)] = fields[0]
    return out


def _running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (a dead process waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# SIGTERM takes SIGKILL's path (the signal read from the return code, its cause from one table): it
# repeats that check with another row of the table, in make test-sweep (two ranks: ~3 CPU-s)
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSEGV", pytest.param("SIGTERM", marks=pytest.mark.sweep)])
def test_a_rank_killed_by_a_signal_is_named_with_the_signal(sig):
    with pytest.raises(LaunchError) as info:
        launch(lw.signal_worker, 2, {"signal": sig}, timeout_s=120)
    err = info.value
    assert str(err).startswith(f"rank 1 of signal_worker was killed by signal {sig}")
    assert err.rank == 1 and sig in err.cause
    assert "rank 0 " not in str(err).splitlines()[0].split(";")[0]
    if sig == "SIGSEGV":  # faulthandler's report: where it crashed
        assert "in signal_worker" in err.details


def test_a_hung_rank_is_blamed_not_the_peer_that_timed_out():
    # rank 1 sleeps; rank 0's barrier gives up after 3 s: rank 1 is the cause
    with pytest.raises(LaunchError) as info:
        launch(stuck_worker, 2, {"sleep_s": 120}, timeout_s=120, collective_timeout_s=3)
    err = info.value
    assert err.rank == 1
    assert str(err).startswith("rank 1 of stuck_worker hung: it was still running in stuck_worker")
    assert "rank 0 gave up waiting for it in a collective after 3 s" in str(err)


@LINUX
def test_past_the_deadline_the_hung_rank_is_named_and_nothing_survives(tmp_path):
    # 20 s, then once more with 90 s if neither rank got as far as its worker in 20 s: on a loaded
    # 2-core machine (CI's own xdist workers) two processes importing torch can take that long,
    # and that case has its own message and test; this one is about a rank hung in its worker
    for timeout_s in (20, 90):
        with pytest.raises(LaunchTimeout, match=f"did not finish within {timeout_s} s") as info:
            launch(lw.grandchild_worker, 2, {"dir": str(tmp_path), "then": "hang"}, timeout_s=timeout_s,
                   collective_timeout_s=300)  # rank 0 waits in its barrier past the deadline
        if "no rank had started its worker" not in str(info.value):
            break
    err = info.value
    assert isinstance(err, TimeoutError) and err.rank == 1, str(err)
    assert "rank 1 hung in grandchild_worker" in str(err)
    assert "rank 0 was stopped by launch while waiting in a collective (barrier)" in str(err)
    assert not [pid for pid, state in _children_state().items() if state == "Z"], "zombie ranks"
    pids = [int((tmp_path / f"child{r}").read_text()) for r in (0, 1)]
    time.sleep(0.2)
    assert not [pid for pid in pids if _running(pid)], "processes started by the workers outlived launch"


@LINUX
def test_a_failure_stops_every_rank_at_once_and_nothing_survives(tmp_path):
    # rank 1 raises while rank 0 computes: launch stops rank 0 at once (no SIGTERM grace period)
    # and kills what both ranks started
    with pytest.raises(LaunchError, match="rank 1 failed after starting a process"):
        launch(lw.grandchild_worker, 2, {"dir": str(tmp_path), "then": "raise"}, timeout_s=120)
    assert time.time() - float((tmp_path / "raised_at").read_text()) < 1.5
    pids = [int(p.read_text()) for p in tmp_path.glob("child*")]
    assert len(pids) == 2
    time.sleep(0.2)
    assert not [pid for pid in pids if _running(pid)]
    assert not [pid for pid, state in _children_state().items() if state == "Z"]


def _in_main(fn):
    fn.__module__, fn.__qualname__ = "__main__", fn.__name__
    return fn


def test_a_worker_from_a_notebook_cell_is_refused_with_the_cause(monkeypatch):
    def my_worker(rank, world, device, config):
        return rank

    worker = _in_main(my_worker)
    # as in Jupyter: __main__ is the kernel's namespace, with no file behind it
    notebook_main = types.ModuleType("__main__")
    notebook_main.my_worker = worker
    monkeypatch.setitem(sys.modules, "__main__", notebook_main)
    with pytest.raises(ValueError, match=r"workers must be importable\. Fix: define it in a module"):
        launch(worker, 2, timeout_s=60)


def test_a_worker_that_cannot_be_imported_by_name_is_refused():
    def my_worker(rank, world, device, config):
        return rank

    with pytest.raises(ValueError, match="workers must be importable"):
        launch(my_worker, 2, timeout_s=60)  # nested function: <locals> in its qualified name
    with pytest.raises(ValueError, match="workers must be importable"):
        launch(_in_main(my_worker), 2, timeout_s=60)  # __main__ here is pytest's, without it


@pytest.mark.parametrize("world_size", [0, -1, 1.5, True, "2", None])
def test_a_bad_world_size_is_refused(world_size):
    with pytest.raises(ValueError, match=r"world_size=.* is not a whole number >= 1\. Fix:"):
        launch(failing_worker, world_size)


@pytest.mark.parametrize("timeout", [0, -1, math.nan, math.inf, "10"])
def test_a_bad_timeout_is_refused(timeout):
    with pytest.raises(ValueError, match=r"timeout_s=.* is not a finite number > 0\. Fix:"):
        launch(failing_worker, 2, timeout_s=timeout)
    with pytest.raises(ValueError, match=r"collective_timeout_s=.* is not a finite number > 0\. Fix:"):
        launch(failing_worker, 2, collective_timeout_s=timeout)


def test_no_other_process_can_take_the_port_where_the_ranks_meet(monkeypatch):
    """CI, 2026-11-28, on a loaded machine: ``launch`` picked a free port, released it, and rank 0
    found it taken (EADDRINUSE) when it bound it seconds later; notebook 09 failed. Here a thief
    takes every port this process releases, at once: the ranks must still meet (the launching
    process holds its store's port from bind to the end)."""
    stolen, close = [], socket.socket.close

    def close_then_steal(sock):
        try:
            port = sock.getsockname()[1] if sock.family == socket.AF_INET else 0
        except OSError:
            port = 0
        close(sock)
        if port:
            thief = socket.socket()
            thief.bind(("127.0.0.1", port))
            thief.listen()
            stolen.append(thief)

    monkeypatch.setattr(socket.socket, "close", close_then_steal)
    try:
        assert launch(lw.printing_worker, 2, {"lines": 1}, timeout_s=120) == [0, 1]
    finally:
        for thief in stolen:
            close(thief)


def test_output_comes_back_whole_lines_prefixed_with_the_rank(capfd):
    assert launch(lw.printing_worker, 2, {"lines": 300}, timeout_s=120) == [0, 1]
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert len(lines) == 600
    for line in lines:
        m = re.fullmatch(r"\[rank (\d)\] rank (\d) line \d+ x{60}", line)
        assert m and m.group(1) == m.group(2), line
    assert err == ""


def test_a_failure_leaves_nothing_on_stderr(capfd):
    # in Jupyter anything on stderr is a pink box; the error itself says everything
    with pytest.raises(LaunchError) as info:
        launch(failing_worker, 2, timeout_s=120)
    out, err = capfd.readouterr()
    assert err == ""
    assert info.value.rank == 1 and info.value.cause.startswith("ValueError: rank 1 failed on purpose")
    assert set(info.value.ranks) == {0, 1}


# -- a peer that lost its connection is a consequence, not the cause -----------------------------
def test_a_rank_that_lost_its_peer_is_not_blamed_even_if_it_ended_first(tmp_path):
    """Rank 0's collective fails with gloo's 'Connection closed by peer' (and rank 0 ends
    first) because rank 1 raised: rank 1 is the cause.
    Without this test the mutant ``launch-peer-gone-is-a-cause`` of tools/mutants.py (a rank whose peer closed the
    connection blamed as the cause) survived the other tests."""
    records = {
        0: {"ok": False, "error": "Traceback (most recent call last):\nRuntimeError: "
                                  "[gloo/transport/tcp/pair.cc:534] Connection closed by peer"},
        1: {"ok": False, "error": "Traceback (most recent call last):\nValueError: a bad shape"},
    }
    err = _diagnose(_RunEnd("w", str(tmp_path), records, codes={0: 1, 1: 1}, ended={0: 1.0, 1: 2.0},
                            stopped=set(), stacks={}, timed_out=False, timeout_s=180, collective_timeout_s=60))
    assert isinstance(err, LaunchError) and err.rank == 1
    assert err.cause == "ValueError: a bad shape"
    assert err.ranks[0] == "failed as a consequence (a peer closed its connection)"
