"""Arithmetic that several modules share, in one place.

* ``relative_error`` -- how far one list of tensors (gradients, outputs) is from a reference,
  computed in float64: every comparison of the tiled, spatial and parallel steps uses it.
* BatchNorm done by hand, for the code that computes the statistics itself (the tiled step in
  ``tiling``, spatial parallelism in ``spatial``, ``parallel.CrossReplicaBatchNorm3d``):
  ``uses_batch_stats`` (does the layer normalise with the batch's statistics?), ``normalise``
  (with given statistics, then the affine map) and ``update_running_stats`` (the running mean and
  variance, as ``nn.BatchNorm`` updates them in training mode).
* ``combine_moments`` -- the statistics of the whole from each part's (count, mean, M2), Chan et
  al.'s combination: ``parallel.CrossReplicaBatchNorm3d`` and ``densenet_spatial.GlobalBatchNorm``
  combine their ranks' statistics with it.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from .checks import ParallelError, guard


def relative_error(got: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> float:
    """Largest difference between two lists of tensors, relative to the largest reference value.
    (Per-tensor ratios would blow up on conv biases in front of BatchNorm, whose true gradient is
    zero and whose computed one is rounding noise.) Computed in float64, on the CPU: tensors of
    any dtype and device compare, and a half-precision difference cannot overflow. An all-zero
    reference gives 0 where the tensors are equal and inf where they are not."""
    got, ref = list(got), list(ref)
    if len(got) != len(ref) or not ref:
        raise ParallelError(f"relative_error: {len(got)} tensors vs {len(ref)} reference tensors.",
                            "pass the same number of tensors, at least one (e.g. grads_of(model), grads_of(ref)).")
    diff = max((a.detach().cpu().double() - b.detach().cpu().double()).abs().max().item()
               for a, b in zip(got, ref, strict=True))
    scale = max(b.detach().abs().max().item() for b in ref)
    return diff / scale if scale else (0.0 if diff == 0 else math.inf)


def uses_batch_stats(bn: nn.Module) -> bool:
    """True if the BatchNorm layer normalises with the batch's statistics (training mode, or no
    running statistics to use)."""
    return bn.training or bn.running_mean is None


def normalise(bn: nn.Module, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """BatchNorm's output for ``x`` (batch, channels, ...) with the given per-channel ``mean`` and
    (biased) ``var``: ``(x - mean) / sqrt(var + eps)``, then the layer's affine map if it has one."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + bn.eps)
    if bn.affine:
        y = y * bn.weight.view(shape) + bn.bias.view(shape)
    return y


def combine_moments(counts: torch.Tensor, means: torch.Tensor,
                    m2s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The count, mean and biased variance of a whole from its parts' statistics, one part a row:
    ``counts`` (parts, 1), ``means`` and ``m2s`` (parts, channels), ``M2`` being a part's sum of
    squared deviations from its own mean. Chan, Golub and LeVeque's combination (1979):
    ``M2 = sum_r M2_r + n_r (mean_r - mean)^2``. Every term is a squared deviation, so nothing
    cancels; the sums of ``x`` and ``x^2`` (``E[x^2] - E[x]^2``) lose the digits that the mean
    shares with ``x^2`` when the mean is large against the spread. Returns ``(n, mean, var)``,
    ``n`` a 0-d tensor (it stays a tensor: under fake tensors its value cannot be read)."""
    n = counts.sum()
    mean = (counts * means).sum(0) / n
    var = (m2s + counts * (means - mean).square()).sum(0) / n
    return n, mean, var


def update_running_stats(bn: nn.Module, mean: torch.Tensor, var: torch.Tensor, count: int) -> None:
    """What ``nn.BatchNorm`` does to its running statistics in training mode, given the batch's
    per-channel ``mean`` and biased ``var`` over ``count`` values per channel: one more batch
    tracked, then a momentum average (cumulative when ``momentum`` is None) of the mean and of the
    unbiased variance ``var * count / (count - 1)``. Nothing happens outside training mode or
    without running statistics."""
    if count < 1:
        raise ParallelError(f"update_running_stats: count={count}: the statistics of no values.",
                            "pass the number of values per channel the mean and var were taken over (>= 1).")
    if not (bn.training and bn.track_running_stats and bn.running_mean is not None):
        return
    with torch.no_grad():
        bn.num_batches_tracked.add_(1)
        f = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
        bn.running_mean.mul_(1 - f).add_(mean.detach().to(bn.running_mean.dtype), alpha=f)
        unbiased = var.detach() * count / max(count - 1, 1)
        bn.running_var.mul_(1 - f).add_(unbiased.to(bn.running_var.dtype), alpha=f)


guard(globals(), ParallelError)
