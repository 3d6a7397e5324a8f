"""Settings for every pytest run of the repository (tests/, notebooks/, solutions/).

``make test`` runs pytest on all cores with pytest-xdist, ``-n auto --dist loadfile``: each file
goes to one worker as a whole, so a notebook's cells run in order in one kernel and a module's
fixtures are computed once. Each worker (and every kernel or rank it starts) uses one torch
thread: two workers with two threads each on two cores would fight over them. The notebooks whose
asserts compare launched ranks with an fp32 reference run on TF32 ranks (the hook below).
"""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # before torch is imported anywhere in this worker; kernels and spawned ranks inherit it
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


import pytest  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Notebooks 08 and 09 (and their solutions) run on TF32 ranks: nbval starts a notebook's
    kernel in the setup of its first cell, which inherits ``COURSE_EMULATE_TF32=1`` from here, and
    so do the ranks it launches (``course_utils.tf32.ranks_on_tf32_for`` says why once is enough)."""
    if item.path.suffix != ".ipynb":  # a unit test: nothing to set, nothing to import
        yield
        return
    from course_utils.tf32 import ranks_on_tf32_for

    with ranks_on_tf32_for(item.path):
        yield


#: ``course_utils.session_cache.ENV_VAR``, named here so that the controller does not import
#: torch (tests/test_session_cache.py checks the two agree)
SESSION_CACHE_VAR = "COURSE_SESSION_CACHE"


def pytest_configure(config):
    """One folder of shared predictions per session (``course_utils.session_cache``): the
    controller (or a run without workers) makes a fresh one, whatever it inherited -- a pytest
    run on a mutated or scaffolded copy must compute its own -- and its workers, their kernels
    and the ranks they launch inherit it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import tempfile

    config._course_session_cache = tempfile.mkdtemp(prefix="course-predictions-")
    os.environ[SESSION_CACHE_VAR] = config._course_session_cache


def pytest_unconfigure(config):
    folder = getattr(config, "_course_session_cache", None)
    if folder:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


# --- how close each test came to its timeout, listed at the end of a run (.ci/run shows it): a
# test near its limit on an idle machine fails on a loaded one (CI gets ~0.15 of a core per process)
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _CPU_START in item.stash:
        outcome.get_result().user_properties.append(("cpu_s", _cpu_seconds() - item.stash[_CPU_START]))
    if call.when == "call":
        marker = item.get_closest_marker("timeout")
        limits = [marker.args[0] if marker and marker.args else item.config.getoption("timeout", None)]
        if item.path.suffix == ".ipynb":  # nbval's own limit for each cell
            limits.append(item.config.getoption("nbval_cell_timeout", None))
        limits = [float(t) for t in limits if t]
        if limits:
            outcome.get_result().user_properties.append(("timeout_s", min(limits)))


_NEAR: list[tuple[float, float, str]] = []
_CPU: dict[str, float] = {}

# --- the CPU seconds each test cost (setup, call and teardown; a module's fixtures count in its
# first test), listed at the end of a run with each file's total: CI's time is its CPU seconds
_CPU_START = pytest.StashKey[float]()
#: /proc's clock ticks per second
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds() -> float:
    """User + system seconds of this process, of the children it has reaped and of every live
    descendant (a notebook's kernel, a grader's sandbox, a launched rank; Linux's /proc, read
    without a scan of every process: each test reads it twice)."""
    import resource

    total = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                for f in ("ru_utime", "ru_stime"))
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            for task in os.scandir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task.name}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            if pid != os.getpid():
                with open(f"/proc/{pid}/stat") as f:  # utime stime cutime cstime: fields 14-17
                    total += sum(int(v) for v in f.read().rsplit(")", 1)[1].split()[11:15]) / _TICKS
        except (OSError, ValueError):  # gone meanwhile (counted once reaped), or no /proc
            continue
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_CPU_START] = _cpu_seconds()
    yield


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        cpu = dict(report.user_properties).get("cpu_s")
        if cpu is not None:
            _CPU[report.nodeid] = cpu
    if report.when == "call":
        limit = dict(report.user_properties).get("timeout_s")
        if limit:
            _NEAR.append((report.duration / limit, report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    if _CPU:
        top = int(os.environ.get("COURSE_CPU_TOP", 20))
        files: dict[str, float] = {}
        for nodeid, cpu in _CPU.items():
            name = nodeid.split("::")[0]
            files[name] = files.get(name, 0.0) + cpu
        terminalreporter.section(f"CPU seconds: {sum(_CPU.values()):.0f} in tests (the costliest files and tests)")
        for name, cpu in sorted(files.items(), key=lambda kv: -kv[1])[:top]:
            terminalreporter.write_line(f"{cpu:7.1f} s  {name}")
        terminalreporter.write_line("")
        for nodeid, cpu in sorted(_CPU.items(), key=lambda kv: -kv[1])[:top]:
            terminalreporter.write_line(f"{cpu:7.1f} s  {nodeid}")
    if not _NEAR:
        return
    terminalreporter.section("closest to their timeouts (duration / timeout)")
    for share, seconds, nodeid in sorted(_NEAR, reverse=True)[:8]:
        terminalreporter.write_line(f"{share:6.1%}  {seconds:7.1f} s  {nodeid}")
