"""Settings for every pytest run of the repository (tests/, notebooks/, solutions/).

``make test`` runs pytest on all cores with pytest-xdist, ``-n auto --dist loadfile``: each file
goes to one worker as a whole, so a notebook's cells run in order in one kernel and a module's
fixtures are computed once. Each worker (and every kernel or rank it starts) uses one torch
thread: two workers with two threads each on two cores would fight over them.
"""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # before torch is imported anywhere in this worker; kernels and spawned ranks inherit it
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
