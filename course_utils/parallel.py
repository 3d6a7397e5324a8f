"""Data, model and pipeline parallelism with ``torch.distributed``: the same code on CPU (gloo,
processes on one machine, as in CI) and on GPUs (NCCL, one process per GPU).

From a notebook, ``launch(worker, world_size, config)`` spawns the processes (workers must live
in an importable module, so they live here) and returns each rank's result. Every collective has
a timeout and ``launch`` has a deadline, so a failed or stuck worker becomes a clear error in the
notebook, never a hang. Under ``torchrun`` the same workers run through ``main()``::

    torchrun --nproc-per-node=2 -m course_utils.parallel --mode ddp --steps 3

Workers:

* ``ddp_worker``      -- DistributedDataParallel on the U-Net: gradients, per-rank memory;
* ``fsdp_worker``     -- FSDP2 ``fully_shard``: per-rank parameter/gradient/optimizer bytes;
* ``pipeline_worker`` -- the U-Net split in two stages, one per rank, with a GPipe schedule of
  micro-batches; per-rank timelines to measure the bubble.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from .memory import SavedTensorMeter
from .unet import UNet3D

COLLECTIVE_TIMEOUT_S = 60


# --------------------------------------------------------------------------------------------
# Launching
# --------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(world_size: int) -> tuple[str, str]:
    """NCCL with one GPU per rank when there are enough GPUs, else gloo on CPU."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl", "cuda"
    return "gloo", "cpu"


def _init(rank: int, world_size: int, port: int) -> torch.device:
    backend, dev = backend_for(world_size)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    if dev == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    torch.set_num_threads(1)  # two processes on two cores: one thread each
    return torch.device("cpu")


def _entry(rank: int, worker: Callable, world_size: int, port: int, config: dict, out: str) -> None:
    path = Path(out) / f"rank{rank}.pt"
    try:
        device = _init(rank, world_size, port)
        result = worker(rank, world_size, device, config)
        torch.save({"ok": True, "result": result}, path)
        dist.barrier()  # no collective may still be in flight when the process group goes
    except BaseException:
        torch.save({"ok": False, "error": traceback.format_exc()}, path)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # The result is on disk. Leave now, without the interpreter's teardown: under load, gloo's
    # background threads can still be running when C++ static destructors run, and the process
    # then aborts ("terminate called without an active exception") after its work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    # config["exit_code_after_result"] lets the tests play a crash at exit (see launch)
    os._exit(int(config.get("exit_code_after_result", 0)))


def launch(worker: Callable, world_size: int = 2, config: dict | None = None,
           timeout_s: float = 180) -> list[Any]:
    """Run ``worker(rank, world_size, device, config)`` in ``world_size`` spawned processes and
    return the results, rank by rank. A worker's exception is re-raised here with its traceback;
    a run past ``timeout_s`` is killed and reported."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(_entry, args=(worker, world_size, free_port(), config or {}, out),
                                 nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        failure: BaseException | None = None
        while True:
            try:
                if ctx.join(timeout=0.5):
                    break
            except Exception as err:  # a worker died: collect its traceback below
                failure = err
                break
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(
                    f"{worker.__name__}: workers did not finish within {timeout_s:.0f} s and were "
                    "killed. A rank is probably waiting in a collective its peer never reached."
                )
        results, errors = [], []
        for r in range(world_size):
            path = Path(out) / f"rank{r}.pt"
            if not path.exists():
                errors.append((r, "ended without a result (killed?)"))
                continue
            rec = torch.load(path, weights_only=False)
            if rec["ok"]:
                results.append(rec["result"])
            else:
                errors.append((r, rec["error"]))
        if failure is not None or errors:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            # lead with the cause: a rank whose error is not "my peer went away"
            consequence = ("closed by peer", "Connection reset", "ended without a result")
            errors.sort(key=lambda e: any(c in e[1] for c in consequence))
            if not errors:  # every rank delivered its result, then a process died on its way out
                warnings.warn(f"{worker.__name__}: every rank returned its result, but a process "
                              f"crashed while exiting ({failure}); the results are complete.",
                              RuntimeWarning, stacklevel=2)
                return results
            rank, tb = errors[0]
            others = ", ".join(str(r) for r, _ in errors[1:])
            raise RuntimeError(f"rank {rank} of {worker.__name__} failed:\n{tb}"
                               + (f"\n(ranks {others} failed as a consequence)" if others else ""))
        return results


# --------------------------------------------------------------------------------------------
# BatchNorm across replicas
# --------------------------------------------------------------------------------------------
class CrossReplicaBatchNorm3d(nn.BatchNorm3d):
    """BatchNorm3d whose training statistics are those of the *global* batch: per-channel sums
    are added over all ranks with the differentiable ``torch.distributed.nn.all_reduce``.

    The same computation as ``nn.SyncBatchNorm``, which on this torch runs only on GPUs; on CUDA
    use ``nn.SyncBatchNorm.convert_sync_batchnorm``. Outside a process group it is BatchNorm3d.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        from torch.distributed._functional_collectives import all_reduce

        dims = [0, *range(2, x.dim())]
        count = torch.full((1,), x.numel() // x.shape[1], dtype=x.dtype, device=x.device)
        stats = all_reduce(torch.cat([x.sum(dims), (x * x).sum(dims), count]), "sum",
                           dist.group.WORLD)
        c = x.shape[1]
        n = stats[-1]
        mean = stats[:c] / n
        var = stats[c:2 * c] / n - mean * mean
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
            self.running_var.mul_(1 - m).add_(var.detach() * n / (n - 1), alpha=m)
            self.num_batches_tracked.add_(1)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        x_hat = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        return x_hat * self.weight.view(shape) + self.bias.view(shape)


def cross_replica_bn_relu(channels: int) -> list[nn.Module]:
    """``norm_act`` for UNet3D: BatchNorm with global statistics (CPU/gloo), then ReLU."""
    return [CrossReplicaBatchNorm3d(channels), nn.ReLU(inplace=True)]


def gn_relu(channels: int) -> list[nn.Module]:
    """``norm_act`` with GroupNorm: statistics per sample, independent of batch size and of how
    the batch is split (replicas, micro-batches, accumulation)."""
    return [nn.GroupNorm(min(4, channels), channels), nn.ReLU(inplace=True)]


NORMS: dict[str, Callable | None] = {"bn": None, "cross_replica_bn": cross_replica_bn_relu,
                                     "gn": gn_relu}


def build_net(config: dict) -> UNet3D:
    """The small U-Net every parallel demo uses, identically initialised on every rank."""
    torch.manual_seed(config.get("seed", 0))
    norm = NORMS[config.get("norm", "bn")]
    if config.get("norm") == "sync_bn":  # CUDA only
        net = UNet3D(levels=config.get("levels", 3), channels=config.get("channels", 4))
        return nn.SyncBatchNorm.convert_sync_batchnorm(net)
    return UNet3D(levels=config.get("levels", 3), channels=config.get("channels", 4), norm_act=norm)


def global_batch(config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch on every rank (each then takes its shard)."""
    g = torch.Generator().manual_seed(1234)
    b, vol = config.get("global_batch", 4), tuple(config.get("volume", (8, 16, 16)))
    return torch.randn(b, 1, *vol, generator=g), torch.randint(0, 5, (b, *vol), generator=g)


def relative_error(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """Largest difference between two lists of gradients, relative to the largest reference
    gradient. (Per-tensor ratios would blow up on conv biases in front of BatchNorm, whose true
    gradient is zero and whose computed one is rounding noise.)"""
    return max((a - b).abs().max().item() for a, b in zip(got, ref)) / max(b.abs().max().item() for b in ref)


def single_process_grads(config: dict) -> list[torch.Tensor]:
    """The reference: one process, the whole global batch, one backward."""
    net = build_net(config)
    x, y = global_batch(config)
    nn.functional.cross_entropy(net(x), y).backward()
    return [p.grad.clone() for p in net.parameters()]


def accumulated_grads(config: dict, micro_batches: int) -> list[torch.Tensor]:
    """Gradient accumulation on one device: the global batch in ``micro_batches`` pieces, each
    loss divided by their number, one optimizer step's worth of gradients."""
    net = build_net(config)
    x, y = global_batch(config)
    for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        (nn.functional.cross_entropy(net(xs), ys) / micro_batches).backward()
    return [p.grad.clone() for p in net.parameters()]


def _state_bytes(params, optimizer) -> dict[str, int]:
    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    opt = sum(local(v) for s in optimizer.state.values() for v in s.values()
              if isinstance(v, torch.Tensor) and v.dim() > 0)
    return {"param_bytes": sum(local(p) for p in params),
            "grad_bytes": sum(local(p.grad) for p in params if p.grad is not None),
            "optimizer_bytes": opt}


# --------------------------------------------------------------------------------------------
# Data parallel
# --------------------------------------------------------------------------------------------
def ddp_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """One DDP step on this rank's shard of the global batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = build_net(config).to(device)
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    x, y = global_batch(config)
    xs, ys = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
    opt = torch.optim.Adam(model.parameters())
    with SavedTensorMeter(model.parameters()) as meter:
        loss = nn.functional.cross_entropy(model(xs), ys)
    loss.backward()
    grads = [p.grad.detach().cpu().clone() for p in model.parameters()]
    opt.step()
    return {"rank": rank, "local_batch": xs.shape[0], "loss": loss.item(), "grads": grads,
            "saved_bytes": meter.peak, **_state_bytes(list(model.parameters()), opt)}


def fsdp_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """One step with FSDP2: every parameter, its gradient and Adam's state sharded over ranks."""
    from torch.distributed.fsdp import fully_shard

    net = build_net(config).to(device)
    for block in [net.inc, *net.downs, *net.ups]:
        fully_shard(block)
    fully_shard(net)
    x, y = global_batch(config)
    xs, ys = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
    opt = torch.optim.Adam(net.parameters())
    loss = nn.functional.cross_entropy(net(xs), ys)
    loss.backward()
    opt.step()
    full = [p.grad.full_tensor().detach().cpu() for p in net.parameters()]
    return {"rank": rank, "loss": loss.item(), "grads": full,
            **_state_bytes(list(net.parameters()), opt)}


# --------------------------------------------------------------------------------------------
# Model and pipeline parallel
# --------------------------------------------------------------------------------------------
class EncoderStage(nn.Module):
    """Stage 1 of a split U-Net: ``inc`` and every ``Down``; returns all skip tensors."""

    def __init__(self, net: UNet3D):
        super().__init__()
        self.inc, self.downs = net.inc, net.downs

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        skips = [self.inc(x)]
        for d in self.downs:
            skips.append(d(skips[-1]))
        return skips


class DecoderStage(nn.Module):
    """Stage 2: every ``Up`` and ``outc``; takes the skip tensors (deepest last)."""

    def __init__(self, net: UNet3D):
        super().__init__()
        self.ups, self.outc = net.ups, net.outc

    def forward(self, skips: list[torch.Tensor]) -> torch.Tensor:
        skips = list(skips)
        x = skips.pop()
        for up in self.ups:
            x = up(x, skips.pop())
        return self.outc(x)


class TwoStageUNet(nn.Module):
    """The U-Net split across two devices. Every skip connection crosses the boundary: the
    encoder's outputs are moved to the second device, the gradients come back in backward."""

    def __init__(self, net: UNet3D, devices=("cpu", "cpu")):
        super().__init__()
        self.devices = [torch.device(d) for d in devices]
        self.encoder = EncoderStage(net).to(self.devices[0])
        self.decoder = DecoderStage(net).to(self.devices[1])
        self.boundary_bytes = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = self.encoder(x.to(self.devices[0]))
        self.boundary_bytes = sum(s.numel() * s.element_size() for s in skips)
        return self.decoder([s.to(self.devices[1]) for s in skips])


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """GPipe's idle share of each device: (S - 1) / (M + S - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def simulate_gpipe(timelines: list[list[tuple[str, int, float, float]]]) -> dict:
    """Replay a 2-stage GPipe schedule with the measured op durations and free communication:
    the ideal step time and each stage's idle share, to compare with what was measured.

    Dependencies: F(s, i) after F(s, i-1) and F(s-1, i); the backward runs micro-batches in
    reverse, B(1, i) after every forward of stage 1, B(s, i) after B(s, previous) and B(s+1, i)."""
    dur = [{(k, i): e - s for k, i, s, e in tl} for tl in timelines]
    m = 1 + max(i for k, i in dur[0] if k == "F")
    end: dict[tuple[int, str, int], float] = {}
    for i in range(m):
        end[0, "F", i] = end.get((0, "F", i - 1), 0.0) + dur[0]["F", i]
        end[1, "F", i] = max(end.get((1, "F", i - 1), 0.0), end[0, "F", i]) + dur[1]["F", i]
    prev1, prev0 = end[1, "F", m - 1], end[0, "F", m - 1]
    for i in reversed(range(m)):
        end[1, "B", i] = prev1 = prev1 + dur[1]["B", i]
        end[0, "B", i] = prev0 = max(prev0, end[1, "B", i]) + dur[0]["B", i]
    makespan = max(end.values())
    return {"ideal_step_s": makespan,
            "ideal_idle": [1 - sum(d.values()) / makespan for d in dur]}


def pipeline_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """GPipe with 2 stages: rank 0 runs the encoder, rank 1 the decoder and the loss. All
    micro-batches go forward, then all go backward. One untimed warm-up step first (first calls
    set up kernels), then the timed step records (kind, micro-batch, start, end) per op."""
    if world != 2:
        raise ValueError(f"pipeline_worker splits the U-Net in 2 stages: run it with 2 ranks, not {world}")
    net = build_net(config)
    m = config.get("micro_batches", 4)
    x, y = global_batch(config)
    xs, ys = x.chunk(m), y.chunk(m)
    stage = (EncoderStage(net) if rank == 0 else DecoderStage(net)).to(device)
    if rank == 1:
        enc = EncoderStage(build_net(config)).to("meta")
        shapes = [s.shape for s in enc(torch.empty(xs[0].shape, device="meta"))]

    def step(timeline: list | None) -> None:
        t0 = time.perf_counter()

        def timed(kind, i, fn):
            start = time.perf_counter() - t0
            out = fn()
            if timeline is not None:
                timeline.append((kind, i, start, time.perf_counter() - t0))
            return out

        if rank == 0:
            outs = []
            for i in range(m):
                skips = timed("F", i, lambda i=i: stage(xs[i].to(device)))
                for s in skips:
                    dist.send(s.detach().contiguous(), dst=1)
                outs.append(skips)
            for i in reversed(range(m)):
                grads = [torch.empty_like(s) for s in outs[i]]
                for g in grads:
                    dist.recv(g, src=1)
                timed("B", i, lambda i=i, grads=grads: torch.autograd.backward(outs[i], grads))
                outs[i] = None
        else:
            inputs, losses = [], []
            for i in range(m):
                skips = [torch.empty(sh, device=device) for sh in shapes]
                for s in skips:
                    dist.recv(s, src=0)
                    s.requires_grad_()
                loss = timed("F", i, lambda i=i, skips=skips:
                             nn.functional.cross_entropy(stage(skips), ys[i].to(device)) / m)
                inputs.append(skips)
                losses.append(loss)
            for i in reversed(range(m)):
                timed("B", i, lambda i=i: losses[i].backward())
                for s in inputs[i]:
                    dist.send(s.grad.contiguous(), dst=0)
                inputs[i] = losses[i] = None

    step(None)  # warm-up
    stage.zero_grad(set_to_none=True)
    timeline: list[tuple[str, int, float, float]] = []
    dist.barrier()
    t0 = time.perf_counter()
    step(timeline)
    dist.barrier()
    total = time.perf_counter() - t0
    params = list(stage.parameters())
    return {"rank": rank, "timeline": timeline, "step_s": total,
            "busy_s": sum(e - s for _, _, s, e in timeline),
            "grads": [p.grad.detach().cpu().clone() for p in params],
            "param_bytes": sum(p.numel() * p.element_size() for p in params)}


def train_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """A few DDP (or FSDP) training steps on synthetic volumes; the script entry point."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .data import SyntheticVolumes

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


def failing_worker(rank: int, world: int, device: torch.device, config: dict) -> None:
    """For the demo of failures: rank 1 raises while rank 0 waits for it at a barrier."""
    if rank == 1:
        raise ValueError("rank 1 failed on purpose (a bad shape, a missing file, ...)")
    dist.barrier()


def stuck_worker(rank: int, world: int, device: torch.device, config: dict) -> None:
    """For the demo of hangs: rank 1 never reaches the barrier rank 0 waits at."""
    if rank == 1:
        time.sleep(config.get("sleep_s", 600))
    dist.barrier()


def source_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """Runs a learner's ``ddp_step(model, x, y, rank, world) -> grads`` given as source code
    (a notebook's functions cannot be imported by spawned processes). The namespace has
    ``torch``, ``nn``, ``dist`` and ``DDP``. Records the batch size the model saw."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ns: dict[str, Any] = {"torch": torch, "nn": nn, "dist": dist, "DDP": DDP}
    exec(compile(config["source"], "<learner>", "exec"), ns)
    net = build_net(config).to(device)
    seen: list[int] = []
    net.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    x, y = global_batch(config)
    grads = ns[config["name"]](net, x, y, rank, world)
    return {"rank": rank, "grads": [g.detach().cpu() for g in grads], "batch_seen": seen}


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``torchrun --nproc-per-node=N -m course_utils.parallel``."""
    ap = argparse.ArgumentParser(description="DDP/FSDP training of the course U-Net")
    ap.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--global-batch", type=int, default=4)
    args = ap.parse_args(argv)
    if "RANK" not in os.environ:
        print("not under torchrun: spawning 2 processes here instead")
        for r in launch(train_worker, 2, vars(args) | {"global_batch": args.global_batch}):
            print(f"rank {r['rank']}: losses {[round(v, 4) for v in r['losses']]}")
        return 0
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend, dev = backend_for(world)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if dev == "cuda" else torch.device("cpu")
    if dev == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    try:
        r = train_worker(rank, world, device, vars(args) | {"global_batch": args.global_batch})
        print(f"rank {rank}/{world} ({backend}): losses {[round(v, 4) for v in r['losses']]}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
