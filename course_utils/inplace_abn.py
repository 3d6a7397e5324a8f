"""In-Place Activated BatchNorm (Rota Bulo, Porzi, Kontschieder, CVPR 2018), in pure PyTorch.

Standard ``BatchNorm3d -> ReLU`` keeps two tensors per layer for backward: BN's input (the conv
output) and the activation's output. In-Place ABN overwrites the conv output with
``z = leaky_relu(s * x_hat + beta)`` and keeps **only z**. Backward recovers what it needs by
inverting:

* leaky ReLU: ``y = z`` where ``z >= 0``, else ``y = z / slope`` -- invertible only for
  ``slope > 0`` (ReLU maps every negative value to 0: the pre-activation is lost);
* the affine part of BN: ``x_hat = (y - beta) / s`` -- needs ``s != 0``.

**The scale is ``s = |gamma| + eps``, as in the paper's code** (``mapillary/inplace_abn`` uses
``weight.abs() + eps`` in forward and backward). Plain BN's scale ``gamma`` can reach 0 (weight
decay pushes it there); then ``y = beta`` everywhere, ``x_hat`` cannot be recovered and the
division gives NaN gradients. ``|gamma| + eps`` is never below ``eps``. For ``gamma >= 0`` this
is BatchNorm with ``gamma + eps`` (a relative difference of ``eps / gamma``); for ``gamma < 0``
it is BatchNorm with ``|gamma|``, and the gradient of ``gamma`` carries the sign of ``gamma``.

**Reduced precision** (a conv under ``torch.autocast`` hands over fp16/bf16): like
``nn.BatchNorm``, the batch statistics, the running-statistics update and the per-channel
gradient sums are computed in fp32, the output stays in the input's dtype. The hazard is the
per-channel *sums* (of ``x`` and ``x**2`` for the statistics, of ``dy`` and ``dy * x_hat`` for
the gradients of beta and gamma): over seed 000's 2,496,000 values per channel a sum held in fp16
(largest value 65,504) overflows once the mean summand exceeds 65,504 / 2,496,000 = 0.026 (the
sum of squares of unit-variance activations is about 2.5 million). ``channel_sums_fp16`` shows it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .checks import TechniqueError, guard
from .memory import saved_tensors

#: at most this many channel groups are converted to fp32 at once for the statistics of an
#: fp16/bf16 input: the transient fp32 copy is 1/8 of the input's elements, not all of them
_STAT_CHUNKS = 8


def _channel_view(t: torch.Tensor, ndim: int) -> torch.Tensor:
    return t.view(1, -1, *([1] * (ndim - 2)))


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics and gradient sums are accumulated in: fp64 stays fp64, every other
    floating dtype (fp32, fp16, bf16) uses fp32 -- what ``nn.BatchNorm`` does under autocast."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def channel_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel biased variance and mean of ``x`` (channels in dim 1), in the accumulation
    dtype. A reduced-precision input is converted a group of channels at a time."""
    dims = [0, *range(2, x.dim())]
    acc = accumulation_dtype(x.dtype)
    if x.dtype == acc:
        return torch.var_mean(x, dim=dims, correction=0)
    step = max(1, math.ceil(x.shape[1] / _STAT_CHUNKS))
    parts = [torch.var_mean(x[:, c:c + step].to(acc), dim=dims, correction=0)
             for c in range(0, x.shape[1], step)]
    return torch.cat([v for v, _ in parts]), torch.cat([m for _, m in parts])


def check_abn_args(slope: float, eps: float, momentum: float | None) -> None:
    """Raise a ValueError that names the fix for arguments In-Place ABN cannot work with."""
    if not (isinstance(slope, (int, float)) and math.isfinite(slope) and slope > 0):
        raise ValueError(
            f"slope must be a finite number > 0, got {slope!r}: In-Place ABN inverts the "
            "activation in backward and ReLU (slope 0) is not invertible -- every negative input "
            "becomes 0 (a negative slope is not invertible either: signs are lost). Use a leaky "
            "ReLU slope such as 0.01."
        )
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(
            f"eps must be a finite number > 0, got {eps!r}: it keeps 1/sqrt(var + eps) finite "
            "and the scale |gamma| + eps away from 0, which backward divides by. Use e.g. 1e-5."
        )
    if momentum is None:
        raise ValueError("momentum=None (cumulative average) is not supported: give a float "
                         "in [0, 1] such as 0.1")
    if not (isinstance(momentum, (int, float)) and 0 <= momentum <= 1):
        raise ValueError(f"momentum must be a number in [0, 1], got {momentum!r} (e.g. 0.1)")


class InPlaceABNFunction(torch.autograd.Function):
    """``z = leaky_relu(batch_norm(x, scale=|weight| + eps), slope)`` written into ``x``;
    saves only ``z`` (plus per-channel vectors: the scale, ``bias`` and ``1/std``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                training: bool, momentum: float, eps: float, slope: float) -> torch.Tensor:
        check_abn_args(slope, eps, momentum)
        nd = x.dim()
        acc = accumulation_dtype(x.dtype)
        if training:
            count = x.numel() // x.shape[1]
            if count < 2:
                raise ValueError(
                    f"In-Place ABN in training needs more than 1 value per channel, got input "
                    f"shape {tuple(x.shape)}. Use a larger batch or volume, or eval() mode.")
            var, mean = channel_stats(x)
            if running_mean is not None:
                with torch.no_grad():
                    unbiased = var * (count / (count - 1))
                    running_mean.copy_(running_mean.to(acc) * (1 - momentum) + mean * momentum)
                    running_var.copy_(running_var.to(acc) * (1 - momentum) + unbiased * momentum)
        else:
            if running_mean is None or running_var is None:
                raise ValueError("eval mode needs running_mean and running_var")
            mean, var = running_mean.to(acc), running_var.to(acc)
        invstd = torch.rsqrt(var + eps)
        scale = weight.detach().to(acc).abs() + eps  # the paper's |gamma| + eps: never 0
        with torch.no_grad():
            x.sub_(_channel_view(mean, nd)).mul_(_channel_view(scale * invstd, nd))
            x.add_(_channel_view(bias.detach().to(acc), nd))
            nn.functional.leaky_relu_(x, slope)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, scale, bias, invstd)
        ctx.training, ctx.slope = training, slope
        ctx.weight_sign = torch.where(weight.detach() < 0, -1.0, 1.0).to(acc)  # d|w|/dw
        return x

    @staticmethod
    def backward(ctx: Any, dz: torch.Tensor):
        # Written for memory: each full-size temporary is reused in place, so that the saving in
        # stored activations is not spent again on temporaries at the backward peak. Per-channel
        # sums are accumulated in fp32 (fp64 for fp64) whatever the activations' dtype.
        z, scale, bias, invstd = ctx.saved_tensors
        nd = z.dim()
        dims = [0, *range(2, nd)]
        acc = accumulation_dtype(z.dtype)
        # invert leaky ReLU: its inverse is a leaky ReLU with slope 1/slope (y and z share signs),
        # and dy = dz * slope where z < 0: one new tensor each, no boolean masks
        x_hat = nn.functional.leaky_relu(z, 1.0 / ctx.slope)
        dy = torch.ops.aten.leaky_relu_backward(dz, z, ctx.slope, False)
        # invert the affine part: x_hat = (y - beta) / scale, scale = |gamma| + eps > 0
        x_hat.sub_(_channel_view(bias.detach().to(acc), nd)).div_(_channel_view(scale, nd))
        dbias = dy.sum(dims, dtype=acc)
        dscale = (dy * x_hat).sum(dims, dtype=acc)
        dx = dy  # reuse dy's memory for dx
        if ctx.training:
            m = z.numel() // z.shape[1]
            dx.sub_(_channel_view(dbias / m, nd))
            dx.sub_(x_hat.mul_(_channel_view(dscale / m, nd)))
        del x_hat
        dx.mul_(_channel_view(scale * invstd, nd))
        dweight = (dscale * ctx.weight_sign).to(scale.dtype)
        return dx, dweight, dbias.to(bias.dtype), None, None, None, None, None, None


class InPlaceABN(nn.BatchNorm3d):
    """BatchNorm3d + LeakyReLU(slope) in one in-place op that stores only its output.

    The same parameters, buffers and running-statistics update as ``[BatchNorm3d(c),
    LeakyReLU(slope)]``, with one difference taken from the paper's code: the scale is
    ``|weight| + eps`` (never 0, so always invertible). Cumulative averaging (``momentum=None``)
    is not supported. Its input is overwritten: use it right after a layer whose output nothing
    else needs, such as a convolution. Works on inputs of any rank >= 2 (channels in dim 1).
    """

    def __init__(self, num_features: int, slope: float = 0.01, eps: float = 1e-5,
                 momentum: float = 0.1):
        check_abn_args(slope, eps, momentum)
        super().__init__(num_features, eps=eps, momentum=momentum)
        self.slope = float(slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[1] != self.num_features:
            raise ValueError(f"expected input with {self.num_features} channels in dim 1, got "
                             f"shape {tuple(x.shape)}")
        if self.training and x.numel() // x.shape[1] < 2:
            raise ValueError(
                f"In-Place ABN in training needs more than 1 value per channel, got input shape "
                f"{tuple(x.shape)}: the batch variance of a single voxel is undefined. Use a "
                "larger batch or volume, or eval() mode."
            )
        if self.training and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        return InPlaceABNFunction.apply(
            x, self.weight, self.bias, self.running_mean, self.running_var, self.training,
            self.momentum, self.eps, self.slope,
        )

    def extra_repr(self) -> str:
        return super().extra_repr() + f", slope={self.slope}"


def inplace_abn(channels: int, slope: float = 0.01) -> list[nn.Module]:
    """``norm_act`` factory for ``UNet3D``/``DoubleConv``: one In-Place ABN per conv."""
    return [InPlaceABN(channels, slope=slope)]


def bn_leaky_relu(channels: int, slope: float = 0.01) -> list[nn.Module]:
    """The pair In-Place ABN replaces: BatchNorm3d followed by LeakyReLU (``inplace=False``: the
    LeakyReLU saves its *input*, BN's output, so a unit stores three layer-sized tensors)."""
    return [nn.BatchNorm3d(channels), nn.LeakyReLU(slope)]


def bn_leaky_relu_inplace(channels: int, slope: float = 0.01) -> list[nn.Module]:
    """BatchNorm3d followed by ``LeakyReLU(inplace=True)``: the activation overwrites BN's output
    and saves its *result* (for slope > 0 the result's sign says where the input was negative),
    so a unit stores two layer-sized tensors, like BN + ReLU -- the fair baseline of In-Place ABN."""
    return [nn.BatchNorm3d(channels), nn.LeakyReLU(slope, inplace=True)]


def compare_with_reference(slope: float = 0.02, eps: float = 1e-3, momentum: float = 0.3,
                           channels: int = 8, seed: int = 1):
    """``InPlaceABN(channels, slope, eps, momentum)`` against PyTorch's own ops on one random
    (2, channels, 6, 6, 6) batch in training mode: ``F.batch_norm`` with the scale |gamma| + eps,
    then ``F.leaky_relu``. Returns a DataFrame (``compared``, ``max abs difference``): the output,
    the gradients of the input, gamma and beta, the running variance; and, last, the output
    against plain ``BatchNorm3d`` + ``LeakyReLU`` at their default eps (1e-5) for gamma > 0 (the
    difference is the eps added to the scale). Measured on CPU tensors, fp32."""
    import pandas as pd

    torch.manual_seed(seed)
    abn = InPlaceABN(channels, slope=slope, eps=eps, momentum=momentum)
    x = torch.randn(2, channels, 6, 6, 6)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    w, b = abn.weight.detach().clone().requires_grad_(), abn.bias.detach().clone().requires_grad_()
    rm, rv = abn.running_mean.clone(), abn.running_var.clone()
    ref = nn.functional.leaky_relu(nn.functional.batch_norm(x1, rm, rv, w.abs() + eps, b, True, momentum, eps), slope)
    out = abn(x2 * 1)  # * 1: a non-leaf, like a conv output
    g = torch.randn_like(out)
    ref.backward(g)
    out.backward(g)
    diff = {"output": out - ref, "d input": x2.grad - x1.grad, "d gamma": abn.weight.grad - w.grad,
            "d beta": abn.bias.grad - b.grad, "running var": abn.running_var - rv}
    bn, act = bn_leaky_relu(channels, slope=slope)
    diff["output vs plain BatchNorm3d + LeakyReLU (eps = 1e-5)"] = act(bn(x.clone())) - InPlaceABN(channels, slope=slope)(x.clone())
    return pd.DataFrame([{"compared": k, "max abs difference": v.abs().max().item()} for k, v in diff.items()])


def channel_sums_fp16(x: torch.Tensor, dz: torch.Tensor | None = None):
    """The per-channel sums a BatchNorm (and In-Place ABN) forward and backward need -- of ``x``
    and ``x**2`` (the statistics) and of ``dz`` (the gradient of beta; default all ones) -- each
    held in fp16 (``sum(..., dtype=float16)``) and in fp32 (the course's accumulation). Channels
    in dim 1. Returns a pandas DataFrame, one row per sum and channel (method: computed)."""
    import pandas as pd

    dims = [0, *range(2, x.dim())]
    dz = torch.ones_like(x) if dz is None else dz
    terms = {"sum of x": x, "sum of x**2": x * x, "sum of dz (gradient of beta)": dz}
    rows = []
    for name, t in terms.items():
        s16 = t.sum(dims, dtype=torch.float16)
        s32 = t.sum(dims, dtype=torch.float32)
        for c in range(x.shape[1]):
            rows.append({"sum": name, "channel": c, "held in fp16": float(s16[c]),
                         "fp32 accumulation": float(s32[c])})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# What is stored, and who made it (notebook 06)
# --------------------------------------------------------------------------------------------
#: readable names of the ops that produce stored tensors
PRODUCER_NAMES = {
    "convolution": "conv outputs",
    "native_batch_norm": "BN outputs",
    "_native_batch_norm_legit": "BN outputs",
    "_native_batch_norm_legit_no_training": "BN outputs",
    "relu": "ReLU outputs",
    "leaky_relu": "LeakyReLU outputs",
    "cat": "concatenations (U-Net skips + upsampled)",
    "max_pool3d_with_indices": "max-pool outputs + indices",
    "max_pool2d_with_indices": "max-pool outputs + indices",
    "upsample_trilinear3d": "upsampled maps",
    "constant_pad_nd": "padded maps",
    "_log_softmax": "loss (log-softmax)",
    "input": "the input",
    "target": "the target (class indices)",
}


def saved_by_producer(model: nn.Module, x: torch.Tensor, target: torch.Tensor | None = None,
                      loss_fn=nn.functional.cross_entropy):
    """Saved-for-backward bytes of one forward (+ loss), grouped by the op that **produced**
    each stored tensor (a conv output that In-Place ABN overwrote is still a conv output).
    Each storage is counted once; parameters are left out. Returns a pandas DataFrame with
    columns ``stored tensor``, ``MiB``, ``share %``, ``bytes`` (method: saved-tensor graph walk).

    How: a ``TorchDispatchMode`` records which op created each storage (in-place ops and views
    keep the creator), then ``memory.saved_tensors`` walks the autograd graph."""
    import pandas as pd
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class _Producers(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.owner: dict[int, str] = {}
            self.keep: list[torch.Tensor] = []  # alive until the walk: no storage address reuse

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    key = t.untyped_storage()._cdata
                    if key not in self.owner:
                        self.owner[key] = name
                        self.keep.append(t)
            return out

    x = x.detach()
    with _Producers() as rec:
        rec.owner[x.untyped_storage()._cdata] = "input"
        if target is not None:
            rec.owner[target.untyped_storage()._cdata] = "target"
        out = model(x)
        loss = loss_fn(out, target) if target is not None else out.sum()
    seen: dict[int, tuple[str, int]] = {}
    for s in saved_tensors(loss, model.parameters()):
        if not s.is_param and s.storage not in seen:
            seen[s.storage] = (rec.owner.get(s.storage, "other"), s.nbytes)
    total = sum(nbytes for _, nbytes in seen.values())
    raw: dict[str, int] = {}
    for op, nbytes in seen.values():
        label = PRODUCER_NAMES.get(op, op)
        raw[label] = raw.get(label, 0) + nbytes
    groups: dict[str, int] = {}
    for label, nbytes in raw.items():  # tiny groups: BN's per-channel mean/invstd, scalars
        if nbytes < 0.001 * total:
            label = "other (per-channel statistics, scalars)"
        groups[label] = groups.get(label, 0) + nbytes
    df = pd.DataFrame([{"stored tensor": k, "MiB": v / 2**20, "share %": 100 * v / total,
                        "bytes": v} for k, v in sorted(groups.items(), key=lambda kv: -kv[1])])
    df.attrs["total_bytes"] = total
    return df.round({"MiB": 3, "share %": 1})


def stored_per_unit(norm_act, channels: int = 4, units: int = 4, size: int = 8) -> dict[str, float]:
    """For a stack of ``units`` x (Conv3d -> ``norm_act``) followed by one more Conv3d (so that
    the last unit's output is stored too, as inside a network), the stored tensors per unit, in
    layer-sized tensors, by producing op (``saved_by_producer``); the stack's input and the
    per-channel statistics are left out. E.g. BN + ReLU: 1 conv output + 1 ReLU output."""
    layers: list[nn.Module] = []
    for _ in range(units):
        layers += [nn.Conv3d(channels, channels, 3, padding=1), *norm_act(channels)]
    net = nn.Sequential(*layers, nn.Conv3d(channels, channels, 3, padding=1))
    x = torch.randn(2, channels, size, size, size)
    df = saved_by_producer(net, x)
    layer_bytes = x.numel() * x.element_size()
    per_unit = {r["stored tensor"]: r["bytes"] / layer_bytes / units
                for _, r in df.iterrows() if r["stored tensor"] != "the input"}
    return {k: round(v, 2) for k, v in per_unit.items() if v >= 0.05}


def plot_stored_per_unit(variants: dict[str, object], ax=None):
    """Stacked horizontal bars: layer-sized tensors stored per conv unit for each norm +
    activation variant (``stored_per_unit``), coloured by the op that produced them."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.6 + 0.55 * len(variants)))
    data = {name: stored_per_unit(na) for name, na in variants.items()}
    kinds = sorted({k for d in data.values() for k in d})
    colours = dict(zip(kinds, plt.cm.tab10.colors, strict=False))  # tab10 has more colours than kinds
    names = list(data)[::-1]
    for i, name in enumerate(names):
        left = 0.0
        for k in kinds:
            v = data[name].get(k, 0.0)
            if v:
                ax.barh(i, v, left=left, color=colours[k], edgecolor="white",
                        label=k)  # the legend below keeps one entry per kind
                ax.text(left + v / 2, i, f"{v:.2g}", ha="center", va="center", fontsize=8)
                left += v
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("layer-sized tensors stored for backward, per conv unit (measured: graph walk)")
    handles = {lbl: h for h, lbl in zip(*ax.get_legend_handles_labels(), strict=True)}
    ax.legend(handles.values(), handles.keys(), fontsize=8, loc="lower right")
    ax.set_xlim(0, max(sum(d.values()) for d in data.values()) * 1.45)
    return data


guard(globals(), TechniqueError, positive=("eps",))  # slope 0: check_abn_args says why
