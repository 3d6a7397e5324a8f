"""The torchrun entry point and the workers that are not a parallel scheme of their own:
``train_worker`` (a few DDP or FSDP training steps: what ``torchrun -m course_utils.parallel``
runs, through ``main``), ``torchrun_backend`` and ``torchrun_command`` (one GPU per rank, or gloo),
the failure demos ``failing_worker`` and ``stuck_worker``, and ``source_worker`` (a learner's
function, sent as source code).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..checks import ParallelError, guard
from ..data import SyntheticVolumes
from .data_parallel import build_net, global_batch
from .launcher import COLLECTIVE_TIMEOUT_S, compared, launch


def train_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """A few DDP (or FSDP) training steps on synthetic volumes; the script entry point."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = build_net(config).to(device)
    if config.get("mode") == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(net)
        model = net
    else:
        model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    per_rank = config.get("global_batch", 4) // world
    ds = SyntheticVolumes(per_rank * world * config.get("steps", 3), config.get("volume", (8, 16, 16)))
    losses = []
    for step in range(config.get("steps", 3)):
        idx = [step * per_rank * world + rank * per_rank + k for k in range(per_rank)]
        x = torch.stack([ds[i][0] for i in idx]).to(device)
        y = torch.stack([ds[i][1] for i in idx]).to(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"rank": rank, "losses": losses}


def failing_worker(rank: int, world: int, device: torch.device, config: dict) -> None:  # noqa: ARG001 - launch's worker
    """For the demo of failures: rank 1 raises while rank 0 waits for it at a barrier."""
    if rank == 1:
        raise ValueError("rank 1 failed on purpose (a bad shape, a missing file, ...)")
    dist.barrier()


def stuck_worker(rank: int, world: int, device: torch.device, config: dict) -> None:  # noqa: ARG001 - launch's worker
    """For the demo of hangs: rank 1 never reaches the barrier rank 0 waits at."""
    if rank == 1:
        time.sleep(config.get("sleep_s", 600))
    dist.barrier()


@compared
def source_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """Runs a learner's ``ddp_step(model, x, y, rank, world) -> grads`` given as source code
    (a notebook's functions cannot be imported by spawned processes). The namespace has
    ``torch``, ``nn``, ``dist`` and ``DDP``. The model and the global batch are on this rank's
    device (``cuda:rank`` under NCCL). Records the batch size and device the model saw."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ns: dict[str, Any] = {"torch": torch, "nn": nn, "dist": dist, "DDP": DDP}
    exec(compile(config["source"], "<learner>", "exec"), ns)
    net = build_net(config).to(device)
    seen: list[int] = []
    devices: list[str] = []

    def record(module, args):  # noqa: ARG001 - nn.Module forward pre-hook (module, args)
        seen.append(args[0].shape[0])
        devices.append(str(args[0].device))

    net.register_forward_pre_hook(record)
    x, y = global_batch(config)
    grads = ns[config["name"]](net, x.to(device), y.to(device), rank, world)
    return {"rank": rank, "grads": [g.detach().cpu() for g in grads], "batch_seen": seen,
            "devices_seen": devices}


def torchrun_backend(env: dict | None = None, backend: str = "auto") -> tuple[str, torch.device]:
    """Backend and device of this rank under ``torchrun``, from its environment: one GPU per
    process on this node (``LOCAL_RANK`` of ``LOCAL_WORLD_SIZE``), however many nodes. With
    CUDA present that is NCCL or an error, never a silent fall-back to the CPU; without CUDA
    (or with ``backend="gloo"``) gloo on CPU."""
    env = os.environ if env is None else env
    local_rank = int(env.get("LOCAL_RANK", 0))
    local_world = int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1)))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "gloo":
        return "gloo", torch.device("cpu")
    if backend != "nccl":
        raise ValueError(f"--backend {backend!r}: choose auto, nccl or gloo")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < local_world:
        raise RuntimeError(
            f"this node runs {local_world} ranks but has {gpus} GPU(s). Fix: start torchrun with "
            f"--nproc-per-node={max(gpus, 1)} (one process per GPU), or pass --backend gloo to "
            "train on the CPU")
    return "nccl", torch.device("cuda", local_rank)


def torchrun_command(nproc: int = 2, module: str = "course_utils.parallel") -> tuple[list[str], str]:
    """The command that starts ``nproc`` ranks of ``module`` with torchrun on this machine, and
    one line saying where they run. NCCL needs a GPU per rank: with fewer GPUs than ranks (one
    GPU, say) the ranks are told to use gloo on the CPU, instead of stopping at the error
    ``torchrun_backend`` raises for that case."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # --standalone: the rendezvous on a free port of this machine, not torchrun's fixed 29500,
    # where a second run at the same time (another notebook, a class on one server) would meet
    # this one and share its rendezvous store
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", module]
    if gpus >= nproc:
        return cmd, f"{nproc} processes, NCCL, one GPU each"
    if gpus:
        return cmd + ["--backend", "gloo"], (f"{nproc} processes, gloo on the CPU: this machine has {gpus} "
                                             f"GPU(s), NCCL needs one per process")
    return cmd, f"{nproc} processes, gloo on the CPU (no GPU)"


def _say(line: str) -> None:
    """Print one line of a rank's output in a single write. torchrun's ranks share one stdout
    (a pipe when a notebook captures it), and ``print`` writes the text and then the newline:
    two writes when Python's output is unbuffered (``PYTHONUNBUFFERED=1``, as in many containers
    and CI images), so two ranks finishing together printed ``rank 0 ...rank 1 ...`` on one line
    and an empty line after it. One write of fewer than ``PIPE_BUF`` bytes (4096 on Linux) to a
    pipe is atomic (POSIX): whole lines, in whatever order the ranks finish."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


#: the most steps and samples the command trains (a demo of a few steps on small volumes)
_MAX_STEPS, _MAX_GLOBAL_BATCH = 1000, 1024
#: ranks the command spawns when it is not run under torchrun
_LOCAL_RANKS = 2


def _check_options(steps: int, global_batch: int, world: int) -> None:
    """``ParallelError`` naming the option and the fix unless ``steps`` and ``global_batch`` are
    what ``world`` ranks can train: 1 to ``_MAX_STEPS`` steps, a global batch of 1 to
    ``_MAX_GLOBAL_BATCH`` that splits evenly over the ranks."""
    if not 1 <= steps <= _MAX_STEPS:
        raise ParallelError(f"--steps {steps}: the command trains 1 to {_MAX_STEPS} steps.",
                            "pass e.g. --steps 3")
    if not 1 <= global_batch <= _MAX_GLOBAL_BATCH or global_batch % world:
        raise ParallelError(f"--global-batch {global_batch}: each of the {world} ranks takes an equal share of "
                            f"at most {_MAX_GLOBAL_BATCH} samples.",
                            f"pass a multiple of {world} up to {_MAX_GLOBAL_BATCH}, e.g. --global-batch {2 * world}")


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``torchrun --nproc-per-node=N -m course_utils.parallel``; without torchrun it
    spawns ``_LOCAL_RANKS`` processes. Returns 0, or 2 with a one-line error (``error: ... Fix: ...``)
    when an option cannot be run, before any process starts."""
    ap = argparse.ArgumentParser(prog="python -m course_utils.parallel",
                                 description="DDP/FSDP training of the course U-Net")
    ap.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--steps", type=int, default=3, help=f"training steps, 1 to {_MAX_STEPS} (default 3)")
    ap.add_argument("--global-batch", type=int, default=None,
                    help=f"samples per step over all ranks, a multiple of the ranks up to {_MAX_GLOBAL_BATCH} "
                         "(default: 2 per rank)")
    ap.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                    help="auto: NCCL when CUDA is present (one GPU per process), else gloo")
    args = ap.parse_args(argv)
    torchrun = "RANK" in os.environ
    try:
        world = int(os.environ["WORLD_SIZE"]) if torchrun else _LOCAL_RANKS
        batch = 2 * world if args.global_batch is None else args.global_batch
        config = {"mode": args.mode, "steps": args.steps, "global_batch": batch}
        _check_options(args.steps, batch, world)
        backend, device = torchrun_backend(os.environ, args.backend) if torchrun else ("gloo", None)
    except (ParallelError, RuntimeError) as err:  # RuntimeError: fewer GPUs than NCCL ranks
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not torchrun:
        print(f"not under torchrun: spawning {_LOCAL_RANKS} processes here instead")
        for r in launch(train_worker, _LOCAL_RANKS, config):
            print(f"rank {r['rank']}: losses {[round(v, 4) for v in r['losses']]}")
        return 0
    rank = int(os.environ["RANK"])
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before init_process_group, as documented
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                            device_id=device if device.type == "cuda" else None)
    try:
        r = train_worker(rank, world, device, config)
        _say(f"rank {rank}/{world} ({backend}): losses {[round(v, 4) for v in r['losses']]}")
        dist.barrier()  # no collective may still be in flight when the process group goes
    finally:
        dist.destroy_process_group()
    return 0


guard(globals(), ParallelError)
