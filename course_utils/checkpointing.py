"""Gradient checkpointing: recompute activations in backward instead of storing them.

PyTorch's ``torch.utils.checkpoint`` does the work; this module adds what a U-Net needs:

* ``frozen_bn_stats`` -- recomputation runs BatchNorm's forward a second time, in training mode,
  so its running statistics would be updated twice per step. Non-reentrant checkpointing takes a
  ``context_fn`` whose second context wraps the recomputation: we freeze the statistics there.
* ``save_convolutions`` -- a selective-checkpointing policy: keep convolution outputs (expensive
  to recompute), recompute BatchNorm, activations and the rest (cheap).
* ``checkpoint_context`` -- builds the ``context_fn`` from both.
* ``deep_stack`` / ``run_sequential`` -- a plain deep conv stack for the sqrt(n) experiment with
  ``checkpoint_sequential``.
* ``DenseBlock`` -- seed 004's DenseNet block, naive and memory-efficient (checkpointed
  concatenation + bottleneck, Pleiss et al. 2017).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

_CONV_OPS = {torch.ops.aten.convolution.default, torch.ops.aten.cudnn_convolution.default}


@contextlib.contextmanager
def frozen_bn_stats(module: nn.Module) -> Iterator[None]:
    """Inside, every BatchNorm in ``module`` normalises with batch statistics as usual but
    leaves its running mean/var and batch counter exactly as they were (momentum 0)."""
    bns = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m.momentum, None if m.num_batches_tracked is None else m.num_batches_tracked.clone())
             for m in bns]
    for m in bns:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, (momentum, count) in zip(bns, saved):
            m.momentum = momentum
            if count is not None:
                m.num_batches_tracked.copy_(count)


def save_convolutions(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Selective-checkpointing policy: store convolution outputs, recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if op in _CONV_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def checkpoint_context(module: nn.Module, policy: Callable | None = None,
                       fix_bn: bool = True) -> Callable[[], tuple]:
    """The ``context_fn`` for ``checkpoint(..., use_reentrant=False)``: an optional selective
    policy, and BN statistics frozen during recomputation (``fix_bn``)."""

    def context_fn():
        fwd, rec = (create_selective_checkpoint_contexts(policy) if policy
                    else (contextlib.nullcontext(), contextlib.nullcontext()))
        if not fix_bn:
            return fwd, rec
        stack = contextlib.ExitStack()

        class _Recompute:
            def __enter__(self):
                # freeze first: its bookkeeping ops must run outside the selective policy's
                # dispatch mode, which expects exactly the ops of the forward pass
                stack.enter_context(frozen_bn_stats(module))
                stack.enter_context(rec)

            def __exit__(self, *exc):
                return stack.__exit__(*exc)

        return fwd, _Recompute()

    return context_fn


def checkpointed(block: nn.Module, *args: torch.Tensor, policy: Callable | None = None,
                 fix_bn: bool = True) -> torch.Tensor:
    """``block(*args)`` with its activations recomputed in backward (non-reentrant)."""
    return checkpoint(block, *args, use_reentrant=False,
                      context_fn=checkpoint_context(block, policy, fix_bn))


# --------------------------------------------------------------------------------------------
# sqrt(n): a deep plain stack and checkpoint_sequential
# --------------------------------------------------------------------------------------------
def deep_stack(n_layers: int, channels: int = 16, dims: int = 3) -> nn.Sequential:
    """``n_layers`` x (conv 3x3(x3) -> BN -> ReLU) at constant width: every layer's activations
    are the same size, the setting of Chen et al. (2016)."""
    conv, bn = (nn.Conv3d, nn.BatchNorm3d) if dims == 3 else (nn.Conv2d, nn.BatchNorm2d)
    layers: list[nn.Module] = []
    for _ in range(n_layers):
        layers.append(nn.Sequential(conv(channels, channels, 3, padding=1, bias=False),
                                    bn(channels), nn.ReLU(inplace=True)))
    return nn.Sequential(*layers)


class SegmentedStack(nn.Module):
    """Runs a ``deep_stack`` with ``checkpoint_sequential`` in ``segments`` segments
    (0 = no checkpointing). The input layer lifts 1 channel to the stack's width."""

    def __init__(self, stack: nn.Sequential, segments: int = 0, in_channels: int = 1):
        super().__init__()
        width = stack[0][0].in_channels
        conv = type(stack[0][0])
        self.lift = conv(in_channels, width, 1)
        self.stack, self.segments = stack, segments
        self.head = conv(width, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lift(x)
        if self.segments and torch.is_grad_enabled():
            x = checkpoint_sequential(self.stack, self.segments, x, use_reentrant=False)
        else:
            x = self.stack(x)
        return self.head(x)


# --------------------------------------------------------------------------------------------
# seed 004: a DenseNet block, naive and memory-efficient
# --------------------------------------------------------------------------------------------
class DenseLayer(nn.Module):
    """BN -> ReLU -> Conv1x1 (bottleneck, 4 x growth) -> BN -> ReLU -> Conv3x3 (growth),
    on the concatenation of all earlier feature maps (2D, as for X-rays)."""

    def __init__(self, in_channels: int, growth: int, efficient: bool):
        super().__init__()
        self.bottleneck = nn.Sequential(
            nn.BatchNorm2d(in_channels), nn.ReLU(inplace=False),
            nn.Conv2d(in_channels, 4 * growth, 1, bias=False))
        self.conv = nn.Sequential(
            nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True),
            nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))
        self.efficient = efficient

    def _concat_bottleneck(self, *features: torch.Tensor) -> torch.Tensor:
        return self.bottleneck(torch.cat(features, 1))

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        if self.efficient and torch.is_grad_enabled():
            # the concatenation and the BN/ReLU on it are the quadratic part: recompute them
            out = checkpoint(self._concat_bottleneck, *features, use_reentrant=False,
                             context_fn=checkpoint_context(self.bottleneck))
        else:
            out = self._concat_bottleneck(*features)
        return self.conv(out)


class DenseBlock(nn.Module):
    """``n_layers`` DenseLayers; each sees every earlier output. ``efficient=True`` stores no
    concatenation: memory grows linearly instead of quadratically with depth."""

    def __init__(self, n_layers: int = 6, in_channels: int = 64, growth: int = 32,
                 efficient: bool = False, n_classes: int = 5):
        super().__init__()
        self.layers = nn.ModuleList(
            DenseLayer(in_channels + i * growth, growth, efficient) for i in range(n_layers))
        self.stem = nn.Conv2d(1, in_channels, 3, padding=1, bias=False)
        self.head = nn.Conv2d(in_channels + n_layers * growth, n_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [self.stem(x)]
        for layer in self.layers:
            features.append(layer(features))
        return self.head(torch.cat(features, 1))
