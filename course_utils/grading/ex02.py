"""Exercise 02 -- seed 000's hook logger, written with PyTorch's four module hooks.

``log_hooks(model, x, target, counter)`` registers ``register_forward_pre_hook``,
``register_forward_hook``, ``register_full_backward_pre_hook`` and ``register_full_backward_hook``
on every leaf module, runs one forward (cross-entropy loss) and backward, and returns one row
``(module name, hook, counter())`` per hook call, in the order they fired; the hooks are removed
before it returns. The check passes a counter of saved-for-backward bytes (on a GPU the same
logger would read ``torch.cuda.memory_allocated``).
"""

from __future__ import annotations

import functools
import random

import torch
from torch import nn

from ..memory import SavedTensorMeter
from ..unet import UNet3D
from .core import (CheckFailed, Exercise, expect_equal, expect_int, expect_keys, expect_list, expect_str, reference, short,
                   seeded, seeded_build)

EX = Exercise("02", "A hook logger", names=("log_hooks", "biggest_saver"),
              refused={"course_utils.memory.hook_table": ("MemoryLog", "log_step")})

HOOKS = ("pre", "fwd", "bwd_pre", "bwd")


def logger_inputs(seed: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The net and batch the logger is tried on (the same in the sandbox and the judge)."""
    g = seeded(seed, 20)
    model = seeded_build(lambda: UNet3D(levels=2, channels=2), g)
    x = torch.randn(2, 1, 8, 8, 8, generator=g)
    target = torch.randint(0, 5, (2, 8, 8, 8), generator=g)
    return model, x, target


def hook_count(model: nn.Module) -> int:
    """How many module hooks (forward pre, forward, backward pre, backward) are still registered
    on ``model`` and its submodules: 0 after a logger that removes its own."""
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) + len(m._backward_pre_hooks)
               + len(m._backward_hooks) for m in model.modules())


def run_logger(log_hooks, seed: int) -> dict:
    """Run ``log_hooks`` on the seed's net and batch with a saved-for-backward bytes counter; returns
    its rows (as lists) and the hooks it left on the model."""
    model, x, target = logger_inputs(seed)
    with SavedTensorMeter(model.parameters()) as meter:
        rows = log_hooks(model, x, target, lambda: meter.current)
    return {"rows": [list(r) for r in rows], "hooks_left": hook_count(model)}


@reference
def reference_log_hooks(model, x, target, counter) -> list[tuple[str, str, int]]:
    """The reference logger: the four hooks on every leaf module, one forward and backward, one row
    ``(module name, hook, counter())`` per call; the hooks removed after."""
    rows: list[tuple[str, str, int]] = []
    handles = []
    for name, m in model.named_modules():
        if any(True for _ in m.children()):
            continue
        handles += [
            # ARG005: the hooks' signatures, (module, args[, output]) and (module, [grad_input,] grad_output)
            m.register_forward_pre_hook(lambda mod, args, n=name: rows.append((n, "pre", counter()))),  # noqa: ARG005
            m.register_forward_hook(lambda mod, args, out, n=name: rows.append((n, "fwd", counter()))),  # noqa: ARG005
            m.register_full_backward_pre_hook(lambda mod, gout, n=name: rows.append((n, "bwd_pre", counter()))),  # noqa: ARG005
            m.register_full_backward_hook(lambda mod, gin, gout, n=name: rows.append((n, "bwd", counter()))),  # noqa: ARG005
        ]
    try:
        nn.functional.cross_entropy(model(x), target).backward()
    finally:
        for h in handles:
            h.remove()
    return rows


@reference
@functools.lru_cache(maxsize=4)
def reference_rows(seed: int) -> list:
    """The reference logger's rows for ``seed`` (cached: every part judges the same run)."""
    return run_logger(reference_log_hooks, seed)["rows"]


def _rows(got) -> list[list]:
    """The observed rows, checked for form: (module name, hook, bytes), as many as the reference
    logger writes for this net (every hook of every leaf module fires once)."""
    expect_keys("log_hooks", got, ("rows", "hooks_left"))
    rows = got["rows"]
    if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 3 for r in rows):
        raise CheckFailed("log_hooks must return a list of (module name, hook, bytes) rows")
    for k, r in enumerate(rows):
        expect_str(f"row {k}: the module name", r[0])
        expect_str(f"row {k}: the hook", r[1])
        expect_int(f"row {k}: the bytes (what counter() returned)", r[2])
    expect_int("hooks left on the model", got["hooks_left"])
    return rows


EVENTS = EX.part("events", "log_hooks: one row per hook call, in the order the hooks fire", 2, ["log_hooks"])
BYTES = EX.part("bytes", "log_hooks: the counter read at every hook", 1, ["log_hooks"])
CLEAN = EX.part("cleanup", "log_hooks: removes its hooks", 1, ["log_hooks"])


@EVENTS.observe
def _(log_hooks, seed):
    return run_logger(log_hooks, seed)


@EVENTS.judge
def _(got, seed):
    rows, ref = _rows(got), reference_rows(seed)
    hooks = {r[1] for r in rows}
    if not hooks <= set(HOOKS):
        raise CheckFailed(f"hook names must be {HOOKS}, got {sorted(map(str, hooks - set(HOOKS)))}")
    missing = [h for h in HOOKS if h not in hooks]
    if missing:
        raise CheckFailed(f"no row for the {', '.join(missing)} hook(s): register all four hooks on "
                          "every leaf module (a module with no children)")
    for k, (a, b) in enumerate(zip(rows, ref, strict=False)):  # the count is checked below
        if a[:2] != b[:2]:
            raise CheckFailed(f"row {k}: expected {tuple(b[:2])}, got {tuple(a[:2])}")
    expect_equal("number of rows", len(rows), len(ref))


@BYTES.observe
def _(log_hooks, seed):
    return run_logger(log_hooks, seed)


@BYTES.judge
def _(got, seed):
    rows, ref = _rows(got), reference_rows(seed)
    if [r[:2] for r in rows] != [r[:2] for r in ref]:
        raise CheckFailed("the rows are not yet the right events (see the part above)")
    for k, (a, b) in enumerate(zip(rows, ref, strict=True)):
        if a[2] != b[2]:
            raise CheckFailed(f"row {k} {tuple(a[:2])}: counter() gave {b[2]:,} bytes at that hook, "
                              f"your row has {short(a[2])}: read counter() inside the hook")


@CLEAN.observe
def _(log_hooks, seed):
    return run_logger(log_hooks, seed)


@CLEAN.judge
def _(got, seed):
    rows, ref = _rows(got), reference_rows(seed)
    if len(rows) != len(ref):  # a logger that registered no hook has nothing to remove
        raise CheckFailed("the rows are not yet one per hook call (see the first part): register the "
                          "four hooks on every leaf module, then remove them")
    if got["hooks_left"] != 0:
        raise CheckFailed(f"{got.get('hooks_left')} hooks are still registered on the model after "
                          "log_hooks returned: keep the handles and call handle.remove()")


# -- biggest_saver(rows): which module's forward added the most to the counter ----------------
NAMES = ["inc.double_conv.0", "inc.double_conv.1", "inc.double_conv.2", "downs.0.maxpool_conv.0",
         "downs.0.maxpool_conv.1.double_conv.0", "downs.0.maxpool_conv.1.double_conv.3",
         "ups.0.up", "ups.0.conv.double_conv.0", "ups.0.conv.double_conv.4", "outc.conv"]


def synthetic_rows(seed: int, k: int) -> list[list]:
    """A hook table like log_hooks's: pre/fwd per module, then bwd_pre/bwd in reverse."""
    rnd = random.Random(seed * 31 + k)
    names = rnd.sample(NAMES, rnd.randint(4, len(NAMES)))
    deltas = rnd.sample(range(0, 4096, 64), len(names))  # distinct: one largest
    rows, level = [], rnd.randrange(0, 10_000, 8)
    for n, d in zip(names, deltas, strict=True):
        rows.append([n, "pre", level])
        level += d
        rows.append([n, "fwd", level])
    for n, d in zip(reversed(names), reversed(deltas), strict=True):
        rows.append([n, "bwd_pre", level])
        level -= d
        rows.append([n, "bwd", level])
    return rows


N_TABLES = 3
BIGGEST = EX.part("biggest", "biggest_saver: the module whose forward added the most", 1, ["biggest_saver"])


@BIGGEST.observe
def _(biggest_saver, seed):
    return [biggest_saver([tuple(r) for r in synthetic_rows(seed, k)]) for k in range(N_TABLES)]


@BIGGEST.judge
def _(got, seed):
    expect_list("biggest_saver", got, N_TABLES, "answers (one per table)")
    for k, name in enumerate(got):
        expect_str(f"table {k + 1}: biggest_saver", name)
        rows = synthetic_rows(seed, k)
        added = {r[0]: rows[i + 1][2] - r[2] for i, r in enumerate(rows) if r[1] == "pre"}
        best = max(added, key=added.get)
        if name != best:
            raise CheckFailed(f"table {k + 1}: {name!r} added {added.get(name, 'no')} bytes in its "
                              f"forward; {best!r} added {added[best]:,}")


def check_log_hooks(log_hooks, verbose: bool = True):
    """Instant feedback on your ``log_hooks``."""
    return EX.run(["events", "bytes", "cleanup"], {"log_hooks": log_hooks}, verbose=verbose)


def check_biggest_saver(biggest_saver, verbose: bool = True):
    """Instant feedback on your ``biggest_saver``."""
    return EX.run(["biggest"], {"biggest_saver": biggest_saver}, verbose=verbose)
