"""Seed 003's tiled step run for real and measured: ``measure_tiled_step`` (on CUDA, the
allocator's peaks under a memory cap; on CPU, the time) and ``measure_seed003_cuda`` (the
predicted largest N checked on a GPU, prediction beside measurement).
"""

from __future__ import annotations

from typing import Any

import torch

from ..checks import TilingError, guard
from ..limit_test import input_bytes
from ..memory import catch_oom, cuda_peak, mib, require_cuda
from .predict import largest_tiled_n, _limit_net, predict_tiled_step
from .step import tiled_step


def measure_tiled_step(n: int, owned: int = 1, *, device: str | torch.device = "cuda",
                       stream: bool = False, budget_bytes: float | None = None) -> dict:
    """Run seed 003's tiled step on an N^3 volume for real and measure it: on CUDA with the
    allocator's peaks (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``, capped
    at ``budget_bytes`` with ``set_per_process_memory_fraction``; an out-of-memory error is
    caught and reported); on CPU only the time (no allocator statistics). ``"cuda"`` means the
    current CUDA device: ``set_per_process_memory_fraction`` needs its index (a
    ``torch.device("cuda")`` without one raised ``ValueError`` on the H200 run of 2026-11-27)."""
    import time

    if n < 1 or owned < 1:
        raise TilingError(f"measure_tiled_step(n={n}, owned={owned}): a volume of n >= 1 voxels a side, slabs "
                          "owning owned >= 1 depth voxels.", "n >= 1 and owned >= 1.")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    tiles = -(-n // owned)
    cuda = device.type == "cuda"
    row: dict[str, Any] = {"N": n, "slabs": tiles, "streamed": stream}
    if cuda and budget_bytes is not None:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)
    try:
        with catch_oom(verbose=False) as oom:
            torch.manual_seed(0)
            model = _limit_net().to(device)
            where = torch.device("cpu") if stream else device
            x = torch.randn(1, 1, n, n, n, device=where)
            target = torch.randn(1, 1, n, n, n, device=where)
            if stream and cuda:
                x, target = x.pin_memory(), target.pin_memory()
            t0 = time.perf_counter()
            if cuda:
                peak = cuda_peak(lambda: tiled_step(model, x, target, tiles, stream=stream), baseline=False)
                row.update({"peak allocated MiB": round(mib(peak.peak_allocated)),
                            "peak reserved MiB": round(mib(peak.peak_reserved))})
            else:
                tiled_step(model, x, target, tiles, stream=stream)
            row["step s"] = round(time.perf_counter() - t0, 2)
        row["fits"] = oom.ok
        if not oom.ok:
            row["error"] = oom.explanation.splitlines()[0]
    finally:
        if cuda and budget_bytes is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        if cuda:
            torch.cuda.empty_cache()
    return row


def measure_seed003_cuda(budget_bytes: float, margin_bytes: float = 256 * 2**20):
    """On a CUDA GPU capped at ``budget_bytes``: seed 003's tiled step at the predicted largest
    N, at the largest N with ``margin_bytes`` left for cuDNN's workspaces (which the prediction
    does not see), and streamed from pinned host memory (slabs owning 32 depth voxels) where
    this machine's host memory holds the volume twice over. One row each, with the prediction
    beside the measurement (``torch.cuda.max_memory_allocated``)."""
    import os

    import pandas as pd

    if margin_bytes >= budget_bytes:
        raise TilingError(f"measure_seed003_cuda: a margin of {margin_bytes:,} bytes leaves nothing of the budget "
                          f"({budget_bytes:,} bytes).", "a margin smaller than the budget (default: 256 MiB).")
    require_cuda("measure_seed003_cuda")
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cases = [("volume on the device", largest_tiled_n(budget_bytes, start=256), 1, False),
             (f"on the device, {mib(margin_bytes):.0f} MiB margin",
              largest_tiled_n(budget_bytes - margin_bytes, start=256), 1, False),
             ("streamed from host", largest_tiled_n(budget_bytes, owned=32, stream=True, start=256), 32, True)]
    rows = []
    for label, n, owned, stream in cases:
        predicted = predict_tiled_step(_limit_net, n, -(-n // owned), stream=stream).peak
        if stream and 2 * 2 * input_bytes(n) > host:
            rows.append({"case": label, "N": n, "predicted MiB": round(mib(predicted)),
                         "fits": None, "error": f"skipped: needs {2 * 2 * input_bytes(n) / 2**30:.0f} GiB "
                         f"of host memory, this machine has {host / 2**30:.0f}"})
            continue
        row = measure_tiled_step(n, owned, stream=stream, budget_bytes=budget_bytes)
        rows.append({"case": label, "predicted MiB": round(mib(predicted)), **row})
    return pd.DataFrame(rows).fillna("")


guard(globals(), TilingError)
