"""The model side of tiling: which models can be tiled, and the halo they need.

``conv_chain(model)`` walks the model's modules (``nn.Sequential`` chains of stride-1 "same"
convolutions, point-wise activations and BatchNorm) and *derives* the halo per spatial axis: the
sum of the convolutions' radii ``dilation * (k - 1) // 2``. Anything whose receptive field cannot
be read off the modules (pooling, upsampling, a module with its own ``forward``, whole-volume
normalisations, dropout in training mode) is refused with a ``TilingError`` that says why and
what to do. ``probe_halo(model)`` measures the same halo independently, from the support of one
output voxel's input gradient.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from ..checks import TilingError, guard
from ..numerics import uses_batch_stats


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


@dataclass(frozen=True)
class Layer:
    """One layer of a ``ConvChain``: its path in the model, the module, its kind, and the halo it
    needs on each spatial axis, in voxels (a convolution's radius; none for the other kinds)."""

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
        raise TilingError(f"the model mixes convolutions of {sorted(dims)} spatial dims.",
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
        raise TilingError("probe_halo needs a model with a convolution (to know the input's channels and dims).",
                          "give it the convolutional part of the network.")
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
                          f"{20 * trials} random trials (dead activations?): nothing to probe.",
                          "probe a freshly initialised model, or pass the halo to plan_tiles yourself (halo=).")
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


guard(globals(), TilingError)
