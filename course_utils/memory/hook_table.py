"""Seed 000's hook table: ``MemoryLog`` (PyTorch's ``MemTracker`` with one row per module event,
saved-for-backward bytes beside it, the CUDA allocator's figures on a GPU) and ``log_step`` (one
training step under the log).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor import DTensor

from ..checks import MeasureError, guard
from ..loops import Loop, optimizers_of
from ..train import require_data, training_step
from .meters import SavedTensorMeter
from .units import mib

#: MemTracker's categories, in the order the course stacks them in plots.
CATEGORIES = ("Parameter", "Buffer", "Gradient", "Optstate", "Activation", "Temp", "Other")


@dataclass
class Row:
    """One module event of ``MemoryLog``: which module and hook, the live tensor bytes MemTracker
    counts, the saved-for-backward bytes, and the CUDA allocator's figures on a GPU."""

    event: int
    call: int
    module: str
    layer_type: str
    hook: str  # pre | fwd | bwd_pre | bwd
    tracked: int  # live tensor bytes (MemTracker)
    saved: int  # saved-for-backward bytes
    cuda_allocated: int | None  # torch.cuda.memory_allocated(), None on CPU
    cuda_reserved: int | None  # torch.cuda.memory_reserved(), None on CPU


#: what ``MemoryLog.peak_location`` names when the peak falls outside every module: the loss (its
#: forward, or autograd differentiating it before the model's first backward hook) or the optimizer
#: step (and anything else after the backward pass)
LOSS = "(loss)"
OPTIMIZER = "(optimizer)"

#: ops that return no tensor and allocate nothing: MemTracker's bookkeeping after each op (track
#: its outputs, update the peaks) cannot change a figure after them. Under fake tensors
#: ``prim.device`` is most of a step's ops -- autograd asks the device of every gradient, a foreach
#: optimizer the device of every parameter: 11,384 of the 19,160 ops of DenseNet-169's step --
#: and ``MemoryLog`` (with ``module_peaks=False``) passes them straight on: a prediction costs
#: ~10 % less CPU, with the same figures (tests/test_memory.py)
_NO_MEMORY_OPS = frozenset({torch.ops.prim.device.default})

#: the CUDA caching allocator hands out blocks in multiples of 512 bytes
CUDA_BLOCK_ROUNDING = 512


@contextlib.contextmanager
def _cuda_block_rounding(enabled: bool) -> Iterator[None]:
    """Count each fake/CPU storage as the CUDA allocator would: rounded up to 512 bytes
    (MemTracker does this only for tensors that really are on a CUDA device)."""
    if not enabled:
        yield
        return
    from torch.distributed._tools import mem_tracker as mt

    original = mt._WeakRefInfo._calculate_mem_consumed

    def rounded(self) -> int:
        mem = self.size * self.element_size
        return -(-mem // CUDA_BLOCK_ROUNDING) * CUDA_BLOCK_ROUNDING

    mt._WeakRefInfo._calculate_mem_consumed = rounded
    try:
        yield
    finally:
        mt._WeakRefInfo._calculate_mem_consumed = original


class _NoHook:
    """A hook handle with nothing to remove (a frozen parameter's, see ``MemoryLog._pre_fw_hook``)."""

    def remove(self) -> None:
        """Nothing was registered."""


_NO_HOOK = _NoHook()


class MemoryLog(MemTracker):
    """Seed 000's per-layer memory table, from PyTorch's ``MemTracker``.

    Use it like ``MemTracker``: ``track_external`` what was created before, then run one
    training step inside ``with``. ``log.rows`` has one ``Row`` per module event;
    ``log.frame()`` is the table in MiB; ``log.plot()`` the timeline; ``log.after_forward`` the
    bytes per category at the end of the model's forward pass.

    ``MemTracker`` is a private PyTorch API: ``tests/test_memory.py`` pins the parts used here so
    that an upgrade that changes them fails loudly.

    Why the log removes hooks on exit: MemTracker's ``ModTracker`` registers a multi-grad hook on
    each module's inputs and drops the handle; the hook's closure refers to the graph node it is
    attached to, a reference cycle through C++ that Python's garbage collector cannot break, and
    the node reaches the model's parameters. Without the removal, every tracked model (and its
    gradients) stays alive after ``del model`` -- gigabytes on a GPU. (``tests/test_memory.py``
    checks with weak references.)
    """

    def __init__(self, model: nn.Module | None = None, cuda: bool | None = None,
                 module_peaks: bool = True, round_like_cuda: bool | None = None):
        super().__init__()
        self.module_peaks = module_peaks
        self.rows: list[Row] = []
        self._calls: dict[int, int] = {}
        self._n_calls = 0
        self._root: int | None = None
        self.after_forward: dict[str, int] | None = None
        params = list(model.parameters()) if model is not None else []
        self.saved = SavedTensorMeter(params)
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        # real CUDA tensors are rounded by MemTracker itself
        self.round_like_cuda = bool(round_like_cuda) and not self.cuda
        self._grad_hooks: list[Any] = []
        self._restore: list[Callable[[], None]] = []
        self._peak_at: tuple[str, str] = ("(nothing tracked)", "")
        self.peak_event: int = 0
        # before forward -> forward (the root module's) -> loss -> after backward
        self._stage = "before forward"

    def track_external(self, *external: Any) -> None:
        with _cuda_block_rounding(self.round_like_cuda):
            super().track_external(*external)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # the per-module peaks (module_peaks=True) are MemTracker's own, left as they are; DTensor
        # ops go to MemTracker, which hands them back to DTensor first
        if func in _NO_MEMORY_OPS and not self.module_peaks and DTensor not in types:
            self._advance_stage()
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _advance_stage(self) -> None:
        # after every op: the stage moves on when autograd's backward starts and ends
        if self._mod_tracker.is_bw:
            self._stage = "backward"
        elif self._stage == "backward":
            self._stage = "after backward"

    def _update_peak_stats(self, peak_state) -> None:
        self._advance_stage()
        before = sum(self._peak_mem.values())
        if self.module_peaks:
            super()._update_peak_stats(peak_state)
        else:
            # only the global peak: MemTracker's per-module loop runs over every module on every
            # op, and is most of its cost; the explorer needs the global figure alone
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = dict(snap)
        if sum(self._peak_mem.values()) > before:
            self._peak_at = (self._running_module(), self._phase())
            self.peak_event = len(self.rows)

    def _phase(self) -> str:
        if self._stage == "backward":
            return "backward"
        return "forward" if self._stage in ("forward", "loss") and not self._in_opt else "optimizer/other"

    def _running_module(self) -> str:
        """The innermost module whose forward or backward is running; when none is (outside the
        model: the loss, the optimizer step), what runs instead, in brackets."""
        parents = [p for p in self._mod_tracker.parents if p != "Global"]
        if parents:
            name = max(parents, key=lambda p: p.count("."))
            return name.split(".", 1)[1] if "." in name else name
        if self._in_opt:
            return OPTIMIZER
        if self._stage == "backward":
            # no module's backward hook has fired yet in this backward: autograd is
            # differentiating the loss (the model's root module becomes a parent as soon as the
            # gradient of its output is ready)
            return LOSS
        return {"before forward": "(before forward)", "forward": "(model forward)", "loss": LOSS,
                "after backward": OPTIMIZER}[self._stage]

    @property
    def peak_location(self) -> tuple[str, str]:
        """Where the step's peak (``self.peak``) is: ``(module, phase)`` at the moment the live
        bytes reached their maximum -- the course's one definition of "where the peak is".

        ``module`` is the innermost module whose forward or backward was running (a
        checkpointed module's recomputation during backward included), or, outside the model,
        ``"(loss)"`` (the loss and its gradient) or ``"(optimizer)"`` (the optimizer step,
        zero_grad). ``phase`` is ``"forward"`` (the model's forward and the loss), ``"backward"``
        (from ``loss.backward()`` on: the loss's gradient, every module's backward,
        recomputation) or ``"optimizer/other"``.

        The hook table (``rows``) samples the live bytes only when a module hook fires; the peak
        can fall between two rows (inside an op, e.g. while a ReLU's backward allocates its
        gradient, or in the loss), so the row with the most live bytes can be lower than
        ``peak`` and name another module. ``peak_event`` is the number of rows recorded before
        the peak (the peak lies between rows ``peak_event - 1`` and ``peak_event``)."""
        return self._peak_at

    # -- MemTracker's module hooks, extended with a row each ---------------------------------
    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        if module not in self.memory_tracking:
            # MemTracker hooks every parameter's gradient; torch refuses a hook on a frozen one
            # (requires_grad=False: fine-tuning, frozen BatchNorm, LoRA), which has no gradient
            # to track: a handle that does nothing stands in for its hooks
            for p in module.parameters():
                if not p.requires_grad and p not in self._param_to_grad_hook_handles:
                    self._param_to_grad_hook_handles[p] = (_NO_HOOK, _NO_HOOK)
        if id(module) == self._root and module in self.memory_tracking and not self._mod_tracker.is_bw:
            # the root's second forward: a new micro-batch (gradient accumulation). MemTracker keeps
            # per-module stats for one iteration only; the global peak and the rows go on
            self.reset_mod_stats()
        super()._pre_fw_hook(module, inputs)
        if not self._mod_tracker.is_bw:  # not a recomputation under checkpointing
            if self._root is None:
                self._root = id(module)
            if id(module) == self._root:
                self._stage = "forward"
            self._calls[id(module)] = self._n_calls
            self._n_calls += 1
        self._record(module, "pre")

    def _post_fw_hook(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
        super()._post_fw_hook(module, inputs, outputs)
        if id(module) == self._root and not self._mod_tracker.is_bw:
            self.after_forward = self._snapshot_total("current")
            self._stage = "loss"
        self._record(module, "fwd")

    def _pre_bw_hook(self, module: nn.Module, args: Any) -> None:
        super()._pre_bw_hook(module, args)
        self._record(module, "bwd_pre")

    def _post_bw_hook(self, module: nn.Module, args: Any) -> None:
        super()._post_bw_hook(module, args)
        self._record(module, "bwd")

    def _record(self, module: nn.Module | None, hook: str) -> None:
        if module is None:
            return
        name = self._mod_tracker.get_known_fqn(module) or type(module).__name__
        if "." in name:
            name = name.split(".", 1)[1]
        self.rows.append(Row(
            event=len(self.rows),
            call=self._calls.get(id(module), -1),
            module=name,
            layer_type=type(module).__name__,
            hook=hook,
            tracked=self.current_total(),
            saved=self.saved.current,
            cuda_allocated=torch.cuda.memory_allocated() if self.cuda else None,
            cuda_reserved=torch.cuda.memory_reserved() if self.cuda else None,
        ))

    # -- entering also starts the saved-tensor meter; leaving drops every hook ----------------
    def __enter__(self) -> "MemoryLog":
        from torch.distributed._tools import mod_tracker

        register = mod_tracker.register_multi_grad_hook

        def recording(*args: Any, **kwargs: Any):
            handle = register(*args, **kwargs)
            self._grad_hooks.append(handle)
            return handle

        mod_tracker.register_multi_grad_hook = recording
        self._restore.append(lambda: setattr(mod_tracker, "register_multi_grad_hook", register))
        rounding = _cuda_block_rounding(self.round_like_cuda)
        rounding.__enter__()
        self._restore.append(lambda: rounding.__exit__(None, None, None))
        super().__enter__()
        self.saved.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        try:
            self.saved.__exit__(*args)
            super().__exit__(*args)
        finally:
            for handle in self._grad_hooks:
                handle.remove()
            self._grad_hooks.clear()
            while self._restore:
                self._restore.pop()()

    # -- results ------------------------------------------------------------------------------
    def _snapshot_total(self, kind: str) -> dict[str, int]:
        out = {c: 0 for c in CATEGORIES}
        for dev_snap in self.get_tracker_snapshot(kind).values():
            for k, v in dev_snap.items():
                key = getattr(k, "value", k)
                if key in out:
                    out[key] += v
        out["Total"] = sum(out[c] for c in CATEGORIES)
        return out

    def current_total(self) -> int:
        return self._snapshot_total("current")["Total"]

    def breakdown(self, kind: str = "peak") -> dict[str, int]:
        """Bytes per category ("Parameter", "Gradient", "Optstate", "Activation", "Temp", ...)
        at the tracked ``peak`` or ``current`` moment, plus "Total"."""
        return self._snapshot_total(kind)

    @property
    def peak(self) -> int:
        """Peak live tensor bytes during the tracked step (MemTracker)."""
        return self.breakdown("peak")["Total"]

    def frame(self):
        """The hook table as a pandas DataFrame, memory in MiB."""
        import pandas as pd

        df = pd.DataFrame([r.__dict__ for r in self.rows])
        for col in ("tracked", "saved", "cuda_allocated", "cuda_reserved"):
            df[col + "_MiB"] = df[col].map(mib).round(2)
        cols = ["event", "call", "module", "layer_type", "hook", "tracked_MiB", "saved_MiB"]
        if self.cuda:
            cols += ["cuda_allocated_MiB", "cuda_reserved_MiB"]
        return df[cols]

    def per_module_saved(self, leaves_only: bool = True) -> dict[str, int]:
        """Saved-for-backward bytes each module added during its forward (fwd minus pre),
        summed over its calls. ``leaves_only`` drops containers (whose figure is the sum of
        their children's) so that the values add up to the step's total."""
        names = {r.module for r in self.rows if r.call > 0}
        parents = {n.rsplit(".", 1)[0] for n in names if "." in n}
        start: dict[int, int] = {}
        out: dict[str, int] = {}
        for r in self.rows:
            if r.hook == "pre":
                start[r.call] = r.saved
            elif r.hook == "fwd" and r.call in start:
                begin = start.pop(r.call)
                if leaves_only and (r.call == 0 or r.module in parents):
                    continue
                out[r.module] = out.get(r.module, 0) + r.saved - begin
        return out

    def saved_by(self, key: Callable[[str], str] | None = None):
        """``per_module_saved``'s bytes added up per ``key(module name)`` -- by default the
        module's layer type (``Conv3d``, ``ReLU``...); ``unet.place_of`` groups them by place in
        the U. A pandas Series, sorted by key."""
        import pandas as pd

        if key is None:
            key = {r.module: r.layer_type for r in self.rows}.get
        per_module = pd.Series(self.per_module_saved(), dtype="int64")
        return per_module.groupby(per_module.index.map(key)).sum()

    def plot(self, ax=None, title: str | None = None):
        """Timeline: tracked live bytes and saved bytes (and CUDA allocated/reserved) per event."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(10, 3.5))
        ev = [r.event for r in self.rows]
        ax.plot(ev, [mib(r.tracked) for r in self.rows], label="live tensors (MemTracker)")
        ax.plot(ev, [mib(r.saved) for r in self.rows], label="saved for backward")
        if self.cuda:
            ax.plot(ev, [mib(r.cuda_allocated) for r in self.rows], "--", label="cuda allocated")
            ax.plot(ev, [mib(r.cuda_reserved) for r in self.rows], ":", label="cuda reserved")
        bw = next((r.event for r in self.rows if r.hook.startswith("bwd")), None)
        if bw is not None:
            ax.axvspan(bw, ev[-1], color="grey", alpha=0.08, lw=0)
            ax.text(bw, 0.02, " backward", va="bottom", fontsize=8, transform=ax.get_xaxis_transform())
            ax.text(0, 0.02, " forward", va="bottom", fontsize=8, transform=ax.get_xaxis_transform())
        module, phase = self.peak_location
        ax.axhline(mib(self.peak), color="black", lw=0.8, ls="--")
        ax.text(0.99, mib(self.peak), f"peak {mib(self.peak):,.0f} MiB: {module} ({phase}) ",
                ha="right", va="bottom", fontsize=8, transform=ax.get_yaxis_transform())
        ax.set_xlabel("hook event (module pre/fwd, then bwd_pre/bwd)")
        ax.set_ylabel("MiB")
        ax.set_title(title or "memory over one training step")
        ax.set_ylim(0, mib(self.peak) * 1.12)
        ax.legend(fontsize=8, loc="center right")
        return ax


def _check_model_and_input(model: Any, x: Any) -> None:
    if not isinstance(model, nn.Module):
        raise MeasureError(
            f"expected an nn.Module, got {type(model).__name__}.",
            "pass the model itself (e.g. UNet3D(...)), not its output or its class.")
    if not isinstance(x, torch.Tensor):
        raise MeasureError(f"expected the input as a torch.Tensor, got {type(x).__name__}.",
                           "pass the batch as one tensor, e.g. torch.randn(2, 1, 64, 64, 64).")


def log_step(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor | None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
    optimizer: Any = None,  # a torch.optim.Optimizer, a loops.OptimizerInBackward, or None
    autocast_dtype: torch.dtype | None = None,
    module_peaks: bool = True,
    round_like_cuda: bool = False,
    loop: Loop | None = None,
) -> MemoryLog:
    """Run one ``training_step`` (zero_grad, forward + loss, backward, optimizer step) under a
    ``MemoryLog`` and return the log. Whatever exists before the step (parameters, gradients,
    optimizer state from earlier steps, the batch) is tracked as resident. ``loop``: that loop's
    step instead (``loops.Loop.run``, at most two micro-batches)."""
    _check_model_and_input(model, x)
    require_data(model, x, target, where="log_step")
    log = MemoryLog(model, cuda=x.device.type == "cuda", module_peaks=module_peaks,
                    round_like_cuda=round_like_cuda)
    log.track_external(*(t for t in (model, x, target) if t is not None), *optimizers_of(optimizer))
    with log, warnings.catch_warnings():
        if getattr(optimizer, "in_backward", False):
            # the optimizer's hook (registered first) has freed the gradient when MemTracker's own
            # post-accumulate-grad hook looks at it: that hook's warning about a None is expected
            warnings.filterwarnings("ignore", "Expected a tensor or a traceable wrapper-subclass", UserWarning)
        if loop is None:
            training_step(model, x, target, optimizer, loss_fn=loss_fn, autocast_dtype=autocast_dtype)
        else:
            loop.run(model, x, target, optimizer, loss_fn=loss_fn, autocast_dtype=autocast_dtype, micro_batches=2)
    return log


guard(globals(), MeasureError)
