"""Workers for tests/test_parallel_launch.py. They live in a module because each rank is a fresh
process that imports its worker by name (a function defined in a test would do, but these are
shared by several tests)."""

import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch.distributed as dist


def signal_worker(rank, world, device, config):
    """Rank 1 is killed by ``config["signal"]``; rank 0 waits for it at a barrier."""
    if rank == 1:
        os.kill(os.getpid(), getattr(signal, config["signal"]))
        time.sleep(30)
    dist.barrier()


def printing_worker(rank, world, device, config):
    """Both ranks print many lines at once."""
    for k in range(config["lines"]):
        print(f"rank {rank} line {k} " + "x" * 60)
    return rank


def grandchild_worker(rank, world, device, config):
    """Each rank starts a process of its own (a grandchild of launch) and writes its pid. Then,
    with ``config["then"] == "hang"``, rank 1 sleeps while rank 0 waits at a barrier; with
    ``"raise"``, rank 1 writes the time and raises while rank 0 computes in plain Python (no
    collective that would notice: only launch can stop it)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    Path(config["dir"], f"child{rank}").write_text(str(child.pid))
    if config["then"] == "raise":
        if rank == 1:
            peer = Path(config["dir"], "child0")
            while not peer.exists():  # rank 0 has started its child too
                time.sleep(0.05)
            time.sleep(0.2)
            Path(config["dir"], "raised_at").write_text(repr(time.time()))
            raise RuntimeError("rank 1 failed after starting a process")
        time.sleep(120)
    if rank == 1:
        time.sleep(300)
    dist.barrier()


def uncompared_ddp_worker(rank, world, device, config):
    """``parallel.ddp_worker`` without its ``exact_fp32()`` (what it was before TF32 was handled):
    under ``COURSE_EMULATE_TF32=1`` its gradients carry TF32's rounding. Also reports how many
    convolutions the emulation rounded on this rank."""
    import torch.utils._python_dispatch as pd

    from course_utils import parallel

    worker = inspect.unwrap(parallel.ddp_worker)  # under guard's check and exact_fp32()
    out = worker(rank, world, device, config)
    modes = [m for m in pd._get_current_dispatch_mode_stack() if hasattr(m, "counts")]
    out["tf32_counts"] = dict(modes[0].counts) if modes else {}
    return out
