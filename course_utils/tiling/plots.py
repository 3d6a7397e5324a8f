"""Pictures and tables for notebooks 03 and 09: a volume cut into slabs (``draw_tiles``), the
voxels each layer of one slab computes (``draw_shrinking``), and seed 003 tiled: the largest N
per slab thickness (``seed003_table``) and the step's peak against N (``draw_memory_vs_n``).
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

from ..checks import TilingError, guard
from ..limit_test import input_bytes
from ..memory import mib, predict_step
from .halo import conv_chain
from .plan import _as_halo, plan_tiles
from .predict import largest_tiled_n, _limit_net, predict_tiled_step
from .step import _needed_ranges, work_factor


def draw_tiles(shape: Sequence[int], tiles: int | Sequence[int], halo: int | Sequence[int],
               ax=None, title: str | None = None, label: str = "slab"):
    """A 2D slice of the volume (rows: depth D, columns: height H) cut into slabs, each slab's
    owned voxels filled in its colour, the volume's border in black. What each slab reads
    (owned + halo, clipped at the border): for slabs along depth, a bar per slab beside the
    slice, solid where it owns and hatched over the halo it reads from its neighbours; for a
    grid of blocks, a dashed frame. ``label="rank"`` names the slabs as ranks."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.2), layout="constrained")
    plan = plan_tiles(shape, tiles, halo)
    colours = plt.get_cmap("tab10").colors
    depth_only = all(t.own[1] == slice(0, shape[1]) for t in plan)
    bar_w, gap = max(1.0, shape[1] / 12), max(1.0, shape[1] / 20)
    for k, tile in enumerate(plan):
        c = colours[k % len(colours)]
        (d0, d1), (h0, h1) = [(s.start, s.stop) for s in tile.own]
        (rd0, rd1), (rh0, rh1) = [(s.start, s.stop) for s in tile.read]
        ax.add_patch(Rectangle((h0, d0), h1 - h0, d1 - d0, color=c, alpha=0.4, lw=0))
        text = f"{label} {k}\nowns D {d0}-{d1 - 1}" + ("" if depth_only else f"\n  H {h0}-{h1 - 1}")
        text += f"\nreads D {rd0}-{rd1 - 1}" + ("" if depth_only else f"\n  H {rh0}-{rh1 - 1}")
        ax.text((h0 + h1) / 2, (d0 + d1) / 2, text, ha="center", va="center", fontsize=8)
        if depth_only:
            x = shape[1] + gap + k * (bar_w + gap / 2)
            ax.add_patch(Rectangle((x, d0), bar_w, d1 - d0, color=c, alpha=0.8, lw=0))
            for a, b in ((rd0, d0), (d1, rd1)):
                if b > a:
                    ax.add_patch(Rectangle((x, a), bar_w, b - a, fill=False, ec=c, hatch="////", lw=1))
            ax.text(x + bar_w / 2, rd1 + 0.3, str(k), ha="center", va="top", fontsize=7)
        else:
            inset = 0.12 * (k % 3)  # overlapping frames stay distinguishable
            ax.add_patch(Rectangle((rh0 + inset, rd0 + inset), rh1 - rh0 - 2 * inset,
                                   rd1 - rd0 - 2 * inset, fill=False, ec=c, ls="--", lw=1.6))
    ax.add_patch(Rectangle((0, 0), shape[1], shape[0], fill=False, ec="k", lw=2.2))
    pad = max(_as_halo(halo, 2)) + 1
    right = shape[1] + (gap + len(plan) * (bar_w + gap / 2) if depth_only else 0) + pad
    ax.set_xlim(-pad, right)
    ax.set_ylim(shape[0] + pad, -pad)
    ax.set_aspect("equal")
    ax.set_xlabel("H (voxels)" + (f"; beside the slice: what each {label} reads" if depth_only else ""))
    ax.set_ylabel("D (voxels)")
    read = (Patch(fill=False, hatch="////", ec="grey", label="halo read from the neighbours")
            if depth_only else Line2D([], [], color="grey", ls="--", label="read: owned + halo"))
    ax.legend(handles=[Patch(color="grey", alpha=0.4, label="owned: loss computed here"), read,
                       Line2D([], [], color="k", lw=2.2, label="volume border (zero padding)")],
              loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    ax.set_title(title or f"{len(plan)} {label}s, halo {halo}")
    return ax


def draw_shrinking(model: nn.Module, size: int = 16, tiles: int = 3, slab: int = 1, ax=None):
    """Along depth, for one slab of a ``tiles``-slab plan of a ``size``-voxel axis: the voxels
    each layer computes. The input is read with the whole halo; every convolution of radius r
    gives up r voxels on each side of a cut, so the output is exactly the owned voxels."""
    import matplotlib.pyplot as plt

    if slab >= tiles:
        raise TilingError(f"draw_shrinking: slab {slab} of a {tiles}-slab plan (slabs count from 0).",
                          f"a slab from 0 to {tiles - 1}.")
    chain = conv_chain(model)
    nd = chain.spatial_dims
    shape = (size,) + (1,) * (nd - 1)
    halo = (chain.halo[0],) + (0,) * (nd - 1)
    plan = plan_tiles(shape, tiles, halo)
    tile = plan[slab]
    ranges = _needed_ranges(chain, tile)
    rows = [("input read", (tile.read[0].start, tile.read[0].stop))]
    rows += [(f"after conv {j + 1} ({type(c.module).__name__} '{c.name}', r={c.radius[0]})", k[0])
             for j, (c, _, _, _, k) in enumerate(ranges)]
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.55 * len(rows) + 1.2))
    o0, o1 = tile.own[0].start, tile.own[0].stop
    for y, (name, (a, b)) in enumerate(rows):
        ax.barh(y, b - a, left=a, color="tab:blue", alpha=0.3, edgecolor="tab:blue")
        ax.barh(y, o1 - o0, left=o0, color="tab:blue", alpha=0.6)
        ax.text(b + 0.2, y, f"{b - a} voxels", va="center", fontsize=8)
    for t in plan:
        ax.axvline(t.own[0].start, color="grey", ls=":", lw=1)
    ax.axvline(size, color="grey", ls=":", lw=1)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(-0.5, size + 3)
    ax.set_xlabel("D (voxels); dotted: slab boundaries; dark: the voxels this slab owns")
    ax.set_title(f"slab {slab} of {tiles}: computed voxels per layer (halo {chain.halo[0]} = sum of radii)")
    return ax


def seed003_table(budget_bytes: float, owned: Sequence[int] = (1, 4, 16), stream: bool = False):
    """Seed 003's net, tiled: for slabs owning ``owned`` depth voxels each, the largest N whose
    tiled step is predicted to fit ``budget_bytes``, and what its peak is made of."""
    import pandas as pd

    if not owned or min(owned) < 1:
        raise TilingError(f"seed003_table: owned={owned!r}: each slab owns at least one depth voxel.",
                          "owned=(1, 4, 16), each >= 1.")
    rows = []
    chain = conv_chain(_limit_net())
    for o in owned:
        n = largest_tiled_n(budget_bytes, owned=o, stream=stream, start=256)
        tiles = -(-n // o)
        p = predict_tiled_step(_limit_net, n, tiles, stream=stream)
        volumes = 2 * input_bytes(n)
        row = {"slab owns (depth voxels)": o, "largest N": n, "slabs": tiles,
               "peak MiB (predicted)": round(mib(p.peak)),
               "one slab's step MiB": round(mib(p.peak - (0 if stream else volumes))),
               "conv work / untiled": round(work_factor(chain, plan_tiles((n,) * 3, tiles, chain.halo)), 2)}
        if stream:
            row["input + target in host memory GiB"] = round(volumes / 2**30, 1)
        else:
            row["input + target MiB"] = round(mib(volumes))
        rows.append(row)
    return pd.DataFrame(rows)


def draw_memory_vs_n(budget_bytes: float, ns: Sequence[int] | None = None, ax=None,
                     marks: dict[str, int] | None = None):
    """Seed 003's step peak against N, predicted: untiled, tiled with the volume and target on
    the device (slabs owning 1 depth voxel), and tiled with the volume streamed from host
    memory; the input + target storage 2 x 4 N^3 bytes, the budget, and ``marks`` (label -> N)
    as vertical lines."""
    import matplotlib.pyplot as plt

    ns = list(ns or [64, 128, 256, 512, 1024, 2048, 4096, 8192])
    if min(ns) < 1:
        raise TilingError(f"draw_memory_vs_n: ns={ns!r}: each N is a cube's side, >= 1.", "e.g. ns=(64, 128, 256).")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.2), layout="constrained")
    untiled = [predict_step(_limit_net, (1, 1, n, n, n), (1, 1, n, n, n), optimizer=None,
                            module_peaks=False).peak for n in ns]
    tiled = [predict_tiled_step(_limit_net, n, n).peak for n in ns]
    streamed = [predict_tiled_step(_limit_net, n, n, stream=True).peak for n in ns]
    ax.plot(ns, [mib(v) for v in untiled], "o-", label="untiled step (predicted)")
    ax.plot(ns, [mib(v) for v in tiled], "s-", label="tiled, volume + target on the device")
    ax.plot(ns, [mib(v) for v in streamed], "^-", label="tiled, volume streamed from host")
    ax.plot(ns, [mib(2 * input_bytes(n)) for n in ns], "k:", label="input + target storage, 8 N^3 B")
    ax.axhline(mib(budget_bytes), color="tab:red", lw=1)
    ax.text(ns[0], mib(budget_bytes) * 1.15, f"budget {budget_bytes / 2**30:.0f} GiB", color="tab:red", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N (volume N^3, batch 1, fp32)")
    ax.set_ylabel("step peak, MiB (MemTracker under FakeTensorMode)")
    for label, n in (marks or {}).items():
        ax.axvline(n, color="grey", ls="--", lw=0.8)
        ax.text(n, 0.02, f" {label}\n N = {n}", fontsize=8, va="bottom",
                transform=ax.get_xaxis_transform())
    ax.set_title("seed 003: slabs owning 1 depth voxel each")
    ax.legend(fontsize=8, loc="upper left")
    return ax


guard(globals(), TilingError, zero=("slab",))  # slab: an index
