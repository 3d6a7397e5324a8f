"""The references' results recorded for the student release: its check cells without the references.

A ``@reference`` function (``core.reference``) computes what a part's judge compares with; its
source is often the part's answer. The student release (``release``) ships no such body: each
becomes a lookup (``recorded``) in the results the teacher's references returned while the release
was built, for the seed the notebooks' check cells use (0), when the judges checked the solutions
(``Recorder``). A call the recording holds gets its result back; any other call (another seed,
another input) raises ``RefusedObject``, and the part says "checked by your teacher's grader".

A call is known by the function's qualified name and a *fingerprint* of its arguments (bound to
the signature, defaults applied): the exact ``repr`` of numbers, strings, booleans and None; the
shape and dtype of a tensor (not its values: a check cell computes them on the learner's machine,
where the last bits may differ); a module's class and parameter shapes; a callable's qualified
name; lists, tuples, sets and dicts item by item. Where one fingerprint has several different
results, the k-th call gets the k-th (and the sequence starts again after the last).

The recording is data only (``torch.save``; read back with ``weights_only=True``): numbers,
strings, tensors, lists, tuples and dicts, a set as ``{SET: [items]}``.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from . import core
from .core import RefusedObject

#: the recording's file, next to this module in the student release's ``course_utils/grading``
FILE = "expected_seed0.pt"
#: the seed the recording is made for: the notebooks' check cells use it (``Exercise.run``)
SEED = 0
#: a set in the recording: ``{SET: [items, sorted]}``
SET = "__frozenset__"
NOT_RECORDED = ("checked by your teacher's grader: the student release holds this reference's results only for "
                "the inputs of the notebook's own check (seed 0)")


# -- fingerprints --------------------------------------------------------------------------------------
def fingerprint(value: Any) -> str | None:
    """A call argument as a string that identifies it (see the module's docstring); None for a
    value it cannot describe (such a call is not recorded, and a lookup of it is refused)."""
    try:
        return _fp(value)
    except TypeError:
        return None


def _fp(v: Any) -> str:
    if v is None or isinstance(v, (bool, int, float, str)):
        return repr(v)
    if isinstance(v, torch.Tensor):
        return f"tensor{tuple(v.shape)}:{v.dtype}"
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, nn.Module):
        return f"module {_name(type(v))}{[tuple(p.shape) for p in v.parameters()]}"
    if isinstance(v, (tuple, list)):
        return f"{type(v).__name__}({', '.join(_fp(x) for x in v)})"
    if isinstance(v, (set, frozenset)):
        return f"set({', '.join(sorted(_fp(x) for x in v))})"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_fp(k)}: {_fp(x)}" for k, x in v.items()) + "}"
    if isinstance(v, functools.partial):
        return f"partial({_fp(v.func)}, {_fp(v.args)}, {_fp(v.keywords)})"
    if callable(v) and hasattr(v, "__qualname__"):
        return _name(v)
    raise TypeError(f"no fingerprint for {type(v).__name__}")


def _name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '')}.{obj.__qualname__}"


def arguments(fn: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``fn``'s arguments by parameter name, defaults applied (``*args`` as a tuple, ``**kw`` a
    dict): what the release's stub of ``fn`` passes to ``recorded``."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


# -- results as data -----------------------------------------------------------------------------------
def to_data(value: Any) -> Any:
    """``value`` as data ``torch.load(weights_only=True)`` reads back (TypeError for any other)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple):
        return tuple(to_data(v) for v in value)
    if isinstance(value, list):
        return [to_data(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return {SET: sorted(to_data(v) for v in value)}
    if isinstance(value, dict) and all(isinstance(k, (str, int)) for k in value):
        return {k: to_data(v) for k, v in value.items()}
    raise TypeError(f"a recorded result must be data, got {type(value).__name__}")


def from_data(data: Any) -> Any:
    """A recorded result as the reference returned it (a fresh copy: a caller may change it)."""
    if isinstance(data, torch.Tensor):
        return data.clone()
    if isinstance(data, tuple):
        return tuple(from_data(v) for v in data)
    if isinstance(data, list):
        return [from_data(v) for v in data]
    if isinstance(data, dict):
        if list(data) == [SET]:
            return frozenset(from_data(v) for v in data[SET])
        return {k: from_data(v) for k, v in data.items()}
    return data


def _equal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    return a == b


# -- recording (the teacher's package, while the release is built) -----------------------------------------
class Recorder:
    """While entered (``with Recorder() as r``), every call of a function marked ``@reference``,
    nested calls included, is recorded: its qualified name, its arguments' fingerprint, its result.
    A call whose arguments or result are not data (a prediction object) is listed in ``skipped``
    instead. ``@answer`` calls are not recorded: their parts are the teacher's."""

    def __init__(self):
        self.calls: dict[str, dict[str, list]] = {}
        self.skipped: list[str] = []

    def __enter__(self) -> Recorder:
        core.RECORDERS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        core.RECORDERS.remove(self)

    def call(self, kind: str, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """Call ``fn`` (a function marked ``@kind``) and record the call (a reference's)."""
        if kind != "reference":
            return fn(*args, **kwargs)
        name = _name(fn)
        key = fingerprint(arguments(fn, args, kwargs))  # before the call: fn may change its arguments
        result = fn(*args, **kwargs)
        try:
            data = to_data(result)
        except TypeError:
            data = None
        if key is None or (data is None and result is not None):
            self.skipped.append(name)
        else:
            self.calls.setdefault(name, {}).setdefault(key, []).append(data)
        return result

    def data(self) -> dict[str, dict[str, list]]:
        """{qualified name: {fingerprint: [results]}}, one result where every call returned the same."""
        out = {}
        for name, by_key in self.calls.items():
            out[name] = {key: results[:1] if all(_equal(r, results[0]) for r in results) else list(results)
                         for key, results in by_key.items()}
        return out


# -- lookup (the student release's stubs) ------------------------------------------------------------------
_COUNTS: dict[tuple[str, str], int] = {}


@functools.lru_cache(maxsize=1)
def _recording() -> dict:
    path = Path(__file__).resolve().with_name(FILE)
    if not path.is_file():
        return {}
    return torch.load(path, weights_only=True)


def recorded(name: str, args: dict[str, Any]) -> Any:
    """The recorded result of reference ``name`` (module.qualname) called with ``args`` (by
    parameter name): what the student release's stub of a reference returns. ``RefusedObject``
    when the recording has no such call."""
    key = fingerprint(args)
    results = _recording().get(name, {}).get(key) if key is not None else None
    if not results:
        raise RefusedObject(NOT_RECORDED)
    k = _COUNTS.get((name, key), 0)
    _COUNTS[(name, key)] = k + 1
    return from_data(results[k % len(results)])
