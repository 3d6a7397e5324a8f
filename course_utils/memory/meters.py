"""Bytes measured while a step runs, on any device: ``SavedTensorMeter`` (what autograd keeps
for backward, through ``saved_tensors_hooks``), ``saved_tensors`` (the same read off a finished
graph, tensor by tensor) and ``LiveBytes`` (every storage created and freed: the CPU's stand-in
for ``torch.cuda.memory_allocated``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ..checks import MeasureError, guard


def storage_key(t: torch.Tensor) -> int:
    """An id of ``t``'s storage, the same for every view of it: two tensors that share memory have
    the same key."""
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
    Autograd puts the ``grad_fn`` back when it unpacks.

    It also keeps the tensor's version (``_version``, bumped by every in-place op on it or on
    any view: the alias shares the counter) and the name of the op that made it: with hooks
    set, autograd leaves its own check ("modified by an inplace operation") to them, so
    ``SavedTensorMeter`` makes it at unpack time, as autograd's ``SavedVariable::unpack`` does."""

    __slots__ = ("tensor", "version", "made_by", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor.detach()
        self.version = tensor._version
        self.made_by = tensor.grad_fn.name() if tensor.grad_fn is not None else ""


class SavedTensorModifiedError(MeasureError):
    """A tensor autograd saved for backward was changed in place before backward read it: the
    step's backward fails in PyTorch too ("one of the variables needed for gradient computation
    has been modified by an inplace operation"), with or without the course's hooks. ``saved``
    names the tensor (its shape, dtype and the op that made it)."""

    def __init__(self, handle: _Packed):
        t = handle.tensor
        made = f", the output of {handle.made_by}" if handle.made_by else ""
        self.saved = f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}{made}"
        super().__init__(
            f"a tensor saved for backward ({self.saved}) was modified by an in-place operation before backward "
            f"read it (version {t._version}, saved at version {handle.version}): the step's backward fails in "
            "PyTorch too ('one of the variables needed for gradient computation has been modified by an "
            "inplace operation').",
            "make the operation that overwrites it out of place: inplace=False on the activation after that "
            "op (e.g. an nn.ELU(inplace=True) after a ReLU overwrites the output ReLU's backward needs), or "
            "y = x + 1 for x += 1.")


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
        self._param_keys = {storage_key(p) for p in params}
        self._refs: dict[int, int] = {}
        self._bytes: dict[int, int] = {}
        self.current = 0  # activation bytes held right now
        self.peak = 0
        self.param_bytes = 0  # parameter storages referenced by the graph (not extra memory)
        self.n_saved = 0  # how many times a tensor was saved (before dedup)
        self._ctx: Any = None

    def _pack(self, t: torch.Tensor) -> _Packed:
        self.n_saved += 1
        key = storage_key(t)
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
        if handle.tensor._version != handle.version:  # autograd's own check, which hooks switch off
            raise SavedTensorModifiedError(handle)
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
        raise MeasureError(
            "saved_tensors needs the output of a forward pass that requires grad (a tensor with a grad_fn).",
            "run the forward outside torch.no_grad(), with parameters that require grad.")
    param_keys = {storage_key(p) for p in params}
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
                        nbytes=t.untyped_storage().nbytes(), is_param=storage_key(t) in param_keys,
                        storage=storage_key(t),
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


guard(globals(), MeasureError)
