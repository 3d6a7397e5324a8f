"""Split the volume, not the network: a tiled training step for convolution chains.

A 3x3x3 convolution (stride 1, padding 1) needs, for each output voxel, only the input voxels
one step away. A chain of such layers needs ``halo = sum((k - 1) // 2 * dilation)`` voxels on
each side: its *receptive field*. So a volume can be trained in **slabs** (tiles): each slab
reads the voxels it owns plus a halo of that width from its neighbours, runs forward and
backward on that piece alone, and computes the loss only on the voxels it owns. Summed over the
slabs, the losses are the full volume's loss and the weight gradients accumulate to the
full-volume gradient -- exactly, not approximately (``tests/test_tiling.py`` checks it in
float64). Memory then holds one slab's activations at a time instead of the whole volume's.

How the pieces fit together:

* ``conv_chain(model)`` walks the model's modules (``nn.Sequential`` chains of stride-1 "same"
  convolutions, point-wise activations and BatchNorm) and *derives* the halo per spatial axis;
  anything whose receptive field cannot be read off the modules (pooling, upsampling, a module
  with its own ``forward``) is refused with an error that says why and what to do.
  ``probe_halo(model)`` measures the same halo independently, from the support of one output
  voxel's input gradient.
* ``plan_tiles(shape, tiles, halo)`` cuts the volume: each ``Tile`` has the region it *owns*
  and the region it *reads* (owned + halo, clipped at the volume's border).
* ``tiled_step(model, x, target, tiles)`` is the training step: gradients accumulate in
  ``.grad`` as after ``loss.backward()`` of the untiled step; it returns the loss.

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

import contextlib
import copy
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .numerics import normalise, relative_error, update_running_stats, uses_batch_stats


class TilingError(ValueError):
    """The model or the split cannot be tiled exactly; the message names the fix."""


#: layers that act on each voxel on its own (halo 0)
POINTWISE: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Softplus,
    nn.Identity,
)
CONVS = {nn.Conv1d: 1, nn.Conv2d: 2, nn.Conv3d: 3}
BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
WHOLE_VOLUME_NORMS = (nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
                      nn.LayerNorm, nn.LocalResponseNorm)
RESAMPLING = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d,
              nn.AvgPool3d, nn.Upsample, nn.ConvTranspose1d, nn.ConvTranspose2d,
              nn.ConvTranspose3d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool3d, nn.PixelShuffle)

_SUPPORTED = ("nn.Sequential chains of ConvNd (stride 1, odd kernel, 'same' zero padding), "
              "point-wise activations (ReLU, LeakyReLU, GELU, ...) and BatchNorm")


# --------------------------------------------------------------------------------------------
# The model: a checked chain of layers, and its halo
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layer:
    name: str  # the module's path in the model, e.g. "2" or "block.conv"
    module: nn.Module
    kind: str  # "conv" | "pointwise" | "batchnorm"
    radius: tuple[int, ...]  # halo this layer needs per spatial axis (conv: dilation*(k-1)//2)


@dataclass(frozen=True)
class ConvChain:
    """A model the tiled step can run: its layers in order and the halo they need.

    ``halo[a]`` is the number of voxels a slab must read beyond the ones it owns, on each side
    of spatial axis ``a``: the sum of the convolutions' radii (``dilation * (k - 1) // 2``).
    """

    layers: tuple[Layer, ...]
    spatial_dims: int
    halo: tuple[int, ...]

    @property
    def batch_stat_norms(self) -> list[nn.Module]:
        """BatchNorm layers that normalise with batch statistics (training mode)."""
        return [l.module for l in self.layers if l.kind == "batchnorm" and uses_batch_stats(l.module)]

    @property
    def in_channels(self) -> int:
        return next(l.module.in_channels for l in self.layers if l.kind == "conv")


def _conv_radius(path: str, m: nn.Module) -> tuple[int, ...]:
    k, d, s = m.kernel_size, m.dilation, m.stride
    if any(v != 1 for v in s):
        raise TilingError(
            f"{path} ({type(m).__name__}) has stride {s}: it changes the resolution, so slab "
            "boundaries would have to align to the stride and the halo be counted at each "
            "resolution; not supported. Fix: tile a chain of stride-1 convolutions.")
    if m.padding_mode != "zeros":
        raise TilingError(
            f"{path} uses padding_mode={m.padding_mode!r}; tiling reproduces zero padding "
            "exactly (a slab at the border pads like the volume) but 'circular' wraps to the "
            "other side of the volume. Fix: padding_mode='zeros'.")
    radius = []
    for i, (kk, dd) in enumerate(zip(k, d, strict=True)):
        if kk % 2 == 0:
            raise TilingError(
                f"{path} has an even kernel size {k}: no symmetric padding keeps the size, so "
                "output voxel i is not centred on input voxel i. Fix: odd kernels (3, 5, ...).")
        need = dd * (kk - 1) // 2
        pad = need if m.padding == "same" else (None if isinstance(m.padding, str) else m.padding[i])
        if pad != need:
            raise TilingError(
                f"{path} has padding {m.padding} but kernel {k} with dilation {d} needs "
                f"padding {need} on axis {i} to keep the volume's size ('same' padding); "
                f"tiling needs the output voxel i to sit on input voxel i. Fix: padding="
                f"{tuple(dd * (kk - 1) // 2 for kk, dd in zip(k, d, strict=True))} (or padding='same').")
        radius.append(need)
    return tuple(radius)


def _refuse(path: str, m: nn.Module) -> TilingError:
    name = type(m).__name__
    if name == "UNet3D" or hasattr(m, "ups") and hasattr(m, "downs"):
        return TilingError(
            f"{path or 'the model'} is a U-Net: its forward is its own code (skip connections), "
            "it pools (slabs would have to align to 2**(levels-1) and the halo be counted at "
            "every resolution) and its Upsample uses align_corners=True, whose sampling grid "
            "depends on the whole volume's size -- no halo makes slabs exact. Not supported. "
            f"Fix: tile {_SUPPORTED}; for a U-Net use Upsample(align_corners=False), slabs "
            "aligned to 2**(levels-1) and halo exchange per layer (as spatially parallel 3D "
            "U-Net trainings do), or reduce memory with checkpointing (notebook 07).")
    if isinstance(m, RESAMPLING):
        return TilingError(
            f"{path} is {name}: it changes the resolution, so the slabs would have to align to "
            "its stride and the halo be counted at each resolution. Not supported. Fix: tile "
            "only the full-resolution part of the network, made of " + _SUPPORTED + ".")
    if isinstance(m, WHOLE_VOLUME_NORMS):
        return TilingError(
            f"{path} is {name}: it normalises with statistics over the whole volume of each "
            "sample, which no slab sees, so a tiled step cannot reproduce it (and it is no way "
            "around BatchNorm's problem). Fix: BatchNorm (handled exactly, in extra sweeps), "
            "BatchNorm with frozen statistics (.eval()), or no normalisation.")
    if isinstance(m, DROPOUTS):
        return TilingError(
            f"{path} is {name} in training mode: the halo that two slabs both compute would get "
            "different random masks, so the tiled step equals no untiled step. Fix: put it in "
            "eval mode (module.eval()) or remove it for the tiled step.")
    if isinstance(m, nn.Sequential):
        return TilingError(
            f"{path or 'the model'} ({name}) subclasses nn.Sequential but overrides forward(): "
            "what it computes cannot be read off its modules. Fix: a plain nn.Sequential.")
    if any(True for _ in m.children()):
        return TilingError(
            f"{path or 'the model'} ({name}) has its own forward(): which layers the data goes "
            "through, in which order, cannot be read off its modules, so its receptive field "
            f"cannot be derived. Fix: express it as {_SUPPORTED}.")
    return TilingError(
        f"{path or 'the model'} is {name}: the course does not know its receptive field. "
        f"Fix: tile {_SUPPORTED}; check a new point-wise layer with probe_halo().")


def _walk(m: nn.Module, path: str) -> list[Layer]:
    if type(m) is nn.Sequential or (isinstance(m, nn.Sequential)
                                    and type(m).forward is nn.Sequential.forward):
        out: list[Layer] = []
        for name, child in m.named_children():
            out += _walk(child, f"{path}.{name}" if path else name)
        return out
    for conv_type in CONVS:
        if type(m) is conv_type:
            return [Layer(path, m, "conv", _conv_radius(path, m))]
    if isinstance(m, BATCHNORMS):
        return [Layer(path, m, "batchnorm", ())]
    if isinstance(m, POINTWISE) or (isinstance(m, DROPOUTS) and not m.training):
        return [Layer(path, m, "pointwise", ())]
    raise _refuse(path, m)


def conv_chain(model: nn.Module) -> ConvChain:
    """Check that ``model`` can be tiled and derive its halo by walking its modules.

    >>> from course_utils.limit_test import LimitTestNet
    >>> conv_chain(LimitTestNet()).halo   # three 3x3x3 convolutions: 1 + 1 + 1 per side
    (3, 3, 3)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}. Fix: pass the "
                        "model itself, not its class or its output.")
    layers = _walk(model, "")
    convs = [l for l in layers if l.kind == "conv"]
    if not convs:
        raise TilingError("the model has no convolution: nothing to tile. Fix: " + _SUPPORTED)
    dims = {CONVS[type(l.module)] for l in convs}
    if len(dims) > 1:
        raise TilingError(f"the model mixes convolutions of {sorted(dims)} spatial dims; "
                          "tile one kind at a time.")
    nd = dims.pop()
    halo = tuple(sum(l.radius[a] for l in convs) for a in range(nd))
    layers = [Layer(l.name, l.module, l.kind, l.radius or (0,) * nd) for l in layers]
    return ConvChain(tuple(layers), nd, halo)


def probe_halo(model: nn.Module, size: int = 15, trials: int = 3, seed: int = 0) -> tuple[int, ...]:
    """The halo measured instead of derived: the gradient of the centre output voxel with
    respect to the input is non-zero exactly on its receptive field. Runs a float64 copy of
    ``model`` on ``trials`` random volumes of ``size`` voxels per side and takes the union of
    the supports (a ReLU that happens to be off hides part of the field in one trial).

    Raises ``TilingError`` when the support reaches the volume's border: the field is larger
    than ``size // 2`` or global (BatchNorm in training mode makes every output depend on every
    input)."""
    convs = [m for m in model.modules() if type(m) in CONVS]
    if not convs:
        raise TilingError("probe_halo needs a model with a convolution (to know the input's "
                          "channels and dims)")
    nd, cin = CONVS[type(convs[0])], convs[0].in_channels
    probe = copy.deepcopy(model).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    support = torch.zeros((size,) * nd, dtype=torch.bool)
    c = size // 2
    found = 0
    for _ in range(20 * trials):  # a trial where the centre output's ReLU is off shows nothing
        x = torch.randn(1, cin, *(size,) * nd, dtype=torch.float64, generator=g)
        x = (3 * x).requires_grad_()
        out = probe(x)
        out[(0, slice(None)) + (c,) * nd].sum().backward()
        grad = x.grad.abs().sum(dim=(0, 1)) > 0
        support |= grad
        found += bool(grad.any())
        if found == trials:
            break
    if not support.any():
        raise TilingError("the centre output voxel never depended on the input in "
                          f"{20 * trials} random trials (dead activations?): nothing to probe")
    halo = []
    for a in range(nd):
        idx = support.any(dim=tuple(d for d in range(nd) if d != a)).nonzero().flatten()
        lo, hi = int(idx.min()), int(idx.max())
        if lo == 0 or hi == size - 1:
            raise TilingError(
                f"the centre voxel's input gradient reaches the border of a {size}-voxel probe "
                f"on axis {a}: the receptive field is wider than {c} voxels, or global (batch "
                "statistics). Fix: probe with a larger size, or remove the global operation.")
        halo.append(max(c - lo, hi - c))
    return tuple(halo)


# --------------------------------------------------------------------------------------------
# The plan: which voxels each slab owns and reads
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tile:
    """One slab: ``own`` = the voxels whose loss it computes (global coordinates, one slice per
    spatial axis); ``read`` = the input it needs, owned +- halo, clipped at the volume's border."""

    index: tuple[int, ...]
    own: tuple[slice, ...]
    read: tuple[slice, ...]
    volume: tuple[int, ...]  # the whole volume's spatial shape (where the true border is)

    @property
    def own_voxels(self) -> int:
        return math.prod(s.stop - s.start for s in self.own)

    @property
    def read_voxels(self) -> int:
        return math.prod(s.stop - s.start for s in self.read)


def _as_counts(tiles: int | Sequence[int], nd: int, axis: int) -> tuple[int, ...]:
    if isinstance(tiles, int):
        counts = [1] * nd
        counts[axis] = tiles
        return tuple(counts)
    counts = tuple(int(t) for t in tiles)
    if len(counts) != nd:
        raise TilingError(f"tiles={tiles} gives {len(counts)} counts for a volume with {nd} "
                          f"spatial axes. Fix: one count per axis, e.g. {(2,) + (1,) * (nd - 1)}.")
    return counts


def _as_halo(halo: int | Sequence[int], nd: int) -> tuple[int, ...]:
    h = (halo,) * nd if isinstance(halo, int) else tuple(halo)
    if len(h) != nd or any(not isinstance(v, int) or v < 0 for v in h):
        raise TilingError(f"halo must be a non-negative int or {nd} of them, got {halo!r}")
    return h


def plan_tiles(shape: Sequence[int], tiles: int | Sequence[int], halo: int | Sequence[int],
               axis: int = 0, only: Sequence[tuple[int, ...]] | None = None) -> list[Tile]:
    """Cut a volume of spatial ``shape`` into ``tiles`` slabs along spatial ``axis`` (an int),
    or into a grid (one count per axis). Owned sizes differ by at most one voxel. ``only``:
    build just the tiles with these indices (the predictor's representative slabs)."""
    shape = tuple(int(s) for s in shape)
    nd = len(shape)
    counts = _as_counts(tiles, nd, axis)
    h = _as_halo(halo, nd)
    bounds = []
    for a, (n, k) in enumerate(zip(shape, counts, strict=True)):
        if k < 1:
            raise TilingError(f"tiles must be >= 1 per axis, got {k} on axis {a}")
        if k > n:
            raise TilingError(
                f"cannot cut axis {a} of {n} voxels into {k} slabs: each slab must own at least "
                f"one voxel. Fix: at most {n} slabs on that axis (and far fewer: a slab reads "
                f"its owned voxels + 2 x {h[a]} halo, so thin slabs mostly recompute).")
        if k > 1 and n < 2 * h[a]:
            raise TilingError(
                f"axis {a} has {n} voxels but the halo is {h[a]} on each side: every slab would "
                f"read (nearly) the whole axis, so splitting it saves no memory and only "
                f"recomputes. Fix: do not split axis {a}; split a longer axis instead.")
        bounds.append(lambda i, n=n, k=k: (i * n // k, (i + 1) * n // k))
    plan = []
    for index in (itertools.product(*(range(k) for k in counts)) if only is None else only):
        own = tuple(slice(*bounds[a](i)) for a, i in enumerate(index))
        read = tuple(slice(max(0, o.start - h[a]), min(shape[a], o.stop + h[a]))
                     for a, o in enumerate(own))
        plan.append(Tile(tuple(index), own, read, shape))
    return plan


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
                raise TilingError(f"{layer.name}: BatchNorm with batch statistics needs the "
                                  "global statistics; run it through tiled_step.")
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
                          f"{x.shape[1]} (shape {tuple(x.shape)})")
    if tuple(target.shape[-nd:]) != tuple(x.shape[2:]) or target.shape[0] != x.shape[0]:
        raise TilingError(f"target {tuple(target.shape)} does not match the volume "
                          f"{tuple(x.shape)}: the tiled loss cuts both at the same voxels")


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


def tiled_step(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    tiles: int | Sequence[int] = 2,
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
        raise ValueError(f"bn_backward must be 'exact' or 'detached', got {bn_backward!r}")
    device = next(model.parameters()).device
    if not stream and x.device != device:
        raise TilingError(f"x is on {x.device}, the model on {device}. Fix: move x there, or "
                          "pass stream=True to keep the volume where it is and copy slab by slab.")

    def piece(t: torch.Tensor, spatial: tuple[slice, ...]) -> torch.Tensor:
        p = region(t, spatial)
        return p.to(device, copy=True, non_blocking=True) if stream else p

    norms = chain.batch_stat_norms
    count = target.numel()

    # 1. forward statistics, BatchNorm layer by BatchNorm layer
    stats: list[tuple[torch.Tensor, torch.Tensor]] = []
    n_vox = 0

    def fixed(i: int, bn: nn.Module, a: torch.Tensor, own: tuple[slice, ...]) -> torch.Tensor:
        mean, var = stats[i]
        return normalise(bn, a, mean, var)

    for k in range(len(norms)):
        s1 = s2 = None
        n_vox = 0
        with torch.no_grad():
            for tile in plan:
                a, own = run_chain(chain, piece(x, tile.read), tile, fixed, stop_at_norm=k)
                t1, t2, n = _owned_sums(a, own)
                s1, s2 = (t1, t2) if s1 is None else (s1 + t1, s2 + t2)
                n_vox += n
                del a
        mean = s1 / n_vox
        stats.append((mean.to(x.dtype), (s2 / n_vox - mean * mean).to(x.dtype)))
    if bn_backward == "exact":
        stats = [(m.clone().requires_grad_(), v.clone().requires_grad_()) for m, v in stats]

    # 2. the loss: every slab forward and backward, loss on the owned voxels only
    total = torch.zeros((), dtype=torch.float64, device=device)
    for tile in plan:
        out, own = run_chain(chain, piece(x, tile.read), tile, fixed)
        loss = loss_fn(region(out, own), piece(target, tile.own), reduction="sum") / count
        del out
        loss.backward()
        total += loss.detach()
        del loss

    # 3. backward through the statistics, last BatchNorm first
    if bn_backward == "exact":
        for k in reversed(range(len(norms))):
            mean, var = stats[k]
            g_mean, g_var = mean.grad, var.grad
            if g_mean is None:  # the loss does not depend on this layer's statistics
                continue
            for tile in plan:
                a, own = run_chain(chain, piece(x, tile.read), tile, fixed, stop_at_norm=k)
                own = region(a, own)
                shape = (1, -1) + (1,) * (own.dim() - 2)
                m = mean.detach().view(shape)
                surrogate = (g_mean.view(shape) * own + g_var.view(shape) * (own * own - 2 * m * own)).sum() / n_vox
                surrogate.backward()
                del a, own, surrogate
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


# --------------------------------------------------------------------------------------------
# Memory: the tiled step predicted under FakeTensorMode (seed 003 at N >= 700)
# --------------------------------------------------------------------------------------------
def _representative_indices(n: int, k: int, h: int) -> list[tuple[int, ...]]:
    """What ``representative`` picks for ``k`` slabs along an axis of ``n`` voxels with halo
    ``h`` -- first, last, and the interior slab that reads the most -- without building every
    tile."""
    if k <= 3:
        return [(i,) for i in range(k)]

    def read(i: int) -> int:
        return min(n, (i + 1) * n // k + h) - max(0, i * n // k - h)

    middle = max(range(1, k - 1), key=read)
    return [(0,), (middle,), (k - 1,)]


def representative(plan: Sequence[Tile]) -> list[Tile]:
    """The first, one middle and the last slab. Each border slab is its own case (zero padding
    on one side); every other slab reads owned + 2 x halo, or less where the border clips it,
    with owned sizes that differ by at most one voxel, and the middle slab picked has the
    larger. A slab's step frees everything it allocated before the next starts, so the step's
    peak is the largest of these three. The predictor runs only them; ``tests/test_tiling.py``
    checks that the peak equals the full plan's."""
    plan = list(plan)
    if len(plan) <= 3:
        return plan
    middle = max(plan[1:-1], key=lambda t: t.read_voxels)
    return [plan[0], middle, plan[-1]]


def _tiled_log_class():
    from .memory import MemoryLog

    class TiledLog(MemoryLog):
        """MemoryLog for a step that calls each layer once per slab. MemTracker keeps
        per-module statistics for one call per step and refuses a second; a slab's backward is
        over before the next slab's forward, so each forward call starts the module's
        statistics afresh. The global peak and breakdown are unaffected."""

        def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
            if not self._mod_tracker.is_bw:
                self.memory_tracking.pop(module, None)
            super()._pre_fw_hook(module, inputs)

    return TiledLog


def predict_tiled_step(
    build_model: Callable[[], nn.Module],
    n: int | Sequence[int],
    tiles: int | Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
    optimizer: str | None = None,
    stream: bool = False,
    all_tiles: bool = False,
    fake: bool = True,
):
    """Predict the memory of ``tiled_step`` on a volume of ``n`` voxels per side (or a shape),
    batch 1 and one channel, MSE against a target of the same shape: MemTracker (the course's
    ``MemoryLog``) under ``FakeTensorMode``, the method of ``memory.predict_step``.

    ``optimizer``: None (the seed's step: forward + backward) or "adam"/"sgd" in the steady
    state (its state created before the tracked step, then ``optimizer.step()`` inside it).
    ``stream``: the volume and target live outside the tracked device memory (host memory) and
    each slab's piece is copied in. ``all_tiles=False`` runs only ``representative`` slabs.
    ``fake=False`` runs the same step on real CPU tensors (the test that the prediction is
    right). Returns a ``memory.Prediction``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .memory import Prediction, _make_optimizer, default_dtype, prime_optimizer

    _TiledLog = _tiled_log_class()

    shape = (n,) * 3 if isinstance(n, int) else tuple(n)
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with default_dtype(dtype), mode:
        model = build_model()
        chain = conv_chain(model)
        x = torch.randn(1, chain.in_channels, *shape)
        target = torch.randn(1, 1, *shape)
        if all_tiles or not isinstance(tiles, int):
            plan = plan_tiles(shape, tiles, chain.halo)
            run = plan if all_tiles else representative(plan)
        else:  # a slab per depth slice makes thousands of tiles: build only the three needed
            only = [idx + (0,) * (len(shape) - 1)
                    for idx in _representative_indices(shape[0], tiles, chain.halo[0])]
            run = plan_tiles(shape, tiles, chain.halo, only=only)
        n_tiles = math.prod(_as_counts(tiles, len(shape), 0))
        opt = _make_optimizer(optimizer, model)
        if opt is not None:  # steady state: the optimizer's state exists before the step
            prime_optimizer(model, opt)
        log = _TiledLog(model, cuda=False, module_peaks=False)
        log.track_external(model, x, target, *([opt] if opt else []))
        with log:
            tiled_step(model, x, target, run, stream=stream)
            if opt is not None:
                opt.step()
    peak, breakdown = log.peak, log.breakdown("peak")
    if stream:
        # MemTracker sees the host volume's storage through the slab views cut from it, so it
        # is tracked (as "Other") but lives in host memory; it is constant through the step,
        # so removing it from the peak is exact.
        host = x.numel() * x.element_size() + target.numel() * target.element_size()
        peak -= host
        breakdown = dict(breakdown, Other=breakdown["Other"] - host, Total=breakdown["Total"] - host)
    how = "MemTracker under FakeTensorMode" if fake else "MemTracker on real CPU tensors"
    where = "volume streamed from host memory" if stream else "volume and target on the device"
    return Prediction(peak=peak, breakdown=breakdown, saved_peak=log.saved.peak,
                      after_forward=log.after_forward or {}, steady_state=opt is not None,
                      target="cpu", parameters=sum(p.numel() for p in model.parameters()), log=log,
                      method=f"{'predicted' if fake else 'measured'} ({how}), tiled step, "
                             f"{n_tiles} slabs, {where}")


def largest_tiled_n(budget_bytes: int, build_model: Callable[[], nn.Module] | None = None, *,
                    owned: int = 1, stream: bool = False, optimizer: str | None = None,
                    dtype: torch.dtype = torch.float32, start: int = 16, limit: int = 1 << 14) -> int:
    """The largest cube side N whose tiled step is predicted to fit ``budget_bytes``, with
    slabs that own ``owned`` voxels of depth each (1 = the thinnest slabs: least memory, most
    recomputation; see ``work_factor``). Seed 003's net by default."""
    from .memory import largest_that_fits

    build = build_model or _limit_net

    def fits(n: int) -> bool:
        tiles = max(1, -(-n // owned))
        return predict_tiled_step(build, n, tiles, stream=stream, optimizer=optimizer,
                                  dtype=dtype).peak <= budget_bytes

    return largest_that_fits(fits, start=start, limit=limit)


# --------------------------------------------------------------------------------------------
# Pictures
# --------------------------------------------------------------------------------------------
def draw_tiles(shape: Sequence[int], tiles: int | Sequence[int], halo: int | Sequence[int],
               ax=None, title: str | None = None, label: str = "slab"):
    """A 2D slice of the volume (rows: depth D, columns: height H) cut into slabs, each slab's
    owned voxels filled in its colour, the volume's border in black. What each slab reads
    (owned + halo, clipped at the border): for slabs along depth, a bar per slab beside the
    slice, solid where it owns and hatched over the halo it reads from its neighbours; for a
    grid of blocks, a dashed frame. ``label="rank"`` names the slabs as ranks."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.2), layout="constrained")
    plan = plan_tiles(shape, tiles, halo)
    colours = plt.get_cmap("tab10").colors
    depth_only = all(t.own[1] == slice(0, shape[1]) for t in plan)
    bar_w, gap = max(1.0, shape[1] / 12), max(1.0, shape[1] / 20)
    for k, tile in enumerate(plan):
        c = colours[k % len(colours)]
        (d0, d1), (h0, h1) = [(s.start, s.stop) for s in tile.own]
        (rd0, rd1), (rh0, rh1) = [(s.start, s.stop) for s in tile.read]
        ax.add_patch(Rectangle((h0, d0), h1 - h0, d1 - d0, color=c, alpha=0.4, lw=0))
        text = f"{label} {k}\nowns D {d0}-{d1 - 1}" + ("" if depth_only else f"\n  H {h0}-{h1 - 1}")
        text += f"\nreads D {rd0}-{rd1 - 1}" + ("" if depth_only else f"\n  H {rh0}-{rh1 - 1}")
        ax.text((h0 + h1) / 2, (d0 + d1) / 2, text, ha="center", va="center", fontsize=8)
        if depth_only:
            x = shape[1] + gap + k * (bar_w + gap / 2)
            ax.add_patch(Rectangle((x, d0), bar_w, d1 - d0, color=c, alpha=0.8, lw=0))
            for a, b in ((rd0, d0), (d1, rd1)):
                if b > a:
                    ax.add_patch(Rectangle((x, a), bar_w, b - a, fill=False, ec=c, hatch="////", lw=1))
            ax.text(x + bar_w / 2, rd1 + 0.3, str(k), ha="center", va="top", fontsize=7)
        else:
            inset = 0.12 * (k % 3)  # overlapping frames stay distinguishable
            ax.add_patch(Rectangle((rh0 + inset, rd0 + inset), rh1 - rh0 - 2 * inset,
                                   rd1 - rd0 - 2 * inset, fill=False, ec=c, ls="--", lw=1.6))
    ax.add_patch(Rectangle((0, 0), shape[1], shape[0], fill=False, ec="k", lw=2.2))
    pad = max(_as_halo(halo, 2)) + 1
    right = shape[1] + (gap + len(plan) * (bar_w + gap / 2) if depth_only else 0) + pad
    ax.set_xlim(-pad, right)
    ax.set_ylim(shape[0] + pad, -pad)
    ax.set_aspect("equal")
    ax.set_xlabel("H (voxels)" + (f"; beside the slice: what each {label} reads" if depth_only else ""))
    ax.set_ylabel("D (voxels)")
    read = (Patch(fill=False, hatch="////", ec="grey", label="halo read from the neighbours")
            if depth_only else Line2D([], [], color="grey", ls="--", label="read: owned + halo"))
    ax.legend(handles=[Patch(color="grey", alpha=0.4, label="owned: loss computed here"), read,
                       Line2D([], [], color="k", lw=2.2, label="volume border (zero padding)")],
              loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    ax.set_title(title or f"{len(plan)} {label}s, halo {halo}")
    return ax


def draw_shrinking(model: nn.Module, size: int = 16, tiles: int = 3, slab: int = 1, ax=None):
    """Along depth, for one slab of a ``tiles``-slab plan of a ``size``-voxel axis: the voxels
    each layer computes. The input is read with the whole halo; every convolution of radius r
    gives up r voxels on each side of a cut, so the output is exactly the owned voxels."""
    import matplotlib.pyplot as plt

    chain = conv_chain(model)
    nd = chain.spatial_dims
    shape = (size,) + (1,) * (nd - 1)
    halo = (chain.halo[0],) + (0,) * (nd - 1)
    plan = plan_tiles(shape, tiles, halo)
    tile = plan[slab]
    ranges = _needed_ranges(chain, tile)
    rows = [("input read", (tile.read[0].start, tile.read[0].stop))]
    rows += [(f"after conv {j + 1} ({type(c.module).__name__} '{c.name}', r={c.radius[0]})", k[0])
             for j, (c, _, _, _, k) in enumerate(ranges)]
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.55 * len(rows) + 1.2))
    o0, o1 = tile.own[0].start, tile.own[0].stop
    for y, (name, (a, b)) in enumerate(rows):
        ax.barh(y, b - a, left=a, color="tab:blue", alpha=0.3, edgecolor="tab:blue")
        ax.barh(y, o1 - o0, left=o0, color="tab:blue", alpha=0.6)
        ax.text(b + 0.2, y, f"{b - a} voxels", va="center", fontsize=8)
    for t in plan:
        ax.axvline(t.own[0].start, color="grey", ls=":", lw=1)
    ax.axvline(size, color="grey", ls=":", lw=1)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(-0.5, size + 3)
    ax.set_xlabel("D (voxels); dotted: slab boundaries; dark: the voxels this slab owns")
    ax.set_title(f"slab {slab} of {tiles}: computed voxels per layer (halo {chain.halo[0]} = sum of radii)")
    return ax


def seed003_table(budget_bytes: int, owned: Sequence[int] = (1, 4, 16), stream: bool = False):
    """Seed 003's net, tiled: for slabs owning ``owned`` depth voxels each, the largest N whose
    tiled step is predicted to fit ``budget_bytes``, and what its peak is made of."""
    import pandas as pd

    from .limit_test import input_bytes
    from .memory import mib

    rows = []
    chain = conv_chain(_limit_net())
    for o in owned:
        n = largest_tiled_n(budget_bytes, owned=o, stream=stream, start=256)
        tiles = -(-n // o)
        p = predict_tiled_step(_limit_net, n, tiles, stream=stream)
        volumes = 2 * input_bytes(n)
        row = {"slab owns (depth voxels)": o, "largest N": n, "slabs": tiles,
               "peak MiB (predicted)": round(mib(p.peak)),
               "one slab's step MiB": round(mib(p.peak - (0 if stream else volumes))),
               "conv work / untiled": round(work_factor(chain, plan_tiles((n,) * 3, tiles, chain.halo)), 2)}
        if stream:
            row["input + target in host memory GiB"] = round(volumes / 2**30, 1)
        else:
            row["input + target MiB"] = round(mib(volumes))
        rows.append(row)
    return pd.DataFrame(rows)


def _limit_net() -> nn.Module:
    from .limit_test import LimitTestNet

    return LimitTestNet()


def draw_memory_vs_n(budget_bytes: int, ns: Sequence[int] | None = None, ax=None,
                     marks: dict[str, int] | None = None):
    """Seed 003's step peak against N, predicted: untiled, tiled with the volume and target on
    the device (slabs owning 1 depth voxel), and tiled with the volume streamed from host
    memory; the input + target storage 2 x 4 N^3 bytes, the budget, and ``marks`` (label -> N)
    as vertical lines."""
    import matplotlib.pyplot as plt

    from .limit_test import input_bytes
    from .memory import mib, predict_step

    ns = list(ns or [64, 128, 256, 512, 1024, 2048, 4096, 8192])
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.2), layout="constrained")
    untiled = [predict_step(_limit_net, (1, 1, n, n, n), (1, 1, n, n, n), optimizer=None,
                            module_peaks=False).peak for n in ns]
    tiled = [predict_tiled_step(_limit_net, n, n).peak for n in ns]
    streamed = [predict_tiled_step(_limit_net, n, n, stream=True).peak for n in ns]
    ax.plot(ns, [mib(v) for v in untiled], "o-", label="untiled step (predicted)")
    ax.plot(ns, [mib(v) for v in tiled], "s-", label="tiled, volume + target on the device")
    ax.plot(ns, [mib(v) for v in streamed], "^-", label="tiled, volume streamed from host")
    ax.plot(ns, [mib(2 * input_bytes(n)) for n in ns], "k:", label="input + target storage, 8 N^3 B")
    ax.axhline(mib(budget_bytes), color="tab:red", lw=1)
    ax.text(ns[0], mib(budget_bytes) * 1.15, f"budget {budget_bytes / 2**30:.0f} GiB", color="tab:red", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N (volume N^3, batch 1, fp32)")
    ax.set_ylabel("step peak, MiB (MemTracker under FakeTensorMode)")
    for label, n in (marks or {}).items():
        ax.axvline(n, color="grey", ls="--", lw=0.8)
        ax.text(n, 0.02, f" {label}\n N = {n}", fontsize=8, va="bottom",
                transform=ax.get_xaxis_transform())
    ax.set_title("seed 003: slabs owning 1 depth voxel each")
    ax.legend(fontsize=8, loc="upper left")
    return ax


def measure_tiled_step(n: int, owned: int = 1, *, device: str | torch.device = "cuda",
                       stream: bool = False, budget_bytes: int | None = None) -> dict:
    """Run seed 003's tiled step on an N^3 volume for real and measure it: on CUDA with the
    allocator's peaks (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``, capped
    at ``budget_bytes`` with ``set_per_process_memory_fraction``; an out-of-memory error is
    caught and reported); on CPU only the time (no allocator statistics)."""
    import time

    from .memory import catch_oom, cuda_peak, mib

    device = torch.device(device)
    tiles = -(-n // owned)
    cuda = device.type == "cuda"
    row: dict[str, Any] = {"N": n, "slabs": tiles, "streamed": stream}
    if cuda and budget_bytes is not None:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)
    try:
        with catch_oom(verbose=False) as oom:
            torch.manual_seed(0)
            model = _limit_net().to(device)
            where = torch.device("cpu") if stream else device
            x = torch.randn(1, 1, n, n, n, device=where)
            target = torch.randn(1, 1, n, n, n, device=where)
            if stream and cuda:
                x, target = x.pin_memory(), target.pin_memory()
            t0 = time.perf_counter()
            if cuda:
                peak = cuda_peak(lambda: tiled_step(model, x, target, tiles, stream=stream), baseline=False)
                row.update({"peak allocated MiB": round(mib(peak.peak_allocated)),
                            "peak reserved MiB": round(mib(peak.peak_reserved))})
            else:
                tiled_step(model, x, target, tiles, stream=stream)
            row["step s"] = round(time.perf_counter() - t0, 2)
        row["fits"] = oom.ok
        if not oom.ok:
            row["error"] = oom.explanation.splitlines()[0]
    finally:
        if cuda and budget_bytes is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        if cuda:
            torch.cuda.empty_cache()
    return row


def measure_seed003_cuda(budget_bytes: int, margin_bytes: int = 256 * 2**20):
    """On a CUDA GPU capped at ``budget_bytes``: seed 003's tiled step at the predicted largest
    N, at the largest N with ``margin_bytes`` left for cuDNN's workspaces (which the prediction
    does not see), and streamed from pinned host memory (slabs owning 32 depth voxels) where
    this machine's host memory holds the volume twice over. One row each, with the prediction
    beside the measurement (``torch.cuda.max_memory_allocated``)."""
    import os

    import pandas as pd

    from .limit_test import input_bytes
    from .memory import mib, require_cuda

    require_cuda("measure_seed003_cuda")
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cases = [("volume on the device", largest_tiled_n(budget_bytes, start=256), 1, False),
             (f"on the device, {mib(margin_bytes):.0f} MiB margin",
              largest_tiled_n(budget_bytes - margin_bytes, start=256), 1, False),
             ("streamed from host", largest_tiled_n(budget_bytes, owned=32, stream=True, start=256), 32, True)]
    rows = []
    for label, n, owned, stream in cases:
        predicted = predict_tiled_step(_limit_net, n, -(-n // owned), stream=stream).peak
        if stream and 2 * 2 * input_bytes(n) > host:
            rows.append({"case": label, "N": n, "predicted MiB": round(mib(predicted)),
                         "fits": None, "error": f"skipped: needs {2 * 2 * input_bytes(n) / 2**30:.0f} GiB "
                         f"of host memory, this machine has {host / 2**30:.0f}"})
            continue
        row = measure_tiled_step(n, owned, stream=stream, budget_bytes=budget_bytes)
        rows.append({"case": label, "predicted MiB": round(mib(predicted)), **row})
    return pd.DataFrame(rows).fillna("")
