"""Every public entry point of course_utils refuses bad arguments where they are passed.

The module index (course_utils/__init__.py's docstring) lists the modules; each (but the grading
package, whose checks report a learner's wrong answer instead of raising) ends with
``guard(globals(), <its family's error>)``. These tests hold that to every public function and
class of every listed module, with values generated independently of the guard's own tests:

* every module is guarded, with the error of the family ``checks.FAMILIES`` puts it in;
* every public function or class with an argument the guard can check is guarded;
* hostile values (NaN, inf, negative, zero for a size, 2.5 for a count, True for a count, the
  wrong kind) for each checked argument raise the family's error, naming the argument and the fix,
  before the body runs (nothing is written: the calls run in an empty folder that stays empty);
* good values of each annotation pass the guard (no false refusal).

The issue's named examples and each family's own properties (file contents, commands, ``fit``,
numbers with relations between them) are in tests/test_properties_{numbers,files,commands,fit}.py.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import importlib
import inspect
import math
import os
import pkgutil
import re
import types
import typing
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import course_utils
from course_utils import checks

UNGUARDED = ("course_utils.grading", "course_utils.exercises", "course_utils.grade", "course_utils.checks")


def _index_modules() -> list[str]:
    """Every module of the package the index lists (a subpackage: each of its modules)."""
    out = []
    for info in pkgutil.walk_packages(course_utils.__path__, "course_utils."):
        name = info.name
        if ".templates" in name or name.startswith(UNGUARDED) or name.endswith("__main__"):
            continue
        if info.ispkg:
            continue
        out.append(name)
    return out


MODULES = _index_modules()


def _family_of() -> dict[str, type[checks.CourseError]]:
    """{top-level module or subpackage: its family's error}, read from the families' docstrings."""
    out = {}
    for error in checks.FAMILIES:
        listed = error.__doc__.split(":")[0]
        for name in re.split(r",\s*", listed):
            assert name not in out, f"{name} is in two families: {out[name].__name__}, {error.__name__}"
            out[name.strip()] = error
    return out


def _public(module) -> list[tuple[str, object]]:
    return [(k, v) for k, v in vars(module).items()
            if not k.startswith("_") and getattr(v, "__module__", None) == module.__name__
            and (inspect.isfunction(v) or (inspect.isclass(v) and not issubclass(v, BaseException)))]


def _entry_points() -> list[tuple[str, object, checks.Check, type]]:
    out = []
    for name in MODULES:
        module = importlib.import_module(name)
        for qual, obj in _public(module):
            found = checks.guarded_checks(obj)
            if found:
                out.extend((f"{name}.{qual}", obj, c, found[1]) for c in found[0])
    return out


ENTRY_POINTS = _entry_points()


def test_the_index_covers_the_package_and_every_family_names_real_modules():
    family = _family_of()
    tops = {m.removeprefix("course_utils.").split(".")[0] for m in MODULES}
    assert tops == set(family), (
        f"modules without a family: {sorted(tops - set(family))}; families naming no module: "
        f"{sorted(set(family) - tops)}. Fix: list each module in one family's docstring in course_utils/checks.py")
    assert len(ENTRY_POINTS) > 1000  # 1,487 checked arguments when this test was written


@pytest.mark.parametrize("name", MODULES)
def test_every_module_is_guarded_with_its_familys_error(name):
    module = importlib.import_module(name)
    error = _family_of()[name.removeprefix("course_utils.").split(".")[0]]
    source = Path(module.__file__).read_text()
    assert f"guard(globals(), {error.__name__}" in source, (
        f"{name} does not end with guard(globals(), {error.__name__}): its public functions take any argument")
    for qual, obj in _public(module):
        found = checks.guarded_checks(obj)
        if found:
            assert found[1] is error, f"{name}.{qual} raises {found[1].__name__}, its family is {error.__name__}"


def _checkable(obj) -> bool:
    """Whether ``obj`` has an argument ``guard`` can check (its own rules, asked directly)."""
    func = vars(obj).get("__init__") if inspect.isclass(obj) else obj
    if not inspect.isfunction(func):
        return False
    module = inspect.getmodule(obj)
    rules = {"positive": checks.POSITIVE, "signed": checks.SIGNED, "zero": frozenset(), "infinite": frozenset(),
             "nan": frozenset(), "skip": frozenset()}
    return bool(checks._checks(inspect.unwrap(func), vars(module), rules))  # noqa: SLF001 - the rule asked of itself


@pytest.mark.parametrize("name", MODULES)
def test_every_public_function_with_a_checkable_argument_is_guarded(name):
    module = importlib.import_module(name)
    missed = [qual for qual, obj in _public(module) if _checkable(obj) and checks.guarded_checks(obj) is None]
    assert not missed, f"{name}: {missed} check no argument. Fix: keep guard(globals(), ...) the module's last line"


# ---- values generated independently of the guard ------------------------------------------------

_NONE = type(None)


def _arms(ann) -> tuple[list, bool]:
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = typing.get_args(ann)
        return [a for a in args if a is not _NONE], _NONE in args
    return [ann], False


def _numbers_in(ann) -> set:
    arms, _ = _arms(ann)
    return {a for a in arms if a in (int, float)}


def _lowest(check: checks.Check, positive: bool) -> float:
    if check.name in checks.SIGNED:
        return -math.inf
    return 1 if positive else 0


def bad_values(check: checks.Check, positive: bool) -> st.SearchStrategy:
    """Values no annotation of this argument admits, whatever the guard thinks."""
    arms, nullable = _arms(check.annotation)
    kinds = set(arms)
    out = [st.just(object()), st.just(b"\x00bytes")]
    if not nullable:
        out.append(st.none())
    if str not in kinds and not any(typing.get_origin(a) is typing.Literal for a in arms) and not _path_like(kinds):
        out.append(st.text(max_size=12))
    numbers = _numbers_in(check.annotation)
    if numbers:
        low = _lowest(check, positive)
        out += [st.just(math.nan), st.just(-math.inf)]
        if low > -math.inf:
            out.append(st.integers(max_value=int(low) - 1, min_value=-10**12))
        if float not in numbers:
            out += [st.just(math.inf), st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f)),
                    st.booleans()]
    if kinds == {bool}:
        out += [st.just("False"), st.integers(0, 1)]
    for a in arms:
        if typing.get_origin(a) is typing.Literal:
            choices = typing.get_args(a)
            out.append(st.text(max_size=12).filter(lambda s, c=choices: s not in c))
    return st.one_of(out)


def _path_like(kinds: set) -> bool:
    return any(isinstance(k, type) and issubclass(k, os.PathLike) or k is Path for k in kinds)


def _positive(check: checks.Check, obj) -> bool:
    if check.name in checks.SIGNED or _module_rule(obj, "signed", check.name) or _module_rule(obj, "zero", check.name):
        return False
    return check.name in checks.POSITIVE or _module_rule(obj, "positive", check.name)


def _module_rule(obj, rule: str, name: str) -> bool:
    """Whether the module's guard line names ``name`` in ``rule`` (positive=, infinite=), read from
    its source, not from the guard."""
    line = _guard_line(inspect.getmodule(obj).__file__)
    return bool(line and re.search(rf"{rule}=\([^)]*[\"']{re.escape(name)}[\"']", line))


@functools.cache
def _guard_line(path: str) -> str | None:
    found = re.search(r"^guard\(globals\(\).*$", Path(path).read_text(), re.M | re.S)
    return found.group(0) if found else None


def _admitted(value, check: checks.Check, obj) -> bool:
    """Whether a value drawn as bad is one a broad annotation admits after all (a str where a
    path or a device name is meant, +inf where the module allows an unlimited budget)."""
    arms, _ = _arms(check.annotation)
    if isinstance(value, str):
        return any(a is str or _path_like({a}) or a is torch.device for a in arms)
    if isinstance(value, bytes):
        return bytes in arms
    if isinstance(value, bool):
        return bool in arms
    if isinstance(value, int) and torch.device in arms:
        return value >= 0
    if isinstance(value, float) and value == math.inf:
        return float in arms and _module_rule(obj, "infinite", check.name)
    if isinstance(value, float) and math.isnan(value):
        return float in arms and _module_rule(obj, "nan", check.name)
    if isinstance(value, (int, float)) and any(a in (int, float) for a in arms):
        return _module_rule(obj, "signed", check.name)
    return False


@pytest.mark.parametrize("chunk", range(8))
@settings(max_examples=settings().max_examples * 10)
@given(data=st.data())
def test_a_bad_argument_is_refused_with_the_familys_error_before_the_body_runs(chunk, data, tmp_path_factory):
    """A function called with one hostile argument raises its family's error naming the argument
    and the fix -- or, where the drawn value is one the annotation admits, the guard lets it by."""
    cases = ENTRY_POINTS[chunk::8]
    where, obj, check, error = data.draw(st.sampled_from(cases), label="entry point")
    value = data.draw(bad_values(check, _positive(check, obj)), label=check.name)
    folder = tmp_path_factory.mktemp("cwd")
    old = os.getcwd()
    os.chdir(folder)
    try:
        if check.test(value):
            assert _admitted(value, check, obj), f"{where}: {check.name}={value!r} passed the guard"
            return
        with pytest.raises(checks.CourseError) as info:
            obj(**{check.name: value})
    finally:
        os.chdir(old)
    assert isinstance(info.value, error), f"{where} raised {type(info.value).__name__}, its family is {error.__name__}"
    wrong_kind = not check.kind(value)
    assert isinstance(info.value, TypeError) == wrong_kind, f"{where}: {check.name}={value!r} TypeError {not wrong_kind}"
    message = str(info.value)
    assert check.name in message and "Fix:" in message, message
    assert not any(folder.iterdir()), f"{where} wrote {sorted(folder.iterdir())} before refusing"


def good_values(check: checks.Check, positive: bool) -> st.SearchStrategy | None:
    """Values the annotation admits (None where it is a class this test does not build)."""
    arms, nullable = _arms(check.annotation)
    out = [st.none()] if nullable else []
    low = 1 if positive else (-10**6 if check.name in checks.SIGNED else 0)
    for a in arms:
        origin = typing.get_origin(a)
        if a is int:
            out.append(st.integers(low, 10**12))
        elif a is float:
            out.append(st.floats(low if positive else max(low, -1e12), 1e12).filter(lambda f: f > 0 or not positive))
        elif a is bool:
            out.append(st.booleans())
        elif a is str:
            out.append(st.text(max_size=12))
        elif origin is typing.Literal:
            out.append(st.sampled_from(typing.get_args(a)))
        elif a is torch.dtype:
            out.append(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
        elif _path_like({a}):
            out.append(st.sampled_from(["x.json", Path("x")]))
        elif origin in (list, tuple, collections.abc.Sequence) and typing.get_args(a)[:1] == (int,):
            out.append(st.lists(st.integers(max(low, 1) if positive else max(low, 0), 64), max_size=5))
        else:
            return None
    return st.one_of(out) if out else None


GOOD = [(w, o, c) for w, o, c, _ in ENTRY_POINTS if good_values(c, _positive(c, o)) is not None]


@settings(max_examples=settings().max_examples * 10)
@given(data=st.data())
def test_a_good_argument_passes_the_guard(data):
    where, obj, check = data.draw(st.sampled_from(GOOD), label="entry point")
    value = data.draw(good_values(check, _positive(check, obj)), label=check.name)
    assert check.test(value), f"{where}: the guard refuses {check.name}={value!r}, which its annotation admits"


def test_the_guard_refuses_before_the_body_and_keeps_the_function_itself():
    from course_utils import budget, tiling

    with pytest.raises(checks.TilingError, match=r"budget_bytes=0 .*Fix: pass budget_bytes as a finite number > 0"):
        tiling.largest_tiled_n(0)
    assert inspect.unwrap(tiling.largest_tiled_n).__name__ == "largest_tiled_n"
    assert "budget_bytes" in inspect.signature(tiling.largest_tiled_n).parameters
    with pytest.raises(checks.TechniqueError, match="card_gib=nan"):
        budget.usable_bytes(float("nan"))


def test_every_course_error_carries_its_fix():
    err = checks.FitError("the builder returned None.", "return the model from the function.")
    assert str(err) == "the builder returned None. Fix: return the model from the function."
    assert isinstance(err, ValueError) and err.fix.startswith("return")
    with pytest.raises(TypeError):
        checks.guard({"__name__": "x"}, ValueError)


def test_every_guarded_default_passes_its_own_check():
    """A default the guard would refuse is a false refusal waiting for the first call that passes
    it back (``dataclasses.replace`` passes every field): CostEstimate's memory_bytes_per_s=inf
    ("not counted") was refused so, until its module said ``infinite=``."""
    refused = []
    for where, obj, check, _ in ENTRY_POINTS:
        func = inspect.unwrap(vars(obj)["__init__"] if inspect.isclass(obj) else obj)
        default = inspect.signature(func).parameters[check.name].default
        if dataclasses.is_dataclass(obj) and repr(default) == "<factory>":  # default_factory: call it
            default = next(f for f in dataclasses.fields(obj) if f.name == check.name).default_factory()
        if default is not inspect.Parameter.empty and not check.test(default):
            refused.append(f"{where}: {check.name}={default!r}")
    assert not refused, f"defaults the guard refuses: {refused}. Fix: the module's guard line (zero=, signed=, infinite=, nan=) or the annotation"


def test_a_refusal_survives_a_process_pool_and_a_number_past_floats_range_is_refused():
    """A wrong-kind argument inside a multiprocessing worker comes back pickled: the TypeError
    flavour of a family's error must pickle (made on the fly, it did not). An int past float's
    range (10**400) made the guard itself raise OverflowError."""
    import pickle

    from course_utils import budget, tiling

    with pytest.raises(checks.TilingError) as info:
        tiling.largest_tiled_n("8 GiB")
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is type(info.value) and isinstance(again, TypeError) and str(again) == str(info.value)
    with pytest.raises(checks.TechniqueError, match="Fix:"):
        budget.usable_bytes(10**400)
