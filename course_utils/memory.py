"""Measuring memory with PyTorch's own machinery.

Three instruments, each naming its method in what it prints:

* ``SavedTensorMeter`` -- *saved-for-backward bytes*: every tensor autograd stores for the backward
  pass goes through ``torch.autograd.graph.saved_tensors_hooks``; we count its storage once (views
  and in-place results share a storage) and release it when autograd frees it. Device-independent:
  the same number on CPU and GPU. (Inside a checkpointed region ``torch.utils.checkpoint``'s own
  hooks take over: what a checkpoint keeps is not seen here; ``Prediction.after_forward`` is.)
* ``MemoryLog`` -- seed 000's hook table. A subclass of PyTorch's
  ``torch.distributed._tools.mem_tracker.MemTracker`` (a ``TorchDispatchMode`` that sees every
  tensor an op creates and when it dies) with one row per module event: pre-forward, forward,
  pre-backward, backward. Columns: *live tensor bytes* tracked by MemTracker (parameters,
  gradients, optimizer state, activations, temporaries), saved-for-backward bytes, and on CUDA the
  allocator's own ``memory_allocated`` / ``memory_reserved``. A finished log holds figures, not
  tensors: it never keeps the measured model alive.
* ``predict_step`` -- the course's training step (``train.training_step``) run under the log on
  ``FakeTensorMode`` tensors: shapes and dtypes, no data, so seed 000's full-size U-Net is
  "trained" on a laptop CPU in about a second. By default it predicts what a CUDA GPU's
  ``max_memory_allocated`` shows in the **steady state** (step 2 and later: the optimizer's state
  exists), under **CUDA's autocast rules** (``amp_rules``), with Adam's multi-tensor (foreach)
  implementation as on CUDA and the allocator's 512-byte rounding. ``measure_step`` runs the same
  step on a GPU and reads the allocator.

What a prediction cannot see: the CUDA context (300-600 MiB, never in ``memory_allocated``, but
part of the card's memory), cuDNN/cuBLAS workspaces (scratch memory the convolution algorithms
allocate *through* the caching allocator, so it does count in ``memory_allocated`` on a GPU),
the caching allocator's reserved-but-free blocks (``memory_reserved - memory_allocated``), and
anything allocated outside PyTorch's dispatcher. ``gpu_report`` measures each on a GPU.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._python_dispatch import TorchDispatchMode

MiB = 2**20
GiB = 2**30

#: MemTracker's categories, in the order the course stacks them in plots.
CATEGORIES = ("Parameter", "Buffer", "Gradient", "Optstate", "Activation", "Temp", "Other")


def mib(nbytes: float | None) -> float:
    """Bytes -> MiB (NaN stays NaN, None becomes NaN)."""
    return float("nan") if nbytes is None else nbytes / MiB


def tensor_bytes(t: torch.Tensor) -> int:
    """numel x element size: the bytes a tensor's elements occupy."""
    return t.numel() * t.element_size()


def _storage_key(t: torch.Tensor) -> int:
    # data_ptr() is 0 for every fake tensor; the storage object's C pointer is unique per storage.
    return t.untyped_storage()._cdata


# --------------------------------------------------------------------------------------------
# Saved-for-backward bytes
# --------------------------------------------------------------------------------------------
class _Packed:
    """What the meter's pack hook hands autograd: a *detached* alias of the saved tensor (same
    storage, no ``grad_fn``). Keeping the tensor itself would close a cycle through C++ that
    Python's garbage collector cannot see -- the output's ``grad_fn`` owns the saved variable,
    which would own the output again -- so a graph whose backward never runs (an OOM in the
    forward, ``catch_oom``) would never be freed: on a GPU, each failed attempt of a
    largest-batch search stayed allocated (PyTorch's saved-tensor-hooks docs; pytorch#115255).
    Autograd puts the ``grad_fn`` back when it unpacks."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor.detach()


class SavedTensorMeter:
    """Bytes autograd holds for backward, counted through ``saved_tensors_hooks``.

    Each saved tensor's *storage* is counted once, however many ops save it (ReLU's output and
    the next conv's input are one storage). Storages of ``params`` are tallied separately as
    ``param_bytes``: a conv saves its weight, but the weight is resident anyway.

    >>> conv = nn.Conv3d(1, 4, 3, padding=1)
    >>> x = torch.randn(1, 1, 8, 8, 8, requires_grad=False)
    >>> with SavedTensorMeter(conv.parameters()) as m:
    ...     y = torch.relu(conv(x))
    >>> m.current == (1 + 4) * 8**3 * 4   # conv saves x, relu saves its output
    True
    """

    def __init__(self, params: Iterable[torch.Tensor] = ()):
        self._param_keys = {_storage_key(p) for p in params}
        self._refs: dict[int, int] = {}
        self._bytes: dict[int, int] = {}
        self.current = 0  # activation bytes held right now
        self.peak = 0
        self.param_bytes = 0  # parameter storages referenced by the graph (not extra memory)
        self.n_saved = 0  # how many times a tensor was saved (before dedup)
        self._ctx: Any = None

    def _pack(self, t: torch.Tensor) -> _Packed:
        self.n_saved += 1
        key = _storage_key(t)
        handle = _Packed(t)
        if key in self._param_keys:
            if key not in self._refs:
                self.param_bytes += t.untyped_storage().nbytes()
        elif key not in self._refs:
            nbytes = t.untyped_storage().nbytes()
            self._bytes[key] = nbytes
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        self._refs[key] = self._refs.get(key, 0) + 1
        weakref.finalize(handle, self._release, key)
        return handle

    @staticmethod
    def _unpack(handle: _Packed) -> torch.Tensor:
        return handle.tensor

    def _release(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            del self._refs[key]
            if key in self._param_keys:
                return
            self.current -= self._bytes.pop(key)

    def __enter__(self) -> "SavedTensorMeter":
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)


@dataclass
class SavedTensor:
    """One tensor an autograd node keeps for backward."""

    node: str  # e.g. "ConvolutionBackward0"
    attr: str  # e.g. "_saved_input"
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    is_param: bool
    storage: int  # key: equal keys share memory


def saved_tensors(output: torch.Tensor, params: Iterable[torch.Tensor] = ()) -> list[SavedTensor]:
    """Walk the autograd graph behind ``output`` and list every tensor each node saved.

    Uses the ``_saved_*`` attributes PyTorch exposes on graph nodes, in the order of the forward
    pass (inputs first). Storages shared between entries have the same ``storage`` key.
    """
    if not isinstance(output, torch.Tensor) or output.grad_fn is None:
        raise ValueError(
            "saved_tensors needs the output of a forward pass that requires grad "
            "(a tensor with a grad_fn); run the forward outside torch.no_grad()."
        )
    param_keys = {_storage_key(p) for p in params}
    seen, order, stack = set(), [], [output.grad_fn]
    while stack:  # depth-first, then reversed: roughly forward order
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        order.append(node)
        stack.extend(fn for fn, _ in node.next_functions)
    rows: list[SavedTensor] = []
    for node in reversed(order):
        for attr in sorted(a for a in dir(node) if a.startswith("_saved_")):
            try:
                val = getattr(node, attr)
            except RuntimeError:  # already freed by a backward pass
                continue
            for t in val if isinstance(val, (tuple, list)) else (val,):
                if isinstance(t, torch.Tensor):
                    rows.append(SavedTensor(
                        node=node.name(), attr=attr, shape=tuple(t.shape), dtype=t.dtype,
                        nbytes=t.untyped_storage().nbytes(), is_param=_storage_key(t) in param_keys,
                        storage=_storage_key(t),
                    ))
    return rows


# --------------------------------------------------------------------------------------------
# Live tensor bytes: the CPU's stand-in for torch.cuda.memory_allocated()
# --------------------------------------------------------------------------------------------
class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every tensor storage created while active, until it dies: what
    ``torch.cuda.memory_allocated()`` reports on a GPU (with ``round_to=512``, block by block),
    on any device and under ``FakeTensorMode``. ``current`` and ``peak`` are in bytes;
    ``events`` (with ``trace=True``) lists ``(+bytes, key)`` for each allocation and
    ``(-bytes, key)`` for each free, in order: the input of ``allocator.simulate``.

    Tensors that existed before (the model's weights, the batch) are not counted unless passed
    to ``track(...)``, the way ``memory_allocated`` counts whatever is on the device.
    """

    def __init__(self, round_to: int = 1, trace: bool = False):
        super().__init__()
        self.round_to, self.trace = round_to, trace
        self.current = self.peak = 0
        self.events: list[tuple[int, int]] = []
        self._live: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}

    def _size(self, st: torch.UntypedStorage) -> int:
        n = st.nbytes()
        return -(-n // self.round_to) * self.round_to

    def _add(self, st: torch.UntypedStorage) -> None:
        key = st._cdata
        if key in self._live or st.nbytes() == 0:
            return
        size = self._size(st)
        self._live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        if self.trace:
            self.events.append((size, key))
        self._refs[key] = weakref.ref(st, lambda _, key=key: self._free(key))

    def _free(self, key: int) -> None:
        size = self._live.pop(key, None)
        self._refs.pop(key, None)
        if size is not None:
            self.current -= size
            if self.trace:
                self.events.append((-size, key))

    def track(self, *tensors: Any) -> None:
        """Count tensors that already exist (and, for a module, its parameters and buffers)."""
        for t in tensors:
            if isinstance(t, nn.Module):
                self.track(*t.parameters(), *t.buffers())
            elif isinstance(t, torch.Tensor):
                self._add(t.untyped_storage())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self._add(t.untyped_storage())
        return out


# --------------------------------------------------------------------------------------------
# The hook table (seed 000)
# --------------------------------------------------------------------------------------------
@dataclass
class Row:
    event: int
    call: int
    module: str
    layer_type: str
    hook: str  # pre | fwd | bwd_pre | bwd
    tracked: int  # live tensor bytes (MemTracker)
    saved: int  # saved-for-backward bytes
    cuda_allocated: int | None  # torch.cuda.memory_allocated(), None on CPU
    cuda_reserved: int | None  # torch.cuda.memory_reserved(), None on CPU


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
        self._in_forward = False

    def track_external(self, *external: Any) -> None:
        with _cuda_block_rounding(self.round_like_cuda):
            super().track_external(*external)

    def _update_peak_stats(self, peak_state) -> None:
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
            self._peak_at = (self._innermost_module(), "backward" if self._mod_tracker.is_bw
                             else "forward" if self._in_forward else "optimizer/other")

    def _innermost_module(self) -> str:
        parents = [p for p in self._mod_tracker.parents if p != "Global"]
        name = max(parents, key=lambda p: p.count("."), default="(between modules: the loss or the engine)")
        return name.split(".", 1)[1] if "." in name else name

    @property
    def peak_location(self) -> tuple[str, str]:
        """(innermost module, phase) at the moment of the peak: phase is "forward",
        "backward" (checkpoint recomputation included) or "optimizer/other"."""
        return self._peak_at

    # -- MemTracker's module hooks, extended with a row each ---------------------------------
    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        super()._pre_fw_hook(module, inputs)
        if not self._mod_tracker.is_bw:  # not a recomputation under checkpointing
            if self._root is None:
                self._root = id(module)
            if id(module) == self._root:
                self._in_forward = True
            self._calls[id(module)] = self._n_calls
            self._n_calls += 1
        self._record(module, "pre")

    def _post_fw_hook(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
        super()._post_fw_hook(module, inputs, outputs)
        if id(module) == self._root and not self._mod_tracker.is_bw:
            self.after_forward = self._snapshot_total("current")
            self._in_forward = False
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


# --------------------------------------------------------------------------------------------
# One training step under the log; the GPU-free predictor; the same step measured on CUDA
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules in ``dtype`` (``.to(dtype)`` fails on fake parameters); restores the old one."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _check_model_and_input(model: Any, x: Any) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"expected an nn.Module, got {type(model).__name__}. Fix: pass the model itself "
            "(e.g. UNet3D(...)), not its output or its class."
        )
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected the input as a torch.Tensor, got {type(x).__name__}")


def log_step(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
    optimizer: torch.optim.Optimizer | None = None,
    autocast_dtype: torch.dtype | None = None,
    module_peaks: bool = True,
    round_like_cuda: bool = False,
) -> MemoryLog:
    """Run one ``training_step`` (zero_grad, forward + loss, backward, optimizer step) under a
    ``MemoryLog`` and return the log. Whatever exists before the step (parameters, gradients,
    optimizer state from earlier steps, the batch) is tracked as resident."""
    from .train import training_step

    _check_model_and_input(model, x)
    log = MemoryLog(model, cuda=x.device.type == "cuda", module_peaks=module_peaks,
                    round_like_cuda=round_like_cuda)
    extra = [optimizer] if optimizer is not None else []
    log.track_external(model, x, target, *extra)
    with log:
        training_step(model, x, target, optimizer, loss_fn=loss_fn, autocast_dtype=autocast_dtype)
    return log


@dataclass
class Prediction:
    """A predicted (or CPU-measured) training step: peak live bytes and what they are made of."""

    peak: int  # bytes: the predicted torch.cuda.max_memory_allocated() of the step
    breakdown: dict[str, int]  # bytes per category at the peak
    saved_peak: int  # saved-for-backward bytes (saved_tensors_hooks), at their maximum
    after_forward: dict[str, int]  # bytes per category when the model's forward returns
    parameters: int  # number of parameters
    log: MemoryLog = field(repr=False)
    steady_state: bool = True
    target: str = "cuda"
    method: str = "predicted (MemTracker under FakeTensorMode)"

    def mib(self) -> dict[str, float]:
        return {k: round(mib(v), 1) for k, v in self.breakdown.items()}

    @property
    def kept_after_forward(self) -> int:
        """Activation bytes alive when the forward returns: everything kept for backward
        (saved tensors, checkpoint inputs, selectively saved outputs) and the logits."""
        return self.after_forward["Activation"]

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v:,.0f}" for k, v in self.mib().items() if k != "Total" and v)
        return f"peak {mib(self.peak):,.0f} MiB [{self.method}]: {parts}"


def method_label(fake: bool, steady_state: bool, target: str, autocast: bool) -> str:
    """How a figure was obtained, in words: the label every table prints."""
    step = "steady-state step" if steady_state else "first step"
    if fake:
        rules = f", {target.upper() if target == 'cuda' else 'CPU'} autocast rules" if autocast else ""
        where = "for a CUDA GPU" if target == "cuda" else "for the CPU"
        return f"predicted {where} (MemTracker under FakeTensorMode; {step}{rules})"
    rules = ", CPU autocast rules" if autocast else ""
    return f"measured on CPU tensors (MemTracker; {step}{rules})"


def _check_builder(build_model: Any) -> None:
    if isinstance(build_model, nn.Module):
        raise TypeError(
            "predict_step takes a function that builds the model, not a model: it must build it "
            "inside FakeTensorMode, in the requested dtype. Fix: pass e.g. "
            "`lambda: seed000_unet('large')` instead of the model itself."
        )
    if not callable(build_model):
        raise TypeError(f"build_model must be a function returning an nn.Module, got "
                        f"{type(build_model).__name__}")


def _check_shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of whole numbers, got {shape!r}") from None
    if any(s < 1 for s in shape):
        raise ValueError(f"{name} {shape}: every size (batch included) must be >= 1")
    return shape


def _target_spec(input_shape: tuple[int, ...], target_shape: Sequence[int] | None,
                 n_classes: int | None, loss_fn: Callable | None) -> tuple[bool, tuple[int, ...], Callable]:
    """The target a step trains against: class indices (the input's shape without the channel
    dim; cross-entropy) unless a ``target_shape`` without ``n_classes`` asks for floats (MSE)."""
    classify = n_classes is not None or target_shape is None
    if target_shape is None:
        target_shape = (input_shape[0], *input_shape[2:])
    target_shape = _check_shape("target_shape", target_shape)
    if loss_fn is None:
        loss_fn = nn.functional.cross_entropy if classify else nn.functional.mse_loss
    return classify, target_shape, loss_fn


def prime_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Put ``optimizer`` in the state it has after a first step (Adam's two moments, SGD's
    momentum buffers...) without a forward pass: one ``step()`` on zero gradients, then the
    gradients are dropped, as ``zero_grad(set_to_none=True)`` does at the next step."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def predict_step(
    build_model: Callable[[], nn.Module],
    input_shape: Sequence[int],
    target_shape: Sequence[int] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    loss_fn: Callable | None = None,
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | str | None = "adam",
    autocast_dtype: torch.dtype | None = None,
    n_classes: int | None = None,
    fake: bool = True,
    module_peaks: bool = True,
    steady_state: bool = True,
    target: str | None = None,
) -> Prediction:
    """Predict the memory of one training step (``train.training_step``) without running it.

    The model is built by ``build_model()`` (so it can be built *inside* ``FakeTensorMode``,
    in ``dtype``) and trained on fake data of ``input_shape``. The target is class indices of
    ``target_shape`` (default: the input's shape without the channel dim, with ``n_classes``
    classes -> cross-entropy) or, if ``n_classes`` is None and ``target_shape`` is given, a float
    tensor (-> MSE). ``optimizer``: "adam", "sgd", None (no step) or a factory.

    * ``steady_state=True`` (default): the step of a running loop (step 2 and later), whose
      optimizer state already exists; ``False``: the very first step, where Adam creates its
      state only in ``optimizer.step()``, after the backward pass.
    * ``target``: whose rules the step follows. ``"cuda"`` (default for ``fake=True``): CUDA's
      autocast op lists (``amp_rules``), Adam's foreach implementation (the default on CUDA),
      and the caching allocator's 512-byte blocks. ``"cpu"`` (the only choice for
      ``fake=False``): what this CPU does.
    * ``module_peaks=False`` skips MemTracker's per-module peak bookkeeping (about half its
      cost); the global peak and breakdown are unchanged.

    With ``fake=False`` the same step runs on real CPU tensors: with ``target="cpu"`` the figures
    agree exactly with the fake ones (a test checks this), which is what makes the prediction
    trustworthy.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .amp_rules import autocast_rules

    _check_builder(build_model)
    input_shape = _check_shape("input_shape", input_shape)
    if len(input_shape) < 2:
        raise ValueError(f"input_shape needs at least (batch, channels), got {input_shape}")
    target = target or ("cuda" if fake else "cpu")
    if target not in ("cuda", "cpu"):
        raise ValueError(f"target must be 'cuda' or 'cpu', got {target!r}")
    if target == "cuda" and not fake:
        raise ValueError("real CPU tensors follow the CPU's rules: use target='cpu' with fake=False, "
                         "or measure_step() on a GPU")
    classify, target_shape, loss_fn = _target_spec(input_shape, target_shape, n_classes, loss_fn)

    # the same starting state every time: Python's garbage collector frees cyclic garbage (some
    # of it holds tensors, e.g. under checkpointing) at moments set by its allocation counters;
    # collecting first makes those moments, and so the prediction, independent of what ran before
    import gc

    gc.collect()
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with default_dtype(dtype), mode, autocast_rules(target if autocast_dtype else None):
        model = build_model()
        _check_model_and_input(model, torch.empty(0))
        x = torch.randn(input_shape)
        if classify:
            y = torch.randint(0, n_classes or 2, target_shape)
        else:
            y = torch.randn(target_shape)
        opt = _make_optimizer(optimizer, model, foreach=target == "cuda")
        if steady_state and opt is not None:
            prime_optimizer(model, opt)
        log = log_step(model, x, y, loss_fn, opt, autocast_dtype, module_peaks,
                       round_like_cuda=target == "cuda")
        n_params = sum(p.numel() for p in model.parameters())
    return Prediction(
        peak=log.peak, breakdown=log.breakdown("peak"), saved_peak=log.saved.peak,
        after_forward=log.after_forward or {}, parameters=n_params, log=log,
        steady_state=steady_state, target=target,
        method=method_label(fake, steady_state, target, autocast_dtype is not None),
    )


def _make_optimizer(spec: Any, model: nn.Module, foreach: bool = False) -> torch.optim.Optimizer | None:
    if spec is None:
        return None
    if callable(spec):
        return spec(model.parameters())
    if spec == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)
    if spec == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=foreach)
    raise ValueError(f"optimizer must be 'adam', 'sgd', None or a factory, got {spec!r}")


def measure_step(
    build_model: Callable[[], nn.Module],
    input_shape: Sequence[int],
    target_shape: Sequence[int] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    loss_fn: Callable | None = None,
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | str | None = "adam",
    autocast_dtype: torch.dtype | None = None,
    n_classes: int | None = None,
    steady_state: bool = True,
    device: str | torch.device = "cuda",
) -> "CudaPeak":
    """``predict_step``'s twin on a real GPU: the same ``training_step`` on real CUDA tensors,
    read from the caching allocator (``max_memory_allocated`` / ``max_memory_reserved`` of the
    measured step; with ``steady_state`` the second step, after an unmeasured first one).
    The model is built in ``dtype`` on the CPU and moved; the batch is created on the GPU."""
    from .train import training_step

    require_cuda("measure_step")
    _check_builder(build_model)
    input_shape = _check_shape("input_shape", input_shape)
    classify, target_shape, loss_fn = _target_spec(input_shape, target_shape, n_classes, loss_fn)
    dev = torch.device(device)
    with default_dtype(dtype):
        model = build_model().to(dev)
    x = torch.randn(input_shape, device=dev, dtype=dtype)
    y = (torch.randint(0, n_classes or 2, tuple(target_shape), device=dev) if classify
         else torch.randn(tuple(target_shape), device=dev, dtype=dtype))
    opt = _make_optimizer(optimizer, model, foreach=True)
    meter = SavedTensorMeter(model.parameters())
    marks: dict[str, int] = {}
    pre = model.register_forward_pre_hook(lambda *a: marks.__setitem__("pre", torch.cuda.memory_allocated()))
    post = model.register_forward_hook(lambda *a: marks.__setitem__("post", torch.cuda.memory_allocated()))

    def step() -> None:
        with meter:
            training_step(model, x, y, opt, loss_fn=loss_fn, autocast_dtype=autocast_dtype)

    try:
        if steady_state:
            step()
        torch.cuda.synchronize(dev)
        meter.peak = meter.current
        result = cuda_peak(step, baseline=False, device=dev)
    finally:
        pre.remove()
        post.remove()
    result.saved_peak = meter.peak
    result.kept_after_forward = marks["post"] - marks["pre"]
    result.allocated_after_forward = marks["post"]
    result.method = ("measured (cuda max_memory_allocated / max_memory_reserved; "
                     + ("steady-state step)" if steady_state else "first step)"))
    del model, opt, x, y
    return result


# --------------------------------------------------------------------------------------------
# Budgets and out-of-memory
# --------------------------------------------------------------------------------------------
def largest_that_fits(fits: Callable[[int], bool], start: int = 1, limit: int = 1 << 20,
                      at_limit: str = "raise") -> int:
    """The largest integer n in [start, limit] with ``fits(n)`` True, assuming fits is monotone
    (True up to some n, then False). Doubling, then bisection: O(log n) calls.

    Returns ``start - 1`` if even ``start`` does not fit. If ``limit`` itself fits, the search
    cannot tell how much further it goes: ``at_limit="raise"`` (default) raises, ``"return"``
    returns ``limit``."""
    for name, v in (("start", start), ("limit", limit)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be a whole number, got {v!r}")
    if start < 1:
        raise ValueError(f"start must be >= 1 (doubling from {start} never grows), got {start}")
    if limit < start:
        raise ValueError(f"limit ({limit}) is below start ({start}): nothing to search")
    if at_limit not in ("raise", "return"):
        raise ValueError(f"at_limit must be 'raise' or 'return', got {at_limit!r}")
    if not fits(start):
        return start - 1
    lo, hi = start, start * 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        if lo == limit or fits(limit):  # lo == limit: the doubling already saw it fit
            if at_limit == "raise":
                raise ValueError(
                    f"everything up to limit={limit} fits: the largest value is not known. "
                    "Fix: raise limit, or pass at_limit='return' to accept the limit."
                )
            return limit
        hi = limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


_OOM_PATTERNS = {
    "asked": r"Tried to allocate ([\d.]+ [KMG]iB)",
    "total": r"total capacity of ([\d.]+ [KMG]iB)",
    "free": r"of which ([\d.]+ [KMG]iB) is free",
    "by_pytorch": r"([\d.]+ [KMG]iB) is allocated by PyTorch",
    "reserved_unallocated": r"([\d.]+ [KMG]iB) is reserved by PyTorch but unallocated",
}


def explain_oom(err: BaseException) -> str:
    """Turn a CUDA out-of-memory error into a short explanation with the figures in it."""
    import re

    msg = str(err)
    found = {k: (m.group(1) if (m := re.search(p, msg)) else None) for k, p in _OOM_PATTERNS.items()}
    lines = ["Out of memory."]
    if found["asked"]:
        lines.append(f"  asked for:            {found['asked']} (one new tensor)")
    if found["free"] and found["total"]:
        lines.append(f"  free on the device:   {found['free']} of {found['total']}")
    if found["by_pytorch"]:
        lines.append(f"  held by live tensors: {found['by_pytorch']} (memory_allocated)")
    if found["reserved_unallocated"]:
        lines.append(
            f"  cached, unused:       {found['reserved_unallocated']} (reserved - allocated). If "
            "large, the cache is fragmented: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "helps, but only if set before CUDA starts (in the shell, or in os.environ before the "
            "first CUDA call); restart the kernel after setting it"
        )
    lines.append(
        "  What to do: a smaller batch or volume, mixed precision (04), in-place activations "
        "(05, 06), checkpointing (07), or more devices (08, 09)."
    )
    if len(lines) == 2:
        first = msg.splitlines()[0][:200] if msg.strip() else "(no message)"
        lines.insert(1, f"  {type(err).__name__}: {first}")
    return "\n".join(lines)


def is_oom(err: BaseException) -> bool:
    """True for CUDA's ``torch.OutOfMemoryError`` and for the CPU's failed allocations."""
    text = str(err).lower()
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError)
        and ("out of memory" in text or "can't allocate memory" in text)
    )


def _drop_traceback(err: BaseException) -> BaseException:
    """Clear every frame an exception (and its chain) refers to, and detach the tracebacks:
    a stored exception must not keep the failed attempt's tensors alive."""
    import traceback

    seen = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
            e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return err


class catch_oom:
    """``with catch_oom() as r:`` runs the block; an OOM is caught, explained and recorded in
    ``r.error`` instead of killing the kernel. The failed attempt leaves nothing alive: the
    exception's frames (which hold the block's tensors) are cleared before it is stored, then
    garbage is collected and the CUDA cache emptied."""

    def __init__(self, verbose: bool = True):
        self.verbose = verbose
        self.error: BaseException | None = None
        self.explanation = ""

    def __enter__(self) -> "catch_oom":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not is_oom(exc):
            return False
        self.explanation = explain_oom(exc)
        self.error = _drop_traceback(exc)
        if self.verbose:
            print(self.explanation)
        del exc, tb
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return True

    @property
    def ok(self) -> bool:
        return self.error is None


# --------------------------------------------------------------------------------------------
# CUDA measurements (the real figures; need a GPU)
# --------------------------------------------------------------------------------------------
def require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{what} needs a CUDA GPU and torch.cuda.is_available() is False. "
            "On CPU use predict_step() / SavedTensorMeter for the device-independent figures, "
            "and course_utils.recorded.show() for figures recorded on a GPU."
        )


@dataclass
class CudaPeak:
    peak_allocated: int
    peak_reserved: int
    allocated_after: int
    reserved_after: int
    driver_used: int = 0  # total - free from cudaMemGetInfo after the step (context included)
    saved_peak: int = 0
    kept_after_forward: int = 0  # memory_allocated when the forward returns, minus before it
    allocated_after_forward: int = 0  # memory_allocated when the forward returns
    method: str = "measured (cuda max_memory_allocated / max_memory_reserved)"

    def __str__(self) -> str:
        return (f"peak allocated {mib(self.peak_allocated):,.0f} MiB, peak reserved "
                f"{mib(self.peak_reserved):,.0f} MiB [{self.method}]")


def cuda_peak(fn: Callable[[], Any], baseline: bool = True,
              device: str | torch.device | None = None) -> CudaPeak:
    """Run ``fn()`` and return the CUDA allocator's peaks during it (peak stats reset first;
    with ``baseline`` the cache is emptied first, so reserved starts from what is live)."""
    require_cuda("cuda_peak")
    torch.cuda.synchronize(device)
    if baseline:
        torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return CudaPeak(
        torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device),
        torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device),
        driver_used=total - free,
    )


@contextlib.contextmanager
def memory_cap(gib: float, device: int = 0) -> Iterator[float]:
    """Cap the caching allocator at ``gib`` GiB (``set_per_process_memory_fraction``) inside the
    block, as if the GPU had that much memory for tensors; the fraction is always restored.
    Yields the fraction used (at most 1: a cap above the card's size is the card)."""
    require_cuda("memory_cap")
    if gib <= 0:
        raise ValueError(f"the cap must be > 0 GiB, got {gib}")
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, gib * GiB / total)
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    try:
        yield fraction
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
