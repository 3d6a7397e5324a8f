"""Units: bytes in MiB and GiB, and the bytes a tensor's elements occupy."""

from __future__ import annotations

import torch

from ..checks import MeasureError, guard

MiB = 2**20
GiB = 2**30


def mib(nbytes: float | None) -> float:
    """Bytes -> MiB (NaN stays NaN, None becomes NaN)."""
    return float("nan") if nbytes is None else nbytes / MiB


def tensor_bytes(t: torch.Tensor) -> int:
    """numel x element size: the bytes a tensor's elements occupy."""
    return t.numel() * t.element_size()


guard(globals(), MeasureError, signed=("nbytes",), nan=("nbytes",))  # mib(a difference); NaN stays NaN
