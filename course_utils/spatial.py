"""Spatial parallelism: the volume split across ranks, one slab per rank, halos exchanged.

The single-device tiled step (``course_utils.tiling``) runs the slabs one after the other. Give
each slab its own device and they run at the same time: *spatial parallelism* (also called
domain decomposition). Each rank holds one slab of the input and of every activation; a
convolution near the cut needs its neighbour's voxels, which travel with ``torch.distributed``
point-to-point messages (gloo on CPU, NCCL on GPUs); the weight gradients are summed over ranks.

Two ways to get the neighbour's voxels (``config["exchange"]``):

* ``"per_layer"`` (the default, what spatially parallel 3D U-Net trainings do): before every
  convolution of radius r, each rank sends its r outermost layers to each neighbour and
  receives theirs (``HaloExchange``), then convolves without padding along the split axis
  (``conv_with_halos``: the interior from the slab alone, the r output voxels at each end from a
  thin piece with the halo, so that no padded copy of the whole slab is kept). No voxel is
  computed twice; the price is one small message pair per convolution in forward and
  one in backward, where the adjoint of the exchange sends the halo's gradient back to its
  owner, which adds it to its own. The activations on each rank are exactly its slab, so
  BatchNorm's statistics are its per-channel sums, all-reduced (differentiably) over ranks.
  Why this one: the halo never grows with depth (a 3D U-Net has ~20 convolutions: a halo of 20
  voxels, at every resolution, would be recomputed by every rank), and it extends to pooling
  layers, which need exchanges at each resolution anyway.
* ``"input_once"``: the input's halo (the whole receptive field, ``conv_chain(model).halo``)
  is exchanged once and every rank recomputes the overlap -- the single-device tiled step with
  one slab per rank. One message pair, no communication inside the network, but compute and
  memory grow with the halo. Kept to compare.

At the true border of the volume a rank has no neighbour: per layer, the exchange fills that
side with zeros, which *is* the convolution's zero padding there; once, the slab is simply not
extended there, and the network's own padding acts at every layer.

The gradient: each rank's loss is its owned voxels' summed loss / the volume's voxel count, so
the ranks' losses add up to the full volume's mean loss, and the weight gradients are *summed*
over ranks with ``all_reduce`` (``DistributedDataParallel`` would average them: divide by the
world size, which is wrong for this loss scaling).

Run it from a notebook with ``course_utils.parallel.launch(spatial_worker, 2, config)``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .checks import ParallelError, guard
from .limit_test import LimitTestNet
from .memory import SavedTensorMeter, default_dtype
from .numerics import normalise, update_running_stats, uses_batch_stats
from .parallel import compared
from .tiling import ConvChain, Tile, TilingError, conv_chain, region, run_chain

#: bytes sent by this process, per direction of the pass (reset by spatial_worker)
EXCHANGED = {"forward": 0, "backward": 0}


def _neighbour_swap(to_lower: torch.Tensor, to_upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Send ``to_lower`` to rank-1 and ``to_upper`` to rank+1; return what rank-1 and rank+1
    sent here (zeros where there is no neighbour: the volume's border)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    from_lower, from_upper = torch.zeros_like(to_upper), torch.zeros_like(to_lower)
    ops = []
    if rank > 0:
        ops += [dist.P2POp(dist.isend, to_lower.contiguous(), rank - 1),
                dist.P2POp(dist.irecv, from_lower, rank - 1)]
    if rank < world - 1:
        ops += [dist.P2POp(dist.isend, to_upper.contiguous(), rank + 1),
                dist.P2POp(dist.irecv, from_upper, rank + 1)]
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return from_lower, from_upper


def _sent_bytes(to_lower: torch.Tensor, to_upper: torch.Tensor) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    return (to_lower.numel() * (rank > 0) + to_upper.numel() * (rank < world - 1)) * to_lower.element_size()


class HaloExchange(torch.autograd.Function):
    """The halos of a rank's slab: the ``r`` voxels along ``dim`` that its lower and upper
    neighbours own next to the cut (zeros at the volume's border, which is the convolution's
    zero padding there). Backward is the adjoint: the gradient that landed on a halo goes back
    to the rank that owns those voxels and is added to its own gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, r: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = x.shape[dim]
        if t < r:
            raise ParallelError(
                f"rank {dist.get_rank()} holds {t} voxels along dim {dim} but a layer needs a "
                f"halo of {r}: the halo would have to come from beyond the neighbouring rank.",
                "fewer ranks (thicker slabs), or a larger volume.")
        ctx.r, ctx.dim, ctx.t = r, dim, t
        lower, upper = x.narrow(dim, 0, r), x.narrow(dim, t - r, r)
        EXCHANGED["forward"] += _sent_bytes(lower, upper)
        return _neighbour_swap(lower, upper)

    @staticmethod
    def backward(ctx: Any, g_lower: torch.Tensor, g_upper: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        r, dim, t = ctx.r, ctx.dim, ctx.t
        # my lower halo is rank-1's last r voxels: send its gradient there, and vice versa
        EXCHANGED["backward"] += _sent_bytes(g_lower, g_upper)
        from_lower, from_upper = _neighbour_swap(g_lower, g_upper)
        shape = list(g_lower.shape)
        shape[dim] = t
        gx = g_lower.new_zeros(shape)
        gx.narrow(dim, 0, r).add_(from_lower)
        gx.narrow(dim, t - r, r).add_(from_upper)
        return gx, None, None


def conv_with_halos(conv_fn: Callable, m: nn.Module, x: torch.Tensor, r: int, dim: int,
                    padding: tuple[int, ...]) -> torch.Tensor:
    """A convolution of this rank's slab with its neighbours' halos, without concatenating
    the halos to the whole slab (which would copy it, and autograd would keep the copy as
    well as the original): the interior from the slab alone, the ``r`` output voxels at each
    end from a thin piece (halo + 2r of the slab). ``padding`` is 0 along ``dim``."""
    lower, upper = HaloExchange.apply(x, r, dim)
    t = x.shape[dim]

    def conv(v: torch.Tensor) -> torch.Tensor:
        return conv_fn(v, m.weight, m.bias, 1, padding, m.dilation, m.groups)

    if t <= 2 * r:  # too thin to have an interior: one convolution of the extended slab
        return conv(torch.cat([lower, x, upper], dim))
    first = conv(torch.cat([lower, x.narrow(dim, 0, 2 * r)], dim))
    last = conv(torch.cat([x.narrow(dim, t - 2 * r, 2 * r), upper], dim))
    return torch.cat([first, conv(x), last], dim)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Differentiable sum over ranks (its backward sums the gradients over ranks too)."""
    from torch.distributed._functional_collectives import all_reduce

    return all_reduce(t, "sum", dist.group.WORLD)


def _global_norm(stats_log: list):
    """BatchNorm with the statistics of the whole volume: per-channel sums over each rank's
    owned voxels, all-reduced."""
    def norm(_i: int, bn: nn.Module, a: torch.Tensor, own: tuple[slice, ...]) -> torch.Tensor:
        own_a = region(a, own)
        dims = [0, *range(2, own_a.dim())]
        c = own_a.shape[1]
        n = torch.full((1,), own_a.numel() // c, dtype=a.dtype, device=a.device)
        s = all_reduce_sum(torch.cat([own_a.sum(dims), (own_a * own_a).sum(dims), n]))
        count = s[-1]
        mean = s[:c] / count
        var = s[c:2 * c] / count - mean * mean
        stats_log.append((bn, mean.detach(), var.detach(), int(count.item())))
        return normalise(bn, a, mean, var)
    return norm


def forward_per_layer(chain: ConvChain, x: torch.Tensor, dim: int, stats_log: list) -> torch.Tensor:
    """This rank's slab through the chain, exchanging halos before every convolution."""
    axis = dim - 2
    norm = _global_norm(stats_log)
    whole = tuple(slice(None) for _ in range(chain.spatial_dims))
    conv_fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[chain.spatial_dims]
    i = 0
    for layer in chain.layers:
        m = layer.module
        if layer.kind == "conv":
            r = layer.radius[axis]
            padding = list(layer.radius)
            padding[axis] = 0  # the halo (or the border's zeros) replaces the padding
            if r:
                x = conv_with_halos(conv_fn, m, x, r, dim, tuple(padding))
            else:
                x = conv_fn(x, m.weight, m.bias, 1, tuple(padding), m.dilation, m.groups)
        elif layer.kind == "batchnorm" and uses_batch_stats(m):
            x = norm(i, m, x, whole)
            i += 1
        else:
            x = m(x)
    return x


def forward_input_once(chain: ConvChain, x: torch.Tensor, dim: int,
                       stats_log: list) -> torch.Tensor:
    """Exchange the input's whole-receptive-field halo once, then run the slab as the
    single-device tiled step does (each convolution computes what later layers need, valid at
    the cuts, zero-padded at the volume's border); return the owned output."""
    axis, h = dim - 2, chain.halo[dim - 2]
    rank, world = dist.get_rank(), dist.get_world_size()
    t = x.shape[dim]
    ext = x
    if h:
        with torch.no_grad():  # the input needs no gradient: nothing flows back
            lower, upper = HaloExchange.apply(x, h, dim)
        ext = torch.cat([lower, x, upper], dim)
    lo = h if rank > 0 else 0  # no neighbour: do not extend, that side is the volume's border
    hi = h if rank < world - 1 else 0
    slab = ext.narrow(dim, h - lo, lo + t + hi)
    # the slab in its own coordinates: it owns [lo, lo + t) and reads all of itself; the
    # border sides are at 0 and at its end (a cut side is never reached with a full halo)
    shape = tuple(slab.shape[2:])
    own = tuple(slice(lo, lo + t) if a == axis else slice(0, n) for a, n in enumerate(shape))
    tile = Tile((rank,), own, tuple(slice(0, n) for n in shape), shape)
    out, local = run_chain(chain, slab, tile, _global_norm(stats_log))
    return region(out, local)


# --------------------------------------------------------------------------------------------
# The worker and its single-process reference
# --------------------------------------------------------------------------------------------
NETS = ("limit", "plain", "bn")


def build_spatial_net(config: dict) -> nn.Module:
    """The nets the demos and tests use, identically initialised on every rank:
    ``limit`` = seed 003's LimitTestNet, ``plain`` = a conv stack with a 5x5x5 and a dilated
    convolution, ``bn`` = conv-BN-ReLU twice, then a conv."""
    _check_config(config)
    name = config.get("net", "limit")
    torch.manual_seed(config.get("seed", 0))
    with default_dtype(getattr(torch, config.get("dtype", "float64"))):
        if name == "limit":
            return LimitTestNet()
        if name == "plain":
            return nn.Sequential(nn.Conv3d(1, 3, 5, padding=2), nn.Tanh(),
                                 nn.Conv3d(3, 2, 3, padding=2, dilation=2), nn.GELU(),
                                 nn.Conv3d(2, 1, 3, padding=1))
        return nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.BatchNorm3d(4), nn.ReLU(),
                             nn.Conv3d(4, 4, 3, padding=1), nn.BatchNorm3d(4), nn.ReLU(),
                             nn.Conv3d(4, 1, 3, padding=1))


def _check_config(config: dict) -> None:
    """What the demos read from ``config``: ``net`` (one of ``NETS``), ``dtype`` (a floating
    torch dtype's name), ``batch`` (>= 1), ``volume`` (three sides >= 1), ``dim`` (2, 3 or 4:
    a spatial axis) and ``exchange``; checked before any rank sends a message."""
    def whole(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    volume, dtype = config.get("volume", (16, 10, 10)), config.get("dtype", "float64")
    problems = {
        "net": config.get("net", "limit") in NETS,
        "dtype": isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype)
        and getattr(torch, dtype).is_floating_point,
        "batch": whole(config.get("batch", 1)),
        "volume": isinstance(volume, (tuple, list)) and len(volume) == 3 and all(whole(v) for v in volume),
        "dim": config.get("dim", 2) in (2, 3, 4) and not isinstance(config.get("dim", 2), bool),
        "exchange": config.get("exchange", "per_layer") in ("per_layer", "input_once"),
    }
    bad = [k for k, ok in problems.items() if not ok]
    if bad:
        raise ParallelError(f"spatial config: {', '.join(f'{k}={config.get(k)!r}' for k in bad)} not understood.",
                            f"net one of {NETS}, dtype a float dtype's name ('float64'), batch >= 1, volume three "
                            "sides >= 1, dim 2, 3 or 4, exchange 'per_layer' or 'input_once'.")


def spatial_volume(config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The same (batch, 1, D, H, W) input and target on every rank."""
    _check_config(config)
    g = torch.Generator().manual_seed(1234)
    dtype = getattr(torch, config.get("dtype", "float64"))
    shape = (config.get("batch", 1), 1, *config.get("volume", (16, 10, 10)))
    return (torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g, dtype=dtype))


def _split_bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    return rank * n // world, (rank + 1) * n // world


@compared
def spatial_worker(rank: int, world: int, device: torch.device, config: dict) -> dict:
    """One training step of ``build_spatial_net(config)`` on this rank's slab of the volume
    (split along depth, ``config["dim"]`` = 2), halos exchanged ``config["exchange"]``
    ("per_layer" or "input_once"); gradients summed over ranks. Returns the summed gradients,
    the global loss, this rank's slab, saved-for-backward bytes and bytes sent."""
    if config.get("runs"):  # several steps in one launch (processes take seconds to start)
        out = []
        for run in config["runs"]:
            try:
                out.append(spatial_worker(rank, world, device, {**config, **run, "runs": None}))
            except (TilingError, ParallelError) as err:  # refused: report it, keep the ranks alive
                out.append({"rank": rank, "error": str(err)})
                dist.barrier()
        return out
    _check_config(config)
    if rank >= world:
        raise ParallelError(f"rank {rank} of a world of {world}.", f"a rank from 0 to {world - 1}.")
    dim = config.get("dim", 2)
    exchange = config.get("exchange", "per_layer")
    net = build_spatial_net(config).to(device)
    chain = conv_chain(net)
    x, target = spatial_volume(config)
    # checked on every rank before any message, so that all ranks refuse together
    n = x.shape[dim]
    thinnest = n // world  # _split_bounds' slabs are n // world or one more thick
    radii = [l.radius[dim - 2] for l in chain.layers if l.kind == "conv"]
    need = max(radii) if exchange == "per_layer" else chain.halo[dim - 2]
    if thinnest < max(1, need):
        what = "a layer needs a halo of" if exchange == "per_layer" else "the input's halo is"
        raise ParallelError(
            f"{world} ranks split {n} voxels along dim {dim} into slabs of {thinnest} or more, "
            f"but {what} {need} voxels, which must come from the neighbouring rank alone.",
            "fewer ranks (thicker slabs), or a larger volume.")
    lo, hi = _split_bounds(n, world, rank)
    xs = x.narrow(dim, lo, hi - lo).to(device)  # in a real run each rank loads only its slab
    ts = target.narrow(dim, lo, hi - lo).to(device)
    EXCHANGED.update(forward=0, backward=0)
    stats_log: list = []
    dist.barrier()
    t0 = time.perf_counter()
    with SavedTensorMeter(net.parameters()) as meter:
        if exchange == "per_layer":
            out = forward_per_layer(chain, xs, dim, stats_log)
        else:
            out = forward_input_once(chain, xs, dim, stats_log)
        loss = F.mse_loss(out, ts, reduction="sum") / target.numel()
    loss.backward()
    for p in net.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
    total = loss.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    seconds = time.perf_counter() - t0
    for bn, mean, var, count in stats_log:
        update_running_stats(bn, mean, var, count)
    return {"rank": rank, "exchange": exchange, "owned": (lo, hi), "loss": total.item(),
            "grads": [p.grad.detach().cpu().clone() for p in net.parameters()],
            "running": [b.detach().cpu().clone() for b in net.buffers()],
            "saved_bytes": meter.peak, "sent_bytes": dict(EXCHANGED), "step_s": seconds}


def spatial_reference(config: dict) -> dict:
    """The same step in one process on the whole volume: ``mse_loss(net(x), target)``."""
    net = build_spatial_net(config)
    x, target = spatial_volume(config)
    with SavedTensorMeter(net.parameters()) as meter:
        loss = F.mse_loss(net(x), target)
    loss.backward()
    return {"loss": loss.item(), "grads": [p.grad.detach().clone() for p in net.parameters()],
            "running": [b.detach().clone() for b in net.buffers()], "saved_bytes": meter.peak}


guard(globals(), ParallelError)
