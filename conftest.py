"""Settings for every pytest run of the repository (tests/, notebooks/, solutions/).

``make test`` runs pytest on all cores with pytest-xdist (``-n auto --dist loadgroup``). Two things
make that safe and fast here:

* a notebook's cells run in order in one kernel, so all the cells of one notebook form one
  xdist group (one worker runs them, in order); so do a test module's tests that share a
  module-scoped fixture (computed once, not once per worker); the other tests spread freely;
* each worker (and every kernel or rank it starts) uses one torch thread: two workers with two
  threads each on two cores would fight over them.
"""

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # before torch is imported anywhere in this worker; kernels and spawned ranks inherit it
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_configure(config):
    # known without pytest-xdist too (a GPU machine's bare pytest), so no unknown-mark warning
    config.addinivalue_line("markers", "xdist_group(name): run these tests on one xdist worker, in order")


def _shares_a_fixture(item) -> bool:
    """Whether ``item`` uses a fixture computed once per module or class (a launch of ranks, a
    float64 U-Net step): its module's users of such fixtures go to one worker, or each worker
    would compute it again."""
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) or {}
    return any(getattr(d, "scope", "function") in ("module", "class") for ds in defs.values() for d in ds)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = os.path.relpath(str(item.path), config.rootpath)
        if path.endswith(".ipynb"):
            item.add_marker(pytest.mark.xdist_group(name=path))
        elif _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(name=path + "::shared fixtures"))
