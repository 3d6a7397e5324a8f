"""cuDNN's convolution workspaces, added to a prediction at the op that takes them.

A fake-tensor prediction sees every op's outputs and never the scratch memory a kernel takes while
it runs. On a GPU that scratch memory, a cuDNN convolution's *workspace*, is allocated through the
caching allocator and given back before the op returns, so it counts in ``max_memory_allocated``.
The H200 run's diagnosis (docs/gpu-runs/2026-11-27-nvidia-h200, ``diagnose/*``: every op of a
step between two readings of the allocator, ``OpTransients``) found what it follows. For every 3D
convolution of seed 000's U-Nets whose operands are large enough to move a peak, cuDNN took
about the bytes of its two activation operands, 0.5 to 1.05 times:

* forward (``convolution``): input + output;
* backward (``convolution_backward``): input + output gradient.

These are the copies cuDNN makes of them in the channels-last layout its kernels read (NDHWC; a
PyTorch tensor is NCDHW). ``gpu_kit.workspace_check`` checks this op by op against a run's
recording and every recorded peak against the model.

**The model.** ``WorkspaceRule``: workspace(op) = ``forward`` x ``conv_operands`` for a
convolution, ``backward`` x ``conv_operands`` for its backward, 0 for any other op. The prediction
op by op (``op_memory_step`` on fake tensors under CUDA's rules, read by a ``LiveBytes`` meter)
gives each op's live bytes before it and its new outputs; the peak with workspaces is

    max(plain peak, max over ops of before + new outputs + workspace(op))

``TRANSPOSED_COPIES`` (1.0, 1.0) is the rule; ``NO_WORKSPACE`` (0, 0) is the plain prediction,
its lower bound. Where a GPU's recording exists, ``gpu_kit.workspace_check`` fits the factors
from it (the median ratio over the convolutions that could move a peak); elsewhere the rule is
an assumption, and the two bounds say how far the answer moves if it is wrong.

What the rule does not hold: small convolutions take a fixed part besides (up to ~34 MiB on the
H200: weight copies, kernel descriptors), a convolution with one input channel or a 1x1x1 kernel
may take none, and cuDNN may choose another algorithm at another size (seed 003's net: 12 input
volumes at N = 128, 6-7 at N = 256 and 384 on the H200). Each is a measured miss, stated where
its figure is shown.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..amp_rules import autocast_rules
from ..checks import MeasureError, guard
from .predict import cuda_dropout
from .transients import OpMemory, op_memory_step
from .units import MiB

#: the ops a rule adds a workspace at: op name -> the rule's field
CONV_OPS = {"convolution": "forward", "convolution_backward": "backward"}


@dataclass(frozen=True)
class WorkspaceRule:
    """workspace(op) = ``forward`` (or ``backward``) x the op's ``conv_operands``; for an fp32
    convolution ``forward_fp32`` / ``backward_fp32`` where given (cuDNN's fp32 and 16-bit kernels
    are other kernels)."""

    forward: float
    backward: float
    source: str  # where the factors come from: a GPU run's recording, or an assumption
    forward_fp32: float | None = None
    backward_fp32: float | None = None

    def factor(self, family: str, itemsize: int) -> float:
        """The factor for ``family`` ("forward" or "backward") at ``itemsize`` bytes per element."""
        fp32 = getattr(self, f"{family}_fp32") if itemsize == 4 else None
        return fp32 if fp32 is not None else getattr(self, family)

    def bytes(self, row: OpMemory) -> int:
        """The workspace this rule gives ``row``'s op (0 for an op that is no convolution)."""
        family = CONV_OPS.get(row.op)
        return round(self.factor(family, row.conv_itemsize) * row.conv_operands) if family else 0


TRANSPOSED_COPIES = WorkspaceRule(1.0, 1.0, "assumed: cuDNN's channels-last copies of both activation operands "
                                  "of every convolution (the H200 run's diagnosis: 0.5-1.05 x at the large ones)")
NO_WORKSPACE = WorkspaceRule(0.0, 0.0, "no workspace: the plain prediction (a lower bound)")


@dataclass(frozen=True)
class WorkspacePeak:
    """A prediction with a rule's workspaces: ``peak`` (bytes) against the ``plain`` one, and the
    op during which it happens (None: the plain peak, which no workspace moved)."""

    plain: int
    peak: int
    rule: WorkspaceRule
    at: OpMemory | None = None
    workspace: int = 0  # bytes the rule gives the op at the peak

    @property
    def added(self) -> int:
        return self.peak - self.plain

    def where(self) -> str:
        if self.at is None:
            return "the plain peak (no workspace moves it)"
        return f"{self.at.op} ({self.at.phase}, op {self.at.index}): workspace {self.workspace / MiB:,.0f} MiB"

    def __str__(self) -> str:
        return (f"{self.peak / MiB:,.0f} MiB with workspaces ({self.plain / MiB:,.0f} plain, "
                f"+{self.added / MiB:,.0f}) at {self.where()}; rule: {self.rule.source}")


def peak_with_workspaces(rows: list[OpMemory], plain: int, rule: WorkspaceRule = TRANSPOSED_COPIES) -> WorkspacePeak:
    """The peak of a step recorded op by op (``rows``, whose own peak is ``plain``) once every
    convolution takes ``rule``'s workspace while it runs: before + new outputs + workspace."""
    best = WorkspacePeak(plain, plain, rule)
    for r in rows:
        ws = rule.bytes(r)
        if ws and r.before + r.new_outputs + ws > best.peak:
            best = WorkspacePeak(plain, r.before + r.new_outputs + ws, rule, r, ws)
    return best


@contextlib.contextmanager
def cuda_rules(autocast_dtype: torch.dtype | None) -> Iterator[None]:
    """What ``predict_step`` runs a step in: fake tensors, CUDA's autocast op lists, dropout's
    fused CUDA kernel."""
    with FakeTensorMode(), autocast_rules("cuda" if autocast_dtype is not None else None), cuda_dropout():
        yield


def predict_ops(build_model: Callable[[], torch.nn.Module], input_shape: tuple[int, ...],
                target_shape: tuple[int, ...] | None = None, **step_kw: Any) -> tuple[list[OpMemory], int]:
    """``predict_step``'s step recorded op by op on fake tensors under CUDA's rules: ``(rows,
    peak)``. ``step_kw``: ``dtype``, ``loss_fn``, ``optimizer``, ``autocast_dtype``,
    ``n_classes``, ``steady_state``."""
    try:
        ops, peak = op_memory_step(build_model, input_shape, target_shape, device="cpu",
                                   within=cuda_rules(step_kw.get("autocast_dtype")), **step_kw)
    except RuntimeError as e:  # autograd's own words for a loss no parameter reaches
        if "does not require grad" not in str(e):
            raise
        raise MeasureError("the loss does not depend on any parameter of the model: a training step has no backward.",
                           "pass a builder whose model has parameters its output depends on, or predict a "
                           "forward-only step with predict_step(loop=Loop(mode='inference')).") from None
    return ops.rows, peak


def predict_with_workspaces(build_model: Callable[[], torch.nn.Module], input_shape: tuple[int, ...],
                            target_shape: tuple[int, ...] | None = None, *,
                            rule: WorkspaceRule = TRANSPOSED_COPIES, **step_kw: Any) -> WorkspacePeak:
    """The step's predicted peak with ``rule``'s convolution workspaces (the module docstring);
    ``step_kw`` as ``predict_ops``.

    >>> predict_with_workspaces(lambda: seed000_unet("large"), (2, 1, 26, 150, 320), n_classes=5).peak
    """
    rows, plain = predict_ops(build_model, input_shape, target_shape, **step_kw)
    if not rows:
        raise MeasureError("the step ran no op.", "pass a model whose forward computes something from its input.")
    return peak_with_workspaces(rows, plain, rule)


guard(globals(), MeasureError)
