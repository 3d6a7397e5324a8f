"""Does my network fit? The course's memory tools applied to the learner's own network.

``fit(build, input_shape, card_gib=8)`` predicts one step of any ``nn.Module`` (fp32, the
steady state from step 2 on, CUDA's rules) in the loop the user runs (``loops.Loop``: Adam by
default, or AdamW / SGD / no optimizer, foreach or fused, kept gradients, gradient accumulation,
the optimizer inside backward, or a forward-only or inference pass; a model with several outputs
through ``output=``), then the same step under each technique of the course, and says for each:
the predicted peak, what the card needs for it, whether it fits, the largest batch that fits,
and the time per step against the plain step (an estimate).
``python -m course_utils.fit MODULE:BUILDER --input 8,1,512,512 --card 8`` prints the same
(``--json``: every figure as data; exit code 0 if the plain step fits the card, 3 if it does not,
2 for bad input).

Method
------
* **Memory** is ``memory.predict_step``: the model is built by ``build()`` inside
  ``FakeTensorMode`` (shapes and dtypes, no data) and runs one step of the loop under
  ``MemoryLog`` (PyTorch's ``MemTracker``): the optimizer's state resident, the CUDA allocator's
  512-byte blocks, CUDA's autocast op lists. ``peak`` is the predicted ``torch.cuda.max_memory_allocated()``.
  Where it is (module and phase) is ``MemoryLog.peak_location``; what each top-level module
  leaves alive for backward is the saved-tensor meter's growth during its forward.
* **What the card needs** is ``budget.Overheads`` applied to the peak: the CUDA context and a
  slack for what a fake-tensor prediction cannot see -- cuDNN/cuBLAS workspaces, the caching
  allocator's rounding and fragmentation (reserved above allocated), NCCL's buffers. They are
  stated assumptions until a GPU run has been recorded (``recorded``), then measured figures.
* **The largest batch** is ``budget.batch_model``'s affine model (parameters, gradients and
  optimizer state fixed; activations, temporaries and the batch per sample) solved for the card's
  usable bytes (``budget.usable_bytes``), then *verified* by a prediction at that batch; for
  the plain step (``largest_batch``) also at batch + 1, so that it is the boundary.
* **Time** is counted, not measured: the step's FLOPs (``FlopCounterMode`` on fake tensors:
  convolutions and matrix products, recomputation included), the bytes the other ops read and
  write (``cost.ElementwiseBytes``) and, for offload, what ``save_on_cpu`` copies to the host
  and back, at a card's spec-sheet rates (``cost.card``; ``DEFAULT_CARD`` unless
  ``time_card`` names another). Reported as a ratio to the plain step.

Time is counted only when a technique is asked for (its rows are ratios to the plain step).
A call over a few seconds shows a progress bar (``progress``).

Techniques (``TECHNIQUES``)
---------------------------
* ``autocast-fp16`` / ``autocast-bf16``: ``predict_step(autocast_dtype=...)`` under CUDA's rules;
* ``inplace``: ``inplace=True`` on every activation module that has the switch (ReLU, LeakyReLU,
  ReLU6, Hardtanh, ELU, SELU, CELU, SiLU, Mish, Hardsigmoid, Hardswish, ...); functional
  activations in ``forward`` (``F.relu``) cannot be switched from outside;
* ``checkpoint-blocks``: every *block* (``blocks``) runs under ``checkpointing.checkpointed``
  (non-reentrant ``torch.utils.checkpoint``, BatchNorm running statistics frozen during the
  recomputation); ``selective``: the same blocks with a selective policy that keeps the outputs
  of convolutions, matrix products and attention (``save_matmuls``), recomputing the rest;
* ``offload``: the model's forward under ``checkpointing.offload_saved`` (``save_on_cpu`` on a
  GPU): saved activations in pinned host memory; time adds the PCIe copies;
* ``ddp-N`` (N = 2, 4, 8, where N divides the batch): each replica runs batch / N and holds DDP's
  gradient buckets (``budget.ddp_bucket_bytes``); communication not counted;
* ``fsdp-N``: parameters, gradients and Adam's state sharded over N ranks with the blocks as
  FSDP units (``parallel.fsdp.fsdp_rank_memory``, which takes any ``nn.Module`` and its units in
  forward order), plus buffers and the activations of batch / N. Resting and working bytes per
  rank; the working moment and the activation peak are added as if they coincided (an upper bound).

Blocks: the top-level children of the model, where a child that is an ``nn.Sequential`` /
``nn.ModuleList`` of composite modules (ResNet's ``layer1``) stands for its elements, and a child
that holds such a list (``nn.TransformerEncoder.layers``) for the list's elements. Single layers
(a conv, a pooling, the head) are not blocks: checkpointing one op saves nothing. The blocks are
assumed to run in the order they are registered (FSDP's units).

Limits
------
A fake-tensor step cannot see the CUDA context, cuDNN workspaces or fragmentation (the
``Overheads``), nor NCCL's buffers; it follows CUDA's autocast op lists, but the attention kernel
it picks is the CPU's. Adam's and AdamW's step counts (one scalar per parameter tensor) are counted
in device memory, where PyTorch keeps them on the host unless the optimizer is fused or capturable
(``torch/optim/adam.py``): 512 bytes per parameter tensor too many.
In ``mode="forward"`` the rows are a train-mode forward and its loss (``checkpoint-blocks``,
``selective`` and ``offload`` change what it keeps); in ``mode="inference"`` the techniques that
change what is kept for backward, and the parallel ones, do not apply. Models whose forward
reads tensor values (``.item()``, ``.tolist()``, ``.numpy()``, a Python ``if`` on a tensor,
``nonzero``) or needs a real CUDA device cannot run on fake tensors: ``fit`` refuses them
(``FitError``) and names what to do; so is a step whose backward PyTorch refuses (an in-place op
overwrites a tensor saved for backward: the meter makes autograd's version check, which its hooks
switch off), and where only a technique causes it (``inplace``) that technique's row. A forward
that fixes the batch size gets its rows at that batch (no larger one searched; DDP / FSDP refused
with the reason). A model built on the meta device is predicted from its shapes. Combinations of
techniques are not predicted; each row is one technique on the plain fp32 step.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .amp_rules import autocast_rules
from .budget import CUBLAS_OPS, cublas_workspaces, ddp_bucket_bytes, fixed_bytes, overheads
from .checks import FitError, guard
from .cost import CARDS, ElementwiseBytes, SaveOnCpuMeter, card
from .fit_model import (
    LOSSES,
    TECHNIQUES,
    activation_modules,
    blocks,
    build_model,
    check_loss,
    check_trainable,
    explain_failure,
    loss_function,
    parse_capability,
    parse_shape,
    parse_techniques,
    resolve_builder,
    target_for,
    underlying,
    variant,
)
from .fit_report import BASELINE, FitReport, Row, by_module, peak_where
from .loops import Loop, LoopError, select_output
from .memory import SavedTensorModifiedError, predict_step
from .parallel.fsdp import fsdp_rank_memory

__all__ = ["BASELINE", "LOSSES", "TECHNIQUES", "FitError", "FitReport", "Row", "StepCost", "StepSpec", "fit",
           "largest_batch", "main", "step_cost"]

#: the largest card ``fit`` takes (1 PiB): beyond it the batch that fills it overflows torch's sizes
MAX_CARD_GIB = 2**20
_AUTOCAST = {"autocast-fp16": torch.float16, "autocast-bf16": torch.bfloat16}
_PRECISION = {"autocast-fp16": "autocast_fp16", "autocast-bf16": "autocast_bf16"}  # cost.Card.flops keys
_KEPT_FOR_BACKWARD = ("checkpoint-blocks", "selective", "offload")  # change what backward finds saved


def _gpus(tech: str) -> int:
    """N of ``ddp-N`` / ``fsdp-N``; 1 for a one-GPU technique."""
    return int(tech.split("-")[1]) if tech.startswith(("ddp-", "fsdp-")) else 1


# --------------------------------------------------------------------------------------------
# The loss, the loop
# --------------------------------------------------------------------------------------------
#: a ``LoopError``'s Python option names, as the command line spells them in a ``FitError``
_CLI_NAMES = (("mode '", "--mode '"), ("optimizer_in_backward", "--optimizer-in-backward"),
              ("keep_grads", "--keep-grads"), ("output=", "--output "))


def _fit_error(e: LoopError) -> FitError:
    """A ``LoopError`` as ``fit``'s error, with the command line's option names in its fix."""
    text = str(e)
    for python, cli in _CLI_NAMES:
        text = text.replace(python, cli)
    return FitError(text)


def make_loop(**options: Any) -> Loop:
    """``loops.Loop(**options)``, its errors as ``FitError`` (the CLI's option names in the fix)."""
    try:
        return Loop(**options)
    except LoopError as e:
        raise _fit_error(e) from None


def _selected(out: Any, loop: Loop) -> Any:
    """``loops.select_output`` of the model's output, its errors as ``FitError``."""
    try:
        return select_output(out, loop.output)
    except LoopError as e:
        raise _fit_error(e) from None


# --------------------------------------------------------------------------------------------
# The step: target, loss, cost
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepSpec:
    """The step ``fit`` predicts: input and target per sample, the loss, the loop."""

    sample_shape: tuple[int, ...]  # the input without its batch dim
    target_sample: tuple[int, ...]  # the target without its batch dim
    n_classes: int | None  # class-index targets (None: float targets)
    loss_name: str
    loss_fn: Callable = field(repr=False)
    output_shape: tuple[int, ...] = ()  # the loss's input (the selected output) at the given batch
    loop: Loop = Loop()
    cublas: bool = False  # the step runs a matrix product (cuBLAS on a GPU)

    def input_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.sample_shape)

    def target_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.target_sample)


class _OpNames(TorchDispatchMode):
    """The names of the aten ops a region runs (``budget.CUBLAS_OPS`` decides the workspace line)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _loss_input(out: Any, loop: Loop, custom_loss: bool) -> Any:
    """What the loss takes from the model's output; a FitError that names ``--output`` when a
    named loss meets several outputs."""
    sel = _selected(out, loop)
    if not isinstance(sel, torch.Tensor) and not custom_loss:
        kind = "keys " + ", ".join(map(repr, sel)) if isinstance(sel, dict) else f"{type(sel).__name__}"
        raise FitError(f"the model returns a {type(sel).__name__} ({kind}), not one tensor. Fix: --output NAME or "
                       "INDEX picks the tensor the loss takes (e.g. --output logits, --output 0), or --loss "
                       "MODULE:FUNCTION takes the whole output.")
    return sel


def _probe(build: Callable[[], nn.Module], input_shape: tuple[int, ...], loss: str | Callable,
           target_shape: Sequence[int] | None, n_classes: int | None,
           loop: Loop = Loop()) -> tuple[StepSpec, dict[str, Any]]:
    """Build the model and run its forward and the loss once on fake tensors: the output's
    shape decides the target; any failure becomes a FitError that names the fix."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    loss_name, loss_fn = loss_function(loss)
    custom = loss_fn not in LOSSES.values()
    if target_shape is not None:
        target_shape = parse_shape(target_shape, "target shape", 1)
        if target_shape[0] != input_shape[0]:
            raise FitError(f"target shape {target_shape} and input shape {input_shape} have different batches. "
                           "Fix: give the target the input's batch as its first size.")
    with FakeTensorMode():
        model = build_model(build)
        info = {"parameters": sum(p.numel() for p in model.parameters()),
                "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
                "blocks": [(n, sum(p.numel() for p in b.parameters())) for n, b in blocks(model)],
                "activations": [type(m).__name__ for m in activation_modules(model)],
                "activations_off": [type(m).__name__ for m in activation_modules(model) if not m.inplace]}
        check_trainable(model, loop)
        x = torch.randn(input_shape)
        try:
            with torch.no_grad(), _OpNames() as ops:
                out = model(x)
        except Exception as e:
            raise explain_failure(e, "the model's forward", input_shape) from e
        cublas = bool(ops.names & CUBLAS_OPS)
        if loop.mode == "inference":  # no loss, no target: the output is all there is
            sel = _selected(out, loop)
            shape = tuple(sel.shape) if isinstance(sel, torch.Tensor) else ()
            return StepSpec(input_shape[1:], (), None, "none (inference)", loss_fn, shape, loop, cublas), info
        sel = _loss_input(out, loop, custom)
        out_shape = tuple(sel.shape) if isinstance(sel, torch.Tensor) else ()
        tgt, n_classes = target_for(loss_name, loss_fn, out_shape, target_shape, n_classes, custom)
        y = torch.randint(0, n_classes, tgt) if n_classes else torch.randn(tgt)
        check_loss(loss_name, loss_fn, sel, out_shape, y, tgt)
    return StepSpec(input_shape[1:], tgt[1:], n_classes, loss_name, loss_fn, out_shape, loop, cublas), info


@dataclass(frozen=True)
class StepCost:
    """What ``step_cost`` counted in one training step: FLOPs, element-wise bytes, and the bytes
    offload would copy to the host."""

    flops: int  # FlopCounterMode: convolutions and matrix products, recomputation included
    elementwise_bytes: int  # cost.ElementwiseBytes: what the other ops read and write
    packed_bytes: int  # what save_on_cpu would copy to the host in forward (offload)


def step_cost(build: Callable[[], nn.Module], spec: StepSpec, batch: int,
              autocast_dtype: torch.dtype | None = None, count_packed: bool = False) -> StepCost:
    """One steady-state step of ``spec.loop`` (one micro-batch; foreach unless the loop says
    otherwise; CUDA's autocast rules) on fake tensors, counted: FLOPs, element-wise bytes and
    (``count_packed``) what offload would copy."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    meter, counter = SaveOnCpuMeter(), ElementwiseBytes()
    loop = spec.loop
    with FakeTensorMode(), autocast_rules("cuda" if autocast_dtype else None):
        model = build_model(build)
        x = torch.randn(spec.input_shape(batch))
        y = (torch.randint(0, spec.n_classes, spec.target_shape(batch)) if spec.n_classes
             else torch.randn(spec.target_shape(batch)))
        opt = loop.make_optimizer(model, default_foreach=True)
        loop.prime(model, opt)
        if count_packed:
            forward = model.forward

            def metered(*args: Any, **kwargs: Any) -> Any:
                with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
                    return forward(*args, **kwargs)

            model.forward = metered
        with FlopCounterMode(display=False) as flops, counter:
            loop.run(model, x, y, opt, loss_fn=spec.loss_fn, autocast_dtype=autocast_dtype, micro_batches=1)
        del model, x, y, opt
    return StepCost(int(flops.get_total_flops()), counter.total, meter.total)


# --------------------------------------------------------------------------------------------
# The predictions, each made once; the largest batch
# --------------------------------------------------------------------------------------------
class _BatchFailed(Exception):
    """The step runs at the asked batch but fails at another (a forward that fixes the batch
    size, e.g. ``x.reshape(8, -1)``): the largest-batch search stops there, a DDP / FSDP row
    (batch / N per GPU) is refused with the reason."""

    def __init__(self, batch: int, error: BaseException):
        error = underlying(error)
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        self.batch, self.text = batch, f"{type(error).__name__}: {first[:160]}"
        super().__init__(f"the step fails at batch {batch} ({self.text})")


#: what a _BatchFailed's reason suggests
_FIXED_BATCH = ("does the forward fix the batch size (e.g. x.reshape(8, -1))? Fix: take it from the input "
                "(x.reshape(x.shape[0], -1), x.flatten(1))")


def _time_card(name: Any) -> Any:
    """``cost.card(name)``, an unknown name (or an empty one) a FitError with the command line's option."""
    if isinstance(name, str) and not name.strip():
        raise FitError(f"time card {name!r} names no card.", f"leave --time-card out (the {card().name}), or one of "
                       f"{', '.join(CARDS)}.")
    try:
        return card(name)
    except ValueError as e:  # cost.card names the choices
        raise FitError(str(e).split(" Fix: ")[0], f"--time-card one of {', '.join(CARDS)}.") from None


class _Fitter:
    """One report's predictions and counts, each made once (cached per technique and batch)."""

    def __init__(self, build: Callable[[], nn.Module], spec: StepSpec, card_gib: float, time_card: Any,
                 bar: Any = None, capability: tuple[int, int] | None = None, batch: int = 0):
        self.build, self.spec, self.card_gib, self.batch = build, spec, card_gib, batch
        self.gpu = _time_card(time_card)
        over = overheads()
        self.workspace = ""
        if spec.cublas:
            ws, self.workspace = cublas_workspaces(capability or self.gpu.compute_capability,
                                                   1 if spec.loop.mode != "train" else 2)
            over = replace(over, workspace_bytes=ws)
        self.over = over
        self.usable = int(over.usable(card_gib * 2**30))  # 0: the card does not even hold the context
        self.bar = bar
        self._preds: dict[tuple[str, int], Any] = {}
        self._costs: dict[tuple[str, int], StepCost] = {}

    @property
    def predictions(self) -> int:
        """How many steps were predicted (each technique and batch once)."""
        return len(self._preds)

    def predict(self, key: str, batch: int):
        if (key, batch) not in self._preds:
            s = self.spec
            if self.bar is not None:
                self.bar.set_postfix_str(f"{key}, batch {batch}")
            try:
                self._preds[key, batch] = predict_step(
                    variant(self.build, key), s.input_shape(batch), s.target_shape(batch), loss_fn=s.loss_fn,
                    n_classes=s.n_classes, autocast_dtype=_AUTOCAST.get(key), module_peaks=False, loop=s.loop)
            except FitError:
                raise
            except Exception as e:
                if batch == self.batch:
                    raise
                raise _BatchFailed(batch, e) from e
        return self._preds[key, batch]

    def cost(self, key: str, batch: int) -> StepCost:
        key = key if key in ("checkpoint-blocks", "selective", *_AUTOCAST) else "baseline"
        if (key, batch) not in self._costs:  # the plain step's count also says what offload moves
            self._costs[key, batch] = step_cost(variant(self.build, key), self.spec, batch,
                                                _AUTOCAST.get(key), count_packed=key == "baseline")
        return self._costs[key, batch]

    def seconds(self, key: str, batch: int, moved: int = 0) -> float:
        c, g = self.cost(key, batch), self.gpu
        return (c.flops / g.flops(_PRECISION.get(key, "fp32")) + c.elementwise_bytes / g.memory_bytes_per_s
                + 2 * moved / g.pcie_bytes_per_s)

    def largest(self, peak: Callable[[int], int], fixed: int, per_sample: float, start: tuple[int, int],
                checks: int, boundary: bool = True) -> tuple[int, bool, str]:
        """The largest batch with peak(b) <= usable: the affine guess (``fixed + b x per_sample``),
        then at most ``checks`` predictions, each at the secant's batch through the nearest two
        known points, kept between the largest batch known to fit and the smallest known not to.
        Returns (batch, verified, why): with ``boundary``, verified when the batch is predicted to
        fit and batch + 1 not to; without, the first predicted batch that fits, verified (a lower
        bound within the line's error); ``why`` says where the step failed at another batch (the
        search stops there, unverified). The plain step takes 3 with ``boundary``: the guess (the
        line's second point), the secant's batch, and its neighbour; a technique's row 2 without:
        the guess and, where the line overshot, the secant's batch."""
        budget = self.usable  # (per_sample >= 1: _fixed_and_per_sample)
        points = dict([start])
        lo = start[0] if start[1] <= budget else 0  # fits at lo (0: nothing known)
        hi = None if start[1] <= budget else start[0]  # does not fit at hi
        guess = max(1, int((budget - fixed) // per_sample))
        for _ in range(checks):
            if hi is not None and hi <= lo + 1:
                break
            guess = min(max(guess, lo + 1), hi - 1) if hi is not None else max(guess, lo + 1)
            if guess not in points:
                try:
                    points[guess] = peak(guess)
                except _BatchFailed as e:
                    return lo, False, f"{e}; {_FIXED_BATCH}"
            if points[guess] <= budget:
                lo = max(lo, guess)
                if not boundary:
                    return lo, True, ""
            else:
                hi = guess if hi is None else min(hi, guess)
            guess = _secant(points, guess, budget, per_sample)
            if guess == lo:
                guess = lo + 1
        verified = boundary and hi is not None and hi == lo + 1
        return lo, verified, ""


def _secant(points: dict[int, int], at: int, budget: int, per_sample: float) -> int:
    """The batch where the line through the two known points nearest ``at`` meets ``budget``."""
    slope = per_sample  # the affine model's, until two points say otherwise
    if len(points) > 1:
        (b1, p1), (b2, p2) = sorted(points.items(), key=lambda bp: abs(bp[0] - at))[:2]
        if (p2 - p1) / (b2 - b1) > 0:
            slope = (p2 - p1) / (b2 - b1)
    return int(at + (budget - points[at]) // slope)


def _fixed_and_per_sample(prediction, batch: int) -> tuple[int, float]:
    """The prediction's bytes that do not grow with the batch (parameters, buffers, gradients,
    optimizer state: the steady state's, whatever the optimizer), and the bytes each sample adds."""
    fixed = fixed_bytes(prediction.breakdown)
    return fixed, max(1.0, (prediction.peak - fixed) / batch)


# --------------------------------------------------------------------------------------------
# fit
# --------------------------------------------------------------------------------------------
def fit(build: Callable[[], nn.Module] | str, input_shape: Sequence[int] | str = (8, 1, 512, 512), *,
        card_gib: float = 8.0, loss: str | Callable = "cross_entropy", target_shape: Sequence[int] | None = None,
        n_classes: int | None = None, techniques: Sequence[str] | str | None = None,
        time_card: Any = None, compute_capability: tuple[int, int] | str | None = None,
        optimizer: str | None = None, momentum: float | None = None, foreach: bool | None = None, fused: bool = False, keep_grads: bool = False, accumulate: int = 1,
        optimizer_in_backward: bool = False, mode: str = "train", output: int | str | None = None,
        progress: bool = True) -> FitReport:
    """Predict one step of ``build()``'s model at ``input_shape`` (batch first) and the same step
    under each of ``techniques`` (default: all, ``TECHNIQUES``) for a card of ``card_gib`` GiB.

    ``loss``: a name of ``LOSSES``, ``"MODULE:FUNCTION"`` or a callable(output, target); the
    target is class indices (cross-entropy, or ``n_classes`` given) of the output's shape without
    its class dim, else floats of the output's shape, unless ``target_shape`` says otherwise.
    The loop (``loops.Loop``): ``optimizer`` "adam" (default) | "adamw" | "sgd" | "none",
    ``momentum`` (SGD; default 0.9), ``foreach`` / ``fused``, ``keep_grads``
    (``zero_grad(set_to_none=False)``), ``accumulate`` (micro-batches per optimizer step; the
    batch is the micro-batch), ``optimizer_in_backward``, ``mode`` "train" | "forward" |
    "inference", ``output`` (the element or key of a tuple / dict output the loss takes).
    ``time_card``: the card the time estimates assume (``cost.card``); ``compute_capability``
    (e.g. ``(9, 0)`` or ``"9.0"`` for a Hopper card) the one cuBLAS's workspace size follows,
    by default the time card's.
    See the module's docstring for the method and its limits."""
    name = build if isinstance(build, str) else getattr(build, "__name__", type(build).__name__)
    build = resolve_builder(build)
    input_shape = parse_shape(input_shape)
    if card_gib > MAX_CARD_GIB:  # (a finite number > 0: the guard) a batch to match would overflow torch's sizes
        raise FitError(f"a card of {card_gib:g} GiB: no GPU holds more than {MAX_CARD_GIB:,} GiB.",
                       "--card in GiB, e.g. --card 80 for an 80 GB H100.")
    loop = make_loop(optimizer=optimizer, momentum=momentum, foreach=foreach, fused=fused, keep_grads=keep_grads,
                     accumulate=accumulate, optimizer_in_backward=optimizer_in_backward, mode=mode, output=output)
    techniques = parse_techniques(techniques)
    capability = parse_capability(compute_capability)
    time_card = _time_card(time_card)
    spec, info = _probe(build, input_shape, loss, target_shape, n_classes, loop)
    from tqdm.auto import tqdm  # lazy: tqdm picks its notebook or terminal form when a fit runs

    with tqdm(total=1 + len(techniques), desc=f"fit {name}", unit="row", disable=not progress,
              file=sys.stderr, leave=False) as bar:
        f = _Fitter(build, spec, card_gib, time_card, bar, capability, input_shape[0])
        rows, skipped = _rows(f, spec, info, input_shape[0], techniques, bar)
    g = f.gpu
    assumption = (f"time estimated for a {g.name}: counted FLOPs at {g.fp32_flops / 1e12:.1f} TFLOP/s fp32, "
                  f"{g.fp16_flops / 1e12:.1f} fp16, {g.bf16_flops / 1e12:.1f} bf16, element-wise bytes at "
                  f"{g.memory_bytes_per_s / 1e9:.0f} GB/s, PCIe at {g.pcie_bytes_per_s / 1e9:.2f} GB/s; spec-sheet "
                  f"peaks, not overlapped; communication between GPUs not counted (source: {g.source})"
                  if techniques else "no technique asked for: time not estimated")
    base = f.predict("baseline", input_shape[0])
    return FitReport(name, input_shape, card_gib, base, spec, rows, skipped, by_module(base), f.usable, f.over,
                     assumption, info["blocks"], loop, f.workspace, f.predictions)


def _rows(f: _Fitter, spec: StepSpec, info: dict[str, Any], batch: int, techniques: list[str],
          bar: Any) -> tuple[list[Row], dict[str, str]]:
    """The plain step's row, then one row per applicable technique (the others with a reason)."""
    try:
        base = f.predict("baseline", batch)
    except FitError:
        raise
    except Exception as e:
        raise explain_failure(e, "the step", spec.input_shape(batch)) from e
    rows: list[Row] = []
    skipped: dict[str, str] = {}
    timed = bool(techniques)

    def row(tech: str, p: Any, peak: int, breakdown: dict[str, int], largest: tuple[int, bool, str],
            seconds: float, note: str = "") -> None:
        needs = int(f.over.needed(peak))
        lb, ok, why = largest
        if why:
            note += ("; " if note else "") + f"largest batch: {lb} predicted to fit, not searched further: {why}"
        elif not ok:
            note += ("; " if note else "") + (f"largest batch: {lb} predicted to fit, {lb + 1} not checked"
                                              if lb and tech == BASELINE else "largest batch: affine estimate, unverified")
        after = sum(v for k, v in (p.after_forward or {}).items() if k != "Total") if p is not None else 0
        where = peak_where(p) if p is not None and _gpus(tech) == 1 else ("", "")
        rows.append(Row(tech, peak, breakdown, needs, needs <= f.card_gib * 2**30, lb, seconds, note, ok,
                        _gpus(tech), after, where))

    fixed, per = _fixed_and_per_sample(base, batch)
    base_largest = f.largest(lambda b: f.predict("baseline", b).peak, fixed, per, (batch, base.peak), 3)
    row(BASELINE, base, base.peak, base.breakdown, base_largest,
        f.seconds("baseline", batch) if timed else math.nan, "peak in {} ({})".format(*peak_where(base)))
    bar.update()
    for tech in techniques:
        try:
            reason = _why_not_applicable(tech, info, batch, spec.loop)
            if reason:
                skipped[tech] = reason
            elif tech.startswith(("ddp-", "fsdp-")):
                _parallel_row(f, tech, info, batch, row)
            else:
                _one_gpu_row(f, tech, info, batch, base, row, base_largest)
        except FitError:
            raise
        except _BatchFailed as e:  # ddp-N / fsdp-N: batch / N per GPU
            skipped[tech] = f"each GPU runs batch {e.batch}, where the step fails ({e.text}): {_FIXED_BATCH}"
        except SavedTensorModifiedError as e:
            skipped[tech] = (f"its backward fails (as it would in PyTorch): an in-place op overwrites a tensor saved "
                             f"for backward ({e.saved}). Fix: leave {tech} out, or switch in-place on by hand only "
                             "where the next op does not need what it overwrites")
        except Exception as e:  # a technique this model does not support
            e = underlying(e)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            skipped[tech] = f"failed on this model: {type(e).__name__}: {first[:200]}"
        bar.update()
    return rows, skipped


def _one_gpu_row(f: _Fitter, tech: str, info: dict[str, Any], batch: int, base: Any, row: Callable,
                 base_largest: tuple[int, bool, str]) -> None:
    p = f.predict(tech, batch)
    fx, ps = _fixed_and_per_sample(p, batch)
    if p.breakdown == base.breakdown:  # the same step (e.g. in-place where nothing it overwrites was kept)
        lb = base_largest
    else:  # checked to fit: a lower bound within the line's error
        lb = f.largest(lambda b, t=tech: f.predict(t, b).peak, fx, ps, (batch, p.peak), 2, boundary=False)
    moved = f.cost("offload", batch).packed_bytes if tech == "offload" else 0
    same = abs(p.peak - base.peak) <= 0.005 * base.peak
    note = {"offload": f"{moved / 2**20:,.0f} MiB to the host and back over PCIe per step",
            "inplace": ("peak unchanged; " if same else "") + f"{len(info['activations_off'])} activations in place"
            + ("; the tensors they overwrite were not kept for backward anyway" if same else ""),
            "checkpoint-blocks": f"{len(info['blocks'])} blocks recomputed in backward",
            "selective": f"{len(info['blocks'])} blocks; conv/matmul outputs kept"}.get(tech, "")
    key = "baseline" if tech in ("inplace", "offload") else tech
    row(tech, p, p.peak, p.breakdown, lb, f.seconds(key, batch, moved), note)


def _why_not_applicable(tech: str, info: dict[str, Any], batch: int, loop: Loop = Loop()) -> str:
    """Why ``tech`` does not apply to this model, batch and loop ('' if it does)."""
    if tech == "inplace":
        if not info["activations"]:
            return ("no in-place-capable activation module (ReLU, LeakyReLU, ELU, SiLU, ...); functional "
                    "activations in forward (F.relu, F.gelu) cannot be switched from outside")
        if not info["activations_off"]:
            return f"every activation module is already in-place ({len(info['activations'])})"
    if tech in _KEPT_FOR_BACKWARD and loop.mode == "inference":
        return "inference keeps nothing for a backward: there is nothing to recompute or move to the host"
    if tech in ("checkpoint-blocks", "selective") and not info["blocks"]:
        return ("no block to checkpoint: the top-level children are single layers. Group them into "
                "nn.Sequential blocks (or checkpoint inside your forward)")
    if tech.startswith(("ddp-", "fsdp-")):
        n = _gpus(tech)
        if loop.mode != "train":
            return f"a training scheme: mode {loop.mode!r} has no gradients to reduce"
        if loop.optimizer_in_backward:
            return "the optimizer in backward is not modelled under DDP / FSDP"
        if batch % n:
            return f"batch {batch} does not divide into {n} equal per-GPU batches"
        if tech.startswith("fsdp-") and not any(p for _, p in info["blocks"]):
            return "no block with parameters to shard as an FSDP unit"
    return ""


def _parallel_row(f: _Fitter, tech: str, info: dict[str, Any], batch: int, row: Callable) -> None:
    """ddp-N / fsdp-N: the plain step at batch / N per GPU, plus what the parallel scheme holds."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    n = _gpus(tech)
    local = batch // n
    p = f.predict("baseline", local)
    b = dict(p.breakdown)
    seconds = f.seconds("baseline", local)
    fx, ps = _fixed_and_per_sample(p, local)
    if tech.startswith("ddp-"):
        buckets = ddp_bucket_bytes(info["grad_bytes"])
        b["Gradient"] += buckets  # DDP's flat copy of every gradient, held for the model's lifetime

        def peak(bb: int) -> int:
            return f.predict("baseline", bb).peak + buckets

        lb, ok, why = f.largest(peak, fx + buckets, ps, (local, p.peak + buckets), 2, boundary=False)
        row(tech, p, p.peak + buckets, b, (lb * n, ok, why), seconds,
            f"time: no communication; {local}/GPU on {n} GPUs; + {buckets / 2**20:,.1f} MiB DDP buckets")
        return

    loop = f.spec.loop
    with FakeTensorMode():
        net = build_model(f.build)
        units = [m for _, m in blocks(net) if any(True for _ in m.parameters())]
        mem = fsdp_rank_memory(net, units, n, bytes_per_value=4, optimizer_states=loop.state_per_parameter())
        n_units = len(units)
        del net, units
    resting = int(mem["resting"]) + b["Buffer"]
    kept = loop.keep_grads or loop.accumulate > 1  # every gradient shard present through the step
    working = mem["working, shards kept"] if kept else mem["working"]
    state = int(working) + b["Buffer"]  # optimizer shard + params and grads at the worst moment
    work = {"Parameter": int(mem["rest params"] + mem["gathered params"] + mem["prefetched params"]),
            "Buffer": b["Buffer"],
            "Gradient": int((mem["rest grads"] if kept else mem["reduced grads"]) + mem["unsharded grads"]
                            + mem["reduce-scatter input"]),
            "Optstate": int(mem["rest optimizer"])}
    rest_of = {k: b[k] for k in ("Activation", "Temp", "Other")}

    def peak(bb: int) -> int:
        q = f.predict("baseline", bb).breakdown
        return state + q["Activation"] + q["Temp"] + q["Other"]

    lb, ok, why = f.largest(peak, state, ps, (local, state + sum(rest_of.values())), 2, boundary=False)
    row(tech, p, state + sum(rest_of.values()), {**work, **rest_of}, (lb * n, ok, why), seconds,
        f"peak: upper bound; time: no communication; {local}/GPU on {n} GPUs, {n_units} units; resting "
        f"{resting / 2**20:,.0f} MiB/GPU, working state {state / 2**20:,.0f} MiB + the activations of batch "
        f"{local}, added as if at one moment")


def largest_batch(build: Callable[[], nn.Module] | str, input_shape: Sequence[int] | str, card_gib: float = 8.0,
                  **options: Any) -> int:
    """The largest batch whose plain step fits a ``card_gib`` card: predicted peak(b) <= the
    card's usable bytes and peak(b + 1) is not (``fit``'s first row; ``options`` as ``fit``'s:
    the loss, the target, the loop)."""
    return fit(build, input_shape, card_gib=card_gib, techniques=[], **options).rows[0].largest_batch


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------
#: the command line's exit codes: a script can branch on "does it fit?"
EXIT_FITS, EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT = 0, 2, 3


def _flag(value: str) -> bool:
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    if value.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r}: write true or false")


def _output(value: str) -> int | str:
    return int(value) if value.lstrip("-").isdigit() else value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m course_utils.fit",
        description="Predict the GPU memory of your network's step, and what each technique of the course "
                    "changes (on fake tensors: no GPU needed). Exit code: 0 if the plain step fits --card, "
                    "3 if it does not, 2 for bad input.")
    p.add_argument("builder", help="MODULE:BUILDER, a function returning the nn.Module "
                                   "(e.g. course_utils.fit_examples:resnet18_2d)")
    p.add_argument("--input", required=True, help="input shape, batch first: e.g. 8,1,512,512")
    p.add_argument("--card", type=float, default=8.0, help="card memory in GiB (default 8)")
    p.add_argument("--loss", default="cross_entropy", help=f"one of {', '.join(LOSSES)}, or MODULE:FUNCTION "
                                                          "taking (output, target)")
    p.add_argument("--classes", type=int, default=None, help="number of classes (checked against the output)")
    p.add_argument("--target-shape", default=None, help="target shape, batch first (default: from the output)")
    p.add_argument("--output", type=_output, default=None,
                   help="the part of a tuple / dict output the loss takes: an index or a key (e.g. 0, logits)")
    p.add_argument("--techniques", default=None, help=f"comma-separated subset of {', '.join(TECHNIQUES)}")
    p.add_argument("--time-card", default=None, help="the card time is estimated for (cost.CARDS)")
    p.add_argument("--compute-capability", default=None,
                   help="the card's MAJOR.MINOR (e.g. 9.0 for an H100), for cuBLAS's workspace size "
                        "(default: the time card's)")
    loop = p.add_argument_group("the loop (what a step runs)")
    loop.add_argument("--optimizer", default=None, help="adam (default) | adamw | sgd | none")
    loop.add_argument("--momentum", type=float, default=None, help="SGD's momentum (default 0.9; 0: no buffer)")
    loop.add_argument("--foreach", type=_flag, default=None, help="true | false: the optimizer's "
                                                                  "multi-tensor step (default: CUDA's, true)")
    loop.add_argument("--fused", action="store_true", help="the optimizer's fused kernel")
    loop.add_argument("--keep-grads", action="store_true", help="zero_grad(set_to_none=False)")
    loop.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step (the input's "
                                                               "batch is the micro-batch)")
    loop.add_argument("--optimizer-in-backward", action="store_true",
                      help="one optimizer per parameter, stepped in its post-accumulate-grad hook")
    loop.add_argument("--mode", default="train", help="train (default) | forward | inference")
    p.add_argument("--json", action="store_true", help="print every figure as JSON instead of the summary")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


#: fit's arguments that the guard checks, and the command line's options that give them
_GUARDED_OPTIONS = (("card_gib", "card"), ("n_classes", "classes"), ("accumulate", "accumulate"),
                    ("momentum", "momentum"), ("output", "output"))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_utils.fit MODULE:BUILDER --input 8,1,512,512 --card 8``: prints the
    summary (``--json``: the report as data) and returns ``EXIT_FITS`` or ``EXIT_DOES_NOT_FIT``;
    a one-line error that names the fix and ``EXIT_BAD_INPUT`` for bad input."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        rep = fit(args.builder, args.input, card_gib=args.card, loss=args.loss, n_classes=args.classes,
                  target_shape=args.target_shape, techniques=args.techniques, time_card=args.time_card,
                  compute_capability=args.compute_capability,
                  optimizer=args.optimizer, momentum=args.momentum, foreach=args.foreach, fused=args.fused,
                  keep_grads=args.keep_grads, accumulate=args.accumulate,
                  optimizer_in_backward=args.optimizer_in_backward, mode=args.mode, output=args.output,
                  progress=not args.no_progress and not args.json)
    except ValueError as e:  # a FitError (the guard's names Python's arguments: the options' instead)
        text = str(e)
        for python, cli in _GUARDED_OPTIONS:
            text = text.replace(f"fit.fit: {python}=", f"--{cli} ").replace(f"pass {python} as", f"give --{cli} as")
        print(f"error: {text}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(rep.to_dict(), indent=1, allow_nan=False) if args.json else rep.summary())
    return EXIT_FITS if rep.fits else EXIT_DOES_NOT_FIT


guard(globals(), FitError, signed=("output",))  # output: an index may count from the end (-1)


if __name__ == "__main__":
    sys.exit(main())
