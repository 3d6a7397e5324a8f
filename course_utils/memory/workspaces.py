"""cuDNN's convolution workspaces, added to a prediction at the op that takes them.

A fake-tensor prediction sees every op's outputs and never the scratch memory a kernel takes while
it runs. On a GPU that scratch memory, a cuDNN convolution's *workspace*, is allocated through the
caching allocator and given back before the op returns, so it counts in ``max_memory_allocated``.
The H200 run's diagnosis (docs/gpu-runs/2026-11-27-nvidia-h200, ``diagnose/*``: every op of a
step between two readings of the allocator, ``OpTransients``; cuDNN 9.19, TF32 on, PyTorch's
defaults) shows what it follows for the 3D convolutions of seed 000's U-Nets large enough to move
a peak: about the bytes of the convolution's two *activations*,

* forward (``convolution``): input + output -- 1.00-1.02 x in 16-bit, 0.50-0.67 x in fp32;
* backward (``convolution_backward``): input + output gradient -- 1.00-1.05 x,

with measured exceptions that took nothing: a 1x1x1 convolution in forward, and in fp32 also in
backward; an fp32 forward with one input channel. That the workspace holds copies of both
activations in the channels-last layout (NDHWC) cuDNN's tensor-core kernels read is a hypothesis
the byte counts fit, not a measurement. ``gpu_kit.workspace_check`` checks the rule op by op
against a run's recording and every recorded peak against the model.

**The model.** ``WorkspaceRule``: workspace(op) = ``forward`` x ``conv_operands`` for a
convolution, ``backward`` x ``conv_operands`` for its backward (the fp32 factors for an fp32 one),
0 for the exceptions and for any other op. The prediction op by op (``op_memory_step`` on fake
tensors under CUDA's rules, read by a ``LiveBytes`` meter) gives each op's live bytes before it
and its new outputs; the peak with workspaces is

    max(plain peak, max over ops of before + new outputs + workspace(op))

``TRANSPOSED_COPIES`` (1 x the activations) is the fallback for a GPU without a recording;
``NO_WORKSPACE`` is the plain prediction (below every measured peak of the H200 run, 45 of 45;
not a guaranteed bound). Where a GPU's recording exists, ``gpu_kit.workspace_check`` fits the
factors from it (the median ratio over the convolutions that could move a peak); elsewhere the
two rules say how far the answer moves.

What the rule does not hold, measured on the H200: small convolutions take more than their
activations (up to 20 x at the U-Net's deepest level: tens of MiB, never at a peak); seed 003's
convolution with one *output* channel took 1.33 x (its step misses the model by about 4 input
volumes at N = 128, 256 and 384); with TF32 off seed 003's convolutions took none. Only 3D
convolutions were diagnosed: 1D, 2D, grouped and transposed ones follow the rule unmeasured.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .. import recorded
from ..amp_rules import autocast_rules
from ..checks import MeasureError, guard
from .predict import cuda_dropout
from .transients import BOOKKEEPING, OP_FIELDS, OpMemory, align_ops, op_memory_step
from .units import MiB

#: the ops a rule adds a workspace at: op name -> the rule's field
CONV_OPS = {"convolution": "forward", "convolution_backward": "backward"}


def exception(row: OpMemory) -> bool:
    """Whether ``row`` is a convolution the H200 measured taking no workspace: a 1x1x1 kernel in
    forward (and in fp32 in backward too), an fp32 forward with one input channel."""
    fp32 = row.conv_itemsize >= 4
    if row.op == "convolution":
        return row.conv_pointwise or (fp32 and row.conv_in_channels == 1)
    return row.op == "convolution_backward" and row.conv_pointwise and fp32


@dataclass(frozen=True)
class WorkspaceRule:
    """workspace(op) = ``forward`` (or ``backward``) x the op's ``conv_operands``; for a
    convolution of 4 or more bytes an element ``forward_fp32`` / ``backward_fp32`` where given
    (cuDNN's fp32 and 16-bit kernels are other kernels; fp64 was never measured); 0 for the
    measured ``exception``s unless ``exceptions`` is False."""

    forward: float
    backward: float
    source: str  # where the factors come from: a GPU run's recording, or an assumption
    forward_fp32: float | None = None
    backward_fp32: float | None = None
    exceptions: bool = True

    def factor(self, family: str, itemsize: int) -> float:
        """The factor for ``family`` ("forward" or "backward") at ``itemsize`` bytes per element."""
        fp32 = getattr(self, f"{family}_fp32") if itemsize >= 4 else None
        return fp32 if fp32 is not None else getattr(self, family)

    def bytes(self, row: OpMemory) -> int:
        """The workspace this rule gives ``row``'s op (0 for an op that is no convolution)."""
        family = CONV_OPS.get(row.op)
        if family is None or (self.exceptions and exception(row)):
            return 0
        return round(self.factor(family, row.conv_itemsize) * row.conv_operands)


TRANSPOSED_COPIES = WorkspaceRule(1.0, 1.0, "assumed: 1 x a convolution's two activations (the H200 run's "
                                  "diagnosis: 0.5-1.05 x at the large ones)")
NO_WORKSPACE = WorkspaceRule(0.0, 0.0, "no workspace: the plain prediction")


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


def recorded_ops(case: str, folder: Any = None) -> tuple[list[OpMemory], str, Any] | None:
    """The newest GPU run's recording of ``case`` (the kit's ``diagnose/<case>``: "large-fp32",
    "small-fp16", "seed003", ...) under cuDNN's default settings: ``(ops, label, path)`` -- its
    ops as ``OpMemory`` rows, the run's label (GPU, date, torch), the file; None where no run
    recorded it (``recorded.diagnosis``; ``folder``: the runs' folder, default docs/gpu-runs)."""
    found = recorded.diagnosis(case, folder)
    if found is None or "cuDNN default" not in found[0]:
        return None
    settings, label, path = found
    rows = recorded.checked_rows(settings["cuDNN default"], set(OP_FIELDS), path, "the ops of cuDNN's default")
    return [OpMemory.from_dict(d) for d in rows], label, path


def plot_ops(rows: list[OpMemory], rule: WorkspaceRule = TRANSPOSED_COPIES, measured: list[OpMemory] | None = None,
             title: str = "", label: str = "", zoom: int = 25) -> Any:
    """A step's memory op by op: the prediction's live bytes once each op has run (before + its
    new outputs), the same with each convolution's workspace while it runs (``rule``) and, given a
    GPU's recording of the same step (``measured``, ``label`` naming it), the peak the allocator
    saw during each op, paired with the prediction's ops by name (``align_ops``). The x axis counts
    the ops that allocate (``BOOKKEEPING`` ops left out). Left: the whole step; right: ``zoom`` ops
    either side of the rule's peak, its largest values labelled. Returns the two Axes."""
    # lazy: matplotlib is loaded by the notebooks that draw, not by every prediction
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.op not in BOOKKEEPING]
    pos = {id(r): k for k, r in enumerate(rows)}
    x = list(range(len(rows)))
    plain = [(r.before + r.new_outputs) / MiB for r in rows]
    with_ws = [(r.before + r.new_outputs + rule.bytes(r)) / MiB for r in rows]
    pairs = align_ops(measured, rows) if measured else []
    mx, my = [pos[id(p)] for _, p in pairs], [m.peak / MiB for m, _ in pairs]
    at = max(x, key=with_ws.__getitem__)
    lo, hi = max(0, at - zoom), min(len(x) - 1, at + zoom)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [2, 1]})
    for ax, zoomed in zip(axes, (False, True), strict=True):
        ax.plot(x, with_ws, color="tab:orange", lw=0.8, label="predicted + each convolution's workspace (the rule)")
        ax.plot(x, plain, color="tab:blue", lw=1.2, label="predicted: live tensors after the op")
        if pairs:
            ax.plot(mx, my, ".", ms=3 if zoomed else 2, color="black",
                    label=f"measured: the allocator's peak during the op ({label or 'a GPU run'})")
        ax.set_xlabel("op of the step that allocates, in the prediction's order")
        if not zoomed:
            ax.set_ylabel("MiB")
            ax.set_title(title or "a training step op by op", fontsize=10)
            ax.set_ylim(0, max(with_ws + my) * 1.08)
            continue
        ax.set_xlim(lo, hi)
        ax.set_title("around the rule's peak", fontsize=10)
        window = [v for xs, ys in ((x, plain), (x, with_ws), (mx, my)) for k, v in zip(xs, ys, strict=True) if lo <= k <= hi]
        ax.set_ylim(min(window) * 0.97, max(window) * 1.06)
        for xs, ys, color, dy in ((x, plain, "tab:blue", -14), (x, with_ws, "tab:orange", -2), (mx, my, "black", 10)):
            inside = [k for k in range(len(xs)) if lo <= xs[k] <= hi]
            if inside:
                k = max(inside, key=ys.__getitem__)
                ax.annotate(f"{ys[k]:,.0f}", (xs[k], ys[k]), textcoords="offset points", xytext=(6, dy),
                            color=color, fontsize=8)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return axes


guard(globals(), MeasureError)
