"""The CUDA caching allocator, seen from Python: allocated vs reserved, snapshots, and
``expandable_segments``.

* ``torch.cuda.memory_allocated()`` -- bytes in live tensors.
* ``torch.cuda.memory_reserved()``  -- bytes the caching allocator holds from the driver
  ("cached" in old PyTorch, seed 000's ``mem_cached``): live tensors plus freed blocks it keeps
  for reuse. nvidia-smi shows reserved + the CUDA context + other libraries' memory.

The measuring functions need a GPU and say so clearly when there is none. ``SimulatedAllocator``
/ ``simulate`` / ``trace_step`` model the allocator on any machine: a CPU learner sees allocated
vs reserved, segments and fragmentation for seed 000's full-size step, labelled "simulated".
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .checks import TechniqueError, guard
from .files import atomic_write
from .memory import LiveBytes, MiB, default_dtype, require_cuda, target_spec
from .train import training_step


@dataclass
class AllocatorState:
    """The CUDA allocator's two figures after one step of ``caching_demo``: ``allocated`` (bytes in
    live tensors) and ``reserved`` (bytes held from the driver, the cache included)."""

    label: str
    allocated: int
    reserved: int

    def row(self) -> dict[str, Any]:
        return {"step": self.label, "allocated_MiB": round(self.allocated / MiB, 1),
                "reserved_MiB": round(self.reserved / MiB, 1),
                "cached_unused_MiB": round((self.reserved - self.allocated) / MiB, 1)}


def state(label: str) -> AllocatorState:
    """The allocator's figures now, under ``label``: ``torch.cuda.memory_allocated()`` and
    ``memory_reserved()``, in bytes (needs a GPU)."""
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


# --------------------------------------------------------------------------------------------
# What is live at a measured peak (needs a GPU to record; the replay runs anywhere)
# --------------------------------------------------------------------------------------------
#: frames that name where a block was really asked for: a kernel library or an ATen op
_NATIVE = ("cudnn", "cublas", "at::native::", "at::_ops::")


@dataclass
class PeakBlock:
    """One allocation live at the peak: its size and where it was made (innermost frame first)."""

    size: int
    frames: list[str]

    def where(self, n: int = 2) -> str:
        """The innermost C++ frame that names a kernel library or an ATen op (a cuDNN workspace
        shows as ``cudnn``), then the first ``n`` Python frames."""
        cpp = [f[:100] for f in self.frames if any(k in f for k in _NATIVE)]
        py = [f for f in self.frames if ".py:" in f]
        return " < ".join(cpp[:1] + py[:n]) or " < ".join(f[:100] for f in self.frames[:n]) or "?"


def live_at_peak(trace: list[dict[str, Any]]) -> tuple[int, list[PeakBlock]]:
    """Replay an allocator trace (``torch.cuda.memory._snapshot()["device_traces"][0]``: events
    with ``action``, ``addr``, ``size``, ``frames``) and return the largest total it reached, counted
    from where the recording began, and the blocks live at that moment, largest first. The peak
    is what ``max_memory_allocated`` sees above what was live before recording; the blocks say
    what made it: a tensor a PyTorch op returned, a cuDNN workspace, an optimizer state."""
    live: dict[int, dict[str, Any]] = {}
    cur = best = 0
    best_live: dict[int, dict[str, Any]] = {}
    for ev in trace:
        action = ev.get("action")
        if action == "alloc":
            live[ev["addr"]] = ev
            cur += ev["size"]
            if cur > best:
                best, best_live = cur, dict(live)
        elif action == "free_requested" and ev.get("addr") in live:
            cur -= live.pop(ev["addr"])["size"]
    blocks = [PeakBlock(e["size"], [f"{f.get('name', '?')} ({Path(str(f.get('filename', '?'))).name}:{f.get('line', '?')})"
                                    for f in e.get("frames", [])])
              for e in best_live.values()]
    return best, sorted(blocks, key=lambda b: -b.size)


def peak_blocks(fn: Callable[[], Any], stacks: str = "all",
                max_entries: int = 200_000) -> tuple[int, list[PeakBlock]]:
    """Run ``fn()`` with the allocator's history recorded (``stacks="all"``: Python and C++
    frames, so a cuDNN workspace shows as one) and return ``live_at_peak`` of its trace."""
    require_cuda("peak_blocks")
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks=stacks)
    try:
        fn()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return live_at_peak(snap["device_traces"][0] if snap["device_traces"] else [])


# --------------------------------------------------------------------------------------------
# A model of the caching allocator, for machines without a GPU
# --------------------------------------------------------------------------------------------
#: constants of c10/cuda/CUDACachingAllocator.cpp
MIN_BLOCK = 512  # every request is rounded up to a multiple of this
SMALL_SIZE = 1 * MiB  # requests up to this come from the small pool...
SMALL_BUFFER = 2 * MiB  # ...which cudaMallocs 2 MiB segments
MIN_LARGE_ALLOC = 10 * MiB  # large requests below this share 20 MiB segments...
LARGE_BUFFER = 20 * MiB
ROUND_LARGE = 2 * MiB  # ...larger ones get a segment of their own, rounded up to 2 MiB


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    key: int | None = None  # the tensor's storage while allocated; None = free

    @property
    def free(self) -> bool:
        return self.key is None


@dataclass
class SimulatedAllocator:
    """PyTorch's CUDA caching allocator in miniature, replaying allocation events.

    Modelled: rounding to 512 B; the small (<= 1 MiB) and large pools; segment sizes (2 MiB,
    20 MiB, or the request rounded up to 2 MiB); best-fit reuse of cached free blocks; splitting
    (small pool: if >= 512 B remain; large: if > 1 MiB remain); merging freed neighbours; on a
    cap (``limit``), freeing every wholly unused cached segment and retrying before an
    out-of-memory. Not modelled: streams, expandable segments, garbage-collection thresholds.
    A model, not a measurement: figures from it say "simulated".
    """

    limit: int | None = None
    segments: list[list[_Block]] = field(default_factory=list)
    where: dict[int, _Block] = field(default_factory=dict)
    allocated: int = 0
    reserved: int = 0
    n_mallocs: int = 0

    @staticmethod
    def round_size(n: int) -> int:
        return max(MIN_BLOCK, -(-n // MIN_BLOCK) * MIN_BLOCK)

    @staticmethod
    def segment_size(n: int) -> int:
        if n <= SMALL_SIZE:
            return SMALL_BUFFER
        if n < MIN_LARGE_ALLOC:
            return LARGE_BUFFER
        return -(-n // ROUND_LARGE) * ROUND_LARGE

    def pool(self, segment: int) -> str:
        """"small" or "large": the pool a segment belongs to (small-pool segments are 2 MiB)."""
        return "small" if self.segment_size_of(segment) == SMALL_BUFFER else "large"

    def segment_size_of(self, segment: int) -> int:
        return sum(b.size for b in self.segments[segment])

    def malloc(self, nbytes: int, key: int) -> None:
        size = self.round_size(nbytes)
        pool = "small" if size <= SMALL_SIZE else "large"
        fits = [b for seg in range(len(self.segments)) if self.segments[seg] and self.pool(seg) == pool
                for b in self.segments[seg] if b.free and b.size >= size]
        if not fits:
            seg_size = self.segment_size(size)
            if self.limit is not None and self.reserved + seg_size > self.limit:
                self.empty_cache()
                if self.reserved + seg_size > self.limit:
                    raise MemoryError(
                        f"simulated CUDA out of memory: tried to allocate {size / MiB:.2f} MiB; "
                        f"{self.allocated / MiB:.0f} MiB allocated, {self.reserved / MiB:.0f} MiB "
                        f"reserved of a {self.limit / MiB:.0f} MiB limit")
            self.segments.append([_Block(len(self.segments), 0, seg_size)])
            self.reserved += seg_size
            self.n_mallocs += 1
            fits = self.segments[-1][:]
        block = min(fits, key=lambda b: (b.size, b.segment, b.offset))  # best fit
        rest = block.size - size
        if rest >= MIN_BLOCK if pool == "small" else rest > SMALL_SIZE:
            blocks = self.segments[block.segment]
            i = blocks.index(block)
            blocks.insert(i + 1, _Block(block.segment, block.offset + size, rest))
            block.size = size
        block.key = key
        self.where[key] = block
        self.allocated += block.size

    def free(self, key: int) -> None:
        block = self.where.pop(key)
        block.key = None
        self.allocated -= block.size
        blocks = self.segments[block.segment]
        i = blocks.index(block)
        if i + 1 < len(blocks) and blocks[i + 1].free:  # merge with the next free block
            block.size += blocks.pop(i + 1).size
        if i > 0 and blocks[i - 1].free:  # and with the previous one
            blocks[i - 1].size += blocks.pop(i).size

    def empty_cache(self) -> None:
        """Return every wholly free segment to the driver (``torch.cuda.empty_cache()``)."""
        for seg, blocks in enumerate(self.segments):
            if len(blocks) == 1 and blocks[0].free:
                self.reserved -= blocks[0].size
                self.segments[seg] = []

    def snapshot(self) -> list[list[tuple[int, int, bool]]]:
        """Each live segment's blocks as (offset, size, allocated)."""
        return [[(b.offset, b.size, not b.free) for b in blocks] for blocks in self.segments if blocks]


@dataclass
class Simulation:
    """What ``simulate`` replayed: allocated and reserved bytes after each event, and the
    ``SimulatedAllocator`` in its final state."""

    allocated: list[int]  # after each event
    reserved: list[int]
    allocator: SimulatedAllocator
    method: str = "simulated (a model of PyTorch's caching allocator; not a measurement)"

    @property
    def peak_allocated(self) -> int:
        return max(self.allocated, default=0)

    @property
    def peak_reserved(self) -> int:
        return max(self.reserved, default=0)


def simulate(events: list[tuple[int, int]], limit: int | None = None,
             resident: list[tuple[int, int]] = ()) -> Simulation:
    """Replay allocation events (``memory.LiveBytes(trace=True).events``: ``(+bytes, key)`` for
    an allocation, ``(-bytes, key)`` for a free) through ``SimulatedAllocator``. ``resident``:
    allocations made before (weights, batch), replayed first and never freed."""
    alloc = SimulatedAllocator(limit=limit)
    for size, key in resident:
        alloc.malloc(size, key)
    a, r = [], []
    for size, key in events:
        if size > 0:
            alloc.malloc(size, key)
        elif key in alloc.where:
            alloc.free(key)
        a.append(alloc.allocated)
        r.append(alloc.reserved)
    return Simulation(a, r, alloc)


def trace_step(build_model: Callable[[], Any], input_shape: tuple[int, ...], *,
               dtype: torch.dtype = torch.float32, n_classes: int = 5, steps: int = 2,
               target_shape: tuple[int, ...] | None = None, optimizer: bool = True):
    """The allocation events of ``steps`` training steps (``train.training_step``, Adam) of the
    model ``build_model()`` builds, under FakeTensorMode: any size, on a CPU. The target is class
    indices (cross-entropy), or with ``target_shape`` a float tensor (MSE, as in seed 003).
    Returns ``(resident, events, step_starts)``: what exists before (weights, batch), the
    events, and the index of the first event of each step."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    classify, target_shape, loss_fn = target_spec(tuple(input_shape), target_shape, None, None)
    with default_dtype(dtype), FakeTensorMode():
        model = build_model()
        x = torch.randn(input_shape)
        y = torch.randint(0, n_classes, target_shape) if classify else torch.randn(target_shape)
        opt = torch.optim.Adam(model.parameters(), foreach=True) if optimizer else None
        with LiveBytes(trace=True) as live:
            live.track(model, x, y)
            resident = list(live.events)
            live.events.clear()
            starts = []
            for _ in range(steps):
                starts.append(len(live.events))
                training_step(model, x, y, opt, loss_fn=loss_fn)
    return resident, list(live.events), starts


def plot_simulation(sim: Simulation, starts: list[int] = (), ax=None, title: str = ""):
    """Allocated and reserved over the replayed events, steps marked."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.2))
    ax.plot([v / MiB for v in sim.allocated], label="allocated (live tensors)")
    ax.plot([v / MiB for v in sim.reserved], label="reserved (segments held from the driver)")
    ax.fill_between(range(len(sim.reserved)), [v / MiB for v in sim.allocated],
                    [v / MiB for v in sim.reserved], color="grey", alpha=0.2, label="cached, free")
    for i, s in enumerate(starts):
        ax.axvline(s, color="k", lw=0.6, ls=":")
        ax.text(s, 0.98, f" step {i + 1}", va="top", fontsize=8, transform=ax.get_xaxis_transform())
    ax.set_xlabel("allocation event")
    ax.set_ylabel("MiB")
    ax.set_title(title or f"allocated vs reserved [{sim.method}]", fontsize=9)
    ax.legend(fontsize=8, loc="center right")
    return ax


def plot_segments(alloc: SimulatedAllocator, ax=None, title: str = "", largest: int = 12):
    """The ``largest`` segments as horizontal bars: allocated blocks filled, cached free blocks
    hatched. What ``torch.cuda.memory._snapshot()`` shows, in miniature."""
    import matplotlib.pyplot as plt

    segs = sorted(alloc.snapshot(), key=lambda blocks: -sum(s for _, s, _ in blocks))[:largest]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.35 * len(segs) + 1.2))
    for row, blocks in enumerate(segs):
        for off, size, used in blocks:
            ax.barh(row, size / MiB, left=off / MiB, color="#4c72b0" if used else "white",
                    edgecolor="#4c72b0", hatch=None if used else "///", lw=0.6)
    ax.set_yticks(range(len(segs)), [f"segment {i}" for i in range(len(segs))], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("MiB within the segment (filled: allocated block; hatched: cached free block)")
    ax.set_title(title or "segments of the simulated caching allocator", fontsize=9)
    return ax


# --------------------------------------------------------------------------------------------
# A memory snapshot, drawn by the course (no viewer script, no network): the active-memory
# timeline of torch.cuda.memory._snapshot()'s trace
# --------------------------------------------------------------------------------------------
#: the trace events that change what is live: an allocation, and the free that completes it
#: (``free_requested`` comes first; the block stays live until the stream is done with it)
_LIVE_ACTIONS = ("alloc", "free_completed")


@dataclass
class Allocation:
    """One allocation of a snapshot's trace: its bytes, where it was made (``frames``, innermost
    first, as the snapshot stores them) and when it was live, in the timeline's x (``start`` to
    ``end``, excluded); ``preexisting``: live before the trace began."""

    addr: int
    size: int
    start: int
    end: int
    frames: list[dict[str, Any]]
    preexisting: bool = False

    def where(self) -> str:
        """The innermost frame outside torch's own code (``unet.py:57 forward``), else the first."""
        def fmt(f: dict[str, Any]) -> str:
            if not f.get("filename"):  # a frame that only names the tensor (cpu_snapshot's weights)
                return str(f.get("name", "?"))
            return f"{Path(str(f['filename'])).name}:{f.get('line', '?')} {f.get('name', '?')}"
        frames = [f for f in self.frames if isinstance(f, dict)]
        ours = [f for f in frames if not f.get("filename") or (
            "/torch/" not in str(f["filename"]).replace("\\", "/") and str(f["filename"]).endswith(".py"))]
        return fmt((ours or frames)[0]) if (ours or frames) else "(no stack recorded)"


@dataclass
class ActiveTimeline:
    """What ``active_timeline`` computes: ``total[x]`` bytes live at x (x = 0 before the first
    event, x = i + 1 after the trace's i-th alloc / free_completed event), every allocation, and
    each allocation's ``bands``: ``(x, offset)`` points where its place in the stack (the bytes of
    the live allocations made before it) changes."""

    total: list[int]
    allocations: list[Allocation]
    bands: list[list[tuple[int, int]]]
    device: int

    def offset(self, i: int, x: int) -> int:
        """Where allocation ``i`` starts in the stack at ``x`` (it must be live at x)."""
        a = self.allocations[i]
        if not a.start <= x < a.end:
            raise ValueError(f"allocation {i} is live from x={a.start} to {a.end}, not at x={x}")
        return [off for px, off in self.bands[i] if px <= x][-1]


def _load_snapshot(snapshot: dict[str, Any] | str | Path) -> dict[str, Any]:
    if isinstance(snapshot, (str, Path)):
        with open(snapshot, "rb") as f:
            snapshot = pickle.load(f)
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ValueError("not a memory snapshot: expected the dict torch.cuda.memory._snapshot() returns "
                         "(keys 'segments' and 'device_traces'), or the path of a pickle "
                         "torch.cuda.memory._dump_snapshot wrote")
    return snapshot


def active_timeline(snapshot: dict[str, Any] | str | Path, device: int | None = None) -> ActiveTimeline:
    """The active-memory timeline of a snapshot (a dict in ``torch.cuda.memory._snapshot()``'s
    format, or the path of its pickle), as PyTorch's viewer draws it: each allocation from its
    ``alloc`` to its ``free_completed``, stacked in the order they were made; when one is freed,
    those above it move down. An allocation freed but never allocated in the trace (the trace
    keeps only the last ``max_entries`` events), and a block still allocated in ``segments`` that
    the trace never allocated, were live before it began: they sit at the bottom from x = 0.
    ``device``: the index in ``device_traces`` (default: the one with the most events)."""
    snap = _load_snapshot(snapshot)
    traces = snap["device_traces"]
    if device is None:
        device = max(range(len(traces)), key=lambda d: len(traces[d])) if traces else 0
    if traces and not 0 <= device < len(traces):
        raise ValueError(f"device {device}: the snapshot has traces for devices 0 to {len(traces) - 1}")
    events = [e for e in (traces[device] if traces else []) if e.get("action") in _LIVE_ACTIONS]
    n = len(events)
    allocs: list[Allocation] = []
    live: dict[int, int] = {}  # addr -> index in allocs
    for x, e in enumerate(events, start=1):  # find the allocations made before the trace
        if e["action"] == "alloc":
            live[e["addr"]] = -1
        elif e["addr"] in live:
            del live[e["addr"]]
        else:
            allocs.append(Allocation(e["addr"], e["size"], 0, x, e.get("frames") or [], True))
    for seg in snap.get("segments", []):
        if seg.get("device", device) != device:
            continue
        addr = seg.get("address", 0)
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated" and addr not in live:
                allocs.append(Allocation(addr, b["size"], 0, n + 1, b.get("frames") or [], True))
            addr += b["size"]
    live = {}
    for x, e in enumerate(events, start=1):
        if e["action"] == "alloc":
            live[e["addr"]] = len(allocs)
            allocs.append(Allocation(e["addr"], e["size"], x, n + 1, e.get("frames") or []))
        elif e["addr"] in live:
            allocs[live.pop(e["addr"])].end = x
    # the stack, event by event: on a free, every allocation above moves down by its size
    bands: list[list[tuple[int, int]]] = [[] for _ in allocs]
    stack: list[int] = []
    offsets: dict[int, int] = {}
    total = 0
    for i, a in enumerate(allocs):
        if a.preexisting:
            stack.append(i)
            offsets[i] = total
            bands[i].append((0, total))
            total += a.size
    totals = [total]
    by_x: dict[int, list[tuple[str, int]]] = {}
    for i, a in enumerate(allocs):
        if not a.preexisting:
            by_x.setdefault(a.start, []).append(("alloc", i))
        if a.end <= n:
            by_x.setdefault(a.end, []).append(("free", i))
    for x in range(1, n + 1):
        for kind, i in by_x.get(x, []):
            if kind == "alloc":
                stack.append(i)
                offsets[i] = total
                bands[i].append((x, total))
                total += allocs[i].size
            else:
                k = stack.index(i)
                for j in stack[k + 1:]:
                    offsets[j] -= allocs[i].size
                    bands[j].append((x, offsets[j]))
                stack.pop(k)
                total -= allocs[i].size
        totals.append(total)
    return ActiveTimeline(totals, allocs, bands, device)


def plot_snapshot(snapshot: dict[str, Any] | str | Path, ax=None, largest: int = 8, device: int | None = None,
                  title: str = ""):
    """The active-memory timeline of a snapshot (``active_timeline``), drawn with matplotlib: every
    allocation a band, stacked in the order they were made; the ``largest`` allocations coloured
    and labelled with the innermost frame outside torch (``Allocation.where``), the others pale;
    the total live bytes as a black line. Returns the Axes (the timeline: ``ax.timeline``)."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    tl = active_timeline(snapshot, device)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.8))
    n = len(tl.total) - 1
    top = sorted(range(len(tl.allocations)), key=lambda i: -tl.allocations[i].size)[:largest]
    strong = plt.get_cmap("tab10").colors
    pale = ("#dfe6ef", "#c9d5e3", "#e8e2d6", "#d8e3d4")
    polys, colors = [], []
    for i, a in enumerate(tl.allocations):
        pts = tl.bands[i] + [(a.end, None)]
        lower, upper = [], []
        for (x0, off), (x1, _) in zip(pts, pts[1:], strict=False):
            lower += [(x0, off / MiB), (x1, off / MiB)]
            upper += [(x0, (off + a.size) / MiB), (x1, (off + a.size) / MiB)]
        polys.append(lower + upper[::-1])
        colors.append(strong[top.index(i) % len(strong)] if i in top else pale[i % len(pale)])
    ax.add_collection(PolyCollection(polys, facecolors=colors, edgecolors="none"))
    ax.plot(range(n + 1), [t / MiB for t in tl.total], drawstyle="steps-post", color="k", lw=0.8,
            gid="total", label="total live")
    for rank, i in enumerate(top):
        a = tl.allocations[i]
        ax.fill_between([], [], color=strong[rank % len(strong)],
                        label=f"{a.size / MiB:,.1f} MiB  {a.where()}" + ("  (before the trace)" if a.preexisting else ""))
    ax.set_xlim(0, max(n, 1))
    ax.set_ylim(0, max(max(tl.total, default=0) / MiB * 1.05, 1e-3))
    ax.set_xlabel("allocation event (alloc or free_completed)")
    ax.set_ylabel("MiB live")
    ax.set_title(title or f"active memory timeline, device {tl.device}: {len(tl.allocations)} allocations", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0,
              title=f"the {len(top)} largest", title_fontsize=7)
    ax.timeline = tl
    return ax


def show_snapshot(snapshot: dict[str, Any] | str | Path, html: str | Path | None = None, **plot_kw):
    """A snapshot's active-memory timeline, drawn by ``plot_snapshot`` (works offline and on the
    course's static site; returns the Axes). ``html``: also write the page of PyTorch's own viewer
    (``torch.cuda._memory_viz.trace_plot``) to that file; it loads the viewer's script from a CDN,
    so it needs the internet when opened. The pickle itself can be dropped onto PyTorch's viewer
    page (pytorch.org/memory_viz), which reads it in the browser."""
    snap = _load_snapshot(snapshot)
    if html is not None:
        from torch.cuda._memory_viz import trace_plot

        atomic_write(html, trace_plot(snap))  # whole or not at all; a full disk: RecordError with the fix
    return plot_snapshot(snap, **plot_kw)


def _python_frames(limit: int = 8) -> list[dict[str, Any]]:
    """The Python stack here, innermost first, in a snapshot's frame format, without the frames of
    torch and of the course's meters (what ``stacks="python"`` keeps, less the library)."""
    out = []
    frame = sys._getframe(1)
    here = str(Path(__file__).resolve().parent)
    while frame is not None and len(out) < limit:
        name = frame.f_code.co_filename
        if "/torch/" not in name and not name.startswith(str(Path(here) / "memory")) and name != __file__:
            out.append({"filename": name, "line": frame.f_lineno, "name": frame.f_code.co_name})
        frame = frame.f_back
    return out


def cpu_snapshot(build_model: Callable[[], Any], input_shape: tuple[int, ...], *,
                 dtype: torch.dtype = torch.float32, n_classes: int = 5, steps: int = 1) -> dict[str, Any]:
    """A snapshot in ``torch.cuda.memory._snapshot()``'s format made without a GPU: ``steps``
    training steps (``train.training_step``, Adam) under FakeTensorMode, every tensor storage's
    allocation and free counted by ``LiveBytes`` with the Python stack that made it. What it
    holds: live tensor bytes, exactly, in the order they were made; the weights and the batch,
    made before the steps, as blocks allocated before the trace (as on a GPU, where recording
    starts after the model is built), named by their parameter. What it lacks: the caching
    allocator (one block per tensor, no rounding, no cached free blocks), cuDNN workspaces, and
    real addresses (each storage's key stands in for one). ``snapshot["origin"]`` says so."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class _Stacked(LiveBytes):
        def _add(self, st):
            n = len(self.events)
            super()._add(st)
            if len(self.events) > n:
                frames[len(self.events) - 1] = _python_frames()

    frames: dict[int, list[dict[str, Any]]] = {}
    classify, target_shape, loss_fn = target_spec(tuple(input_shape), None, None, None)
    with default_dtype(dtype), FakeTensorMode():
        model = build_model()
        x = torch.randn(input_shape)
        y = torch.randint(0, n_classes, target_shape) if classify else torch.randn(target_shape)
        opt = torch.optim.Adam(model.parameters(), foreach=True)
        with _Stacked(trace=True) as live:
            names = {}  # the weights and the batch: made before the trace, like a GPU's
            for label, t in [*((f"parameter {n}", p) for n, p in model.named_parameters()),
                             *((f"buffer {n}", b) for n, b in model.named_buffers()), ("input batch", x), ("target", y)]:
                live.track(t)
                names.setdefault(t.untyped_storage()._cdata, label)
            before = len(live.events)
            for _ in range(steps):
                training_step(model, x, y, opt, loss_fn=loss_fn)
    segments, made = [], {}
    for size, key in live.events[:before]:
        if key in live._live:  # still live after the steps
            segments.append({"device": 0, "address": key, "total_size": size, "stream": 0, "blocks": [
                {"size": size, "requested_size": size, "state": "active_allocated",
                 "frames": [{"filename": "", "line": 0, "name": names.get(key, "tensor")}]}]})
    trace = []
    for k, (size, key) in enumerate(live.events[before:], start=before):
        if size > 0:
            made[key] = frames.get(k, [])
            trace.append({"action": "alloc", "addr": key, "size": size, "stream": 0, "frames": made[key]})
        else:
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": key, "size": -size, "stream": 0,
                              "frames": made.get(key, [])})
    return {"segments": segments, "device_traces": [trace],
            "origin": (f"made on a CPU by course_utils.allocator.cpu_snapshot: {steps} training step(s) under "
                       "FakeTensorMode, live tensor bytes counted by LiveBytes, no caching allocator")}


guard(globals(), TechniqueError)
