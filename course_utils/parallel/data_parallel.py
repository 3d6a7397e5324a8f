"""Data parallelism: DDP's step (``ddp_worker``), BatchNorm across replicas
(``CrossReplicaBatchNorm3d``, ``norm_worker``), and what the demos share: the small U-Net
(``build_net``, its ``NORMS``), the global batch (``global_batch``), the single-process reference
(``single_process_grads``), gradient accumulation (``accumulated_grads``) and ``relative_error``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..checks import ParallelError, guard
from ..memory import SavedTensorMeter
from ..numerics import combine_moments, normalise, relative_error, update_running_stats
from ..unet import UNet3D
from .launcher import compared


def all_gather(t: torch.Tensor, autograd: bool = True) -> torch.Tensor:
    """Every rank's ``t`` concatenated along dim 0; with ``autograd``, with a backward (a
    reduce-scatter of the gradient). torch 2.13 renamed ``all_gather_tensor[_autograd]`` (2.11,
    2.12) to ``all_gather_single[_autograd]`` and deprecated the old names: take whichever this
    torch has."""
    from torch.distributed import _functional_collectives as fc

    suffix = "_autograd" if autograd else ""
    gather = getattr(fc, f"all_gather_single{suffix}", None) or getattr(fc, f"all_gather_tensor{suffix}")
    return gather(t, 0, dist.group.WORLD)


class CrossReplicaBatchNorm3d(nn.BatchNorm3d):
    """BatchNorm3d whose training statistics are those of the *global* batch, on CPU (gloo).

    Each rank computes, per channel, its count, mean and sum of squared deviations ``M2`` -- in
    fp32 at least (an fp16 count overflows past 65,504 values per channel, and fp16 sums lose the
    mean) -- then the ranks **all-gather** these triples with the autograd-aware
    ``all_gather_single_autograd`` of ``torch.distributed._functional_collectives`` and combine them
    with Chan et al.'s formula (``numerics.combine_moments``: ``M2 = sum M2_r + n_r (mean_r -
    mean)^2``), which has no ``E[x^2] - E[x]^2`` cancellation. Gradients flow back through the
    all-gather (its backward is a reduce-scatter), so each rank's input gradient includes its
    effect on the global statistics. Outside a process group, or in eval mode, it is BatchNorm3d.

    ``nn.SyncBatchNorm`` does the same job on accelerators (torch 2.13, ``nn/modules/_functions.py``):
    forward all-gathers each rank's (mean, invstd, count) and combines them with
    ``torch.batch_norm_gather_stats_with_counts``; backward all-reduces two per-channel sums. In
    training under a process group it refuses CPU tensors (``ValueError: SyncBatchNorm expected
    input tensor to be on GPU or XPU ...``); outside one, or in eval mode, it is plain BatchNorm.
    On GPUs convert a model with ``nn.SyncBatchNorm.convert_sync_batchnorm`` instead.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1):
            return super().forward(x)
        self._check_input_dim(x)
        c, world = x.shape[1], dist.get_world_size()
        shape = (1, c) + (1,) * (x.dim() - 2)
        dims = [0, *range(2, x.dim())]
        xf = x.float() if x.element_size() < 4 else x  # statistics in fp32 at least
        mean_r = xf.mean(dims)
        m2_r = (xf - mean_r.view(shape)).square().sum(dims)
        count_r = torch.full((1,), float(x.numel() // c), dtype=mean_r.dtype, device=x.device)
        stats = all_gather(torch.cat([count_r, mean_r, m2_r]))
        stats = stats.view(world, 2 * c + 1)
        n, mean, var = combine_moments(stats[:, :1], stats[:, 1:c + 1], stats[:, c + 1:])  # var: biased
        update_running_stats(self, mean, var, int(n.item()))
        return normalise(self, xf, mean, var).to(x.dtype)


@compared
def norm_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """``CrossReplicaBatchNorm3d`` on this rank's shard of ``config["x"]`` (the global batch):
    its output, the gradients of ``(y * config["w"]).sum()`` and the running statistics, to
    compare with one BatchNorm3d on the whole batch. With ``config["try_sync_bn"]`` it also runs
    ``nn.SyncBatchNorm`` on this rank's device and reports what happened."""
    x, w = config["x"], config["w"]
    c = x.shape[1]
    bn = CrossReplicaBatchNorm3d(c).to(device)
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, c))
        bn.bias.copy_(torch.linspace(-1.0, 1.0, c))
    xs = x.chunk(world)[rank].to(device).requires_grad_()
    y = bn(xs)
    (y.double() * w.chunk(world)[rank].to(device)).sum().backward()
    out = {"rank": rank, "y": y.detach().cpu(), "x_grad": xs.grad.cpu(),
           "weight_grad": bn.weight.grad.cpu(), "bias_grad": bn.bias.grad.cpu(),
           "running_mean": bn.running_mean.cpu(), "running_var": bn.running_var.cpu()}
    if config.get("try_sync_bn"):
        sync = nn.SyncBatchNorm(c).to(device)
        try:
            sync(xs.detach().float())
            out["sync_bn"] = "ran"
        except Exception as err:
            out["sync_bn"] = f"{type(err).__name__}: {err}"
    return out


def cross_replica_bn_relu(channels: int) -> list[nn.Module]:
    """``norm_act`` for UNet3D: BatchNorm with global statistics (CPU/gloo), then ReLU."""
    return [CrossReplicaBatchNorm3d(channels), nn.ReLU(inplace=True)]


def gn_relu(channels: int) -> list[nn.Module]:
    """``norm_act`` with GroupNorm: statistics per sample, independent of batch size and of how
    the batch is split (replicas, micro-batches, accumulation)."""
    return [nn.GroupNorm(min(4, channels), channels), nn.ReLU(inplace=True)]


def relu_only(channels: int) -> list[nn.Module]:  # noqa: ARG001 - the U-Net's norm_act(channels)
    """``norm_act`` without normalisation (notebook 08 compares TF32's error with and without)."""
    return [nn.ReLU(inplace=True)]


#: ``config["norm"]`` -> the U-Net's ``norm_act`` (None: BatchNorm3d + ReLU). ``"sync_bn"`` is
#: BatchNorm3d converted to ``nn.SyncBatchNorm`` (GPUs; plain BatchNorm outside a process group).
NORMS: dict[str, Callable | None] = {"bn": None, "cross_replica_bn": cross_replica_bn_relu,
                                     "gn": gn_relu, "sync_bn": None, "none": relu_only}


def build_net(config: dict) -> UNet3D:
    """The small U-Net every parallel demo uses, identically initialised on every rank
    (``config``: ``norm``, ``levels``, ``channels``, ``seed``)."""
    norm = config.get("norm", "bn")
    if norm not in NORMS:
        raise ValueError(f"norm={norm!r}: choose one of {', '.join(sorted(NORMS))}")
    torch.manual_seed(config.get("seed", 0))
    net = UNet3D(levels=config.get("levels", 3), channels=config.get("channels", 4), norm_act=NORMS[norm])
    if norm == "sync_bn":
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    return net


def global_batch(config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch on every rank (each then takes its shard); ``config["seed"]``
    changes it together with the net's initialisation, ``config["data_seed"]`` the batch alone."""
    g = torch.Generator().manual_seed(1234 + config.get("data_seed", config.get("seed", 0)))
    b, vol = config.get("global_batch", 4), tuple(config.get("volume", (8, 16, 16)))
    return torch.randn(b, 1, *vol, generator=g), torch.randint(0, 5, (b, *vol), generator=g)


def single_process_grads(config: dict, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """The reference: one process, the whole global batch, one backward, on ``device`` (the
    gradients come back on the CPU)."""
    net = build_net(config).to(device)
    x, y = global_batch(config)
    nn.functional.cross_entropy(net(x.to(device)), y.to(device)).backward()
    return [p.grad.detach().cpu().clone() for p in net.parameters()]


def whole_batch_saved_bytes(config: dict) -> int:
    """What one process saves for backward on the whole global batch (``SavedTensorMeter``'s
    peak, the parameters left out): the figure a DDP rank's ``saved_bytes`` is a share of."""
    net = build_net(config)
    x, y = global_batch(config)
    with SavedTensorMeter(net.parameters()) as meter:
        nn.functional.cross_entropy(net(x), y)
    return meter.peak


def accumulated_grads(config: dict, micro_batches: int, use: int | None = None,
                      device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """Gradient accumulation on one device: the global batch in ``micro_batches`` pieces, each
    loss divided by their number, one optimizer step's worth of gradients. With BatchNorm this is
    also exactly what ``micro_batches`` DDP replicas compute (each normalises with its own
    shard's statistics; DDP averages their gradients). ``use``: only the first ``use`` pieces
    (what a pipeline that lost the others would compute). On ``device`` (the gradients come back
    on the CPU)."""
    net = build_net(config).to(device)
    x, y = global_batch(config)
    for xs, ys in list(zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True))[:use]:
        (nn.functional.cross_entropy(net(xs.to(device)), ys.to(device)) / micro_batches).backward()
    return [p.grad.detach().cpu().clone() for p in net.parameters()]


def per_replica_bn_errors(seeds: Sequence[int], world: int = 2, config: dict | None = None) -> list[float]:
    """For each seed (net and data), how far per-replica BatchNorm's DDP gradient on ``world``
    replicas is from the global batch's gradient (``relative_error``). Computed in one process
    (``accumulated_grads`` is what the replicas compute together)."""
    out = []
    for seed in seeds:
        cfg = dict(config or {}, norm="bn", seed=seed)
        out.append(relative_error(accumulated_grads(cfg, world), single_process_grads(cfg)))
    return out


def state_bytes(params, optimizer) -> dict[str, int]:
    """This rank's bytes of parameters, gradients and optimizer state (a sharded tensor counts its
    local shard; the optimizer's scalars, such as Adam's step, are left out)."""
    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    opt = sum(local(v) for s in optimizer.state.values() for v in s.values()
              if isinstance(v, torch.Tensor) and v.dim() > 0)
    return {"param_bytes": sum(local(p) for p in params),
            "grad_bytes": sum(local(p.grad) for p in params if p.grad is not None),
            "optimizer_bytes": opt}



def _recording_allreduce(buckets: dict):
    """A DDP communication hook that does what DDP does by default (average the bucket over the
    ranks: ``default_hooks.allreduce_hook``) and records each bucket's flat buffer
    (``GradBucket.buffer()``): its bytes and its storage."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        buf = bucket.buffer()
        buckets[bucket.index()] = (buf.numel() * buf.element_size(), buf.untyped_storage().data_ptr())
        return allreduce_hook(state, bucket)

    return hook


@compared
def ddp_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """One DDP step on this rank's shard of the global batch. Besides gradients and memory it
    measures DDP's gradient buckets through a communication hook that averages them as DDP
    does: ``bucket_bytes`` (their flat buffers) and ``bucket_extra_bytes`` (the part that is
    not the ``.grad`` tensors' own storage; ``config["gradient_as_bucket_view"]``, default False
    as in DDP)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = build_net(config).to(device)
    view = bool(config.get("gradient_as_bucket_view", False))
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=view)
    buckets: dict[int, tuple[int, int]] = {}
    model.register_comm_hook(None, _recording_allreduce(buckets))
    x, y = global_batch(config)
    xs, ys = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
    opt = torch.optim.Adam(model.parameters())
    with SavedTensorMeter(model.parameters()) as meter:
        loss = nn.functional.cross_entropy(model(xs), ys)
    loss.backward()
    grads = [p.grad.detach().cpu().clone() for p in model.parameters()]
    grad_storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None}
    opt.step()
    return {"rank": rank, "local_batch": xs.shape[0], "loss": loss.item(), "grads": grads,
            "saved_bytes": meter.peak, "gradient_as_bucket_view": view,
            "bucket_bytes": sum(n for n, _ in buckets.values()),
            "bucket_extra_bytes": sum(n for n, ptr in buckets.values() if ptr not in grad_storages),
            **state_bytes(list(model.parameters()), opt)}


guard(globals(), ParallelError)
