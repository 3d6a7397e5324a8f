"""The plan: which voxels each slab owns and which it reads.

``plan_tiles(shape, tiles, halo)`` cuts a volume into slabs along one axis, or into a grid of
blocks; each ``Tile`` has the region it *owns* (where its loss is computed) and the region it
*reads* (owned + halo, clipped at the volume's border).
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass
from typing import Sequence

from ..checks import TilingError, guard


@dataclass(frozen=True)
class Tile:
    """One slab: ``own`` = the voxels whose loss it computes (global coordinates, one slice per
    spatial axis); ``read`` = the input it needs, owned +- halo, clipped at the volume's border."""

    index: tuple[int, ...]
    own: tuple[slice, ...]
    read: tuple[slice, ...]
    volume: tuple[int, ...]  # the whole volume's spatial shape (where the true border is)

    @property
    def own_voxels(self) -> int:
        return math.prod(s.stop - s.start for s in self.own)

    @property
    def read_voxels(self) -> int:
        return math.prod(s.stop - s.start for s in self.read)


#: the most slabs ``plan_tiles`` builds at once (seed 003's thinnest plans: 16,384)
MAX_TILES = 2**20


def _whole(v: object, low: int) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= low


def _as_counts(tiles: int | Sequence[int], nd: int, axis: int) -> tuple[int, ...]:
    if not -nd <= axis < nd:
        raise TilingError(f"axis={axis}: the volume has {nd} spatial axes.",
                          f"an axis from 0 to {nd - 1} (0: depth).")
    if isinstance(tiles, int):
        counts = [1] * nd
        counts[axis] = tiles
        return tuple(counts)
    counts = tuple(int(t) if _whole(t, 0) else t for t in tiles)
    if len(counts) != nd:
        raise TilingError(f"tiles={tiles} gives {len(counts)} counts for a volume with {nd} "
                          f"spatial axes.", f"one count per axis, e.g. {(2,) + (1,) * (nd - 1)}.")
    return counts


def _as_halo(halo: int | Sequence[int], nd: int) -> tuple[int, ...]:
    h = (halo,) * nd if isinstance(halo, int) else tuple(halo)
    if len(h) != nd or not all(_whole(v, 0) for v in h):
        raise TilingError(f"halo must be a whole number >= 0 or {nd} of them, got {halo!r}.",
                          "derive it from the model: conv_chain(model).halo.")
    return h


def plan_tiles(shape: Sequence[int], tiles: int | Sequence[int], halo: int | Sequence[int],
               axis: int = 0, only: Sequence[tuple[int, ...]] | None = None) -> list[Tile]:
    """Cut a volume of spatial ``shape`` into ``tiles`` slabs along spatial ``axis`` (an int),
    or into a grid (one count per axis). Owned sizes differ by at most one voxel. ``only``:
    build just the tiles with these indices (the predictor's representative slabs)."""
    if len(shape) == 0 or not all(_whole(n, 1) for n in shape):
        raise TilingError(f"shape={shape!r}: a volume's spatial shape is whole numbers >= 1.",
                          "pass the volume's sides, e.g. x.shape[2:].")
    shape = tuple(int(n) for n in shape)
    nd = len(shape)
    counts = _as_counts(tiles, nd, axis)
    h = _as_halo(halo, nd)
    bounds = []
    for a, (n, k) in enumerate(zip(shape, counts, strict=True)):
        if not _whole(k, 1):
            raise TilingError(f"tiles must be a whole number >= 1 per axis, got {k!r} on axis {a}.",
                              "one slab (1) or more on each axis.")
        if k > n:
            raise TilingError(
                f"cannot cut axis {a} of {n} voxels into {k} slabs: each slab must own at least "
                f"one voxel. Fix: at most {n} slabs on that axis (and far fewer: a slab reads "
                f"its owned voxels + 2 x {h[a]} halo, so thin slabs mostly recompute).")
        if k > 1 and n < 2 * h[a]:
            raise TilingError(
                f"axis {a} has {n} voxels but the halo is {h[a]} on each side: every slab would "
                f"read (nearly) the whole axis, so splitting it saves no memory and only "
                f"recomputes. Fix: do not split axis {a}; split a longer axis instead.")
        bounds.append(lambda i, n=n, k=k: (i * n // k, (i + 1) * n // k))
    if only is not None and not all(len(i) == nd and all(_whole(j, 0) and j < k for j, k in zip(i, counts, strict=True))
                                    for i in only):
        raise TilingError(f"only={list(only)[:4]!r}...: each index names one slab of the {counts} plan.",
                          f"indices ({', '.join(f'0..{k - 1}' for k in counts)}).")
    if only is None and math.prod(counts) > MAX_TILES:
        raise TilingError(f"tiles={tiles!r} makes {math.prod(counts):,} slabs, more than {MAX_TILES:,} to build "
                          "at once.", "fewer slabs, or only= the indices you need (the predictor's way).")
    plan = []
    for index in (itertools.product(*(range(k) for k in counts)) if only is None else only):
        own = tuple(slice(*bounds[a](i)) for a, i in enumerate(index))
        read = tuple(slice(max(0, o.start - h[a]), min(shape[a], o.stop + h[a]))
                     for a, o in enumerate(own))
        plan.append(Tile(tuple(index), own, read, shape))
    return plan


guard(globals(), TilingError)
