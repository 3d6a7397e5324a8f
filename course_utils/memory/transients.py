"""Per-op memory: what each ATen op keeps and what it needs only while it runs.

``OpTransients`` is a ``TorchDispatchMode``: every op of a step -- forward, backward (autograd's
engine runs backward ops under the same mode) and the optimizer's -- is run between two
synchronised readings of the CUDA caching allocator::

    sync; before = memory_allocated(); reset_peak_memory_stats()
    op
    sync; after = memory_allocated(); peak = max_memory_allocated()

and each op gets one ``OpMemory`` row:

* ``new_outputs`` -- the bytes of the output storages the op created (not an input's storage, as
  an in-place op or a view returns), each rounded to the allocator's 512-byte blocks;
* ``kept_extra = after - before - new_outputs`` -- memory the op allocated and kept that is no
  output: cuBLAS's workspace, allocated at a handle's first matrix product and kept for as
  long as the handle lives (one per handle and stream, and the backward runs on its own thread's
  handle);
* ``transient = peak - max(before, after)`` -- memory the op allocated and gave back before it
  returned: a cuDNN convolution's workspace, a kernel's scratch buffer.
* ``conv_operands`` (``conv_itemsize``, ``conv_pointwise``, ``conv_in_channels``) -- for a
  convolution, the bytes of its two activations: input + output in forward (``convolution``),
  input + output gradient in backward (``convolution_backward``); 0 for every other op. What
  cuDNN's workspace follows (``memory.workspaces``).

A fake-tensor prediction sees ``new_outputs`` only; the other two are what a GPU adds. The mode
keeps the step's own peaks (``peak``, ``peak_reserved``): it resets the allocator's peak
statistics at every op, so ``max_memory_allocated`` after the step is the last op's.

The readings come from a ``stats`` object (``CudaStats`` by default). ``LiveBytesStats`` reads a
``LiveBytes`` meter instead: on a CPU every op's ``kept_extra`` and ``transient`` are then 0
by construction, which is how the tests and the GPU kit's dry run exercise the same code.
"""

from __future__ import annotations

import contextlib
import difflib
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..checks import MeasureError, guard
from ..train import training_step
from .meters import LiveBytes
from .predict import measure_step, step_parts

BLOCK = 512  # the CUDA caching allocator rounds every request up to a multiple of this


def _rounded(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


class CudaStats:
    """The CUDA caching allocator's counters on ``device``, read after a synchronisation."""

    def __init__(self, device: int | str | torch.device | None = None):
        self.device = device

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reserved(self) -> int:
        return torch.cuda.memory_reserved(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def peak_reserved(self) -> int:
        return torch.cuda.max_memory_reserved(self.device)


class LiveBytesStats:
    """The same counters from a ``LiveBytes`` meter (live tensor bytes in 512-byte blocks): a
    CPU's stand-in, exact for outputs and blind to workspaces. Enter ``meter`` *before* the
    ``OpTransients`` mode: the mode entered last sees an op first, and the meter then counts the
    op's outputs inside it, before the mode reads ``after``."""

    def __init__(self, meter: LiveBytes | None = None):
        self.meter = meter or LiveBytes(round_to=BLOCK)
        self._peak = 0

    def sync(self) -> None:
        pass

    def track(self, *tensors: torch.Tensor) -> None:
        """Count tensors made outside the dispatcher (``torch.tensor(...)``), which an op first
        receives as inputs: on a GPU their memory was allocated before that op."""
        self.meter.track(*tensors)

    def allocated(self) -> int:
        return self.meter.current

    reserved = allocated

    def reset_peak(self) -> None:
        self.meter.peak = self.meter.current

    def peak(self) -> int:
        return self.meter.peak

    peak_reserved = peak


#: what ``OpMemory.from_dict`` needs of a recorded op (the rest have defaults)
OP_FIELDS = frozenset({"index", "op", "phase", "before", "after", "peak", "new_outputs"})


@dataclass
class OpMemory:
    """One op's memory, in bytes (``OpTransients``' module docstring defines each field)."""

    index: int
    op: str
    phase: str  # "backward" (run by autograd's engine, for the node named in ``node``) or "forward"
    node: str
    before: int
    after: int
    peak: int
    new_outputs: int
    conv_operands: int = 0  # a convolution's input + output (forward) / input + output gradient (backward)
    conv_itemsize: int = 0  # a convolution's bytes per element (4: fp32; 2: fp16, bf16); 0 for other ops
    conv_pointwise: bool = False  # a convolution whose kernel is 1 in every dimension
    conv_in_channels: int = 0  # a convolution's input channels

    @property
    def kept_extra(self) -> int:
        return self.after - self.before - self.new_outputs

    @property
    def transient(self) -> int:
        return max(0, self.peak - max(self.before, self.after))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kept_extra": self.kept_extra, "transient": self.transient}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OpMemory":
        """A row as ``as_dict`` wrote it (a GPU run's details archive); rows recorded before
        ``conv_operands`` existed get 0."""
        return cls(d["index"], d["op"], d["phase"], d.get("node", ""), d["before"], d["after"], d["peak"],
                   d["new_outputs"], d.get("conv_operands", 0), d.get("conv_itemsize", 0),
                   d.get("conv_pointwise", False), d.get("conv_in_channels", 0))


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def conv_operands(op: str, args: Any, out: Any) -> tuple[int, int, bool, int]:
    """``(bytes, itemsize, pointwise, in_channels)`` of a convolution: the bytes of its two
    activations -- ``convolution(input, weight, ...)``: input + output;
    ``convolution_backward(grad_output, input, weight, ...)``: input + output gradient --, the
    input's bytes per element, whether the kernel is 1 in every dimension, the input's channels.
    ``(0, 0, False, 0)`` for any other op."""
    if op == "convolution":
        x, w, total = args[0], args[1], _nbytes(args[0]) + _nbytes(out)
    elif op == "convolution_backward":
        x, w, total = args[1], args[2], _nbytes(args[1]) + _nbytes(args[0])
    else:
        return 0, 0, False, 0
    return total, x.element_size(), all(k == 1 for k in w.shape[2:]), x.shape[1] if x.dim() > 1 else 1


#: ops that allocate nothing and that one way of running a step issues and another does not
#: (fake tensors ask for ``prim::device``; autograd detaches what it saves)
BOOKKEEPING = ("device", "detach", "lift_fresh", "alias")


def align_ops(a: list[OpMemory], b: list[OpMemory]) -> list[tuple[OpMemory, OpMemory]]:
    """Two recordings of one step (a GPU's and a prediction's, say) paired op by op: the longest
    common runs of op names (``difflib``, ``BOOKKEEPING`` ops left out), in order."""
    a = [r for r in a if r.op not in BOOKKEEPING]
    b = [r for r in b if r.op not in BOOKKEEPING]
    matcher = difflib.SequenceMatcher(None, [r.op for r in a], [r.op for r in b], autojunk=False)
    return [(a[m.a + i], b[m.b + i]) for m in matcher.get_matching_blocks() for i in range(m.size)]


def _current_node() -> Any:
    """The autograd node whose backward is running on this thread, or None (forward, optimizer)."""
    get = getattr(torch._C, "_current_autograd_node", None)
    return get() if get is not None else None


def _storages(values: Iterable[Any]) -> dict[int, torch.UntypedStorage]:
    out = {}
    for t in values:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            out[st._cdata] = st
    return out


class OpTransients(TorchDispatchMode):
    """Record an ``OpMemory`` row for every op run inside (see the module docstring).

    >>> with OpTransients() as ops:            # on a GPU
    ...     training_step(model, x, y, opt)
    >>> ops.largest("transient")[:3]           # the ops with the largest workspaces
    """

    def __init__(self, stats: Any = None):
        super().__init__()
        self.stats = stats if stats is not None else CudaStats()
        self.rows: list[OpMemory] = []
        self.peak = self.peak_reserved = 0

    def __enter__(self):
        self.stats.sync()
        self.peak = self.stats.allocated()
        self.peak_reserved = self.stats.reserved()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        node = _current_node()
        leaves = tree_leaves((args, kwargs))
        inputs = _storages(leaves)
        s = self.stats
        if hasattr(s, "track"):  # a stand-in meter: an input it has not seen existed before the op
            s.track(*(t for t in leaves if isinstance(t, torch.Tensor)))
        s.sync()
        before = s.allocated()
        s.reset_peak()
        out = func(*args, **kwargs)
        s.sync()
        after, peak = s.allocated(), max(s.peak(), before)
        self.peak = max(self.peak, peak)
        self.peak_reserved = max(self.peak_reserved, s.peak_reserved())
        created = {k: st for k, st in _storages(tree_leaves(out)).items() if k not in inputs}
        new = sum(_rounded(st.nbytes()) for st in created.values() if st.nbytes())
        name = str(func.overloadpacket.__name__)
        self.rows.append(OpMemory(len(self.rows), name, "forward" if node is None else "backward",
                                  type(node).__name__ if node is not None else "", before, after, peak, new,
                                  *conv_operands(name, args, out)))
        return out

    def largest(self, field: str = "transient", n: int = 10) -> list[OpMemory]:
        """The ``n`` rows with the largest ``field`` (``transient`` or ``kept_extra``), largest first."""
        if field not in ("transient", "kept_extra"):
            raise MeasureError(f"field must be 'transient' or 'kept_extra', got {field!r}.", "field='transient'.")
        return sorted((r for r in self.rows if getattr(r, field) > 0), key=lambda r: -getattr(r, field))[:n]

    def by_op(self, field: str = "transient") -> list[dict[str, Any]]:
        """``field`` summed up by op and phase: ``[{"op", "phase", "calls", "max", "total"}]``,
        the largest ``max`` first; ops whose ``field`` is 0 at every call are left out."""
        if field not in ("transient", "kept_extra"):
            raise MeasureError(f"field must be 'transient' or 'kept_extra', got {field!r}.", "field='transient'.")
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        for r in self.rows:
            groups[r.op, r.phase].append(getattr(r, field))
        out = [{"op": op, "phase": phase, "calls": len(v), "max": max(v), "total": sum(v)}
               for (op, phase), v in groups.items() if max(v) > 0]
        return sorted(out, key=lambda d: (-d["max"], d["op"]))


def op_memory_step(build_model: Any, input_shape: Any, target_shape: Any = None, *,
                   device: str | torch.device = "cuda", within: Any = None,
                   **step_kw: Any) -> tuple[OpTransients, Any]:
    """``measure_step``'s steady-state step with every op recorded (``OpTransients``): returns
    ``(ops, peak)``. On CUDA ``peak`` is ``measure_step``'s ``CudaPeak`` (the allocator's
    readings); on a CPU the same step runs on CPU tensors read by a ``LiveBytes`` meter, and
    ``peak`` is the meter's peak in bytes -- inside ``within`` if given (a context manager: the
    GPU kit passes ``FakeTensorMode`` with CUDA's autocast rules, which makes it the prediction's
    step, op by op). ``step_kw``: ``dtype``, ``loss_fn``, ``optimizer``, ``autocast_dtype``,
    ``n_classes``, ``steady_state``."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if within is not None:
            raise MeasureError("within= is for the CPU step (a prediction op by op); a GPU step runs as it is.",
                               "leave within out with device='cuda', or pass device='cpu'.")
        ops = OpTransients(CudaStats(dev))
        return ops, measure_step(build_model, input_shape, target_shape, device=dev, instrument=ops, **step_kw)
    with within if within is not None else contextlib.nullcontext():
        return _cpu_op_memory_step(build_model, input_shape, target_shape, dev, **step_kw)


def _cpu_op_memory_step(build_model: Any, input_shape: Any, target_shape: Any, dev: torch.device,
                        autocast_dtype: Any = None, steady_state: bool = True,
                        **step_kw: Any) -> tuple[OpTransients, int]:
    model, x, y, opt, loss_fn = step_parts(build_model, input_shape, target_shape, device=dev, **step_kw)
    live = LiveBytes(round_to=BLOCK)
    with live:
        live.track(model, x, y)
        if steady_state:
            training_step(model, x, y, opt, loss_fn=loss_fn, autocast_dtype=autocast_dtype)
        with OpTransients(LiveBytesStats(live)) as ops:
            training_step(model, x, y, opt, loss_fn=loss_fn, autocast_dtype=autocast_dtype)
    return ops, ops.peak


guard(globals(), MeasureError)
