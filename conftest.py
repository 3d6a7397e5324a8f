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
