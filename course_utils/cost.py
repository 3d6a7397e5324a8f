"""What a training step costs on a card, estimated on a CPU: published rates, counted work.

* ``Card`` / ``CARDS`` / ``card()`` -- a GPU's spec-sheet rates (FLOP/s per precision, memory and
  PCIe bandwidth) with their sources; ``DEFAULT_CARD`` is the 8 GB card the capstone's budget
  stands for, ``FLOPS_ONLY_50T`` the course's older assumption, kept to compare rankings with.
* ``PRECISIONS`` -- the precision keys every estimate uses: key -> (model dtype, autocast dtype).
* ``ElementwiseBytes`` -- a dispatch mode counting the bytes the ops ``FlopCounterMode`` does not
  count read and write; ``SaveOnCpuMeter`` -- what ``save_on_cpu`` would copy to the host.
* ``Cost`` -- one step's estimate, term by term; ``pareto`` -- the memory-time frontier.

The explorer (``explorer.step_cost``) and ``fit`` add the terms up for their configurations.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._python_dispatch

from .checks import SetupError, guard

#: precision key -> (dtype of the model, autocast dtype or None). Code uses the keys;
#: widgets, ``Config.describe`` and plots show ``PRECISION_LABELS``.
PRECISIONS = {
    "fp32": (torch.float32, None),
    "fp16_model": (torch.float16, None),  # the model built in fp16, as seed 000 did
    "autocast_fp16": (torch.float32, torch.float16),
    "autocast_bf16": (torch.float32, torch.bfloat16),
}
PRECISION_LABELS = {"fp32": "fp32", "fp16_model": "fp16 model (seed 000)", "autocast_fp16": "autocast fp16",
                    "autocast_bf16": "autocast bf16"}


@dataclass(frozen=True)
class Card:
    """A GPU's published peak throughputs, for the time estimates (spec sheets, not measurements:
    sustained rates are lower, so every time computed from them is optimistic)."""

    name: str
    fp32_flops: float  # FP32 FLOP/s (CUDA cores; on Ampere also TF32 tensor cores, dense)
    fp16_flops: float  # 16-bit convolutions as PyTorch runs them: fp16 data, fp32 accumulation
    bf16_flops: float  # bf16 with fp32 accumulation (tensor cores from Ampere on)
    memory_bytes_per_s: float  # device memory bandwidth
    pcie: str  # PCIe generation x lanes
    pcie_bytes_per_s: float  # theoretical host <-> device bandwidth per direction
    source: str
    compute_capability: tuple[int, int] | None = None  # CUDA's (major, minor): picks cuBLAS's workspace size

    def flops(self, precision: str) -> float:
        """FLOP/s of the convolutions of a ``PRECISIONS`` key: its model dtype, or autocast's."""
        dtype, ac = PRECISIONS[precision]
        low = ac or dtype
        return {torch.float16: self.fp16_flops, torch.bfloat16: self.bf16_flops}.get(low, self.fp32_flops)


def pcie_bytes_per_s(gen: int, lanes: int = 16) -> float:
    """Theoretical PCIe bandwidth per direction: GT/s per lane (gen 3: 8, gen 4: 16) x lanes x
    128b/130b encoding / 8 bits (PCI-SIG base specifications 3.0 and 4.0): 15.75 GB/s for gen 3
    x16, 31.5 GB/s for gen 4 x16. Pinned copies reach about 80 % of it in practice."""
    return {3: 8e9, 4: 16e9}[gen] * lanes * 128 / 130 / 8


#: The 8 GB cards the capstone's budget stands for. PyTorch runs an fp16 convolution through
#: cuDNN with fp32 math (ATen's cudnn/Descriptors.h, ConvolutionDescriptor::set: CUDNN_DATA_HALF
#: -> mathType CUDNN_DATA_FLOAT), so its rate is the tensor cores' "fp16 with fp32 accumulate"
#: where there are tensor cores, and the FP32 rate on a GTX 1080 (no tensor cores; its native
#: fp16 runs at 1/64 rate). GeForce cards have no bf16 before Ampere: bf16 at the FP32 rate at best.
CARDS: dict[str, Card] = {c.name: c for c in (
    Card("GTX 1080", 8.87e12, 8.87e12, 8.87e12, 320e9, "3.0 x16", pcie_bytes_per_s(3),
         "NVIDIA GeForce GTX 1080 whitepaper (2016): 2560 CUDA cores at 1733 MHz boost = 8.87 TFLOP/s "
         "FP32, no tensor cores; 8 GB GDDR5X, 320 GB/s; PCIe 3.0 x16", (6, 1)),
    Card("RTX 2080", 10.07e12, 40.3e12, 10.07e12, 448e9, "3.0 x16", pcie_bytes_per_s(3),
         "NVIDIA Turing architecture whitepaper (2018), GeForce RTX 2080 (reference clocks): 2944 CUDA "
         "cores at 1710 MHz = 10.1 TFLOP/s FP32, 40.3 TFLOP/s FP16 tensor with FP32 accumulate; 8 GB "
         "GDDR6, 448 GB/s; PCIe 3.0 x16", (7, 5)),
    Card("RTX 3070", 20.3e12, 40.6e12, 40.6e12, 448e9, "4.0 x16", pcie_bytes_per_s(4),
         "NVIDIA Ampere GA102 whitepaper (2020), appendix A, GeForce RTX 3070: 5888 CUDA cores at 1725 "
         "MHz = 20.3 TFLOP/s FP32, 40.6 TFLOP/s FP16 and BF16 tensor with FP32 accumulate (dense); 8 GB "
         "GDDR6, 448 GB/s; PCIe 4.0 x16", (8, 6)),
)}
#: the card ``step_cost`` assumes when none is named: an 8 GB card with tensor cores on PCIe 3.0
DEFAULT_CARD = "RTX 2080"
#: the throughput the course assumed before (checkpointing.ASSUMED_GPU_FLOPS, 50 TFLOP/s, and
#: 25 GB/s of PCIe; element-wise work not counted): kept to compare rankings with, not a card
FLOPS_ONLY_50T = Card("50 TFLOP/s, FLOPs only (the old assumption)", 50e12, 50e12, 50e12, float("inf"),
                      "4.0 x16", 25e9, "checkpointing.ASSUMED_GPU_FLOPS and ASSUMED_PCIE_BYTES_PER_S")


def card(name: str | Card | None = None) -> Card:
    """``CARDS[name]`` (``DEFAULT_CARD`` for None); a Card is returned as it is."""
    if isinstance(name, Card):
        return name
    name = name or DEFAULT_CARD
    if name not in CARDS:
        raise ValueError(f"unknown card {name!r}: use one of {list(CARDS)} or pass a Card(...)")
    return CARDS[name]


class ElementwiseBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the bytes every op that ``FlopCounterMode`` does not count reads and writes: the
    element-wise and data-movement work of a step (BatchNorm, ReLU, upsampling, concatenation,
    pooling, casts, the optimizer's updates). Per op: the bytes of its tensor inputs plus those of
    its outputs (an in-place op's mutated input once more). Views and metadata queries move no
    data and are skipped, and so are ops that only allocate (``empty``). One pass over memory per
    operand: a lower bound for kernels that read an input twice (cuDNN's BatchNorm does)."""

    _ALLOCATE_ONLY = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
                      "lift_fresh", "_unsafe_view", "_local_scalar_dense"}
    _WRITE_ONLY = {"copy_", "fill_", "zero_"}

    def __init__(self):
        super().__init__()
        self.total = 0
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_leaves
        from torch.utils.flop_counter import flop_registry

        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name, schema = func.overloadpacket.__name__, func._schema
        if func.overloadpacket in flop_registry or name in self._ALLOCATE_ONLY or any(
                r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
            return out  # counted as FLOPs, or allocates only, or a view
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outs and not schema.is_mutable:
            return out  # a metadata query (prim.device, sizes)
        reads = args[1:] if name in self._WRITE_ONLY else args  # their destination is not read
        n = sum(_nbytes(t) for t in tree_leaves((reads, kwargs))) + sum(_nbytes(t) for t in outs)
        if not outs:  # in-place ops that return nothing (the optimizer's _foreach_*_): the writes
            n += sum(_nbytes(t) for a, v in zip(schema.arguments, args, strict=False)
                     if a.alias_info is not None and a.alias_info.is_write for t in tree_leaves(v))
        self.total += n
        self.by_op[name] = self.by_op.get(name, 0) + n
        return out


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


class SaveOnCpuMeter:
    """What ``torch.autograd.graph.save_on_cpu`` would copy to the host: it packs every saved
    tensor into a fresh host tensor of the same size, once per save (no sharing between the ops
    that save one tensor, parameters included), and frees it when autograd drops the save."""

    def __init__(self):
        self.current = self.peak = self.total = 0

    def pack(self, t: torch.Tensor) -> Any:
        n = _nbytes(t)
        self.current += n
        self.total += n
        self.peak = max(self.peak, self.current)
        handle = _Saved(t)
        weakref.finalize(handle, self._drop, n)
        return handle

    def _drop(self, n: int) -> None:
        self.current -= n

    @staticmethod
    def unpack(handle: _Saved) -> torch.Tensor:
        return handle.t

    def watch(self, model: torch.nn.Module) -> None:
        """Count what ``save_on_cpu`` would copy if it wrapped ``model``'s forward, as UNet3D's
        offload does: ``model.forward`` now runs under this meter's pack and unpack hooks."""
        forward = model.forward

        def offloaded_forward(*args):
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                return forward(*args)

        model.forward = offloaded_forward


class _Saved:
    __slots__ = ("t", "__weakref__")

    def __init__(self, t: torch.Tensor):
        self.t = t


@dataclass(frozen=True)
class Cost:
    """A step's estimated cost on one GPU (``explorer.step_cost``): FLOPs, bytes moved, and the
    seconds they take at the card's rates, in three terms added without overlap."""

    flops: int  # per step at the configuration's batch (FlopCounterMode: convolutions)
    offloaded_bytes: int  # what save_on_cpu copies to the host in forward and back in backward
    seconds: float  # estimated: compute_s + elementwise_s + transfer_s, not overlapped
    method: str
    elementwise_bytes: int = 0  # bytes read and written by the ops FlopCounterMode does not count
    host_pinned_bytes: int = 0  # pinned host memory save_on_cpu holds at once (offload only)
    compute_s: float = 0.0  # flops at the card's rate for the precision
    elementwise_s: float = 0.0  # elementwise_bytes at the card's memory bandwidth
    transfer_s: float = 0.0  # 2 x offloaded_bytes at the card's PCIe bandwidth
    card: str = ""


def pareto(points: list[tuple[float, float]]) -> list[bool]:
    """For (time, memory) points: True where no other point is at least as good in both and
    better in one (the memory-time frontier)."""
    return [not any((t2 <= t and m2 <= m) and (t2 < t or m2 < m) for t2, m2 in points)
            for t, m in points]


guard(globals(), SetupError)
