"""TF32: what an Ampere or Hopper GPU does to an fp32 convolution, and how to switch it off.

**TensorFloat-32** (TF32) is a math mode of NVIDIA's tensor cores (A100, H100, RTX 30xx and
newer). An fp32 operand is read with 10 of its 23 mantissa bits (the exponent keeps its 8 bits,
so the range is fp32's); the products are summed in fp32. Each operand moves by up to 2^-11 of
its value (about 4.9e-4) if it is rounded to nearest, 2^-10 if truncated, where fp32 moves by
2^-24 (6e-8). PyTorch runs **convolutions** (cuDNN)
in TF32 by default and **matmuls** (cuBLAS) in full fp32 by default:
``torch.backends.cudnn.conv.fp32_precision`` is ``"tf32"`` and
``torch.backends.cuda.matmul.fp32_precision`` resolves to IEEE fp32.

* ``tf32_enabled("conv" | "matmul")`` -- what the installed torch's flags say a CUDA op would do.
* ``exact_fp32()`` -- full fp32 for convolutions and matmuls while inside, the flags restored
  afterwards. A correctness check (a GPU's gradient against an fp32 reference) runs its GPU side
  under it; training does not (TF32 is several times faster, and PyTorch's notes on it find that
  most networks converge as in fp32).
* ``emulate_tf32()`` -- a ``TorchDispatchMode`` that makes a CPU compute as a TF32 GPU would:
  it rounds the fp32 operands of convolution, convolution backward and matrix products to TF32
  *when the flags say a GPU would*, so code under ``exact_fp32()`` is not rounded. CI runs the
  course's GPU-side comparisons under it: an assert that a TF32 GPU would break, breaks here.
* ``to_tf32(t)`` -- the rounding itself.

The flags are read and set through PyTorch's ``fp32_precision`` settings (torch 2.9 and newer;
the legacy ``allow_tf32`` switches raise when mixed with them), resolved the way ATen's
``Context::float32Precision`` does: an op's own setting, else its backend's ("cuda"/"all"), else
the global one; ``"none"`` everywhere means IEEE fp32.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from .checks import SetupError, guard

#: fp32 keeps 23 explicit mantissa bits, TF32 10: the 13 low bits go.
DROPPED_BITS = 13
#: largest relative change of one operand rounded to nearest TF32 (half a unit in the last place)
TF32_ROUNDING = 2.0 ** -11
_OPS = ("conv", "matmul")


def _raw(backend: str, op: str) -> str:
    return torch._C._get_fp32_precision_getter(backend, op)


def precision(op: str) -> str:
    """``"tf32"`` or ``"ieee"``: what a CUDA ``op`` ("conv", "rnn" or "matmul") would compute in
    under the current flags, resolved as ATen does (op, then "cuda"/"all", then "generic"/"all")."""
    if op not in ("conv", "rnn", "matmul"):
        raise ValueError(f"precision({op!r}): choose 'conv', 'rnn' or 'matmul'")
    for backend, level in (("cuda", op), ("cuda", "all"), ("generic", "all")):
        value = _raw(backend, level)
        if value != "none":
            return "tf32" if value == "tf32" else "ieee"
    return "ieee"


def tf32_enabled(op: str) -> bool:
    """Would a CUDA ``op`` ("conv" or "matmul") on an Ampere-or-newer GPU run in TF32 now?"""
    return precision(op) == "tf32"


def settings() -> dict[str, str]:
    """The effective fp32 precision of CUDA convolutions and matmuls, e.g. for a printout."""
    return {op: precision(op) for op in _OPS}


#: the per-op settings ``exact_fp32`` changes (directly or through a legacy setter)
_SAVED = (("cuda", "conv"), ("cuda", "rnn"), ("cuda", "matmul"), ("mkldnn", "matmul"))


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """Full fp32 (TF32 off) for CUDA convolutions, RNNs and matmuls inside; every flag exactly as
    it was afterwards, also after an error. Does nothing to a CPU's computation (no TF32 there).

    PyTorch keeps two sets of flags that must agree (it raises when code reads a legacy flag that
    disagrees with the new ones): the legacy ``allow_tf32`` switches and the newer per-op
    ``fp32_precision`` settings. Both are set here, consistently: the legacy setters first (they
    also set the new flags), then the per-op settings to ``"ieee"`` (in case a parent setting,
    e.g. ``torch.backends.cudnn.fp32_precision = "tf32"``, would otherwise win)."""
    raw = {key: _raw(*key) for key in _SAVED}
    before = _legacy_reads()
    # a legacy flag torch refuses to read (it disagrees with the new ones) is found by trying
    # values until the flags read back as they did: the saved one first, then the others
    first = (before[0] if isinstance(before[0], bool) else True,
             before[1] if before[1] in _MATMUL_LEGACY else "highest")
    try:
        torch._C._set_cudnn_allow_tf32(False)
        torch._C._set_cublas_allow_tf32(False)
        for op in ("conv", "rnn", "matmul"):
            torch._C._set_fp32_precision_setter("cuda", op, "ieee")
        yield
    finally:
        for legacy in [first] + [(c, m) for c in (True, False) for m in _MATMUL_LEGACY]:
            _restore(legacy, raw)
            if _legacy_reads() == before:
                break
        else:
            _restore(first, raw)


_MATMUL_LEGACY = ("highest", "high", "medium")


def _restore(legacy: tuple[bool, str], raw: dict) -> None:
    """The legacy flags, then the new ones (a legacy setter also writes new flags)."""
    torch._C._set_cudnn_allow_tf32(legacy[0])
    torch._C._set_float32_matmul_precision(legacy[1])
    for key, value in raw.items():
        torch._C._set_fp32_precision_setter(*key, value)


def _legacy_reads() -> tuple:
    """What torch's legacy getters say now (a value, or "refused" where they raise because the
    legacy and the new flags disagree): cuDNN's allow_tf32, the matmul precision, cuBLAS's
    allow_tf32 -- the comparisons ATen itself makes before a CUDA convolution or matmul."""
    out = []
    for get in (torch._C._get_cudnn_allow_tf32, torch._C._get_float32_matmul_precision,
                torch._C._get_cublas_allow_tf32):
        try:
            out.append(get())
        except RuntimeError:
            out.append("refused")
    return tuple(out)


def to_tf32(t: torch.Tensor, rounding: str = "nearest") -> torch.Tensor:
    """``t`` (fp32) with its mantissa cut to TF32's 10 bits, as an fp32 tensor.

    ``rounding="nearest"``: to the nearest TF32 value, ties away from zero (PTX's
    ``cvt.rna.tf32.f32``, the conversion CUTLASS's TF32 kernels use); ``"truncate"``: the low 13
    bits dropped (a tensor core fed raw fp32 reads only the high bits). NVIDIA does not document
    which one each cuDNN kernel does: they are two plausible models, one TF32 unit apart.
    Infinities and NaNs pass through unchanged; a value that rounds past fp32's largest becomes
    infinite, as in hardware. The memory layout is kept. Other dtypes are returned unchanged."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        return t
    if rounding not in ("nearest", "truncate"):
        raise ValueError(f"to_tf32(rounding={rounding!r}): choose 'nearest' or 'truncate'")
    bits = t.view(torch.int32)  # the same memory, any strides (channels_last stays channels_last)
    kept = bits + (1 << (DROPPED_BITS - 1)) if rounding == "nearest" else bits
    kept = kept & ~((1 << DROPPED_BITS) - 1)
    return torch.where(torch.isfinite(t), kept, bits).view(torch.float32)


def _conv_operands(func, args, kwargs, rounding):
    """convolution(input, weight, bias, ...): input and weight rounded; the bias is added in
    fp32 after the product, on a GPU as here. convolution_backward(grad_output, input, weight,
    ...): all three rounded (the input and weight gradients are both products)."""
    args = list(args)
    if func is torch.ops.aten.convolution.default:
        args[0], args[1] = to_tf32(args[0], rounding), to_tf32(args[1], rounding)
    else:
        args[:3] = [to_tf32(a, rounding) for a in args[:3]]
    return args, kwargs


def _matmul_operands(func, args, kwargs, rounding):
    """mm/bmm(a, b): both rounded; addmm/baddbmm/addbmm(bias, a, b): a and b, not the bias."""
    args = list(args)
    first = 1 if func in _ADD_MATMULS else 0
    args[first:first + 2] = [to_tf32(a, rounding) for a in args[first:first + 2]]
    return args, kwargs


_aten = torch.ops.aten
_CONVS = {_aten.convolution.default, _aten.convolution_backward.default}
_ADD_MATMULS = {_aten.addmm.default, _aten.baddbmm.default, _aten.addbmm.default}
_MATMULS = {_aten.mm.default, _aten.bmm.default} | _ADD_MATMULS


class emulate_tf32(TorchDispatchMode):
    """While active, fp32 convolutions (forward and backward) and matrix products on this CPU
    read their operands as a TF32 GPU would: rounded to TF32 before the product, summed in fp32.
    Whether an op is rounded follows the same flags a GPU follows (``tf32_enabled``), read at
    each op: ``exact_fp32()`` inside the mode switches the rounding off, as it switches TF32 off
    on a GPU. ``counts`` says how many ops of each kind were rounded.

    It sits below autograd (a dispatch mode), so it sees the ops of the backward pass too (a CPU
    backward runs on the calling thread; the autograd engine also hands the mode to its device
    threads). It is a model of the tensor cores' input rounding, not of cuDNN's choice of
    algorithm (summation order, Winograd or FFT transforms, or kernels that skip the tensor cores
    for tiny convolutions): it reproduces the size of TF32's error, not its bits. RNNs are not
    modelled: on a GPU cuDNN's RNN follows the "rnn" flag, on a CPU an LSTM is matmuls."""

    def __init__(self, rounding: str = "nearest"):
        super().__init__()
        if rounding not in ("nearest", "truncate"):
            raise ValueError(f"emulate_tf32(rounding={rounding!r}): choose 'nearest' or 'truncate'")
        self.rounding = rounding
        self.counts = {"conv": 0, "matmul": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _CONVS and tf32_enabled("conv") and _any_fp32(args[:3]):
            args, kwargs = _conv_operands(func, args, kwargs, self.rounding)
            self.counts["conv"] += 1
        elif func in _MATMULS and tf32_enabled("matmul") and _any_fp32(args[:3]):
            args, kwargs = _matmul_operands(func, args, kwargs, self.rounding)
            self.counts["matmul"] += 1
        return func(*args, **kwargs)


def _any_fp32(args: Any) -> bool:
    found = []
    tree_map(lambda a: found.append(isinstance(a, torch.Tensor) and a.dtype == torch.float32), list(args))
    return any(found)


#: ``COURSE_EMULATE_TF32=1``: the ranks ``parallel.launch`` starts compute as TF32 GPUs would
ENV_VAR = "COURSE_EMULATE_TF32"


def emulated_if_asked() -> contextlib.AbstractContextManager:
    """``emulate_tf32()`` when ``COURSE_EMULATE_TF32=1`` is set, else nothing. ``parallel``'s
    ranks run their worker inside it: a launched rank is where a learner's GPU computes, so CI
    (``make test-emulated``) sets it to run the notebooks' parallel comparisons as a TF32 GPU
    would. The notebook's own process is left alone: its references stand for an fp32 CPU."""
    value = os.environ.get(ENV_VAR, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV_VAR}={value!r}: set it to 1 (emulate TF32 in launched ranks) or 0")
    return emulate_tf32() if value == "1" else contextlib.nullcontext()


#: the notebooks (and their solutions) whose asserts compare what launched ranks compute with the
#: notebook's own fp32 reference: the test suite runs them with ``COURSE_EMULATE_TF32=1`` (conftest.py)
TF32_RANK_NOTEBOOKS = ("08_data_parallel.ipynb", "09_model_parallel.ipynb")


@contextlib.contextmanager
def ranks_on_tf32_for(path) -> Iterator[bool]:
    """Inside, ``COURSE_EMULATE_TF32=1`` when ``path`` is one of ``TF32_RANK_NOTEBOOKS`` and the
    variable is not set already (an explicit ``0`` is kept); yields whether it set it. The test
    suite starts such a notebook's kernel inside it, so the kernel and the ranks it launches inherit
    it: a learner's CPU computes exactly, a recent GPU in TF32, and a notebook's comparison that
    holds on TF32 ranks holds on exact ones (same code, a smaller difference), so the suite runs
    each of these notebooks once, on TF32 ranks."""
    name = os.path.basename(str(path))
    setting = name in TF32_RANK_NOTEBOOKS and ENV_VAR not in os.environ
    if setting:
        os.environ[ENV_VAR] = "1"
    try:
        yield setting
    finally:
        if setting:
            os.environ.pop(ENV_VAR, None)


def formats() -> list[dict]:
    """Sign, exponent and mantissa bits of fp32, TF32, bf16 and fp16 (from ``torch.finfo``;
    TF32, which is no storage dtype, is fp32 with ``DROPPED_BITS`` fewer mantissa bits)."""
    rows = []
    for name, dtype in (("fp32", torch.float32), ("TF32", None), ("bf16", torch.bfloat16),
                        ("fp16", torch.float16)):
        f = torch.finfo(dtype or torch.float32)
        stored_mantissa = round(-math.log2(f.eps))
        mantissa = stored_mantissa - (DROPPED_BITS if dtype is None else 0)
        rows.append({"format": name, "sign": 1, "exponent": f.bits - 1 - stored_mantissa,
                     "mantissa": mantissa, "stored bits": f.bits,
                     "relative rounding (half an ulp)": 2.0 ** -(mantissa + 1)})
    return rows


def draw_formats(ax=None):
    """The four formats as rows of bits: sign, exponent, mantissa; TF32's 13 bits that a tensor
    core does not read are hatched (the value is still stored in 32 bits)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 2.4))
    colours = {"sign": "#d62728", "exponent": "#1f77b4", "mantissa": "#2ca02c"}
    rows = formats()
    for y, row in enumerate(reversed(rows)):
        x = 0
        for part in ("sign", "exponent", "mantissa"):
            ax.barh(y, row[part], left=x, color=colours[part], edgecolor="white",
                    label=part if y == 0 else None)
            if row[part] > 2:
                ax.text(x + row[part] / 2, y, f"{row[part]} {part}", ha="center", va="center",
                        color="white", fontsize=9)
            x += row[part]
        if row["format"] == "TF32":
            ax.barh(y, DROPPED_BITS, left=x, color="none", edgecolor="grey", hatch="///")
            ax.text(x + DROPPED_BITS / 2, y, f"{DROPPED_BITS} bits not read", ha="center", va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), [f"{r['format']}  (~{r['relative rounding (half an ulp)']:.0e})"
                                     for r in reversed(rows)])
    ax.set_xlim(0, 32)
    ax.set_xlabel("bits, most significant first; in brackets: the largest relative rounding of one value")
    ax.legend(loc="lower right", fontsize=8, ncol=3)
    ax.set_title("fp32, and what a TF32 tensor core reads of it, beside the 16-bit formats")
    return ax


guard(globals(), SetupError)
