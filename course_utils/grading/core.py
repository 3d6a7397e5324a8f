"""What every exercise's checks are made of: parts, each split into an *observation* and a *judgement*.

A part of an exercise has

* an **observe** function: it runs the learner's objects (a function, a class) on inputs derived
  from a seed and returns *data* only -- numbers, strings, tensors, lists/dicts of them. It runs
  wherever the learner's code runs: in the notebook, or in the grader's sandbox process.
* a **judge** function: it recomputes the reference from ``course_utils`` and PyTorch (never a
  typed-in figure) for the same seed and compares; it raises ``CheckFailed`` with a message that
  says what is wrong. The grader runs it in its own process, which never runs learner code, on
  the observed data after a round trip through ``torch.save`` / ``torch.load(weights_only=True)``
  (data only: loading it cannot run code).

In a notebook, ``check_*`` functions run both halves in the learner's kernel, for instant feedback,
and return a ``Score`` (a float: nbgrader reads it as the cell's partial credit).

A part marked ``secret`` answers a question whose value *is* the answer (a segment count, a batch,
a yes/no): its messages never show the expected value.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import numbers
import operator
import os
import reprlib
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

#: set by the grader for the learner's kernel: the notebook's own check cells then do nothing
#: (the grader scores the parts in its own processes; running them twice would only cost time)
GRADER_RUN_ENV = "COURSE_GRADER_RUN"

#: how much of a learner's error message a part keeps (the grader's JSON keeps it all)
MESSAGE_CHARS = 600
#: how much of a judge's message a part keeps (it may quote the learner's values)
JUDGE_CHARS = 2000
#: the deepest nesting of lists and dicts an observation may have (as_data; the grader's load)
MAX_DEPTH = 40


class CheckFailed(AssertionError):
    """A part's judgement failed; the message says what is wrong."""


class RefusedObject(RuntimeError):
    """Graded code used an object the exercise asks the learner to write (or grading code).

    In the grader's sandbox those objects are replaced by stubs that raise this."""


@dataclass
class Raised:
    """An observation that ended in an exception (kept as data: type, message, kind)."""

    type: str
    message: str
    kind: str = "error"  # error | not_implemented | missing | refused | timeout | crashed | check

    def to_data(self) -> dict:
        return {"__raised__": True, "type": self.type, "message": self.message, "kind": self.kind}

    @classmethod
    def from_data(cls, d: Any) -> "Raised | None":
        if isinstance(d, dict) and d.get("__raised__") is True:
            return cls(str(d.get("type", "")), str(d.get("message", "")), str(d.get("kind", "error")))
        return None

    @classmethod
    def from_exception(cls, err: BaseException) -> "Raised":
        if isinstance(err, RefusedObject):
            return cls(type(err).__name__, str(err), "refused")
        if isinstance(err, CheckFailed):  # the harness found the answer unusable
            return cls(type(err).__name__, str(err), "check")
        if isinstance(err, NotImplementedError):
            return cls("NotImplementedError", str(err), "not_implemented")
        return cls(type(err).__name__, str(err), "error")

    def explain(self) -> str:
        if self.kind == "not_implemented":
            return ("not implemented yet: replace `raise NotImplementedError()` with your code"
                    + (f" ({self.message})" if self.message and self.message != "replace this line with your code" else ""))
        if self.kind in ("missing", "refused", "timeout", "crashed", "check"):
            return self.message
        msg = self.message.strip()
        if len(msg) > MESSAGE_CHARS:
            msg = msg[:MESSAGE_CHARS] + " [...]"
        return f"your code raised {self.type}" + (f": {msg}" if msg else "")


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------
@dataclass
class PartResult:
    """One part's result in a ``Report``: its points, whether it passed, and the message saying why
    not; ``checked`` False when the student release cannot check it (the teacher's grader does)."""

    key: str
    name: str
    points: int
    passed: bool = False
    message: str = ""
    checked: bool = True  # False: the student release has no answer to check this part with

    @property
    def score(self) -> int:
        return self.points if self.passed else 0

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, "points": self.points, "score": self.score,
                "passed": self.passed, "message": self.message}


@dataclass
class Report:
    """One check's results, part by part, for an exercise; ``score`` and ``max_score`` count the
    parts this installation can check."""

    exercise: str
    title: str
    parts: list[PartResult] = field(default_factory=list)
    #: in a notebook: the exercise's total so far (this and earlier check cells), set by
    #: ``Exercise.run``; ``Score`` shows it as the exercise's one total
    so_far: "Total | None" = None

    @property
    def score(self) -> int:
        return sum(p.score for p in self.parts)

    @property
    def max_score(self) -> int:
        return sum(p.points for p in self.parts if p.checked)

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.parts if p.checked)

    def as_dict(self) -> dict[str, Any]:
        return {"exercise": self.exercise, "title": self.title, "score": self.score,
                "max_score": self.max_score, "parts": [p.as_dict() for p in self.parts]}

    def lines(self) -> list[str]:
        out = []
        for p in self.parts:
            if not p.checked:
                out.append(f"  [ -- ] {p.name} ({p.points} points): {p.message}")
                continue
            mark = "PASS" if p.passed else "FAIL"
            out.append(f"  [{mark}] {p.name} ({p.score}/{p.points})" + ("" if p.passed else f": {p.message}"))
        return out


@dataclass
class Total:
    """An exercise's points over every part checked so far in this kernel (each part's latest
    result); parts not checked yet count 0 and are named."""

    score: int
    max_score: int
    unchecked: list[str]
    passed: bool

    def line(self, exercise: str, this_cell: Report) -> str:
        done = " -- all parts pass" if not self.unchecked and self.passed else ""
        text = f"**Exercise {exercise}: {self.score}/{self.max_score} points{done}**"
        notes = []
        if self.unchecked or this_cell.max_score != self.max_score:
            notes.append(f"this check: {this_cell.score}/{this_cell.max_score}")
        if self.unchecked:
            notes.append("not checked yet: " + ", ".join(self.unchecked))
        return text + (f" ({'; '.join(notes)})" if notes else "")


class Score(float):
    """A check's score: a float (what nbgrader's autograder reads as the cell's partial credit),
    shown in JupyterLab as "score / maximum"; ``.report`` holds every part."""

    report: Report

    def __new__(cls, report: Report) -> "Score":
        s = super().__new__(cls, float(report.score))
        s.report = report
        return s

    def _repr_markdown_(self) -> str:
        r = self.report
        if r.so_far is not None:
            return r.so_far.line(r.exercise, r)
        done = " -- all parts pass" if r.passed else ""
        return f"**Exercise {r.exercise}: {r.score}/{r.max_score} points{done}**"


# --------------------------------------------------------------------------------------------
# Exercises and parts
# --------------------------------------------------------------------------------------------
@dataclass
class Part:
    """A graded part of an exercise: its points, the learner's names it needs, and its ``observe``
    and ``judge`` functions (set with the decorators ``@PART.observe`` and ``@PART.judge``)."""

    key: str
    name: str
    points: int
    needs: tuple[str, ...]
    secret: bool = False
    observe_fn: Callable[..., Any] | None = None
    judge_fn: Callable[..., None] | None = None

    def observe(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.observe_fn = fn
        return fn

    def judge(self, fn: Callable[..., None]) -> Callable[..., None]:
        self.judge_fn = fn
        return fn


@dataclass
class Exercise:
    """One exercise: its graded names, its parts, and what graded code may not use.

    ``refused`` maps a ``course_utils`` module to the names in it that hold this exercise's
    answer: in the grader's sandbox they are stubs that raise ``RefusedObject``."""

    id: str
    title: str
    names: tuple[str, ...]
    refused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    parts: list[Part] = field(default_factory=list)
    #: each part's latest result in this process (a notebook's check cells): the exercise's total
    latest: dict[str, PartResult] = field(default_factory=dict, repr=False, compare=False)

    def part(self, key: str, name: str, points: int, needs: Iterable[str],
             secret: bool = False) -> Part:
        if any(p.key == key for p in self.parts):
            raise ValueError(f"exercise {self.id}: part {key!r} defined twice")
        needs = tuple(needs)
        unknown = set(needs) - set(self.names)
        if unknown:
            raise ValueError(f"exercise {self.id}: part {key!r} needs unknown names {sorted(unknown)}")
        p = Part(key, name, points, needs, secret)
        self.parts.append(p)
        return p

    def get(self, key: str) -> Part:
        for p in self.parts:
            if p.key == key:
                return p
        raise KeyError(f"exercise {self.id} has no part {key!r}; parts: {[p.key for p in self.parts]}")

    @property
    def max_score(self) -> int:
        return sum(p.points for p in self.parts)

    def total(self) -> Total:
        """The exercise's points over the latest result of every part (``run`` keeps them):
        one total per exercise, however many check cells it has. A part the student release
        cannot check (its answer is the teacher's) is left out of the maximum."""
        results = [self.latest[p.key] for p in self.parts if p.key in self.latest]
        return Total(score=sum(r.score for r in results),
                     max_score=sum(p.points for p in self.parts
                                   if p.key not in self.latest or self.latest[p.key].checked),
                     unchecked=list(dict.fromkeys(p.name.split(":")[0] for p in self.parts
                                                  if p.key not in self.latest)),
                     passed=all(r.passed for r in results if r.checked))

    def refusal(self, name: str, obj: Any) -> Raised | None:
        """In a notebook: refuse a graded object taken from course_utils (the grader refuses
        it too, and more strictly: see notebook_code.graded_objects)."""
        mods = [getattr(obj, "__module__", "") or ""]
        if isinstance(obj, type):
            for base in obj.__mro__[1:]:
                if any(base.__module__ == m and base.__qualname__ in names for m, names in self.refused.items()):
                    mods.append(base.__module__)
        if any(m == "course_utils" or m.startswith("course_utils.") for m in mods):
            return Raised("RefusedObject", f"{name} comes from {mods[-1]}: graded objects must be your own, "
                          "written in the notebook", "refused")
        return None

    # -- the two halves ------------------------------------------------------------------------
    def observe(self, key: str, objects: dict[str, Any], seed: int) -> Any:
        """Run part ``key`` on the learner's objects; return data, or ``Raised`` as data."""
        part = self.get(key)
        for name in part.needs:
            if isinstance(objects.get(name), Raised):
                return objects[name].to_data()
            if name not in objects:
                return Raised("NameError", f"{name} is not defined", "missing").to_data()
        try:
            with quiet():
                value = part.observe_fn(seed=seed, **{n: objects[n] for n in part.needs})
        except BaseException as err:  # noqa: BLE001 - the learner's code may raise anything
            if isinstance(err, (KeyboardInterrupt, SystemExit)) and not _in_sandbox():
                # in a notebook, an interrupt must still stop the cell
                raise
            raised = Raised.from_exception(err)
            # the grader's objects (notebook_code.GradedObjects) say which statement of the
            # notebook they did not run sets a missing name
            hint = getattr(objects, "explain", None)
            note = hint(err) if hint is not None and raised.kind == "error" else None
            if note:
                raised.message = f"{raised.message} -- {note}"
            return raised.to_data()
        try:  # the grader's own conversion: a value it cannot keep is not an error of the learner's code
            return as_data(value)
        except NotData as err:
            return Raised("NotData", f"the result is not data the grader can check: {err}", "check").to_data()
        except Exception as err:  # noqa: BLE001 - e.g. a meta tensor, or a view of 2**40 elements, to copy
            return Raised("NotData", f"the result could not be copied as data ({type(err).__name__}: "
                          f"{str(err)[:200]})", "check").to_data()

    def judge(self, key: str, observed: Any, seed: int) -> PartResult:
        """Compare an observation with the reference; never raises."""
        part = self.get(key)
        result = PartResult(part.key, part.name, part.points)
        raised = Raised.from_data(observed)
        if raised is not None:
            result.message = raised.explain()
            return result
        try:
            with quiet():
                part.judge_fn(observed, seed=seed)
            result.passed, result.message = True, "ok"
        except CheckFailed as err:
            result.message = str(err)
        except RefusedObject:  # the student release: this part's answer is not shipped
            result.checked = False
            result.message = "checked by your teacher's grader (its answer is not in the student release)"
        except Exception as err:  # noqa: BLE001 - the observation was not what the judge expects
            # (the judges check the form first: this is the last line of defence; a secret part's
            # message keeps only the exception's type, which cannot hold the expected value)
            detail = type(err).__name__ if part.secret else f"{type(err).__name__}: {str(err)[:MESSAGE_CHARS]}"
            result.message = f"the result has the wrong form ({detail})"
            # Python's allocator, or torch's
            if isinstance(err, MemoryError) or (isinstance(err, RuntimeError) and "can't allocate memory" in str(err)):
                result.message = ("judging this result needed more memory than the grader allows: it is too "
                                  "large to check")
        if len(result.message) > JUDGE_CHARS:  # a judge may quote the learner's values: never a flood
            result.message = result.message[:JUDGE_CHARS] + " [...]"
        return result

    def run(self, keys: Iterable[str], objects: dict[str, Any], seed: int = 0,
            verbose: bool = True) -> Score | None:
        """Observe and judge parts in this process (a notebook's instant feedback)."""
        if os.environ.get(GRADER_RUN_ENV):
            print(f"(grading run: exercise {self.id} is scored by the grader in its own processes)")
            return None
        report = Report(self.id, self.title)
        objects = {n: self.refusal(n, o) or o for n, o in objects.items()}
        for key in keys:
            data = roundtrip(self.observe(key, objects, seed))
            report.parts.append(self.judge(key, data, seed))
            self.latest[key] = report.parts[-1]
        report.so_far = self.total()
        if verbose:
            print("\n".join(report.lines()))
        return Score(report)


def _in_sandbox() -> bool:
    return bool(os.environ.get("COURSE_GRADER_SANDBOX"))


@contextlib.contextmanager
def quiet():
    """Warnings off, stderr to stdout: nbgrader gives 0 to a test cell that writes to stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stderr(sys.stdout):
            yield


# --------------------------------------------------------------------------------------------
# Observations are data
# --------------------------------------------------------------------------------------------
class NotData(TypeError):
    """An observed value the grader cannot keep as data (``as_data``): the learner's result has a
    type no judge reads, which is said as such -- never as an error raised by the learner's code."""


def as_data(value: Any, depth: int = 0) -> Any:
    """Check that ``value`` is data the grader may load (``torch.load(weights_only=True)``):
    None, bool, int, float, str, tensors (detached, on the CPU), and lists/tuples/dicts of them.
    What Python treats as the same number is converted: a NumPy integer or bool scalar
    (``numpy.int64``) becomes an int or a bool, a NumPy float scalar a float (``numbers``' ABCs,
    ``numpy.bool_`` by its ``dtype``); anything else raises ``NotData``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > MAX_DEPTH:
        raise NotData(f"it is nested more than {MAX_DEPTH} levels deep")
    if getattr(getattr(value, "dtype", None), "kind", None) == "b" and getattr(value, "shape", None) == ():
        return bool(value)  # numpy.bool_ is not a numbers.Integral
    if isinstance(value, numbers.Integral):
        return operator.index(value)
    if isinstance(value, numbers.Real) and not isinstance(value, torch.Tensor):
        return float(value)
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.clone()
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [as_data(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): as_data(v, depth + 1) for k, v in value.items()}
    raise NotData(f"got {type(value).__module__}.{type(value).__qualname__} (return ints, floats, bools, "
                  "strings, tensors, or lists, tuples and dicts of them)")


def roundtrip(data: Any) -> Any:
    """What the grader's judge sees: the data after ``torch.save`` and a safe ``torch.load``."""
    buf = io.BytesIO()
    torch.save(data, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# --------------------------------------------------------------------------------------------
# Comparisons (judge side)
# --------------------------------------------------------------------------------------------
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict = 3, 6, 6, 6
_SHORT.maxset = _SHORT.maxfrozenset = 6
_SHORT.maxstring, _SHORT.maxlong, _SHORT.maxother = 80, 40, 80


def short(v: Any, n: int = 60) -> str:
    """A bounded repr of an observed value, for a message: at most ``n`` characters, made without
    building the whole repr (``reprlib``: a few items per level, a few levels), so a structure
    huge in memory or a long string costs no more than a small one."""
    if isinstance(v, torch.Tensor):
        text = f"tensor of shape {tuple(v.shape)} ({v.dtype})"
    else:
        try:
            text = _SHORT.repr(v)
        except Exception as err:  # noqa: BLE001 - e.g. an int past Python's 4,300 digits
            text = f"<{type(v).__name__}: {type(err).__name__}>"
    return text if len(text) <= n else text[:n] + "..."


def fmt(v: Any) -> str:
    """A value for a message: an int with thousands separators (1,048,576), anything else as its
    bounded repr (``short``)."""
    if isinstance(v, bool) or not isinstance(v, int) or v.bit_length() > 128:
        return short(v, 120)
    return f"{v:,}"


def describe(v: Any) -> str:
    """What an observed value is, for a message: its type and the start of its repr."""
    if isinstance(v, torch.Tensor):
        return f"a tensor of shape {tuple(v.shape)} ({v.dtype})"
    if isinstance(v, (list, dict)):
        return f"a {type(v).__name__} of {len(v)}"
    return f"{type(v).__name__} {short(v)}"


def same(a: Any, b: Any) -> bool:
    """Equal data, types included: ``True`` is not ``1``, ``1.0`` is not ``1``, a list equals a list
    (or tuple) of the same items, a tensor a tensor of the same shape, dtype and values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b, strict=True)))
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()
                and all(same(a[k], b[k]) for k in a))
    return type(a) is type(b) and a == b


def expect_equal(label: str, got: Any, expected: Any, secret: bool = False) -> None:
    """Raise ``CheckFailed`` unless ``got`` is ``same`` as ``expected``; the message shows both, or
    only ``got`` for a ``secret`` part (its answer must not be printed)."""
    if not same(got, expected):
        if secret:
            raise CheckFailed(f"{label}: {fmt(got)} is not right")
        raise CheckFailed(f"{label}: expected {fmt(expected)}, got {fmt(got)}")


def expect_int(label: str, got: Any) -> int:
    """``got`` if it is an int (not a bool); otherwise raise ``CheckFailed`` saying what it is."""
    if isinstance(got, bool) or not isinstance(got, int):
        raise CheckFailed(f"{label}: expected an int, got {describe(got)}")
    return got


def expect_bool(label: str, got: Any) -> bool:
    """``got`` if it is True or False; otherwise raise ``CheckFailed`` saying what it is."""
    if not isinstance(got, bool):
        raise CheckFailed(f"{label}: expected True or False, got {describe(got)}")
    return got


def expect_str(label: str, got: Any) -> str:
    """``got`` if it is a string; otherwise raise ``CheckFailed`` saying what it is."""
    if not isinstance(got, str):
        raise CheckFailed(f"{label}: expected a string, got {describe(got)}")
    return got


def expect_float(label: str, got: Any) -> float:
    """A finite Python float (an observation's ``float(...)``)."""
    if not isinstance(got, float):
        raise CheckFailed(f"{label}: expected a float, got {describe(got)}")
    if not math.isfinite(got):
        raise CheckFailed(f"{label}: {got} is not a finite number")
    return got


# -- the observation's form: the judge trusts nothing it did not derive from the seed itself --------
# An observation is made where the learner's code runs, so it may be incomplete or forged: every
# judge checks its length, keys, types and tensor shapes against its own expectation (the inputs
# recomputed from the seed) before it compares a value.
def expect_list(label: str, got: Any, n: int | None = None, what: str = "items") -> list:
    """``got`` is a list (of exactly ``n`` items when ``n`` is given)."""
    if not isinstance(got, list):
        raise CheckFailed(f"{label}: expected a list" + (f" of {n} {what}" if n is not None else "")
                          + f", got {describe(got)}")
    if n is not None and len(got) != n:
        raise CheckFailed(f"{label}: expected {n} {what}, got {len(got)}")
    return got


def expect_keys(label: str, got: Any, keys: Iterable[str], what: str = "keys") -> dict:
    """``got`` is a dict with exactly ``keys``: none missing, none extra."""
    keys = list(keys)
    if not isinstance(got, dict):
        raise CheckFailed(f"{label}: expected a dict of {len(keys)} {what}, got {describe(got)}")
    missing = [k for k in keys if k not in got]
    extra = [k for k in got if k not in keys]
    if missing:
        raise CheckFailed(f"{label}: {len(missing)} of the {len(keys)} {what} missing: "
                          f"{', '.join(map(str, missing))}")
    if extra:
        raise CheckFailed(f"{label}: unexpected {what}: {', '.join(short(k) for k in extra[:5])}"
                          + (f" (and {len(extra) - 5} more)" if len(extra) > 5 else "")
                          + f"; expected exactly {', '.join(keys)}")
    return got


def expect_items(label: str, got: Any, inputs: list, width: int = 1, what: str = "inputs") -> list:
    """``got`` is one row ``[*input, *values]`` per input of the judge's own list (same order, same
    types: the inputs the seed gives); returns the values (a row's one value when ``width`` is 1).
    An input is a value, or a tuple of values (the row's first items)."""
    keys = [tuple(i) if isinstance(i, tuple) else (i,) for i in inputs]
    shown = ", ".join(", ".join(fmt(v) for v in k) if len(k) == 1 else str(list(k)) for k in keys)
    if not isinstance(got, list) or len(got) != len(keys):
        n = len(got) if isinstance(got, list) else 0
        covers = (f"covers {n} of the {len(keys)} {what}" if n < len(keys)
                  else f"has {n} rows for the {len(keys)} {what}")
        raise CheckFailed(f"{label}: the observation {covers} ({shown})"
                          + ("" if isinstance(got, list) else f"; got {describe(got)}"))
    values = []
    for k, (row, key) in enumerate(zip(got, keys, strict=True)):
        if not isinstance(row, list) or len(row) != len(key) + width:
            raise CheckFailed(f"{label}: row {k + 1} is not [{what}, {width} value(s)]: {describe(row)}")
        if not same(row[:len(key)], list(key)):
            raise CheckFailed(f"{label}: row {k + 1} is for {short(row[:len(key)], 80)}, not for the seed's "
                              f"{short(list(key), 80)}: the observation does not cover this seed's {what}")
        values.append(row[len(key)] if width == 1 else row[len(key):])
    return values


def expect_tensor(label: str, got: Any, shape: Iterable[int] | None = None, dtype: torch.dtype | None = None,
                  none_ok: bool = False) -> torch.Tensor | None:
    """A dense tensor of exactly this shape and dtype (None: any), or None where ``none_ok``."""
    if got is None and none_ok:
        return None
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{label}: expected a tensor, got {describe(got)}")
    if shape is not None and tuple(got.shape) != tuple(shape):
        raise CheckFailed(f"{label}: expected shape {tuple(shape)}, got {tuple(got.shape)}")
    if dtype is not None and got.dtype != dtype:
        raise CheckFailed(f"{label}: expected dtype {dtype}, got {got.dtype}")
    if got.layout != torch.strided:
        raise CheckFailed(f"{label}: expected a dense tensor, got layout {got.layout}")
    return got


def expect_tensors(label: str, got: Any, like: list, none_ok: bool = False, what: str = "tensors") -> list:
    """A list of tensors with the shapes and dtypes of the judge's own ``like`` (None allowed in
    place of a tensor where ``none_ok``: a parameter that got no gradient)."""
    expect_list(label, got, len(like), what)
    for k, (g, e) in enumerate(zip(got, like, strict=True)):
        expect_tensor(f"{label} {k}", g, e.shape, e.dtype, none_ok=none_ok)
    return got


def expect_close(label: str, got: Any, expected: torch.Tensor, atol: float = 1e-5,
                 rtol: float = 1e-4) -> None:
    """Raise ``CheckFailed`` unless ``got`` is a tensor of ``expected``'s shape and dtype, finite,
    and within ``atol + rtol * |expected|`` of it element by element."""
    expect_tensor(label, got, expected.shape, expected.dtype)
    if not bool(torch.isfinite(got).all()):
        raise CheckFailed(f"{label}: contains NaN or inf")
    err = (got - expected).abs()
    tol = atol + rtol * expected.abs()
    if bool((err > tol).any()):
        raise CheckFailed(f"{label}: values differ (max abs error {err.max().item():.3g}, "
                          f"{int((err > tol).sum())} of {err.numel()} elements out of tolerance)")


def expect_grads_close(label: str, got: list, expected: list, rel: float = 1e-4) -> None:
    """Gradients, compared with a tolerance relative to the largest reference gradient: a conv
    bias in front of BatchNorm has a true gradient of zero, and any two correct computations
    disagree there by rounding noise (see ``parallel.relative_error``)."""
    if not isinstance(got, list) or len(got) != len(expected):
        raise CheckFailed(f"{label}: expected {len(expected)} gradients (one per parameter), got "
                          + (f"{len(got)}" if isinstance(got, list) else describe(got)))
    scale = max((e.abs().max().item() for e in expected), default=1.0)
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g is None:
            raise CheckFailed(f"{label} {k}: no gradient (None): is the parameter still in the graph?")
        expect_close(f"{label} {k}", g, e, atol=rel * scale, rtol=1e-3)


def seeded(seed: int, *salt: int) -> torch.Generator:
    """A generator for a part's inputs: the same numbers in the sandbox and in the judge."""
    g = torch.Generator()
    g.manual_seed((int(seed) * 1_000_003 + sum((i + 1) * 7919 * s for i, s in enumerate(salt))) % 2**62)
    return g


def drawn_int(g: torch.Generator, lo: int, hi: int) -> int:
    """One integer in ``[lo, hi)`` drawn from a part's generator (``seeded``)."""
    return int(torch.randint(lo, hi, (1,), generator=g))


def seeded_build(build: Callable[[], Any], generator: torch.Generator) -> Any:
    """``build()`` with torch's global RNG seeded by one draw from ``generator``, then the global
    RNG put back: the same initial weights in the sandbox and in the judge, whatever ran before."""
    with torch.random.fork_rng():
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=generator)))
        return build()


#: the recorders of the calls of ``@reference`` and ``@answer`` functions, innermost last
#: (``expected.Recorder``, while the student release is built); empty otherwise
RECORDERS: list = []


def _recordable(kind: str, fn: Callable) -> Callable:
    """``fn``, its calls passed through the innermost recorder while there is one."""

    def call(*args, **kwargs):
        if RECORDERS:
            return RECORDERS[-1].call(kind, fn, args, kwargs)
        return fn(*args, **kwargs)

    return functools.update_wrapper(call, fn)


def reference(fn: Callable) -> Callable:
    """Marks a function that computes a reference: the grader's sandbox, where learner code runs,
    gets a copy of this package with such bodies removed; the student release replaces them by a
    lookup in their results recorded for the notebooks' checks (``expected``). The outermost
    decorator (above ``lru_cache``), so that a recorder sees every call."""
    return _recordable("reference", fn)


def answer(fn: Callable) -> Callable:
    """Marks a reference that *is* the answer of a secret part: removed from the sandbox and from
    the student release (whose notebooks then leave that part to the teacher's grader)."""
    return _recordable("answer", fn)
