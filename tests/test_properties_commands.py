"""Every command line of the course refuses hostile arguments before it does anything (issue 43).

Each command -- ``python -m course_utils.X`` for fit, fit_validation, gpu_report, readme, scaffold,
hosted, amp_check, parallel, exercises, grade, grading.generate, grading.grade, grading.release,
and ``benchmarks/run.py`` -- is called in this process through its ``main(argv)`` (a process per
call would cost seconds each) with generated hostile argv: unknown flags, negative, zero, NaN,
infinite, fractional and huge numbers, missing and hostile paths (a file where a folder goes, a
name too long, a NUL), empty and very long strings. The property:

* the command returns (or exits) with argparse's usage and status 2, or with a non-zero status
  and one line on stderr that names the fix (``Fix:``); never an exception, never a traceback;
* it refuses before any work: an audit hook (``sys.addaudithook``) refuses -- raises, so nothing
  happens -- any write outside the sandbox folder the calls run in (their cwd), any removed tree
  and any process started; and each command's work (a prediction, a grading run, a training
  step, a build) is replaced by a function that raises. Only hostile argv are generated: a
  command that does anything with one has failed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_utils import benchmark, fit, fit_validation, gpu_report, hosted, readme, scaffold
from course_utils import amp_check
from course_utils.grading import generate, grade, release
from course_utils.parallel import cli

ROOT = Path(__file__).resolve().parent.parent
LONG = "n" * 300  # a name longer than a file system takes (255 bytes)
NEXT = scaffold.next_number()
LAST = scaffold.entries()[-1]


class Worked(BaseException):
    """A command did something for a hostile argv (a BaseException: no ``except Exception`` in
    the command can swallow it)."""


# --------------------------------------------------------------------------------------------
# The audit hook: while a command runs, nothing outside the sandbox is written, nothing removed,
# no process started
# --------------------------------------------------------------------------------------------
WATCH: dict[str, Any] = {"sandbox": None, "late": []}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec")


def _outside(path: Any) -> bool:
    if isinstance(path, int):
        return False
    path = os.fsdecode(path)
    if "\0" in path or path == os.devnull or path.startswith(os.devnull + "/") or path.endswith(".pyc"):
        return False  # a NUL, a path under /dev/null: the call fails by itself; .pyc: an import's cache
    full = os.path.realpath(os.path.join(os.getcwd(), path))
    return not (full == WATCH["sandbox"] or full.startswith(WATCH["sandbox"] + os.sep))


def _refuse(what: str) -> None:
    """Stop the operation -- unless a module is being imported (a library's cache folder, say):
    stopping an import half-way would break the library for the rest of the session, so the
    call fails after it returns instead (``call``)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            WATCH["late"].append(what)
            return
        frame = frame.f_back
    raise Worked(what)


def _audit(event: str, args: tuple) -> None:
    if WATCH["sandbox"] is None:
        return
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(flags, int) and flags & _WRITE_FLAGS) or (isinstance(mode, str) and set(mode) & set("wax+"))
        if writing and _outside(path):
            _refuse(f"wrote {path} (outside the sandbox)")
    elif event in ("os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.truncate", "os.symlink", "os.link"):
        if any(_outside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
            _refuse(f"{event}{args[:2]} (outside the sandbox)")
    elif event == "shutil.rmtree":
        _refuse(f"removed the tree {args[0]}")
    elif event.startswith(_PROCESS_EVENTS):
        _refuse(f"started a process ({event})")


sys.addaudithook(_audit)  # (permanent in this process; it returns at once while WATCH is off)


def call(main: Callable, argv: list[str]) -> tuple[Any, str]:
    """``main(argv)`` under the audit hook, in the sandbox: (its exit status, its stderr)."""
    err = io.StringIO()
    WATCH["sandbox"], WATCH["late"] = os.path.realpath(os.getcwd()), []
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except Worked as w:
                raise AssertionError(f"{argv!r} was not refused before the work: {w}") from None
            except SystemExit as e:  # argparse, or sys.exit("message")
                code = e.code
                if isinstance(code, str):
                    err.write(code + "\n")
                    code = 1
    finally:
        WATCH["sandbox"] = None
    if WATCH["late"]:
        raise AssertionError(f"{argv!r} was not refused before the work: {'; '.join(WATCH['late'])}")
    return code, err.getvalue()


def assert_refused(code: Any, err: str, argv: list[str]) -> None:
    if code == 2 and "usage: " in err and ": error: " in err:
        return  # argparse's usage and its error
    lines = err.strip().splitlines()
    assert isinstance(code, int) and code != 0, f"{argv!r} was not refused (exit {code!r}); stderr: {err[-500:]}"
    assert len(lines) == 1 and "Fix:" in lines[0], \
        f"{argv!r}: exit {code}, but stderr is not one line naming the fix (Fix: ...): {err[-800:]!r}"


# --------------------------------------------------------------------------------------------
# The commands: their valid argv, and the hostile values of each option
# --------------------------------------------------------------------------------------------
NUMBERS_POSITIVE = ("0", "-1", "nan", "inf", "-inf", "1e400", "x", "")
PATHS_FOLDER = ("a_file", "a_file/sub", "", LONG, "bad\0path", "/dev/null/x")
# generated values, beside the listed ones (a pool may hold both): each is hostile whatever is drawn
NOT_POSITIVE_INT = st.integers(max_value=0).map(str)
NOT_POSITIVE_FLOAT = st.floats(max_value=0.0, allow_nan=False).map(repr)
UNDER_A_FILE = st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1,
                       max_size=30).map(lambda name: f"a_file/{name}")
UNKNOWN_FLAGS = (st.from_regex(r"--zz-[a-z0-9-]{1,12}(=[a-z0-9]{0,4})?", fullmatch=True),
                 st.from_regex(r"-[A-GI-Z]", fullmatch=True))


@dataclass(frozen=True)
class Variant:
    """A valid argv (``slots``: positionals by name, then options; True: a flag, a list: several
    values) and the hostile values each slot may take instead."""

    slots: dict[str, Any]
    hostile: dict[str, tuple]


@dataclass(frozen=True)
class Command:
    name: str
    main: Callable
    variants: tuple[Variant, ...]
    work: tuple[tuple[Any, str], ...] = ()  # (module, function) that does the work: replaced by Worked
    extra: tuple[Any, ...] = field(default=UNKNOWN_FLAGS)  # unknown flags


def _benchmarks_run() -> Callable:
    spec = importlib.util.spec_from_file_location("benchmarks_run", ROOT / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _alias(name: str) -> Callable:
    return importlib.import_module(f"course_utils.{name}").main  # the old command's name: same main


FIT_OPTIONS = {
    "builder": ("", "conv1d_net", "a:b:c", ":x", "x:", "course_utils_no_such_module:f",
                "course_utils.fit_examples:no_such_builder", "math:pi", "-x"),
    "--input": ("", " ", "a,b", "0,1,64", "-2,1,64", "2", "2,1,1e9", "2,1,64.5", "2,,64", "nan,1,64",
                "2,1," + "9" * 30),
    "--card": (*NUMBERS_POSITIVE, NOT_POSITIVE_FLOAT), "--classes": ("0", "-3", "1.5", "x", NOT_POSITIVE_INT),
    "--accumulate": ("0", "-1", "x", "2.5", NOT_POSITIVE_INT),
    "--momentum": ("nan", "-0.5", "inf", "x"), "--optimizer": ("adamm", ""), "--mode": ("training", ""),
    "--techniques": ("nope", ",", "checkpointing,nope"), "--time-card": ("no-such-card", ""),
    "--compute-capability": ("x", "9", "-1.0", "nan", "9.0.1"), "--target-shape": ("", "x", "0,64", "3,64"),
    "--loss": ("nosuchloss", "a:b:c", "course_utils.fit_examples:nope", ""), "--foreach": ("maybe", ""),
}
GRADE_OPTIONS = {
    "paths": (["missing"], [""], ["a_file"], ["empty_dir"]),
    **{o: NUMBERS_POSITIVE for o in ("--timeout", "--total-timeout", "--check-timeout", "--memory",
                                     "--max-output", "--disk")},
    "--jobs": ("0", "-2", "x", "1.5"), "--seed": ("x", "1.5"),
    "--json": ("existing_dir", "a_file/sub", "/dev/null/x", ""), "--csv": ("existing_dir", "a_file/sub", ""),
    "--keep": ("a_file", "a_file/sub"),
}
RELEASE_OUT = ("a_file", "a_file/sub", "", LONG, "bad\0path", "existing_dir", "/dev/null/x")
TITLES = (LONG, "tab\there", "a|b", "$x", "", "   ", "!!!", "[x](y)", "lone \ud800", 'a"""b', "line\nbreak", None,
          st.tuples(st.text(max_size=20), st.sampled_from(sorted(scaffold.TITLE_FORBIDDEN) + ["\n", "\t", "\0", "\x7f"]),
                    st.text(max_size=20)).map("".join).filter(str.strip),
          st.text(min_size=scaffold.TITLE_MAX + 1, max_size=300).filter(lambda t: len(t.strip()) > scaffold.TITLE_MAX))
NOT_A_NUMBER = (st.text(max_size=5).filter(lambda t: not (len(t) == 2 and t.isascii() and t.isdigit())),
                st.integers(0, 99).map(lambda n: f"{n:02d}").filter(lambda n: int(n) > int(NEXT)))

COMMANDS = (
    Command("fit", fit.main, (Variant({"builder": "course_utils.fit_examples:conv1d_net", "--input": "2,1,64"},
                                      FIT_OPTIONS),),
            work=((fit, "build_model"),)),
    Command("fit_validation", fit_validation.main,
            (Variant({"--render": False}, {"extra": ("x", "--render=1")}),), work=((fit_validation, "validate"),)),
    Command("gpu_report", gpu_report.main, (
        Variant({"out": "kit_out", "--dry-run": True}, {
            "out": PATHS_FOLDER, "--budget": NUMBERS_POSITIVE, "--only": (["bogus"], ["diagnose/nope"]),
            "--skip": (["bogus"],), "--redo": (["bogus"],), "--runs": ("missing_runs", "a_file", ""),
            "--work": ("a_file", "a_file/sub", LONG), "--techniques": (["baselin fp32"],)}),
        Variant({"--plan": True}, {"--budget": NUMBERS_POSITIVE, "--only": (["bogus"],),
                                   "--runs": ("missing_runs", "a_file", "")}),
        Variant({}, {"--import": ("missing_run", "a_file", "", "/dev/null", "existing_dir")}),
    ), work=((gpu_report, "run"),)),
    Command("readme", readme.main, (
        Variant({"--render": True}, {"--timings": (["99"], ["1"], ["abc"], [""], ["00", "99"]),
                                     "--only": (["bogus"],)}),
        Variant({}, {"--timings": (["99"],), "--only": (["bogus"],)}),
    ), work=((readme, "headlines"), (readme, "write_timings"), (readme, "rendered"))),
    Command("scaffold", scaffold.main, (
        Variant({"nn": NEXT, "title": "A fine title", "--no-timings": True}, {
            "nn": ("1", "123", "ab", "", "\u0661\u0663", f"{NEXT} ", "99", *NOT_A_NUMBER),
            "title": TITLES, "--check": (True,)}),
        Variant({"nn": NEXT, "title": "A fine title"}, {"title": TITLES}),
        Variant({"nn": LAST.nn}, {"title": tuple(t for t in TITLES if not isinstance(t, str | None) or (t and t.strip())) + ("A title no notebook has",),
                                  "--check": (True,)}),
    ), work=((scaffold, "_time"),)),
    Command("hosted", hosted.main, tuple(
        Variant(base, {"--dist": (*PATHS_FOLDER, UNDER_A_FILE)})
        for base in ({"--check-cells": True}, {"--update-cells": True}, {"--tiers": True}, {})
    ) + (Variant({}, {"extra": ("x",)}),),
        work=((hosted, "update_cells"), (hosted, "cell_problems"), (hosted, "update_tiers"), (hosted, "dist"))),
    Command("amp_check", amp_check.main, (Variant({"--json": False}, {"extra": ("x", "--json=1")}),),
            work=((amp_check, "compare_with_real_kernels"),)),
    Command("parallel", cli.main, (Variant({"--mode": "ddp"}, {
        "--steps": ("0", "-1", str(10**9), "x", "1.5", "", NOT_POSITIVE_INT, st.integers(min_value=1001).map(str)),
        "--global-batch": ("0", "-2", "3", str(10**9), "x", NOT_POSITIVE_INT, st.integers(min_value=1025).map(str),
                           st.integers(0, 511).map(lambda n: str(2 * n + 1))),
        "--mode": ("ddpp", ""), "--backend": ("mpi", "")}),), work=((cli, "launch"),)),
    *(Command(name, main, (Variant({"--check": False}, {"extra": ("x", "--check=1", st.text(min_size=1))}),),
              work=((generate, "generate"),))
      for name, main in (("exercises", _alias("exercises")), ("grading.generate", generate.main))),
    *(Command(name, main, (Variant({"paths": ["subs"]}, GRADE_OPTIONS),), work=((grade, "grade_many"),))
      for name, main in (("grade", _alias("grade")), ("grading.grade", grade.main))),
    Command("grading.release", release.main, (
        Variant({"out": "release_out"}, {"out": RELEASE_OUT}),
        Variant({"out": "release_out", "--nbgrader-course": True}, {"out": RELEASE_OUT}),
        Variant({"out": "release_out", "--force": True}, {"out": ("", ".", "a_file/sub", LONG)}),
    ), work=((release, "clean_notebook"),)),
    Command("benchmarks/run.py", _benchmarks_run(), (Variant({"--out": "bench_out"}, {
        "--budget": ("0", "-1", "x", "1.5", "nan", "1" + "0" * 30), "--nets": (["huge"], []),
        "--out": PATHS_FOLDER}),), work=((benchmark, "predicted_row"),)),
)
BY_NAME = {c.name: c for c in COMMANDS}


def argv_of(slots: dict[str, Any]) -> list[str]:
    """The argv of ``slots``: positionals in order, then each option (``--k=v``: a value that
    starts with '-' stays the option's), a flag by its name, a list as several values."""
    out: list[str] = []
    for k, v in slots.items():
        if v is None or v is False:
            continue
        if not k.startswith("-"):
            out += v if isinstance(v, list) else [v]
        elif v is True:
            out.append(k)
        elif isinstance(v, list):
            out += [k, *v]
        else:
            out.append(f"{k}={v}")
    return out


def _drawn(draw, value: Any) -> Any:
    return draw(value) if isinstance(value, st.SearchStrategy) else value


@st.composite
def hostile_argv(draw, command: Command) -> list[str]:
    """A valid argv of one of ``command``'s variants with one or two slots hostile, or an unknown
    flag added (or both)."""
    variant = draw(st.sampled_from(command.variants))
    slots = dict(variant.slots)
    choices = {k: list(vals) for k, vals in variant.hostile.items() if vals}
    chosen = draw(st.lists(st.sampled_from(sorted(choices)), max_size=2, unique=True)) if choices else []
    for k in chosen:
        slots[k] = _drawn(draw, draw(st.sampled_from(choices[k])))
    argv = argv_of(slots)
    if not chosen or draw(st.booleans()):
        argv.insert(draw(st.integers(0, len(argv))), _drawn(draw, draw(st.sampled_from(command.extra))))
    return argv


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """The calls' cwd, with what the hostile paths name (a file, a folder, a class folder with a
    notebook), every command's work replaced by ``Worked``, and no torchrun rank's environment."""
    import torch._dynamo  # noqa: F401 - imported by fit's first fake tensor: it makes its cache folder

    root = tmp_path_factory.mktemp("commands")
    (root / "a_file").write_text("a file, not a folder\n")
    (root / "existing_dir").mkdir()
    (root / "existing_dir" / "kept").write_text("x")
    (root / "empty_dir").mkdir()
    (root / "subs").mkdir()
    (root / "subs" / "00_gpu_memory_basics_exercise.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, '
                                                                        '"nbformat_minor": 5}')
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            mp.delenv(var, raising=False)
        for command in COMMANDS:
            for module, name in command.work:
                def worked(*args, _what=f"{module.__name__}.{name}", **kwargs):  # noqa: ARG001
                    raise Worked(f"{_what} ran: the work began before the arguments were refused")
                mp.setattr(module, name, worked)
        yield root


@pytest.mark.parametrize("name", list(BY_NAME))
@given(data=st.data())
def test_every_command_refuses_hostile_argv_before_any_work(sandbox, name, data):  # noqa: ARG001 - cwd
    command = BY_NAME[name]
    argv = data.draw(hostile_argv(command), label="argv")
    code, err = call(command.main, argv)
    assert_refused(code, err, argv)


def test_the_sandbox_refuses_a_write_outside_it_a_removed_tree_and_a_process(sandbox):
    """The property's own check: what the audit hook refuses, and what it lets through."""
    def writes_outside(argv):  # noqa: ARG001
        (ROOT / "results" / ".property-probe").write_text("x")
    def removes(argv):  # noqa: ARG001
        import shutil
        shutil.rmtree(sandbox / "no_such_tree")
    def runs(argv):  # noqa: ARG001
        import subprocess
        subprocess.run(["true"])
    for fn, what in ((writes_outside, "outside the sandbox"), (removes, "removed the tree"),
                     (runs, "started a process")):
        with pytest.raises(AssertionError, match=f"not refused before the work: .*{what}"):
            call(fn, [])
    assert not (ROOT / "results" / ".property-probe").exists()

    def refuses_inside(argv):
        (sandbox / "out.txt").write_text("x")
        print("error: x. Fix: y", file=sys.stderr)
        return 2
    assert call(refuses_inside, []) == (2, "error: x. Fix: y\n") and (sandbox / "out.txt").exists()
    for code, err in ((0, ""), (1, "a traceback\nline two. Fix: y\n"), (2, "error: no fix named\n")):
        with pytest.raises(AssertionError):
            assert_refused(code, err, [])
