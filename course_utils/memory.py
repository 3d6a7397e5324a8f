"""Measuring memory with PyTorch's own machinery.

Three instruments, each naming its method in what it prints:

* ``SavedTensorMeter`` -- *saved-for-backward bytes*: every tensor autograd stores for the backward
  pass goes through ``torch.autograd.graph.saved_tensors_hooks``; we count its storage once (views
  and in-place results share a storage) and release it when autograd frees it. Device-independent:
  the same number on CPU and GPU.
* ``MemoryLog`` -- seed 000's hook table. A subclass of PyTorch's
  ``torch.distributed._tools.mem_tracker.MemTracker`` (a ``TorchDispatchMode`` that sees every
  tensor an op creates and when it dies) with one row per module event: pre-forward, forward,
  pre-backward, backward. Columns: *live tensor bytes* tracked by MemTracker (parameters,
  gradients, optimizer state, activations, temporaries), saved-for-backward bytes, and on CUDA the
  allocator's own ``memory_allocated`` / ``memory_reserved``.
* ``predict_step`` -- the same log run under ``FakeTensorMode``: tensors have shapes and dtypes but
  no data, so seed 000's full-size U-Net is "trained" for one step on a laptop CPU in seconds, and
  the tracked peak predicts the CUDA ``max_memory_allocated``.

What the prediction ignores: the CUDA context (300-500 MiB, never in ``memory_allocated``),
cuDNN/cuBLAS workspaces (convolution algorithms may ask for scratch memory), the allocator's
rounding of each block to 512 bytes (and of small tensors into 2 MiB segments), and anything
allocated outside PyTorch's dispatcher.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

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
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


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


class MemoryLog(MemTracker):
    """Seed 000's per-layer memory table, from PyTorch's ``MemTracker``.

    Use it like ``MemTracker``: ``track_external`` what was created before, then run one
    training step inside ``with``. ``log.rows`` has one ``Row`` per module event;
    ``log.frame()`` is the table in MiB; ``log.plot()`` the timeline.

    ``MemTracker`` is a private PyTorch API: ``tests/test_memory.py`` pins the parts used here so
    that an upgrade that changes them fails loudly.
    """

    def __init__(self, model: nn.Module | None = None, cuda: bool | None = None,
                 module_peaks: bool = True):
        super().__init__()
        self.module_peaks = module_peaks
        self.rows: list[Row] = []
        self._calls: dict[int, int] = {}
        self._n_calls = 0
        params = list(model.parameters()) if model is not None else []
        self.saved = SavedTensorMeter(params)
        self.cuda = torch.cuda.is_available() if cuda is None else cuda

    def _update_peak_stats(self, peak_state) -> None:
        if self.module_peaks:
            return super()._update_peak_stats(peak_state)
        # only the global peak: MemTracker's per-module loop runs over every module on every
        # op, and is most of its cost; the explorer needs the global figure alone
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = dict(snap)

    # -- MemTracker's module hooks, extended with a row each ---------------------------------
    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        super()._pre_fw_hook(module, inputs)
        if not self._mod_tracker.is_bw:  # not a recomputation under checkpointing
            self._calls[id(module)] = self._n_calls
            self._n_calls += 1
        self._record(module, "pre")

    def _post_fw_hook(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
        super()._post_fw_hook(module, inputs, outputs)
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

    # -- entering also starts the saved-tensor meter ------------------------------------------
    def __enter__(self) -> "MemoryLog":
        super().__enter__()
        self.saved.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self.saved.__exit__(*args)
        super().__exit__(*args)

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
            ax.axvline(bw, color="grey", lw=0.8)
            ax.text(bw, ax.get_ylim()[1] * 0.95, " backward ->", va="top", fontsize=8)
        ax.set_xlabel("hook event")
        ax.set_ylabel("MiB")
        ax.set_title(title or "memory over one training step")
        ax.legend(fontsize=8)
        return ax


# --------------------------------------------------------------------------------------------
# One training step under the log; the GPU-free predictor
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
) -> MemoryLog:
    """Run forward, backward and (if given) ``optimizer.step()`` under a ``MemoryLog``.

    With ``autocast_dtype`` the forward runs under ``torch.autocast`` on the input's device.
    Gradients are left in ``.grad`` (as after a real step); the log is returned.
    """
    _check_model_and_input(model, x)
    log = MemoryLog(model, cuda=x.device.type == "cuda", module_peaks=module_peaks)
    extra = [optimizer] if optimizer is not None else []
    log.track_external(model, x, target, *extra)
    with log:
        if autocast_dtype is not None:
            with torch.autocast(x.device.type, dtype=autocast_dtype):
                out = model(x)
        else:
            out = model(x)
        loss = loss_fn(out.float() if autocast_dtype else out, target)
        del out
        loss.backward()
        if optimizer is not None:
            optimizer.step()
    return log


@dataclass
class Prediction:
    """A predicted training step: peak live bytes and what they are made of."""

    peak: int  # bytes, the predicted torch.cuda.max_memory_allocated() of the step
    breakdown: dict[str, int]  # bytes per category at the peak
    saved_peak: int  # saved-for-backward bytes, at their maximum
    parameters: int  # number of parameters
    log: MemoryLog = field(repr=False)
    method: str = "predicted (MemTracker under FakeTensorMode)"

    def mib(self) -> dict[str, float]:
        return {k: round(mib(v), 1) for k, v in self.breakdown.items()}

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v:,.0f}" for k, v in self.mib().items() if k != "Total" and v)
        return f"peak {mib(self.peak):,.0f} MiB [{self.method}]: {parts}"


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
) -> Prediction:
    """Predict the memory of one training step without running it.

    The model is built by ``build_model()`` (so it can be built *inside* ``FakeTensorMode``,
    in ``dtype``) and trained for one step on fake data of ``input_shape``. The target is class
    indices of ``target_shape`` (default: the input's shape without the channel dim, with
    ``n_classes`` classes -> cross-entropy) or, if ``n_classes`` is None and ``target_shape`` is
    given, a float tensor (-> MSE). ``optimizer``: "adam", "sgd", None (no step) or a factory.

    ``module_peaks=False`` skips MemTracker's per-module peak bookkeeping (about half its cost);
    the global peak and breakdown are unchanged.

    With ``fake=False`` the same step runs on real CPU tensors: the figures must then agree
    exactly with the fake ones (a test checks this), which is what makes the prediction trustworthy.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    input_shape = tuple(int(s) for s in input_shape)
    if len(input_shape) < 2:
        raise ValueError(f"input_shape needs at least (batch, channels), got {input_shape}")
    classify = n_classes is not None or target_shape is None
    if target_shape is None:
        target_shape = (input_shape[0], *input_shape[2:])
    if loss_fn is None:
        loss_fn = nn.functional.cross_entropy if classify else nn.functional.mse_loss

    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with default_dtype(dtype):
        with mode:
            model = build_model()
            _check_model_and_input(model, torch.empty(0))
            x = torch.randn(input_shape)
            if classify:
                target = torch.randint(0, n_classes or 2, tuple(target_shape))
            else:
                target = torch.randn(tuple(target_shape))
            opt = _make_optimizer(optimizer, model)
            log = log_step(model, x, target, loss_fn, opt, autocast_dtype, module_peaks)
    return Prediction(
        peak=log.peak, breakdown=log.breakdown("peak"), saved_peak=log.saved.peak,
        parameters=sum(p.numel() for p in model.parameters()), log=log,
        method="predicted (MemTracker under FakeTensorMode)" if fake
        else "measured (MemTracker on real CPU tensors)",
    )


def _make_optimizer(spec: Any, model: nn.Module) -> torch.optim.Optimizer | None:
    if spec is None:
        return None
    if callable(spec):
        return spec(model.parameters())
    if spec == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    if spec == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    raise ValueError(f"optimizer must be 'adam', 'sgd', None or a factory, got {spec!r}")


# --------------------------------------------------------------------------------------------
# Budgets and out-of-memory
# --------------------------------------------------------------------------------------------
def largest_that_fits(fits: Callable[[int], bool], start: int = 1, limit: int = 1 << 20) -> int:
    """The largest integer n >= start with ``fits(n)`` True, assuming fits is monotone
    (True up to some n, then False). Doubling, then bisection: O(log n) calls.
    Returns ``start - 1`` if even ``start`` does not fit."""
    if not fits(start):
        return start - 1
    lo, hi = start, start * 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
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
            f"  cached, unused:       {found['reserved_unallocated']} (reserved - allocated; "
            "if large, fragmentation: try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"
        )
    lines.append(
        "  What to do: a smaller batch or volume, mixed precision (04), in-place activations "
        "(05, 06), checkpointing (07), or more devices (08, 09)."
    )
    if len(lines) == 2:
        lines.insert(1, f"  message: {msg.splitlines()[0][:200]}")
    return "\n".join(lines)


def is_oom(err: BaseException) -> bool:
    """True for CUDA's ``torch.OutOfMemoryError`` and for the CPU's failed allocations."""
    text = str(err).lower()
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError)
        and ("out of memory" in text or "can't allocate memory" in text)
    )


class catch_oom:
    """``with catch_oom() as r:`` runs the block; an OOM is caught, explained and recorded in
    ``r.error`` instead of killing the kernel; cached blocks are released afterwards."""

    def __init__(self, verbose: bool = True):
        self.verbose = verbose
        self.error: BaseException | None = None
        self.explanation = ""

    def __enter__(self) -> "catch_oom":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not is_oom(exc):
            return False
        self.error = exc
        self.explanation = explain_oom(exc)
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
            "On CPU use predict_step() / SavedTensorMeter for the device-independent figures."
        )


@dataclass
class CudaPeak:
    peak_allocated: int
    peak_reserved: int
    allocated_after: int
    reserved_after: int
    method: str = "torch.cuda.max_memory_allocated / max_memory_reserved"

    def __str__(self) -> str:
        return (f"peak allocated {mib(self.peak_allocated):,.0f} MiB, peak reserved "
                f"{mib(self.peak_reserved):,.0f} MiB [{self.method}]")


def cuda_peak(fn: Callable[[], Any], baseline: bool = True) -> CudaPeak:
    """Run ``fn()`` and return the CUDA allocator's peaks during it (stats reset first)."""
    require_cuda("cuda_peak")
    torch.cuda.synchronize()
    if baseline:
        torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return CudaPeak(
        torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(),
        torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
    )
