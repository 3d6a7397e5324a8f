"""Exercise 00 -- a tensor's size without its data; which operations make new memory."""

from __future__ import annotations

from typing import Callable

import torch

from .core import CheckFailed, Exercise, expect_equal, expect_int, expect_list, reference, seeded

EX = Exercise("00", "A tensor's size, and new memory", names=("tensor_nbytes", "new_bytes"))

FLOAT_TYPES = (torch.float32, torch.float64)
SMALL_TYPES = (torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool)


def _shapes(seed: int, salt: int, n: int) -> list[tuple[int, ...]]:
    g = seeded(seed, salt)
    out = []
    for _ in range(n):
        dims = int(torch.randint(1, 6, (1,), generator=g))
        out.append(tuple(int(v) for v in torch.randint(1, 40, (dims,), generator=g)))
    return out


def _cases(seed: int, part: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    if part == "float":
        shapes = [(2, 1, 26, 150, 320), (3,)] + _shapes(seed, 1, 4)
        return [(s, FLOAT_TYPES[i % 2]) for i, s in enumerate(shapes)]
    if part == "small":
        shapes = [(2, 64, 26, 150, 320)] + _shapes(seed, 2, len(SMALL_TYPES) - 1)
        return [(s, dt) for s, dt in zip(shapes, SMALL_TYPES, strict=True)]
    # a scalar, an empty tensor, and 40 TB that must not be allocated
    return [((), torch.float64), ((0, 5), torch.float32), ((100_000, 100_000, 1_000), torch.float32)]


def _observe_nbytes(tensor_nbytes: Callable, seed: int, part: str) -> list:
    return [tensor_nbytes(shape, dt) for shape, dt in _cases(seed, part)]


def _judge_nbytes(got: list, seed: int, part: str) -> None:
    cases = _cases(seed, part)
    expect_list("tensor_nbytes", got, len(cases), "answers (one per shape and dtype)")
    for (shape, dt), value in zip(cases, got, strict=True):
        expected = torch.empty(shape, dtype=dt, device="meta").nbytes
        expect_int(f"tensor_nbytes({shape}, {dt})", value)
        expect_equal(f"tensor_nbytes({shape}, {dt})", value, expected)


FLOAT = EX.part("float", "float32 and float64 shapes", 1, ["tensor_nbytes"])
SMALL = EX.part("small", "16-bit, integer and bool dtypes", 1, ["tensor_nbytes"])
EDGE = EX.part("edge", "a scalar, an empty tensor, and 40 TB without allocating it", 1, ["tensor_nbytes"])


@FLOAT.observe
def _(tensor_nbytes, seed):
    return _observe_nbytes(tensor_nbytes, seed, "float")


@FLOAT.judge
def _(got, seed):
    _judge_nbytes(got, seed, "float")


@SMALL.observe
def _(tensor_nbytes, seed):
    return _observe_nbytes(tensor_nbytes, seed, "small")


@SMALL.judge
def _(got, seed):
    _judge_nbytes(got, seed, "small")


@EDGE.observe
def _(tensor_nbytes, seed):
    return _observe_nbytes(tensor_nbytes, seed, "edge")


@EDGE.judge
def _(got, seed):
    _judge_nbytes(got, seed, "edge")


# -- new_bytes(fn, x): bytes of NEW storage that fn(x) allocates (0 for a view) ---------------
def _slice(x):
    return x[:, 1:3]


def _view(x):
    return x.view(x.shape[0], -1)


def _transpose(x):
    return x.transpose(1, 2)


def _transpose_contiguous(x):
    return x.transpose(1, 2).contiguous()


def _contiguous(x):
    return x.contiguous()


def _add(x):
    return x + 1


def _add_inplace(x):
    return x.add_(1)


def _to_half(x):
    return x.to(torch.float16)


def _to_same(x):
    return x.to(torch.float32)


def _mask(x):
    return x[x > 0]


def _reshape_transposed(x):
    return x.transpose(1, 2).reshape(-1)


def _expand(x):
    return x[:, :1].expand(-1, 8, -1)


#: the operations new_bytes is tried on (names are what the messages show)
OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "x[:, 1:3]": _slice, "x.view(b, -1)": _view, "x.transpose(1, 2)": _transpose,
    "x.transpose(1, 2).contiguous()": _transpose_contiguous, "x.contiguous()": _contiguous,
    "x + 1": _add, "x.add_(1)": _add_inplace, "x.to(torch.float16)": _to_half,
    "x.to(torch.float32)": _to_same, "x[x > 0]": _mask,
    "x.transpose(1, 2).reshape(-1)": _reshape_transposed, "x[:, :1].expand(-1, 8, -1)": _expand,
}


def _input(seed: int, k: int) -> torch.Tensor:
    g = seeded(seed, 100 + k)
    b, n, m = (int(v) for v in torch.randint(2, 9, (3,), generator=g))
    return torch.randn(b, n + 3, m, generator=g)


@reference
def new_storage_bytes(fn: Callable, x: torch.Tensor) -> int:
    """The bytes ``fn(x)`` allocates: 0 when its result shares ``x``'s storage (a view), else the
    size of the result's storage."""
    out = fn(x)
    if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        return 0
    return out.untyped_storage().nbytes()


NEW = EX.part("new_bytes", "new_bytes: views share storage, copies allocate", 2, ["new_bytes"])


@NEW.observe
def _(new_bytes, seed):
    return [new_bytes(fn, _input(seed, k)) for k, fn in enumerate(OPS.values())]


@NEW.judge
def _(got, seed):
    expect_list("new_bytes", got, len(OPS), "answers (one per operation)")
    wrong = []
    for k, ((name, fn), value) in enumerate(zip(OPS.items(), got, strict=True)):
        expect_int(f"new_bytes({name})", value)
        expected = new_storage_bytes(fn, _input(seed, k))
        if value != expected:
            wrong.append(f"{name}: expected {expected:,} new bytes, got {value!r}")
    if wrong:
        raise CheckFailed(f"{len(wrong)} of {len(OPS)} wrong -- " + "; ".join(wrong))


def check_tensor_nbytes(tensor_nbytes, verbose: bool = True):
    """Instant feedback on ``tensor_nbytes(shape, dtype)``."""
    return EX.run(["float", "small", "edge"], {"tensor_nbytes": tensor_nbytes}, verbose=verbose)


def check_new_bytes(new_bytes, verbose: bool = True):
    """Instant feedback on ``new_bytes(fn, x)``."""
    return EX.run(["new_bytes"], {"new_bytes": new_bytes}, verbose=verbose)
