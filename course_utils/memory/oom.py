"""Budgets and out-of-memory: ``largest_that_fits`` (the largest batch or size that fits, by
doubling and bisection), ``catch_oom`` (an OOM caught, explained and leaving nothing alive),
``explain_oom`` and ``is_oom``.
"""

from __future__ import annotations

from typing import Callable, Literal

import torch

from ..checks import MeasureError, guard


def largest_that_fits(fits: Callable[[int], bool], start: int = 1, limit: int = 1 << 20,
                      at_limit: Literal["raise", "return"] = "raise", hint: int | None = None) -> int:
    """The largest integer n in [start, limit] with ``fits(n)`` True, assuming fits is monotone
    (True up to some n, then False). Doubling, then bisection: O(log n) calls.

    Returns ``start - 1`` if even ``start`` does not fit. If ``limit`` itself fits, the search
    cannot tell how much further it goes: ``at_limit="raise"`` (default) raises, ``"return"``
    returns ``limit``. ``hint``: a guess of the answer (a prediction), tried first with the value
    after it: a right guess costs two calls; a wrong one narrows the search (no value is tried twice)."""
    if hint is not None:  # (whole numbers, start and limit >= 1: the guard)
        if start <= hint < limit:
            known: dict[int, bool] = {}

            def once(n: int) -> bool:
                if n not in known:
                    known[n] = bool(fits(n))
                return known[n]

            if once(hint):
                return hint if not once(hint + 1) else largest_that_fits(once, hint + 1, limit, at_limit)
            return start - 1 if hint == start else largest_that_fits(once, start, hint - 1, "return")
    if limit < start:
        raise MeasureError(f"largest_that_fits: limit ({limit}) is below start ({start}): nothing to search.",
                           "a limit >= start.")
    if not fits(start):
        return start - 1
    lo, hi = start, start * 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        if lo == limit or fits(limit):  # lo == limit: the doubling already saw it fit
            if at_limit == "raise":
                raise MeasureError(f"everything up to limit={limit} fits: the largest value is not known.",
                                   "raise limit, or pass at_limit='return' to accept the limit.")
            return limit
        hi = limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


_OOM_PATTERNS = {
    "asked": r"Tried to allocate ([\d.]+ [KMG]iB)",
    "total": r"total capacity of ([\d.]+ [KMG]iB)",
    "free": r"of which ([\d.]+ [KMG]iB) is free",
    "by_pytorch": r"([\d.]+ [KMG]iB) is allocated by PyTorch",
    "reserved_unallocated": r"([\d.]+ [KMG]iB) is reserved by PyTorch but unallocated",
}


def explain_oom(err: BaseException) -> str:
    """Turn a CUDA out-of-memory error into a short explanation with the figures in it."""
    import re

    msg = str(err)
    found = {k: (m.group(1) if (m := re.search(p, msg)) else None) for k, p in _OOM_PATTERNS.items()}
    lines = ["Out of memory."]
    if found["asked"]:
        lines.append(f"  asked for:            {found['asked']} (one new tensor)")
    if found["free"] and found["total"]:
        lines.append(f"  free on the device:   {found['free']} of {found['total']}")
    if found["by_pytorch"]:
        lines.append(f"  held by live tensors: {found['by_pytorch']} (memory_allocated)")
    if found["reserved_unallocated"]:
        lines.append(
            f"  cached, unused:       {found['reserved_unallocated']} (reserved - allocated). If "
            "large, the cache is fragmented: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "helps, but only if set before CUDA starts (in the shell, or in os.environ before the "
            "first CUDA call); restart the kernel after setting it"
        )
    lines.append(
        "  What to do: a smaller batch or volume, mixed precision (04), in-place activations "
        "(05, 06), checkpointing (07), or more devices (08, 09)."
    )
    if len(lines) == 2:
        first = msg.splitlines()[0][:200] if msg.strip() else "(no message)"
        lines.insert(1, f"  {type(err).__name__}: {first}")
    return "\n".join(lines)


def is_oom(err: BaseException) -> bool:
    """True for CUDA's ``torch.OutOfMemoryError`` and for the CPU's failed allocations."""
    text = str(err).lower()
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError)
        and ("out of memory" in text or "can't allocate memory" in text)
    )


def _drop_traceback(err: BaseException) -> BaseException:
    """Clear every frame an exception (and its chain) refers to, and detach the tracebacks:
    a stored exception must not keep the failed attempt's tensors alive."""
    import traceback

    seen = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
            e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return err


class catch_oom:
    """``with catch_oom() as r:`` runs the block; an OOM is caught, explained and recorded in
    ``r.error`` instead of killing the kernel. The failed attempt leaves nothing alive: the
    exception's frames (which hold the block's tensors) are cleared before it is stored, then
    garbage is collected and the CUDA cache emptied."""

    def __init__(self, verbose: bool = True):
        self.verbose = verbose
        self.error: BaseException | None = None
        self.explanation = ""

    def __enter__(self) -> "catch_oom":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not is_oom(exc):
            return False
        self.explanation = explain_oom(exc)
        self.error = _drop_traceback(exc)
        if self.verbose:
            print(self.explanation)
        del exc, tb
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return True

    @property
    def ok(self) -> bool:
        return self.error is None


guard(globals(), MeasureError, positive=("start", "limit"))  # doubling from 0 never grows
