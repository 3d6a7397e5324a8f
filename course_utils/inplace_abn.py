"""In-Place Activated BatchNorm (Rota Bulo, Porzi, Kontschieder, CVPR 2018), in pure PyTorch.

Standard ``BatchNorm3d -> ReLU`` keeps two tensors per layer for backward: BN's input (the conv
output) and the activation's output. In-Place ABN overwrites the conv output with
``z = leaky_relu(BN(x))`` and keeps **only z**. Backward recovers what it needs by inverting:

* leaky ReLU: ``y = z`` where ``z >= 0``, else ``y = z / slope`` -- invertible only for
  ``slope > 0`` (ReLU maps every negative value to 0: the pre-activation is lost);
* the affine part of BN: ``x_hat = (y - beta) / gamma`` -- needs ``gamma != 0``.

From ``x_hat``, ``dy`` and the saved per-channel ``1/std`` the usual BN gradient follows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _channel_view(t: torch.Tensor, ndim: int) -> torch.Tensor:
    return t.view(1, -1, *([1] * (ndim - 2)))


class InPlaceABNFunction(torch.autograd.Function):
    """``z = leaky_relu(batch_norm(x), slope)`` written into ``x``; saves only ``z``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                training: bool, momentum: float, eps: float, slope: float) -> torch.Tensor:
        dims = [0, *range(2, x.dim())]
        count = x.numel() // x.shape[1]
        if training:
            var, mean = torch.var_mean(x, dim=dims, unbiased=False)
            if running_mean is not None:
                running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                running_var.mul_(1 - momentum).add_(var.detach() * count / (count - 1),
                                                    alpha=momentum)
        else:
            mean, var = running_mean, running_var
        invstd = torch.rsqrt(var + eps)
        scale = _channel_view(invstd * weight, x.dim())
        x.sub_(_channel_view(mean, x.dim())).mul_(scale).add_(_channel_view(bias, x.dim()))
        nn.functional.leaky_relu_(x, slope)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, weight, bias, invstd)
        ctx.training, ctx.slope = training, slope
        return x

    @staticmethod
    def backward(ctx: Any, dz: torch.Tensor):
        # Written for memory: each full-size temporary is reused in place, so that the saving in
        # stored activations is not spent again on temporaries at the backward peak.
        z, weight, bias, invstd = ctx.saved_tensors
        nd = z.dim()
        dims = [0, *range(2, nd)]
        # invert leaky ReLU: its inverse is a leaky ReLU with slope 1/slope (y and z share signs),
        # and dy = dz * slope where z < 0: one new tensor each, no boolean masks
        x_hat = nn.functional.leaky_relu(z, 1.0 / ctx.slope)
        dy = torch.ops.aten.leaky_relu_backward(dz, z, ctx.slope, False)
        # invert the affine part of BN: x_hat = (y - beta) / gamma
        x_hat.sub_(_channel_view(bias, nd)).div_(_channel_view(weight, nd))
        dbias = dy.sum(dims)
        dweight = (dy * x_hat).sum(dims)
        dx = dy  # reuse dy's memory for dx
        if ctx.training:
            m = z.numel() // z.shape[1]
            dx.sub_(_channel_view(dbias / m, nd))
            dx.sub_(x_hat.mul_(_channel_view(dweight / m, nd)))
        del x_hat
        dx.mul_(_channel_view(weight * invstd, nd))
        return dx, dweight, dbias, None, None, None, None, None, None


class InPlaceABN(nn.BatchNorm3d):
    """BatchNorm3d + LeakyReLU(slope) in one in-place op that stores only its output.

    A drop-in for ``[BatchNorm3d(c), LeakyReLU(slope)]`` with the same parameters, buffers and
    running-statistics update (cumulative averaging, ``momentum=None``, is not supported).
    Its input is overwritten: use it right after a layer whose output nothing else needs, such
    as a convolution.
    """

    def __init__(self, num_features: int, slope: float = 0.01, eps: float = 1e-5,
                 momentum: float = 0.1):
        if not slope > 0:
            raise ValueError(
                f"slope must be > 0, got {slope}: In-Place ABN inverts the activation in backward "
                "and ReLU (slope 0) is not invertible -- every negative input becomes 0. Use a "
                "leaky ReLU slope such as 0.01."
            )
        if momentum is None:
            raise ValueError("momentum=None (cumulative average) is not supported: give a float")
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
    """The reference In-Place ABN must match: BatchNorm3d followed by LeakyReLU."""
    return [nn.BatchNorm3d(channels), nn.LeakyReLU(slope)]
