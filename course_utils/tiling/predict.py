"""The tiled step's memory predicted without a GPU: ``predict_tiled_step`` runs it under
``FakeTensorMode`` with the course's ``MemoryLog`` (MemTracker), the method of
``memory.predict_step``, on the ``representative`` slabs only (first, largest middle, last);
``largest_tiled_n`` is the largest cube side N whose tiled step fits a budget (seed 003's net
by default, ``_limit_net``: past N = 700 in 8 GiB, beyond the untiled step's limit).
"""

from __future__ import annotations

import contextlib
import math
import numbers
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..checks import TilingError, guard
from ..limit_test import LimitTestNet
from ..memory import Prediction, default_dtype, largest_that_fits, make_optimizer, prime_optimizer
from .halo import conv_chain
from .plan import Tile, _as_counts, plan_tiles
from .step import tiled_step


def _representative_indices(n: int, k: int, h: int) -> list[tuple[int, ...]]:
    """What ``representative`` picks for ``k`` slabs along an axis of ``n`` voxels with halo
    ``h`` -- first, last, and the interior slab that reads the most -- without building every
    tile."""
    if k <= 3:
        return [(i,) for i in range(k)]

    def read(i: int) -> int:
        return min(n, (i + 1) * n // k + h) - max(0, i * n // k - h)

    middle = max(range(1, k - 1), key=read)
    return [(0,), (middle,), (k - 1,)]


def representative(plan: Sequence[Tile]) -> list[Tile]:
    """The first, one middle and the last slab. Each border slab is its own case (zero padding
    on one side); every other slab reads owned + 2 x halo, or less where the border clips it,
    with owned sizes that differ by at most one voxel, and the middle slab picked has the
    larger. A slab's step frees everything it allocated before the next starts, so the step's
    peak is the largest of these three. The predictor runs only them; ``tests/test_tiling.py``
    checks that the peak equals the full plan's."""
    plan = list(plan)
    if len(plan) <= 3:
        return plan
    middle = max(plan[1:-1], key=lambda t: t.read_voxels)
    return [plan[0], middle, plan[-1]]


def _tiled_log_class():
    # lazy: MemTracker's import costs 1.8 CPU-s, paid only by a prediction (memory.__init__)
    from ..memory import MemoryLog

    class TiledLog(MemoryLog):
        """MemoryLog for a step that calls each layer once per slab. MemTracker keeps
        per-module statistics for one call per step and refuses a second; a slab's backward is
        over before the next slab's forward, so each forward call starts the module's
        statistics afresh. The global peak and breakdown are unaffected."""

        def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
            if not self._mod_tracker.is_bw:
                self.memory_tracking.pop(module, None)
            super()._pre_fw_hook(module, inputs)

    return TiledLog


def predict_tiled_step(
    build_model: Callable[[], nn.Module],
    n: int | Sequence[int],
    tiles: int | Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
    optimizer: str | None = None,
    stream: bool = False,
    all_tiles: bool = False,
    fake: bool = True,
):
    """Predict the memory of ``tiled_step`` on a volume of ``n`` voxels per side (or a shape),
    batch 1 and one channel, MSE against a target of the same shape: MemTracker (the course's
    ``MemoryLog``) under ``FakeTensorMode``, the method of ``memory.predict_step``.

    ``optimizer``: None (the seed's step: forward + backward) or "adam"/"sgd" in the steady
    state (its state created before the tracked step, then ``optimizer.step()`` inside it).
    ``stream``: the volume and target live outside the tracked device memory (host memory) and
    each slab's piece is copied in. ``all_tiles=False`` runs only ``representative`` slabs.
    ``fake=False`` runs the same step on real CPU tensors (the test that the prediction is
    right). Returns a ``memory.Prediction``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _TiledLog = _tiled_log_class()

    shape = (n,) * 3 if isinstance(n, numbers.Integral) else tuple(n)
    if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1 for s in shape):
        raise TilingError(f"n={n!r}: a volume of n voxels per side (or a shape) needs sides >= 1.",
                          "n a whole number >= 1, or a shape such as (64, 64, 64).")
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with default_dtype(dtype), mode:
        model = build_model()
        chain = conv_chain(model)
        x = torch.randn(1, chain.in_channels, *shape)
        target = torch.randn(1, 1, *shape)
        if all_tiles or not isinstance(tiles, int):
            plan = plan_tiles(shape, tiles, chain.halo)
            run = plan if all_tiles else representative(plan)
        else:  # a slab per depth slice makes thousands of tiles: build only the three needed
            only = [idx + (0,) * (len(shape) - 1)
                    for idx in _representative_indices(shape[0], tiles, chain.halo[0])]
            run = plan_tiles(shape, tiles, chain.halo, only=only)
        n_tiles = math.prod(_as_counts(tiles, len(shape), 0))
        opt = make_optimizer(optimizer, model)
        if opt is not None:  # steady state: the optimizer's state exists before the step
            prime_optimizer(model, opt)
        log = _TiledLog(model, cuda=False, module_peaks=False)
        log.track_external(model, x, target, *([opt] if opt else []))
        with log:
            tiled_step(model, x, target, run, stream=stream)
            if opt is not None:
                opt.step()
    peak, breakdown = log.peak, log.breakdown("peak")
    if stream:
        # MemTracker sees the host volume's storage through the slab views cut from it, so it
        # is tracked (as "Other") but lives in host memory; it is constant through the step,
        # so removing it from the peak is exact.
        host = x.numel() * x.element_size() + target.numel() * target.element_size()
        peak -= host
        breakdown = dict(breakdown, Other=breakdown["Other"] - host, Total=breakdown["Total"] - host)
    how = "MemTracker under FakeTensorMode" if fake else "MemTracker on real CPU tensors"
    where = "volume streamed from host memory" if stream else "volume and target on the device"
    return Prediction(peak=peak, breakdown=breakdown, saved_peak=log.saved.peak,
                      after_forward=log.after_forward or {}, steady_state=opt is not None,
                      target="cpu", parameters=sum(p.numel() for p in model.parameters()), log=log,
                      method=f"{'predicted' if fake else 'measured'} ({how}), tiled step, "
                             f"{n_tiles} slabs, {where}")


def largest_tiled_n(budget_bytes: float, build_model: Callable[[], nn.Module] | None = None, *,
                    owned: int = 1, stream: bool = False, optimizer: str | None = None,
                    dtype: torch.dtype = torch.float32, start: int = 16, limit: int = 1 << 14) -> int:
    """The largest cube side N whose tiled step is predicted to fit ``budget_bytes``, with
    slabs that own ``owned`` voxels of depth each (1 = the thinnest slabs: least memory, most
    recomputation; see ``work_factor``). Seed 003's net by default. Searched from ``start`` to
    ``limit``: a budget that does not hold N = ``start``, or holds N = ``limit``, is refused with
    what it holds (the answer lies outside the search)."""
    if owned < 1 or not 1 <= start <= limit:
        raise TilingError(f"largest_tiled_n(owned={owned}, start={start}, limit={limit}): slabs own at least one "
                          "voxel, and the search runs from start >= 1 up to limit >= start.",
                          "owned >= 1 and 1 <= start <= limit (defaults: 1, 16, 16384).")
    build = build_model or _limit_net
    peaks: dict[int, int] = {}

    def fits(n: int) -> bool:
        tiles = max(1, -(-n // owned))
        peaks[n] = predict_tiled_step(build, n, tiles, stream=stream, optimizer=optimizer, dtype=dtype).peak
        return peaks[n] <= budget_bytes

    n = largest_that_fits(fits, start=start, limit=limit, at_limit="return")
    if n < start:
        raise TilingError(f"a budget of {budget_bytes:,} bytes does not hold the tiled step at N = {start}: it "
                          f"needs {peaks[start]:,} bytes (predicted).",
                          f"a budget of at least {peaks[start]:,} bytes, or a smaller start (N >= 1).")
    if n == limit:
        raise TilingError(f"a budget of {budget_bytes:,} bytes holds the tiled step even at N = {limit} (the "
                          "search's limit): the largest N lies beyond it.",
                          "raise limit, or check that the budget is in bytes (8 GiB: 8 * 2**30).")
    return n


def _limit_net() -> nn.Module:
    return LimitTestNet()


guard(globals(), TilingError)
