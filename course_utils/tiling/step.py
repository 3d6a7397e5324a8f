"""Running a chain on one slab, and the tiled training step built on it.

``run_chain`` runs a ``ConvChain`` on the input a tile reads and returns the part it owns;
``tiled_step(model, x, target, tiles)`` is the training step: gradients accumulate in ``.grad``
as after ``loss.backward()`` of the untiled step (``full_step``, compared by
``compare_with_untiled``).

Zero padding at the border, and what each layer computes. A slab reads its owned voxels plus
the halo. Each convolution then computes only the voxels that the layers after it still need
(the owned voxels + the radii of the later convolutions): along a cut it is a *valid*
convolution (no padding: the neighbour's voxels are there, read as halo), so the slab shrinks
layer by layer to exactly its owned voxels; the overlap with the neighbours is computed twice
(``work_factor`` says how much extra work that is). At the true border of the volume the slab
is not extended, and each convolution zero-pads there exactly as on the full volume. (Padding
the *input* with zeros instead would be wrong: a zero input voxel becomes ``relu(bias)`` after
one layer, not the zero that the next layer's padding assumes.) With a halo smaller than the
receptive field the missing neighbour voxels are zero-padded at the cut, and the gradient is
wrong -- which the tests check.

BatchNorm. In training mode BatchNorm normalises with the mean and variance over the *whole*
batch and volume, which no slab sees. ``tiled_step`` handles it exactly, in sweeps over the
slabs (the statistics are accumulated over each slab's *owned* voxels only):

1. forward statistics: for each BatchNorm layer in order, one sweep without autograd runs every
   slab up to that layer (normalising the earlier ones with their global statistics) and
   accumulates per-channel sums and sums of squares: L sweeps for L BatchNorm layers;
2. the loss sweep: every slab forward and backward, with each layer's (mean, variance) as a
   leaf tensor, so that backward also accumulates d loss / d (mean, variance);
3. backward statistics: the mean and variance are functions of the volume too, so that gradient
   must flow on into the weights of the layers before each BatchNorm. For the BatchNorm layers
   from last to first, one sweep runs every slab up to that layer again and back-propagates
   ``sum_owned(G_mean * a + G_var * (a**2 - 2 * mean * a)) / M`` (whose gradient in ``a`` is
   exactly ``G_mean / M + G_var * 2 (a - mean) / M``): L more sweeps.

Cost: 2L + 1 sweeps over the volume instead of 1, each a partial forward (and for the last L a
partial backward) -- for a net with a BatchNorm after each of its L convolutions, roughly L
times the compute of the plain tiled step; memory stays one slab's. Skipping step 3 (the
"two-pass" scheme that gets the forward right, ``bn_backward="detached"``) leaves the gradient
wrong: a test shows by how much. Across devices (``course_utils.spatial``) the statistics are
instead summed over ranks with a differentiable all-reduce, in one pass.

GroupNorm, InstanceNorm and LayerNorm over spatial axes are refused: they too use statistics
over the whole volume (of each sample), so they are *not* a way around the problem; the same
sweeps would work for them but are not implemented here. Alternatives that tile without
sweeps: no normalisation (seed 003's net), BatchNorm with frozen statistics (``.eval()``:
a per-channel affine map), or a normalisation over channels only, per voxel.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import TilingError, guard
from ..numerics import normalise, relative_error, update_running_stats, uses_batch_stats
from .halo import ConvChain, conv_chain
from .plan import Tile, _as_halo, plan_tiles


# --------------------------------------------------------------------------------------------
# Running a slab
# --------------------------------------------------------------------------------------------
def _needed_ranges(chain: ConvChain, tile: Tile):
    """For each convolution of the chain, on this tile (per spatial axis, global coordinates):
    the input range it takes from the previous layer's output, the symmetric zero padding it
    applies, and the output range kept afterwards.

    A convolution computes only the output voxels the rest of the chain still needs: the owned
    voxels + the radii of the later convolutions (clipped at the volume's border). Along a cut
    it is a *valid* convolution (no padding: the neighbours' voxels are there, read as halo);
    at the volume's border it pads with zeros like the full volume. So the slab shrinks from
    owned + 2 x halo at the input to exactly the owned voxels at the output, and no voxel near
    a cut is ever computed from padding -- unless the halo is too small: then the missing
    neighbour voxels are zero-padded and the result is wrong, as it should be."""
    convs = [l for l in chain.layers if l.kind == "conv"]
    after = [tuple(sum(c.radius[a] for c in convs[i + 1:]) for a in range(chain.spatial_dims))
             for i in range(len(convs))]
    have = [(r.start, r.stop) for r in tile.read]
    out = []
    for conv, rest in zip(convs, after, strict=True):
        take, pad, keep, computed = [], [], [], []
        for a, (lo, hi) in enumerate(have):
            r, o, n = conv.radius[a], tile.own[a], tile.volume[a]
            need = (max(0, o.start - rest[a]), min(n, o.stop + rest[a]))
            t_lo, t_hi = max(need[0] - r, lo), min(need[1] + r, hi)
            p = max(t_lo - (need[0] - r), (need[1] + r) - t_hi)
            take.append((t_lo, t_hi))
            pad.append(p)
            computed.append((t_lo - p + r, t_hi + p - r))  # what the padded convolution yields
            keep.append(need)
        out.append((conv, take, pad, computed, keep))
        have = keep
    return out


def run_chain(chain: ConvChain, x: torch.Tensor, tile: Tile | None = None,
              norm: Callable[..., torch.Tensor] | None = None,
              stop_at_norm: int | None = None) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """Run the layers on ``x``, the input read at ``tile.read`` (the whole volume if ``tile``
    is None). Returns the result and the region of it that the tile owns.

    Convolutions compute only what later layers need (see ``_needed_ranges``). BatchNorm layers
    that use batch statistics go through ``norm(i, module, a, owned_region_of_a)`` (i counts
    them from 0); with ``stop_at_norm=i`` the input of the i-th one is returned instead."""
    nd = chain.spatial_dims
    if tile is None:
        shape = tuple(x.shape[-nd:])
        full = tuple(slice(0, n) for n in shape)
        tile = Tile((0,) * nd, full, full, shape)
    ranges = iter(_needed_ranges(chain, tile))
    start = [r.start for r in tile.read]
    conv_fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]

    def local_own() -> tuple[slice, ...]:
        return tuple(slice(o.start - s, o.stop - s) for o, s in zip(tile.own, start, strict=True))

    i = 0
    for layer in chain.layers:
        m = layer.module
        if layer.kind == "conv":
            _, take, pad, computed, keep = next(ranges)
            x = x[(Ellipsis,) + tuple(slice(t0 - s, t1 - s) for (t0, t1), s in zip(take, start, strict=True))]
            x = conv_fn(x, m.weight, m.bias, 1, tuple(pad), m.dilation, m.groups)
            crop = tuple(slice(k0 - c0, k1 - c0) for (k0, k1), (c0, _) in zip(keep, computed, strict=True))
            if any(sl.start or sl.stop != n for sl, n in zip(crop, x.shape[-nd:], strict=True)):
                x = x[(Ellipsis,) + crop]
            start = [k0 for k0, _ in keep]
        elif layer.kind == "batchnorm" and uses_batch_stats(m):
            if i == stop_at_norm:
                return x, local_own()
            if norm is None:
                raise TilingError(f"{layer.name}: BatchNorm with batch statistics needs the global statistics.",
                                  "run the model through tiled_step, which computes them.")
            x = norm(i, m, x, local_own())
            i += 1
        else:
            x = m(x)
    return x, local_own()


def work_factor(chain: ConvChain, plan: Sequence[Tile]) -> float:
    """Convolution work of the tiled step / that of the untiled one (multiply-adds, weighted by
    each layer's cost per voxel): what the halos cost in compute. 1.0 = no recomputation."""
    tiled = full = 0.0
    for tile in plan:
        for conv, _, _, computed, keep in _needed_ranges(chain, tile):
            m = conv.module
            per_voxel = m.in_channels * m.out_channels // m.groups * math.prod(m.kernel_size)
            tiled += per_voxel * math.prod(c1 - c0 for c0, c1 in computed)
            full += per_voxel * tile.own_voxels
    return tiled / full


def region(t: torch.Tensor, spatial: tuple[slice, ...]) -> torch.Tensor:
    """Cut the spatial region (a tile's ``own`` or ``read``, in the tensor's coordinates) out of
    (B, C, *spatial) or (B, *spatial) (class-index targets)."""
    lead = t.dim() - len(spatial)
    return t[(slice(None),) * lead + spatial]


def _owned_sums(a: torch.Tensor, local: tuple[slice, ...]) -> tuple[torch.Tensor, torch.Tensor, int]:
    own = region(a, local)
    dims = [0, *range(2, own.dim())]
    own64 = own.double() if own.dtype != torch.float64 else own
    return own64.sum(dims), (own64 * own64).sum(dims), own.numel() // own.shape[1]


def _check_inputs(chain: ConvChain, x: torch.Tensor, target: torch.Tensor) -> None:
    nd = chain.spatial_dims
    if not isinstance(x, torch.Tensor) or x.dim() != nd + 2:
        raise TilingError(f"x must be a tensor (batch, channels, {nd} spatial dims), got "
                          f"{getattr(x, 'shape', type(x).__name__)}. Fix: x[None, None] for one volume.")
    if x.shape[1] != chain.in_channels:
        raise TilingError(f"the first convolution takes {chain.in_channels} channel(s), x has "
                          f"{x.shape[1]} (shape {tuple(x.shape)}).", "pass x as (batch, channels, *volume).")
    if tuple(target.shape[-nd:]) != tuple(x.shape[2:]) or target.shape[0] != x.shape[0]:
        raise TilingError(f"target {tuple(target.shape)} does not match the volume "
                          f"{tuple(x.shape)}: the tiled loss cuts both at the same voxels.",
                          "pass the target of this volume: (batch, *volume).")


# --------------------------------------------------------------------------------------------
# The tiled training step
# --------------------------------------------------------------------------------------------
@dataclass
class TiledStep:
    """What ``tiled_step`` did: the loss (the untiled step's, up to rounding), the plan, and
    the cost of the halos (``work``: convolution work / the untiled step's, per sweep)."""

    loss: torch.Tensor
    plan: list[Tile]
    halo: tuple[int, ...]
    sweeps: int  # passes over the volume: 1, or 2L + 1 with L BatchNorm layers
    work: float

    def __float__(self) -> float:
        return float(self.loss)


def _normalised_with(stats: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable:
    """``run_chain``'s normalisation: BatchNorm layer i with the statistics ``stats[i]``."""
    def fixed(i: int, bn: nn.Module, a: torch.Tensor, _own: tuple[slice, ...]) -> torch.Tensor:
        mean, var = stats[i]
        return normalise(bn, a, mean, var)

    return fixed


def _batch_statistics(chain, plan: Sequence[Tile], piece: Callable, dtype: torch.dtype
                      ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """1. The forward statistics, BatchNorm layer by BatchNorm layer: layer k's mean and variance
    over the owned voxels of every slab, the layers before it normalised with theirs; and the
    number of voxels each is over."""
    stats: list[tuple[torch.Tensor, torch.Tensor]] = []
    fixed = _normalised_with(stats)
    n_vox = 0
    for k in range(len(chain.batch_stat_norms)):
        s1 = s2 = None
        n_vox = 0
        with torch.no_grad():
            for tile in plan:
                a, own = run_chain(chain, piece(tile.read), tile, fixed, stop_at_norm=k)
                t1, t2, n = _owned_sums(a, own)
                s1, s2 = (t1, t2) if s1 is None else (s1 + t1, s2 + t2)
                n_vox += n
                del a
        mean = s1 / n_vox
        stats.append((mean.to(dtype), (s2 / n_vox - mean * mean).to(dtype)))
    return stats, n_vox


def _backward_through_statistics(chain, plan: Sequence[Tile], piece: Callable,
                                 stats: list[tuple[torch.Tensor, torch.Tensor]], n_vox: int, fixed: Callable) -> None:
    """3. What the loss's gradient with respect to each layer's mean and variance adds to the
    parameters below it, last BatchNorm first: each slab's owned activations again, through a
    surrogate whose gradient is that contribution."""
    for k in reversed(range(len(stats))):
        mean, var = stats[k]
        g_mean, g_var = mean.grad, var.grad
        if g_mean is None:  # the loss does not depend on this layer's statistics
            continue
        for tile in plan:
            a, own = run_chain(chain, piece(tile.read), tile, fixed, stop_at_norm=k)
            own = region(a, own)
            shape = (1, -1) + (1,) * (own.dim() - 2)
            m = mean.detach().view(shape)
            surrogate = (g_mean.view(shape) * own + g_var.view(shape) * (own * own - 2 * m * own)).sum() / n_vox
            surrogate.backward()
            del a, own, surrogate


def tiled_step(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    tiles: int | Sequence[int] | Sequence[Tile] = 2,
    *,
    axis: int = 0,
    halo: int | Sequence[int] | None = None,
    loss_fn: Callable[..., torch.Tensor] = F.mse_loss,
    stream: bool = False,
    bn_backward: str = "exact",
) -> TiledStep:
    """Forward and backward of ``model`` on ``x`` in slabs; gradients accumulate in ``.grad``.

    Equal to ``loss_fn(model(x), target).backward()`` with ``loss_fn``'s mean reduction,
    up to floating-point rounding: each slab's loss is ``loss_fn(out_owned, target_owned,
    reduction="sum") / target.numel()``, so the slabs' losses add up to the mean over the whole
    volume. (Right for MSE, L1, smooth L1, BCE-with-logits, and cross-entropy with class-index
    targets without class weights or ignore_index.)

    Args:
        tiles: number of slabs along spatial ``axis`` (0 = depth), or one count per spatial
            axis for a grid of blocks, or a list of ``Tile`` from ``plan_tiles``.
        halo: voxels read beyond each slab, per side; default (None): derived from the model.
            Pass one only to see what a wrong halo does.
        stream: ``x`` and ``target`` stay where they are (e.g. pinned host memory) and each
            slab's piece is copied to the model's device: the device then holds one slab.
        bn_backward: "exact" (default) or "detached", which treats the BatchNorm statistics as
            constants in backward -- the two-pass mistake, kept to show its error.
    """
    chain = conv_chain(model)
    _check_inputs(chain, x, target)
    h = chain.halo if halo is None else _as_halo(halo, chain.spatial_dims)
    if isinstance(tiles, (list, tuple)) and tiles and isinstance(tiles[0], Tile):
        plan = list(tiles)  # a given plan (the memory predictor runs a few representative slabs)
    else:
        plan = plan_tiles(x.shape[2:], tiles, h, axis)
    if bn_backward not in ("exact", "detached"):
        raise TilingError(f"bn_backward must be 'exact' or 'detached', got {bn_backward!r}.",
                          "bn_backward='exact' (the default) or 'detached'.")
    device = next(model.parameters()).device
    if not stream and x.device != device:
        raise TilingError(f"x is on {x.device}, the model on {device}. Fix: move x there, or "
                          "pass stream=True to keep the volume where it is and copy slab by slab.")

    def piece(t: torch.Tensor, spatial: tuple[slice, ...]) -> torch.Tensor:
        p = region(t, spatial)
        return p.to(device, copy=True, non_blocking=True) if stream else p

    norms = chain.batch_stat_norms
    count = target.numel()
    stats, n_vox = _batch_statistics(chain, plan, functools.partial(piece, x), x.dtype)
    if bn_backward == "exact":
        stats = [(m.clone().requires_grad_(), v.clone().requires_grad_()) for m, v in stats]
    fixed = _normalised_with(stats)

    # 2. the loss: every slab forward and backward, loss on the owned voxels only
    total = torch.zeros((), dtype=torch.float64, device=device)
    for tile in plan:
        out, own = run_chain(chain, piece(x, tile.read), tile, fixed)
        loss = loss_fn(region(out, own), piece(target, tile.own), reduction="sum") / count
        del out
        loss.backward()
        total += loss.detach()
        del loss

    if bn_backward == "exact":  # 3. backward through the statistics, last BatchNorm first
        _backward_through_statistics(chain, plan, functools.partial(piece, x), stats, n_vox, fixed)
    for bn, (mean, var) in zip(norms, stats, strict=True):
        update_running_stats(bn, mean.detach(), var.detach(), n_vox)
    sweeps = 1 + (2 * len(norms) if bn_backward == "exact" else len(norms))
    return TiledStep(total.to(x.dtype), plan, h, sweeps, work_factor(chain, plan))


def full_step(model: nn.Module, x: torch.Tensor, target: torch.Tensor,
              loss_fn: Callable[..., torch.Tensor] = F.mse_loss) -> torch.Tensor:
    """The untiled reference: ``loss_fn(model(x), target).backward()``; returns the loss."""
    loss = loss_fn(model(x), target)
    loss.backward()
    return loss.detach()


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    """Copies of ``model``'s parameter gradients, in parameter order."""
    return [p.grad.detach().clone() for p in model.parameters()]


def compare_with_untiled(build: Callable[[], nn.Module], x: torch.Tensor, target: torch.Tensor,
                         tiles: int | Sequence[int] = 2, **kwargs: Any) -> dict[str, float]:
    """Build the model twice from the same seed, run the untiled and the tiled step, and return
    the relative gradient error and the loss of each."""
    torch.manual_seed(0)
    ref_model = build()
    ref_loss = full_step(ref_model, x, target, kwargs.get("loss_fn", F.mse_loss))
    torch.manual_seed(0)
    model = build()
    step = tiled_step(model, x, target, tiles, **kwargs)
    return {"grad_error": relative_error(grads_of(model), grads_of(ref_model)),
            "loss": float(step.loss), "loss_untiled": float(ref_loss),
            "halo": step.halo, "work": step.work, "sweeps": step.sweeps}


guard(globals(), TilingError)
