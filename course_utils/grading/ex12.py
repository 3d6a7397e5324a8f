"""Exercise 12 -- DenseNet at full resolution: the bytes of an input batch, without allocating it.

TODO(scaffold): the template's example parts (input_bytes): write your exercise's, then delete this line.

Each part observes the learner's function on inputs drawn from the seed (``observe``: data only)
and compares with a reference computed at run time from PyTorch (``judge``); see
``course_utils/grading/core.py`` and CONTRIBUTING.md, "Adding a notebook"."""

from __future__ import annotations

from typing import Callable

import torch

from .core import CheckFailed, Exercise, expect_equal, expect_int, reference, seeded

EX = Exercise("12", "DenseNet at full resolution", names=("input_bytes",))


def cases(seed: int, part: str) -> list[tuple[int, tuple[int, int, int], torch.dtype]]:
    """(batch, volume, dtype) of each question of a part: fixed ones, then ones drawn from the seed."""
    if part == "huge":  # 4 TB, and 1.3 PB: more than a 64-bit machine's address space, it cannot be allocated
        return [(1000, (1000, 1000, 1000), torch.float32), (10_000, (4000, 4000, 4000), torch.bfloat16)]
    g = seeded(seed, int(EX.id), 0 if part == "fp32" else 1)
    drawn = [(int(torch.randint(1, 9, (1,), generator=g)), tuple(int(v) for v in torch.randint(1, 200, (3,), generator=g)))
             for _ in range(4)]
    dtypes = [torch.float32] if part == "fp32" else [torch.float16, torch.bfloat16]
    return [(2, (26, 150, 320), dtypes[0])] + [(b, v, dtypes[k % len(dtypes)]) for k, (b, v) in enumerate(drawn)]


@reference
def reference_bytes(batch: int, volume: tuple[int, int, int], dtype: torch.dtype) -> int:
    """PyTorch's own answer: the bytes of such a tensor on the meta device (no data)."""
    return torch.empty((batch, 1, *volume), dtype=dtype, device="meta").nbytes


def _observe(input_bytes: Callable, seed: int, part: str) -> list:
    return [input_bytes(b, v, dt) for b, v, dt in cases(seed, part)]


def _judge(got: list, seed: int, part: str) -> None:
    questions = cases(seed, part)
    if len(got) != len(questions):
        raise CheckFailed(f"expected {len(questions)} answers, got {len(got)}")
    for (b, v, dt), value in zip(questions, got, strict=True):
        label = f"input_bytes({b}, {v}, {dt})"
        expect_int(label, value)
        expect_equal(label, value, reference_bytes(b, v, dt))


FP32 = EX.part("fp32", "float32 batches", 1, ["input_bytes"])
HALF = EX.part("half", "float16 and bfloat16 batches", 1, ["input_bytes"])
HUGE = EX.part("huge", "terabyte and petabyte batches, without allocating them", 1, ["input_bytes"])


@FP32.observe
def _(input_bytes, seed):
    return _observe(input_bytes, seed, "fp32")


@FP32.judge
def _(got, seed):
    _judge(got, seed, "fp32")


@HALF.observe
def _(input_bytes, seed):
    return _observe(input_bytes, seed, "half")


@HALF.judge
def _(got, seed):
    _judge(got, seed, "half")


@HUGE.observe
def _(input_bytes, seed):
    return _observe(input_bytes, seed, "huge")


@HUGE.judge
def _(got, seed):
    _judge(got, seed, "huge")


def check_input_bytes(input_bytes, verbose: bool = True):
    """Instant feedback on your ``input_bytes(batch, volume, dtype)``."""
    return EX.run(["fp32", "half", "huge"], {"input_bytes": input_bytes}, verbose=verbose)
