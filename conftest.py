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
    if call.when == "call":
        marker = item.get_closest_marker("timeout")
        limits = [marker.args[0] if marker and marker.args else item.config.getoption("timeout", None)]
        if item.path.suffix == ".ipynb":  # nbval's own limit for each cell
            limits.append(item.config.getoption("nbval_cell_timeout", None))
        limits = [float(t) for t in limits if t]
        if limits:
            outcome.get_result().user_properties.append(("timeout_s", min(limits)))


_NEAR: list[tuple[float, float, str]] = []


def pytest_runtest_logreport(report):
    if report.when == "call":
        limit = dict(report.user_properties).get("timeout_s")
        if limit:
            _NEAR.append((report.duration / limit, report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    if not _NEAR:
        return
    terminalreporter.section("closest to their timeouts (duration / timeout)")
    for share, seconds, nodeid in sorted(_NEAR, reverse=True)[:8]:
        terminalreporter.write_line(f"{share:6.1%}  {seconds:7.1f} s  {nodeid}")
