"""Baseline vs technique: one table, the same step measured or predicted for each variant."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .memory import cuda_peak, default_dtype, mib, predict_step


def technique_table(
    builds: dict[str, Callable[[], nn.Module]],
    input_shape: tuple[int, ...],
    *,
    n_classes: int = 5,
    dtype: torch.dtype = torch.float32,
    fake: bool = True,
    device: str | torch.device = "cpu",
    autocast: dict[str, torch.dtype | None] | None = None,
    dtypes: dict[str, torch.dtype] | None = None,
):
    """One training step (forward, backward, Adam) per variant; the first is the baseline.

    * ``device='cuda'``: measured with the CUDA allocator (``max_memory_allocated``); the
      saved-for-backward column is measured too.
    * otherwise the MemTracker log: predicted under ``FakeTensorMode`` (``fake=True``) or
      measured on real CPU tensors (``fake=False``).

    ``autocast`` maps a variant's name to the dtype its forward runs under ``torch.autocast``;
    ``dtypes`` maps a name to the dtype its model and input are built in (default ``dtype``).
    Returns a pandas DataFrame, memory in MiB.
    """
    import pandas as pd

    autocast, dtypes = autocast or {}, dtypes or {}
    rows = []
    for name, build in builds.items():
        ac, dt = autocast.get(name), dtypes.get(name, dtype)
        if torch.device(device).type == "cuda":
            rows.append(_cuda_row(name, build, input_shape, n_classes, dt, ac, device))
            continue
        p = predict_step(build, input_shape, n_classes=n_classes, dtype=dt, fake=fake,
                         autocast_dtype=ac)
        rows.append({"variant": name, "peak MiB": mib(p.peak), "saved MiB": mib(p.saved_peak),
                     "params MiB": mib(p.breakdown["Parameter"]),
                     "activations at peak MiB": mib(p.breakdown["Activation"]),
                     "method": p.method})
    df = pd.DataFrame(rows)
    base = df["peak MiB"].iloc[0]
    df["peak vs baseline %"] = (100 * (df["peak MiB"] - base) / base).round(1)
    base_saved = df["saved MiB"].iloc[0]
    df["saved vs baseline %"] = (100 * (df["saved MiB"] - base_saved) / base_saved).round(1)
    for c in ("peak MiB", "saved MiB", "activations at peak MiB"):
        df[c] = df[c].round(1)
    df["params MiB"] = df["params MiB"].round(1)
    return df[["variant", "peak MiB", "peak vs baseline %", "saved MiB", "saved vs baseline %",
               "activations at peak MiB", "params MiB", "method"]]


def _cuda_row(name, build, input_shape, n_classes, dtype, ac, device):
    from .memory import SavedTensorMeter

    with default_dtype(dtype):
        model = build().to(device)
    x = torch.randn(input_shape, device=device, dtype=dtype)
    y = torch.randint(0, n_classes, (input_shape[0], *input_shape[2:]), device=device)
    opt = torch.optim.Adam(model.parameters())
    meter = SavedTensorMeter(model.parameters())

    def step():
        with meter, torch.autocast("cuda", dtype=ac or torch.float16, enabled=ac is not None):
            out = model(x)
        nn.functional.cross_entropy(out.float(), y).backward()
        opt.step()

    peak = cuda_peak(step, baseline=False)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"variant": name, "peak MiB": mib(peak.peak_allocated), "saved MiB": mib(meter.peak),
            "params MiB": mib(params),
            "activations at peak MiB": float("nan"),
            "method": "measured (cuda max_memory_allocated)"}


def step_time(build: Callable[[], nn.Module], input_shape: tuple[int, ...], *, n_classes: int = 5,
              device: str | torch.device = "cpu", reps: int = 3,
              autocast_dtype: torch.dtype | None = None,
              dtype: torch.dtype = torch.float32) -> float:
    """Median seconds of one real training step (forward, backward, Adam), after one warm-up.
    ``dtype`` is the input's (match a model built in fp16). For notebooks and benchmarks; tests
    never assert on time."""
    import statistics
    import time

    dev = torch.device(device)
    torch.manual_seed(0)
    model = build().to(dev)
    x = torch.randn(input_shape, device=dev, dtype=dtype)
    y = torch.randint(0, n_classes, (input_shape[0], *input_shape[2:]), device=dev)
    opt = torch.optim.Adam(model.parameters())
    times = []
    for i in range(reps + 1):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            out = model(x)
        nn.functional.cross_entropy(out.float(), y).backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)
