"""CUDA measurements, the real figures (they need a GPU): ``cuda_peak`` (the allocator's peaks
during a call), ``memory_cap`` (the allocator capped as if the card were smaller),
``require_cuda``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from .units import GiB, mib
from ..checks import MeasureError, guard


def require_cuda(what: str) -> None:
    """Raise RuntimeError naming ``what`` and the CPU alternatives when there is no CUDA GPU."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{what} needs a CUDA GPU and torch.cuda.is_available() is False. "
            "On CPU use predict_step() / SavedTensorMeter for the device-independent figures, "
            "and course_utils.recorded.show() for figures recorded on a GPU."
        )


@dataclass
class CudaPeak:
    """What ``cuda_peak`` measured around a step, in bytes: the allocator's peaks, what was left
    after it, what the forward kept, and the driver's used memory (the CUDA context included)."""

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
        raise MeasureError(f"memory_cap: the cap must be > 0 GiB, got {gib}.", "e.g. memory_cap(4) for 4 GiB.")
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, gib * GiB / total)
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    try:
        yield fraction
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


guard(globals(), MeasureError)
