"""Does my network fit? The course's memory tools applied to the learner's own network.

``fit(build, input_shape, card_gib=8)`` predicts one training step of any ``nn.Module`` (fp32,
Adam, the steady state from step 2 on, CUDA's rules) and then the same step under each technique
of the course, and says for each: the predicted peak, what the card needs for it, whether it
fits, the largest batch that fits, and the time per step against the plain step (an estimate).
``python -m course_utils.fit MODULE:BUILDER --input 8,1,512,512 --card 8`` prints the same.

Method
------
* **Memory** is ``memory.predict_step``: the model is built by ``build()`` inside
  ``FakeTensorMode`` (shapes and dtypes, no data) and trained for one step under ``MemoryLog``
  (PyTorch's ``MemTracker``): Adam's state resident, the CUDA allocator's 512-byte blocks,
  CUDA's autocast op lists. ``peak`` is the predicted ``torch.cuda.max_memory_allocated()``.
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
it picks is the CPU's. Models whose forward reads tensor values (``.item()``, ``.tolist()``,
``.numpy()``, a Python ``if`` on a tensor, ``nonzero``) or needs a real CUDA device cannot run on
fake tensors: ``fit`` refuses them (``FitError``) and names what to do. Combinations of
techniques are not predicted; each row is one technique on the plain fp32 step.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .amp_rules import autocast_rules
from .budget import batch_model, ddp_bucket_bytes, overheads, steady_state, usable_bytes
from .checkpointing import plot_breakdowns
from .cost import ElementwiseBytes, SaveOnCpuMeter, card, pareto
from .fit_model import (
    FitError,
    activation_modules,
    blocks,
    build_model,
    explain_failure,
    parse_shape,
    resolve_builder,
    variant,
)
from .memory import mib, predict_step, prime_optimizer
from .parallel.fsdp import fsdp_rank_memory
from .train import training_step

#: the losses the CLI knows, by name; from Python ``loss=`` also takes a callable(logits, target)
LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "cross_entropy": F.cross_entropy,
    "mse": F.mse_loss,
    "bce": F.binary_cross_entropy_with_logits,
}
RANKS = (2, 4, 8)
TECHNIQUES = ("autocast-fp16", "autocast-bf16", "inplace", "checkpoint-blocks", "selective", "offload",
              *(f"ddp-{n}" for n in RANKS), *(f"fsdp-{n}" for n in RANKS))
BASELINE = "none (fp32)"
_AUTOCAST = {"autocast-fp16": torch.float16, "autocast-bf16": torch.bfloat16}
_PRECISION = {"autocast-fp16": "autocast_fp16", "autocast-bf16": "autocast_bf16"}  # cost.Card.flops keys
#: the bar categories (MemTracker's) and the names ``FitReport.breakdown`` gives them
_RENAME = {"Temp": "Temporary"}
def _gpus(tech: str) -> int:
    """N of ``ddp-N`` / ``fsdp-N``; 1 for a one-GPU technique."""
    return int(tech.split("-")[1]) if tech.startswith(("ddp-", "fsdp-")) else 1


# --------------------------------------------------------------------------------------------
# The loss
# --------------------------------------------------------------------------------------------
def _loss_fn(loss: str | Callable) -> tuple[str, Callable]:
    if callable(loss):
        return getattr(loss, "__name__", "custom"), loss
    if loss not in LOSSES:
        raise FitError(f"unknown loss {loss!r}: known are {', '.join(LOSSES)}. Fix: pick one of them, or from "
                       "Python pass a callable, fit.fit(..., loss=my_loss, target_shape=..., n_classes=...).")
    return loss, LOSSES[loss]


# --------------------------------------------------------------------------------------------
# The step: target, loss, cost
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepSpec:
    """The training step ``fit`` predicts: input and target per sample, the loss."""

    sample_shape: tuple[int, ...]  # the input without its batch dim
    target_sample: tuple[int, ...]  # the target without its batch dim
    n_classes: int | None  # class-index targets (None: float targets)
    loss_name: str
    loss_fn: Callable = field(repr=False)
    output_shape: tuple[int, ...] = ()  # the model's output at the given batch

    def input_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.sample_shape)

    def target_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.target_sample)


def _probe(build: Callable[[], nn.Module], input_shape: tuple[int, ...], loss: str | Callable,
           target_shape: Sequence[int] | None, n_classes: int | None) -> tuple[StepSpec, dict[str, Any]]:
    """Build the model and run its forward and the loss once on fake tensors: the output's
    shape decides the target; any failure becomes a FitError that names the fix."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    loss_name, loss_fn = _loss_fn(loss)
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
        x = torch.randn(input_shape)
        try:
            with torch.no_grad():
                out = model(x)
        except Exception as e:
            raise explain_failure(e, "the model's forward", input_shape) from e
        if not isinstance(out, torch.Tensor):
            raise FitError(f"the model returns a {type(out).__name__}, not one tensor. Fix: wrap it so that forward "
                           "returns the logits the loss takes (e.g. `lambda: Wrapped(net)` taking out['out']).")
        out_shape = tuple(out.shape)
        classify = n_classes is not None or (loss_name == "cross_entropy" and loss_fn is F.cross_entropy)
        if classify:
            if len(out_shape) < 2:
                raise FitError(f"{loss_name} needs logits of shape (batch, classes, ...), the model returns "
                               f"{out_shape}. Fix: use --loss mse or bce for one output per sample, or give the "
                               "model a class dimension.")
            if n_classes is not None and n_classes != out_shape[1]:
                raise FitError(f"--classes {n_classes} but the model's output {out_shape} has {out_shape[1]} "
                               f"classes in dim 1. Fix: --classes {out_shape[1]} (or leave it out).")
            n_classes = out_shape[1]
            want = (out_shape[0], *out_shape[2:])
        else:
            want = out_shape
        tgt = tuple(target_shape) if target_shape is not None else want
        if tgt != want:
            kind = "class indices (the output without its class dim)" if classify else "the output's shape"
            raise FitError(f"target shape {tgt} does not match the model's output {out_shape} for {loss_name}: "
                           f"it needs {kind}, {want}. Fix: --target-shape {','.join(map(str, want))} (or leave "
                           "it out)" + ("" if classify else ", or use --loss cross_entropy for class labels") + ".")
        y = torch.randint(0, n_classes, tgt) if classify else torch.randn(tgt)
        try:
            loss_fn(torch.randn(out_shape, requires_grad=True), y).backward()
        except Exception as e:
            raise FitError(f"the loss {loss_name} refuses the model's output {out_shape} with a target {tgt} "
                           f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Fix: pick the loss "
                           "that matches the output (--loss cross_entropy|mse|bce), or pass --target-shape.") from e
    spec = StepSpec(input_shape[1:], tgt[1:], n_classes if classify else None, loss_name, loss_fn, out_shape)
    return spec, info


@dataclass(frozen=True)
class StepCost:
    """What ``step_cost`` counted in one training step: FLOPs, element-wise bytes, and the bytes
    offload would copy to the host."""

    flops: int  # FlopCounterMode: convolutions and matrix products, recomputation included
    elementwise_bytes: int  # cost.ElementwiseBytes: what the other ops read and write
    packed_bytes: int  # what save_on_cpu would copy to the host in forward (offload)


def step_cost(build: Callable[[], nn.Module], spec: StepSpec, batch: int,
              autocast_dtype: torch.dtype | None = None, count_packed: bool = False) -> StepCost:
    """One steady-state training step (Adam, foreach, CUDA's autocast rules) on fake tensors,
    counted: FLOPs, element-wise bytes and (``count_packed``) what offload would copy."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    meter, counter = SaveOnCpuMeter(), ElementwiseBytes()
    with FakeTensorMode(), autocast_rules("cuda" if autocast_dtype else None):
        model = build_model(build)
        x = torch.randn(spec.input_shape(batch))
        y = (torch.randint(0, spec.n_classes, spec.target_shape(batch)) if spec.n_classes
             else torch.randn(spec.target_shape(batch)))
        opt = torch.optim.Adam(model.parameters(), foreach=True)
        prime_optimizer(model, opt)
        if count_packed:
            forward = model.forward

            def metered(*args: Any, **kwargs: Any) -> Any:
                with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
                    return forward(*args, **kwargs)

            model.forward = metered
        with FlopCounterMode(display=False) as flops, counter:
            training_step(model, x, y, opt, loss_fn=spec.loss_fn, autocast_dtype=autocast_dtype)
        del model, x, y, opt
    return StepCost(int(flops.get_total_flops()), counter.total, meter.total)


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------
@dataclass
class Row:
    """One technique in ``fit``'s table: the predicted peak and what the card needs (bytes per GPU),
    whether it fits, the largest global batch and the estimated seconds per step."""

    technique: str
    peak: int  # predicted max_memory_allocated per GPU at the given batch
    breakdown: dict[str, int]  # MemTracker categories at the peak (per GPU)
    card_needs: int
    fits: bool
    largest_batch: int  # global batch
    seconds: float  # estimated per step at the given batch
    note: str = ""
    verified: bool = True
    gpus: int = 1  # ddp-N / fsdp-N: N (time is then the wall time of a step on N GPUs)


def _main_parts(b: dict[str, int]) -> dict[str, int]:
    return {_RENAME.get(k, k): v for k, v in b.items()}


@dataclass
class FitReport:
    """What ``fit`` found; ``summary()`` in words, ``table`` / ``by_module`` as DataFrames."""

    name: str
    input_shape: tuple[int, ...]
    card_gib: float
    prediction: Any  # memory.Prediction of the plain step
    spec: StepSpec
    rows: list[Row]
    skipped: dict[str, str]
    by_module: Any  # pandas DataFrame
    usable: int  # bytes: the largest predicted peak the card holds
    overheads: Any  # budget.Overheads
    time_assumption: str
    blocks: list[tuple[str, int]]

    @property
    def parameters(self) -> int:
        return self.prediction.parameters

    @property
    def breakdown(self) -> dict[str, int]:
        """The plain step's peak by category (bytes): Parameter, Buffer, Gradient, Optstate,
        Activation, Temporary, Other (the input and target), Total."""
        return _main_parts(steady_state(self.prediction.breakdown))

    @property
    def peak_module(self) -> str:
        """The innermost module running at the peak, or "(loss)" / "(optimizer)" outside the model."""
        return _where(self.prediction)[0]

    @property
    def peak_phase(self) -> str:
        """"forward", "backward" or "optimizer" (the optimizer step and anything after backward)."""
        return _where(self.prediction)[1]

    @property
    def table(self):
        import pandas as pd

        base = self.rows[0].seconds
        gib = 2**30
        return pd.DataFrame([{
            "technique": r.technique, "peak MiB": round(r.peak / 2**20, 1),
            "card needs GiB": round(r.card_needs / gib, 2), "fits": r.fits,
            f"largest batch in {self.card_gib:g} GiB": r.largest_batch,
            "time x baseline": round(r.seconds / base, 2), "note": r.note} for r in self.rows])

    def summary(self) -> str:
        b, p = self.breakdown, self.prediction
        lines = [f"{self.name}: input {tuple(self.input_shape)}, {self.parameters:,} parameters, "
                 f"loss {self.spec.loss_name} -> output {self.spec.output_shape}",
                 f"baseline: {p.method}",
                 f"  peak {mib(p.peak):,.1f} MiB = " + ", ".join(
                     f"{k} {mib(v):,.1f}" for k, v in b.items() if k != "Total" and v),
                 f"  the peak is in {self.peak_module} ({self.peak_phase})",
                 f"card: {self.card_gib:g} GiB holds a predicted peak of {mib(self.usable):,.0f} MiB "
                 f"({self.overheads.source})", "",
                 "saved for backward, by top-level module:"]
        lines += ["  " + s for s in self.by_module.to_string(index=False).splitlines()]
        lines += ["", f"techniques (one at a time on the fp32 step; {self.time_assumption}):"]
        with _pandas_wide():
            lines += ["  " + s for s in self.table.to_string(index=False).splitlines()]
        if self.skipped:
            lines += ["", "not applicable:"] + [f"  {k}: {v}" for k, v in self.skipped.items()]
        lines += ["", "memory-time frontier on one GPU (no other one-GPU row is both smaller and faster):"]
        for r, front in zip(self.rows, self._front(), strict=True):
            if front:
                lines.append(f"  {r.technique}: card needs {r.card_needs / 2**30:.2f} GiB, "
                             f"time x{r.seconds / self.rows[0].seconds:.2f}")
        return "\n".join(lines)

    def _front(self) -> list[bool]:
        one = [r for r in self.rows if r.gpus == 1]
        front = dict(zip((r.technique for r in one), pareto([(r.seconds, r.card_needs) for r in one]), strict=True))
        return [front.get(r.technique, False) for r in self.rows]

    def plot(self, ax=None):
        """Stacked bars per technique (per GPU at the peak), the card's usable line."""
        ax = plot_breakdowns({r.technique: r.breakdown for r in self.rows}, ax=ax,
                             title=f"{self.name}, batch {self.input_shape[0]}: predicted peak per GPU",
                             budget_mib=self.usable / 2**20,
                             budget_label=f"{self.card_gib:g} GiB card: usable (context + slack off)")
        return ax

    def plot_frontier(self, ax=None):
        """Card needs against estimated time per step (x baseline); the Pareto front of the one-GPU
        techniques joined (ddp-N / fsdp-N, triangles, spend N GPUs: not on the same footing)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 4))
        base = self.rows[0].seconds
        front = self._front()
        pts = [(r.seconds / base, r.card_needs / 2**30, r, f) for r, f in zip(self.rows, front, strict=True)]
        for t, m, r, f in pts:
            ax.scatter(t, m, color="C3" if f else "grey", marker="o" if r.gpus == 1 else "^", zorder=3)
            ax.annotate(r.technique, (t, m), fontsize=7, xytext=(4, 3), textcoords="offset points")
        fp = sorted((t, m) for t, m, _, f in pts if f)
        ax.plot([t for t, _ in fp], [m for _, m in fp], "--", color="C3", label="Pareto front (one GPU)")
        ax.scatter([], [], marker="^", color="grey", label="N GPUs (time: a step on all N)")
        ax.axhline(self.card_gib, color="black", lw=1, ls=":", label=f"{self.card_gib:g} GiB card")
        ax.set_xlabel("estimated time per step / baseline (" + self.time_assumption.split(":")[0] + ")")
        ax.set_ylabel("card needs, GiB per GPU (predicted)")
        ax.legend(fontsize=8)
        return ax


@contextlib.contextmanager
def _pandas_wide():
    import pandas as pd

    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 80):
        yield


def _by_module(prediction) -> Any:
    """Saved-for-backward bytes each top-level module adds during its forward (the saved-tensor
    meter, each storage counted once, at the first module that saves it)."""
    import pandas as pd

    rows = prediction.log.rows
    start: dict[int, int] = {}
    out: dict[str, int] = {}
    root = None
    for r in rows:
        if r.hook == "pre":
            start[r.call] = r.saved
        elif r.hook == "fwd" and r.call in start:
            delta = r.saved - start.pop(r.call)
            if r.call == 0:
                root = delta if root is None else root
            elif "." not in r.module:
                out[r.module] = out.get(r.module, 0) + delta
    total = root if root is not None else sum(out.values())
    rest = total - sum(out.values())
    if rest > 0:
        out["(the root's own forward)"] = rest
    df = pd.DataFrame([{"module": k, "saved MiB": round(v / 2**20, 2), "share %": round(100 * v / total, 1)
                        if total else 0.0, "saved bytes": v} for k, v in out.items()])
    return df


class _Fitter:
    """One report's predictions and counts, each made once (cached per technique and batch)."""

    def __init__(self, build: Callable[[], nn.Module], spec: StepSpec, card_gib: float, time_card: Any):
        self.build, self.spec, self.card_gib = build, spec, card_gib
        self.over = overheads()
        self.usable = usable_bytes(card_gib)
        self.gpu = card(time_card)
        self._preds: dict[tuple[str, int], Any] = {}
        self._costs: dict[tuple[str, int], StepCost] = {}

    def predict(self, key: str, batch: int):
        if (key, batch) not in self._preds:
            s = self.spec
            self._preds[key, batch] = predict_step(
                variant(self.build, key), s.input_shape(batch), s.target_shape(batch), loss_fn=s.loss_fn,
                n_classes=s.n_classes, autocast_dtype=_AUTOCAST.get(key), module_peaks=False)
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

    def largest(self, peak: Callable[[int], int], fixed: int, per_sample: float, exact: bool,
                start: tuple[int, int]) -> tuple[int, bool]:
        """The largest batch with peak(b) <= usable: the affine guess, verified by one prediction;
        ``exact``: searched until peak(b) fits and peak(b + 1) does not. Returns (batch, verified)."""
        budget = self.usable
        if per_sample <= 0:
            raise FitError("the prediction does not grow with the batch: cannot size a batch")
        guess = max(1, int((budget - fixed) // per_sample))
        lo, hi = 0, None  # fits at lo (0: nothing known), not at hi
        points = [start]
        for _ in range(40 if exact else 2):
            pg = peak(guess)
            points.append((guess, pg))
            if pg <= budget:
                lo = max(lo, guess)
                if not exact:
                    return lo, True
            else:
                hi = guess if hi is None else min(hi, guess)
            if hi is not None and hi == lo + 1:
                return lo, True
            if hi == 1:
                return 0, True
            # next guess: the line through the two nearest points, kept inside (lo, hi)
            (b1, p1), (b2, p2) = sorted(points, key=lambda bp: abs(bp[0] - guess))[:2]
            slope = (p2 - p1) / (b2 - b1) if b2 != b1 else per_sample
            slope = slope if slope > 0 else per_sample
            nxt = int(guess + (budget - pg) // slope)
            top = hi - 1 if hi is not None else max(nxt, lo + 1)
            nxt = min(max(nxt, lo + 1), top)
            if hi is not None and nxt == guess:
                nxt = (lo + hi) // 2 if (lo + hi) // 2 > lo else lo + 1
            if nxt == guess:
                nxt = guess + 1
            guess = nxt
        return lo, False


def _where(prediction) -> tuple[str, str]:
    """``MemoryLog.peak_location`` with its phase "optimizer/other" called "optimizer"."""
    module, phase = prediction.log.peak_location
    return module, "optimizer" if phase.startswith("optimizer") else phase


def _fixed_and_per_sample(prediction, batch: int) -> tuple[int, float]:
    """The prediction's bytes that do not grow with the batch, and the bytes each sample adds."""
    bm = batch_model(prediction, batch)
    return bm.fixed, bm.per_sample


def fit(build: Callable[[], nn.Module] | str, input_shape: Sequence[int] | str = (8, 1, 512, 512), *,
        card_gib: float = 8.0, loss: str | Callable = "cross_entropy", target_shape: Sequence[int] | None = None,
        n_classes: int | None = None, techniques: Sequence[str] | str | None = None,
        time_card: Any = None) -> FitReport:
    """Predict the training step of ``build()``'s model at ``input_shape`` (batch first) and the
    same step under each of ``techniques`` (default: all, ``TECHNIQUES``) for a card of
    ``card_gib`` GiB. ``loss``: a name of ``LOSSES`` or a callable(logits, target); the target
    is class indices (cross-entropy, or ``n_classes`` given) of the output's shape without its
    class dim, else floats of the output's shape, unless ``target_shape`` says otherwise.
    ``time_card``: the card the time estimates assume (``cost.card``). See the module's
    docstring for the method and its limits."""
    name = build if isinstance(build, str) else getattr(build, "__name__", type(build).__name__)
    build = resolve_builder(build)
    input_shape = parse_shape(input_shape)
    if not card_gib or card_gib <= 0:
        raise FitError(f"card size {card_gib!r} GiB: must be > 0. Fix: e.g. --card 8 for an 8 GB card.")
    techniques = _techniques(techniques)
    spec, info = _probe(build, input_shape, loss, target_shape, n_classes)
    f = _Fitter(build, spec, card_gib, time_card)
    batch = input_shape[0]
    try:
        base = f.predict("baseline", batch)
    except FitError:
        raise
    except Exception as e:
        raise explain_failure(e, "the training step", input_shape) from e

    rows: list[Row] = []
    skipped: dict[str, str] = {}

    def row(tech: str, peak: int, breakdown: dict[str, int], largest: tuple[int, bool], seconds: float,
            note: str = "") -> None:
        needs = int(f.over.needed(peak))
        lb, ok = largest
        gpus = _gpus(tech)
        rows.append(Row(tech, peak, breakdown, needs, needs <= card_gib * 2**30, lb, seconds,
                        note + ("" if ok else ("; " if note else "") + "largest batch: affine estimate, unverified"),
                        ok, gpus))

    fixed, per = _fixed_and_per_sample(base, batch)
    row(BASELINE, base.peak, base.breakdown,
        f.largest(lambda b: f.predict("baseline", b).peak, fixed, per, True, (batch, base.peak)),
        f.seconds("baseline", batch), "peak in {} ({})".format(*_where(base)))

    for tech in techniques:
        try:
            reason = _why_not_applicable(tech, info, batch)
            if reason:
                skipped[tech] = reason
                continue
            if tech.startswith(("ddp-", "fsdp-")):
                _parallel_row(f, tech, info, batch, row)
                continue
            p = f.predict(tech, batch)
            fx, ps = _fixed_and_per_sample(p, batch)
            lb = f.largest(lambda b, t=tech: f.predict(t, b).peak, fx, ps, False, (batch, p.peak))
            moved = f.cost("offload", batch).packed_bytes if tech == "offload" else 0
            same = abs(p.peak - base.peak) <= 0.005 * base.peak
            note = {"offload": f"{moved / 2**20:,.0f} MiB to the host and back over PCIe per step",
                    "inplace": f"{len(info['activations_off'])} activation modules switched"
                    + ("; peak unchanged: the tensors they overwrite were not kept for backward anyway"
                       if same else ""),
                    "checkpoint-blocks": f"{len(info['blocks'])} blocks recomputed in backward",
                    "selective": f"{len(info['blocks'])} blocks; conv/matmul outputs kept"}.get(tech, "")
            key = "baseline" if tech in ("inplace", "offload") else tech
            row(tech, p.peak, p.breakdown, lb, f.seconds(key, batch, moved), note)
        except FitError:
            raise
        except Exception as e:  # a technique this model does not support (e.g. in-place breaks autograd)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            skipped[tech] = f"failed on this model: {type(e).__name__}: {first[:200]}"

    g = f.gpu
    assumption = (f"time estimated for a {g.name}: counted FLOPs at {g.fp32_flops / 1e12:.1f} TFLOP/s fp32, "
                  f"{g.fp16_flops / 1e12:.1f} fp16, {g.bf16_flops / 1e12:.1f} bf16, element-wise bytes at "
                  f"{g.memory_bytes_per_s / 1e9:.0f} GB/s, PCIe at {g.pcie_bytes_per_s / 1e9:.2f} GB/s; spec-sheet "
                  f"peaks, not overlapped; communication between GPUs not counted (source: {g.source})")
    return FitReport(name, input_shape, card_gib, base, spec, rows, skipped, _by_module(base), f.usable, f.over,
                     assumption, info["blocks"])


def _techniques(techniques: Sequence[str] | str | None) -> list[str]:
    if techniques is None:
        return list(TECHNIQUES)
    if isinstance(techniques, str):
        techniques = [t.strip() for t in techniques.split(",") if t.strip()]
    unknown = [t for t in techniques if t not in TECHNIQUES]
    if unknown:
        raise FitError(f"unknown technique(s) {', '.join(unknown)}. Fix: pick from {', '.join(TECHNIQUES)}.")
    return list(dict.fromkeys(techniques))


def _why_not_applicable(tech: str, info: dict[str, Any], batch: int) -> str:
    """Why ``tech`` does not apply to this model and batch ('' if it does)."""
    if tech == "inplace":
        if not info["activations"]:
            return ("no in-place-capable activation module (ReLU, LeakyReLU, ELU, SiLU, ...); functional "
                    "activations in forward (F.relu, F.gelu) cannot be switched from outside")
        if not info["activations_off"]:
            return f"every activation module is already in-place ({len(info['activations'])})"
    if tech in ("checkpoint-blocks", "selective") and not info["blocks"]:
        return ("no block to checkpoint: the top-level children are single layers. Group them into "
                "nn.Sequential blocks (or checkpoint inside your forward)")
    if tech.startswith(("ddp-", "fsdp-")):
        n = _gpus(tech)
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

        lb, ok = f.largest(peak, fx + buckets, ps, False, (local, p.peak + buckets))
        row(tech, p.peak + buckets, b, (lb * n, ok), seconds,
            f"{local}/GPU on {n} GPUs; + {buckets / 2**20:,.1f} MiB DDP buckets")
        return

    with FakeTensorMode():
        net = build_model(f.build)
        units = [m for _, m in blocks(net) if any(True for _ in m.parameters())]
        mem = fsdp_rank_memory(net, units, n, bytes_per_value=4)
        n_units = len(units)
        del net, units
    resting = int(mem["resting"]) + b["Buffer"]
    state = int(mem["working"]) + b["Buffer"]  # optimizer shard + params and grads at the worst moment
    work = {"Parameter": int(mem["rest params"] + mem["gathered params"] + mem["prefetched params"]),
            "Buffer": b["Buffer"],
            "Gradient": int(mem["unsharded grads"] + mem["reduced grads"] + mem["reduce-scatter input"]),
            "Optstate": int(mem["rest optimizer"])}
    rest_of = {k: b[k] for k in ("Activation", "Temp", "Other")}

    def peak(bb: int) -> int:
        q = f.predict("baseline", bb).breakdown
        return state + q["Activation"] + q["Temp"] + q["Other"]

    lb, ok = f.largest(peak, state, ps, False, (local, state + sum(rest_of.values())))
    row(tech, state + sum(rest_of.values()), {**work, **rest_of}, (lb * n, ok), seconds,
        f"{local}/GPU on {n} GPUs, {n_units} units; resting {resting / 2**20:,.0f} MiB/GPU, working state "
        f"{state / 2**20:,.0f} MiB + activations of batch {local} (upper bound)")


def largest_batch(build: Callable[[], nn.Module] | str, input_shape: Sequence[int] | str, card_gib: float = 8.0, *,
                  loss: str | Callable = "cross_entropy", target_shape: Sequence[int] | None = None,
                  n_classes: int | None = None) -> int:
    """The largest batch whose plain step (fp32, Adam, steady state) fits a ``card_gib`` card:
    predicted peak(b) <= ``budget.usable_bytes(card_gib)`` and peak(b + 1) is not. The batch of
    ``input_shape`` is where the affine model starts; predictions at the guess (and b + 1) verify it."""
    rep = fit(build, input_shape, card_gib=card_gib, loss=loss, target_shape=target_shape,
              n_classes=n_classes, techniques=[])
    return rep.rows[0].largest_batch


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_utils.fit MODULE:BUILDER --input 8,1,512,512 --card 8``: prints the
    summary, returns 0; a one-line error that names the fix and 2 for bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.fit",
        description="Predict the GPU memory of your network's training step, and what each technique of the "
                    "course changes (on fake tensors: no GPU needed).")
    parser.add_argument("builder", help="MODULE:BUILDER, a function returning the nn.Module "
                                        "(e.g. course_utils.fit_examples:resnet18_2d)")
    parser.add_argument("--input", required=True, help="input shape, batch first: e.g. 8,1,512,512")
    parser.add_argument("--card", type=float, default=8.0, help="card memory in GiB (default 8)")
    parser.add_argument("--loss", default="cross_entropy", help=f"one of {', '.join(LOSSES)}")
    parser.add_argument("--classes", type=int, default=None, help="number of classes (checked against the output)")
    parser.add_argument("--target-shape", default=None, help="target shape, batch first (default: from the output)")
    parser.add_argument("--techniques", default=None, help=f"comma-separated subset of {', '.join(TECHNIQUES)}")
    parser.add_argument("--time-card", default=None, help="the card time is estimated for (cost.CARDS)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        rep = fit(args.builder, args.input, card_gib=args.card, loss=args.loss, n_classes=args.classes,
                  target_shape=args.target_shape, techniques=args.techniques, time_card=args.time_card)
    except ValueError as e:  # a FitError, or e.g. an unknown --time-card (cost.card names the choices)
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(rep.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
