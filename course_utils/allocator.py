"""The CUDA caching allocator, seen from Python: allocated vs reserved, snapshots, and
``expandable_segments``.

* ``torch.cuda.memory_allocated()`` -- bytes in live tensors.
* ``torch.cuda.memory_reserved()``  -- bytes the caching allocator holds from the driver
  ("cached" in old PyTorch, seed 000's ``mem_cached``): live tensors plus freed blocks it keeps
  for reuse. nvidia-smi shows reserved + the CUDA context + other libraries' memory.

Everything here needs a GPU; each function says so clearly when there is none.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .memory import MiB, require_cuda


@dataclass
class AllocatorState:
    label: str
    allocated: int
    reserved: int

    def row(self) -> dict[str, Any]:
        return {"step": self.label, "allocated_MiB": round(self.allocated / MiB, 1),
                "reserved_MiB": round(self.reserved / MiB, 1),
                "cached_unused_MiB": round((self.reserved - self.allocated) / MiB, 1)}


def state(label: str) -> AllocatorState:
    return AllocatorState(label, torch.cuda.memory_allocated(), torch.cuda.memory_reserved())


def caching_demo(mib_per_tensor: int = 256) -> list[AllocatorState]:
    """Allocate, free, reallocate and empty the cache; record allocated/reserved at each step."""
    require_cuda("caching_demo")
    n = mib_per_tensor * MiB // 4
    torch.cuda.empty_cache()
    out = [state("start")]
    a = torch.empty(n, device="cuda")
    out.append(state(f"a = {mib_per_tensor} MiB tensor"))
    b = torch.empty(n, device="cuda")
    out.append(state("b = another one"))
    del a
    out.append(state("del a (block kept in the cache)"))
    c = torch.empty(n // 2, device="cuda")
    out.append(state("c = half size: reuses a's block"))
    del b, c
    out.append(state("del b, c"))
    torch.cuda.empty_cache()
    out.append(state("torch.cuda.empty_cache()"))
    return out


def fragmentation_workload(steps: int = 12, base_mib: int = 64) -> dict[str, int]:
    """Tensors of growing sizes, freed every other one: holes too small for the next request.
    Returns peak allocated and peak reserved; run it under both allocator settings."""
    require_cuda("fragmentation_workload")
    torch.cuda.reset_peak_memory_stats()
    keep = []
    for i in range(steps):
        t = torch.empty((base_mib + 16 * i) * MiB // 4, device="cuda")
        if i % 2 == 0:
            keep.append(t)
        del t
    torch.cuda.synchronize()
    return {"peak_allocated": torch.cuda.max_memory_allocated(),
            "peak_reserved": torch.cuda.max_memory_reserved()}


def compare_expandable_segments() -> dict[str, dict[str, int]]:
    """Run ``fragmentation_workload`` in a fresh process per setting of
    ``PYTORCH_CUDA_ALLOC_CONF`` (it is read once, when CUDA starts, so it cannot be changed
    inside a running kernel)."""
    require_cuda("compare_expandable_segments")
    code = ("import json, course_utils.allocator as a; "
            "print(json.dumps(a.fragmentation_workload()))")
    results = {}
    for conf in ("expandable_segments:False", "expandable_segments:True"):
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300, check=True)
        results[conf] = json.loads(out.stdout.strip().splitlines()[-1])
    return results


def record_snapshot(fn: Callable[[], Any], path: str | Path = "snapshots/step.pickle",
                    max_entries: int = 20_000) -> Path:
    """Record the allocator's history while ``fn()`` runs and dump it to ``path``.

    ``stacks="python"`` and a small ``max_entries`` keep the file small: full C++ stacks take
    minutes to dump and a large snapshot freezes the viewer. Open the file at
    https://pytorch.org/memory_viz or with ``show_snapshot``.
    """
    require_cuda("record_snapshot")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        fn()
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return path


def show_snapshot(path: str | Path, height: int = 600):
    """PyTorch's own memory_viz page for a snapshot, rendered inside the notebook."""
    import html

    from IPython.display import HTML
    from torch.cuda._memory_viz import trace_plot

    with open(path, "rb") as f:
        page = trace_plot(pickle.load(f))
    return HTML(f'<iframe srcdoc="{html.escape(page)}" width="100%" height="{height}" '
                'style="border:1px solid #ccc"></iframe>')
