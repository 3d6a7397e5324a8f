"""Bad input, refused where it is made, with the fix in the message.

* ``CourseError`` -- the course's own error: what is wrong, then ``Fix:`` and what to do. One
  subclass per module family (``FAMILIES``), so a caller catches one type for, say, everything
  ``fit`` refuses (``FitError``) or every file the course cannot read (``RecordError``). Each is a
  ``ValueError``, which the course's errors were before.
* ``guard(globals(), FitError)`` -- the last line of a module: every public function (and public
  class's ``__init__``) it defines checks its arguments against their annotations before its body
  runs. ``int`` means a whole number (not a bool, not 2.5), ``float`` a finite number (never NaN),
  ``Literal[...]`` one of its values, a class an instance of it, ``X | None`` either; and a number
  is never negative, and never zero where its name is a count or a size (``POSITIVE``), unless the
  module says otherwise. An argument left at its default is not checked (the module chose it).
* ``guarded_checks(func)`` -- what ``guard`` checks for ``func``: the property-based suite
  (tests/test_properties_boundary.py) reads it to generate bad values for every checked argument.

A function that is not public (``_name``) is not guarded: it is called by the course, which the
tests check, not by a learner. The grading package is not guarded: a learner's answer of the wrong
type is a wrong answer the check reports, never an error (``grading.core``).
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import math
import numbers
import os
import sys
import types
import typing
from pathlib import PurePath
from typing import Any, Callable

__all__ = [
    "CourseError", "SetupError", "MeasureError", "LoopError", "TechniqueError", "NetworkError",
    "TilingError", "ParallelError", "FitError", "RecordError", "ScaffoldError", "FAMILIES",
    "POSITIVE", "SIGNED", "guard", "guarded_checks", "Check",
]


class CourseError(ValueError):
    """Bad input to the course: the message says what is wrong and, after ``Fix:``, what to do."""

    def __init__(self, message: str, fix: str | None = None):
        self.problem, self.fix = message.rstrip(), fix  # what is wrong; what to do (None: in the message)
        super().__init__(f"{self.problem} Fix: {fix}" if fix else self.problem)


class SetupError(CourseError):
    """config, data, cost, tf32, amp_rules: the course's setup and its foundations."""


class MeasureError(CourseError):
    """memory, train, compare: the meters, the predictor, CUDA peaks, the training step."""


class LoopError(CourseError):
    """loops: options that no training loop runs."""


class TechniqueError(CourseError):
    """checkpointing, inplace_abn, budget, allocator, limit_test, explorer, benchmark, amp_check:
    the techniques, the budgets they fit, the benchmark."""


class NetworkError(CourseError):
    """unet, densenet, full_resolution, fit_examples: the course's networks and their sizes."""


class TilingError(CourseError):
    """tiling: a volume trained in slabs."""


class ParallelError(CourseError):
    """parallel, spatial, densenet_spatial, parallel_plots, numerics: ranks, slabs, schedules, and
    the BatchNorm arithmetic they share."""


class FitError(CourseError):
    """fit, fit_model, fit_report, fit_validation, fit_published: ``fit`` cannot predict this
    network as asked."""


class RecordError(CourseError):
    """recorded, files, session_cache, gpu_kit, gpu_report, readme: files the course reads and
    writes."""


class ScaffoldError(CourseError):
    """scaffold, hosted, layout, markdown: a new notebook, the course's file names and links, the
    learner's zip and wheel."""


#: every family's error type; its docstring begins with the modules it covers ("a, b, c: ...")
FAMILIES = (SetupError, MeasureError, LoopError, TechniqueError, NetworkError, TilingError,
            ParallelError, FitError, RecordError, ScaffoldError)

#: names of numbers that count or size something: at least 1 wherever they appear
POSITIVE = frozenset("""
    accumulate base base_channels cell_timeout check_timeout collective_timeout_s batch batch_size bn_size budget_bytes budget_gib budget_mib c_in
    c_out card_gib channels channels_per_group cin depth dilation disk_gib global_batch gpus
    growth_rate heads height hidden hidden_dim image image_size in_channels input_shape jobs kernel
    lanes levels local_batch memory_gib micro micro_batches mlp_dim mlp_ratio n_classes n_layers
    nproc num_classes num_convs num_features num_heads num_init_features num_labels num_layers
    out_channels patch patch_size planes reps rounds segments side sides slab spatial_dims stages
    stride sweeps target_shape threads tiles timeout_s total_gib total_timeout trials type_vocab units vocab
    width world world_size
""".split())

#: names of numbers that may be negative (a tensor dimension counts from the end)
SIGNED = frozenset({"axis", "dim", "returncode", "code", "salt", "sig"})


class Check(typing.NamedTuple):
    """One argument ``guard`` checks: its name, its position (None: keyword-only), what it must
    be (words), ``test(value)``: True when the value is acceptable, and ``kind(value)``: True
    when it is of an acceptable kind, whatever its value (else the error is also a TypeError)."""

    name: str
    position: int | None
    expected: str
    test: Callable[[Any], bool]
    kind: Callable[[Any], bool]
    annotation: Any


_MISSING = object()
_NONE_TYPE = type(None)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _int_check(name: str, rules: dict) -> tuple[str, Callable, Callable]:
    if name in rules["signed"]:
        return "a whole number", _is_int, _is_int
    low = 0 if name in rules["zero"] or name not in rules["positive"] else 1
    return f"a whole number >= {low}", lambda v: _is_int(v) and v >= low, _is_int


def _float_check(name: str, rules: dict) -> tuple[str, Callable, Callable]:
    signed, nan = name in rules["signed"], name in rules["nan"]
    strict = name in rules["positive"] and name not in rules["zero"]
    infinite = name in rules["infinite"]

    def test(v: Any) -> bool:
        if not _is_real(v):
            return False
        try:
            f = float(v)
        except OverflowError:  # an int past float's range: infinite, for this check
            f = math.inf if v > 0 else -math.inf
        if math.isnan(f):
            return nan
        if math.isinf(f) and not (infinite and f > 0):
            return False
        return signed or (f > 0 if strict else f >= 0)
    words = "" if signed else (" > 0" if strict else " >= 0")
    finite = "" if infinite else "finite "
    return f"a {finite}number{words}" + (" or NaN (not known)" if nan else ""), test, _is_real


_ClassCheck = tuple[str, Callable, Callable]


def _isinstance_check(cls: type) -> _ClassCheck | None:
    if getattr(cls, "_is_protocol", False) and not getattr(cls, "_is_runtime_protocol", False):
        return None
    torch = sys.modules.get("torch")  # a torch class in an annotation means torch is imported
    if torch is not None and cls is torch.device:
        def device(v: Any) -> bool:
            return isinstance(v, (torch.device, str)) or (_is_int(v) and v >= 0)
        return "a torch.device or a device name such as 'cuda'", device, device
    if torch is not None and cls is torch.dtype:
        return "a torch.dtype such as torch.float16", *(lambda v: isinstance(v, torch.dtype),) * 2
    if issubclass(cls, PurePath):
        return "a path (a str or a pathlib.Path)", *(lambda v: isinstance(v, (str, os.PathLike)),) * 2
    name = f"{cls.__module__}.{cls.__qualname__}".replace("torch.nn.modules.module.", "torch.nn.")
    return f"a {name.replace('builtins.', '')}", *(lambda v: isinstance(v, cls),) * 2


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _element_check(inner: Any, name: str, rules: dict) -> _ClassCheck | None:
    if inner is int:
        return _int_check(name, rules)
    if inner is float:
        return _float_check(name, rules)
    if inner is str:
        return "a str", _is_str, _is_str
    return None


def _sequence_check(origin: type, args: tuple, name: str, rules: dict) -> _ClassCheck:
    homogeneous = origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)
    inner = _element_check(args[0], name, rules) if args and homogeneous else None

    def kind(v: Any) -> bool:
        if isinstance(v, (str, bytes)) or not isinstance(v, collections.abc.Iterable):
            return False
        return inner is None or not isinstance(v, (list, tuple)) or all(inner[2](x) for x in v)

    def test(v: Any) -> bool:
        return kind(v) and (inner is None or not isinstance(v, (list, tuple)) or all(inner[1](x) for x in v))
    what = f"a sequence, each item {inner[0]}" if inner else "a list or a tuple"
    return what, test, kind


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool) or type(v).__name__ == "bool_"


def _is_mapping(v: Any) -> bool:
    return isinstance(v, collections.abc.Mapping)


def _union_check(args: tuple, name: str, rules: dict) -> _ClassCheck | None:
    arms = [a for a in args if a is not _NONE_TYPE]
    parts = [_checker(a, name, rules) for a in arms]
    if any(p is None for p in parts):
        return None
    nullable = len(arms) < len(args)
    words = " or ".join(p[0] for p in parts) + (" or None" if nullable else "")
    return (words, lambda v: (nullable and v is None) or any(p[1](v) for p in parts),
            lambda v: (nullable and v is None) or any(p[2](v) for p in parts))


def _checker(hint: Any, name: str, rules: dict) -> _ClassCheck | None:
    """(what the argument must be, its test, its kind test), or None where the annotation says
    nothing checkable."""
    if hint is None or hint is Any or isinstance(hint, (typing.TypeVar, str)):
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _union_check(args, name, rules)
    if origin is typing.Literal:
        kinds = tuple({type(c) for c in args})
        return ("one of " + ", ".join(map(repr, args)),
                lambda v: any(v == c and type(v) is type(c) for c in args), lambda v: isinstance(v, kinds))
    if origin is not None:
        if origin in (list, tuple, collections.abc.Sequence, set, frozenset, collections.abc.Iterable):
            return _sequence_check(origin, args, name, rules)
        if origin in (dict, collections.abc.Mapping):
            return "a dict", _is_mapping, _is_mapping
        if origin is collections.abc.Callable:
            return "a function (something callable)", callable, callable
        return None
    simple = {bool: ("True or False", _is_bool, _is_bool), str: ("a str", _is_str, _is_str),
              dict: ("a dict", _is_mapping, _is_mapping)}
    if hint in simple:
        return simple[hint]
    if hint is int:
        return _int_check(name, rules)
    if hint is float:
        return _float_check(name, rules)
    if hint is collections.abc.Callable or hint is typing.Callable:
        return "a function (something callable)", callable, callable
    if hint in (list, tuple):
        return _sequence_check(hint, (), name, rules)
    if isinstance(hint, type) and hint is not object:
        return _isinstance_check(hint)
    return None


def _hints(func: Callable, namespace: dict) -> dict[str, Any]:
    """Each parameter's annotation, resolved in the module's namespace; one that cannot be
    resolved (a name imported only for type checkers) is left out, and so unchecked."""
    out = {}
    for pname, ann in getattr(func, "__annotations__", {}).items():
        if isinstance(ann, str):
            try:
                ann = eval(ann, dict(vars(typing)) | namespace)  # noqa: S307 - the module's own annotation
            except Exception:
                continue
        out[pname] = ann
    return out


def _checks(func: Callable, namespace: dict, rules: dict) -> tuple[Check, ...]:
    hints = _hints(func, namespace)
    out = []
    for i, p in enumerate(inspect.signature(func).parameters.values()):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in rules["skip"]:
            continue
        found = _checker(hints.get(p.name), p.name, rules)
        if found is not None:
            position = None if p.kind is p.KEYWORD_ONLY else i
            out.append(Check(p.name, position, *found, hints.get(p.name)))
    return tuple(out)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind_errors() -> dict[type[CourseError], type[CourseError]]:
    """Each family's error that is also a TypeError (``FitTypeError``, ...), made once, here, so
    that a process pool can pickle one: its name resolves in this module."""
    out = {}
    for family in (CourseError, *FAMILIES):
        name = family.__name__.removesuffix("Error") + "TypeError"
        kind = type(name, (family, TypeError), {"__module__": __name__, "__qualname__": name, "__doc__": (
            f"{family.__name__} for an argument of the wrong kind (a str for a number), as Python's own "
            f"functions raise a TypeError; ``except {family.__name__}`` and ``except TypeError`` both catch it.")})
        globals()[name] = out[family] = kind
    return out


_KIND_ERRORS = _kind_errors()


def _wrap(func: Callable, where: str, checks: tuple[Check, ...], error: type[CourseError]) -> Callable:
    @functools.wraps(func)
    def guarded(*args, **kwargs):
        for c in checks:
            if c.position is not None and c.position < len(args):
                value = args[c.position]
            else:
                value = kwargs.get(c.name, _MISSING)
                if value is _MISSING:
                    continue
            if not c.test(value):
                kind = error if c.kind(value) else _KIND_ERRORS[error]
                raise kind(f"{where}: {c.name}={_show(value)} ({type(value).__name__}) is not "
                           f"{c.expected}.", f"pass {c.name} as {c.expected}.")
        return func(*args, **kwargs)

    guarded.__course_checks__ = checks
    guarded.__course_error__ = error
    return guarded


def guard(namespace: dict, error: type[CourseError], *, positive: tuple[str, ...] = (),
          signed: tuple[str, ...] = (), zero: tuple[str, ...] = (), infinite: tuple[str, ...] = (),
          nan: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> None:
    """Check the arguments of every public function and class the module with globals
    ``namespace`` defines, raising ``error`` (the module family's) with the fix; an argument of
    the wrong kind raises an ``error`` that is also a TypeError. For this module only:
    ``positive`` / ``signed`` add names to ``POSITIVE`` / ``SIGNED``; ``zero``: names of
    ``POSITIVE`` that may be 0 here (0 meaning "none"); ``infinite``: float arguments that may be
    +inf (no limit); ``nan``: float arguments that may be NaN (not known); ``skip``: unchecked."""
    if error not in _KIND_ERRORS:
        raise TypeError(f"guard's error must be CourseError or one of checks.FAMILIES, got {error!r}")
    module = namespace["__name__"]
    rules = {"positive": (POSITIVE | set(positive)) - set(signed), "signed": SIGNED | set(signed),
             "zero": frozenset(zero), "infinite": frozenset(infinite), "nan": frozenset(nan),
             "skip": frozenset(skip)}
    for name, obj in list(namespace.items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module:
            continue
        if inspect.isfunction(obj) and not hasattr(obj, "__course_checks__"):
            checks = _checks(obj, namespace, rules)
            if checks:
                namespace[name] = _wrap(obj, f"{module.removeprefix('course_utils.')}.{name}", checks, error)
        elif inspect.isclass(obj) and not issubclass(obj, BaseException):
            init = vars(obj).get("__init__")
            if inspect.isfunction(init) and not hasattr(init, "__course_checks__"):
                checks = _checks(init, namespace, rules)
                if checks:
                    obj.__init__ = _wrap(init, f"{module.removeprefix('course_utils.')}.{name}", checks, error)


def guarded_checks(func: Callable) -> tuple[tuple[Check, ...], type[CourseError]] | None:
    """The checks ``guard`` runs before ``func`` (a function or a class), and the error it
    raises; None if ``func`` is not guarded."""
    target = vars(func).get("__init__") if inspect.isclass(func) else func
    checks = getattr(target, "__course_checks__", None)
    return None if checks is None else (checks, target.__course_error__)
