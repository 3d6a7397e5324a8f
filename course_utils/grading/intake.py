"""What the grader takes in from a submission, checked before anything reads it (standard library
only, with the observation's check on data ``torch.load(weights_only=True)`` made).

* ``read_submission`` -- a submitted file as the notebook the grader runs: a link is followed only
  inside the class folder; the file is read whatever its saved outputs weigh (up to
  ``FILE_BYTES``), its outputs and attachments are dropped (nothing graded reads them), a lone
  surrogate (a ``\\ud800`` escape in the JSON, which no UTF-8 text can hold) becomes U+FFFD, and
  what is left, the code and the prose, must fit ``CODE_BYTES``. A file that is not a notebook
  raises ``Unreadable`` with the reason: the class report lists it apart, never as a 0.
* ``clean_text`` / ``clean`` -- the one sanitiser of everything the grader prints or writes that
  came from a submission: lone surrogates and control characters (a terminal's escape
  sequences) are written as escapes, so no learner's text can stop the report or rewrite the
  teacher's screen.
* ``observation_problem`` -- an observation's size as a graph: a structure small on disk can be
  huge in memory when its levels share one child (``torch.load`` keeps the sharing), or can
  contain itself. Nodes, depth and leaves (the shared children counted each time they are
  reached) are counted with one visit per node; past ``OBSERVATION_LIMITS`` the part is refused
  before any judge walks or prints it.
* ``memory_window`` -- a bound on the address space for a block of the grader's own process (a
  judge): past it, allocation fails (``MemoryError``, or torch's ``RuntimeError``) in that
  block, instead of the machine killing the process and every result it holds.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import resource
import signal
import time
import warnings
from pathlib import Path
from typing import Any

from . import limits

FILE_BYTES = 1 << 30  # the largest submitted file read at all (outputs included)
CODE_BYTES = 64 << 20  # the notebook without its outputs: code and prose
#: an observation's largest graph: distinct nodes, depth, and leaves counted along every path
OBSERVATION_LIMITS = {"nodes": 1_000_000, "depth": 64, "leaves": 10_000_000}

_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class Unreadable(ValueError):
    """A submitted file the grader cannot take as a notebook; the message says why and what to do."""


# --------------------------------------------------------------------------------------------
# The sanitiser
# --------------------------------------------------------------------------------------------
def clean_text(text: Any) -> str:
    """``text`` as a string any terminal, CSV or JSON file takes: lone surrogates become
    ``\\udXXX`` and control characters other than newline and tab ``\\xNN`` escapes."""
    text = str(text)
    if _SURROGATE.search(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def clean(value: Any) -> Any:
    """``value`` with every string in it (keys too, in lists, tuples and dicts) ``clean_text``-ed."""
    return _map_strings(value, clean_text)


def _map_strings(value: Any, fn) -> Any:
    """``value`` with ``fn`` applied to every string in it: keys too, in lists, tuples and dicts."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {_map_strings(k, fn): _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_strings(v, fn) for v in value)
    return value


# --------------------------------------------------------------------------------------------
# The submitted file
# --------------------------------------------------------------------------------------------
def _target(path: Path, root: Path | None) -> Path:
    """``path``, or the file its link points to when that file is inside ``root`` (the class folder)."""
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    inside = root is not None and target.is_relative_to(Path(os.path.realpath(root)))
    if not inside:
        raise Unreadable(f"{path.name} is a link to {target}, outside the class folder: copy the file "
                         "into the class folder (links are followed only inside it)")
    if not target.is_file():
        raise Unreadable(f"{path.name} is a link to {target}, which is not a file")
    return target


def _drop_outputs(nb: dict) -> int:
    """Remove every code cell's outputs and every cell's attachments; returns the cells changed."""
    changed = 0
    for cell in nb.get("cells", []):
        if not isinstance(cell, dict):
            continue
        if cell.get("outputs"):
            cell["outputs"], changed = [], changed + 1
        if "attachments" in cell:
            del cell["attachments"]
            changed += 1
    return changed


def _replace_surrogates(value: Any) -> tuple[Any, int]:
    """``value`` with every lone surrogate in its strings replaced by U+FFFD, and how many were."""
    count = 0

    def replace(text: str) -> str:
        nonlocal count
        new, n = _SURROGATE.subn("\ufffd", text)
        count += n
        return new

    return _map_strings(value, replace), count


def read_submission(path: str | Path, root: str | Path | None = None,
                    memory_bytes: int = 4 << 30) -> tuple[bytes, list[str]]:
    """The notebook the grader runs for the file ``path`` (in the class folder ``root``), as
    bytes, and notes on what was changed; ``Unreadable`` says why a file is not a notebook. The
    file is read and parsed with at most ``memory_bytes`` more memory than the grader has (JSON
    of many small objects takes ~200 times its size in memory)."""
    path = Path(path)
    try:
        with memory_window(memory_bytes):
            return _read_notebook(path, root)
    except MemoryError:
        raise Unreadable(f"{path.name} needs more than {memory_bytes / 2**30:g} GiB of memory to read: not an "
                         "exercise notebook") from None
    except RecursionError:
        raise Unreadable(f"{path.name} is JSON nested too deeply to read: not a notebook") from None


def _read_notebook(path: Path, root) -> tuple[bytes, list[str]]:
    import nbformat  # lazy: nbformat imports jsonschema (~0.8 s), needed only once a file is read

    source = _target(path, Path(root) if root is not None else None)
    try:
        data = limits.read_regular(source, FILE_BYTES)
    except limits.Unsafe as err:
        raise Unreadable(f"{path.name}: {err.strerror}" + (
            "; clear its outputs (Edit > Clear Outputs of All Cells) and submit it again"
            if err.errno == errno.EFBIG else "")) from None
    except OSError as err:
        raise Unreadable(f"{path.name} cannot be read ({err.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Unreadable(f"{path.name} is not UTF-8 text (byte {err.start:,}): not a notebook file") from None
    del data
    try:
        nb = json.loads(text)  # a RecursionError: read_submission's "nested too deeply"
    except ValueError as err:
        raise Unreadable(f"{path.name} is not JSON ({clean_text(err)}): not a notebook, or a damaged one") from None
    del text
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        what = "a JSON " + {dict: "object without a list of cells", list: "list"}.get(type(nb), type(nb).__name__)
        raise Unreadable(f"{path.name} is {what}, not a notebook")
    notes = []
    if _drop_outputs(nb):
        notes.append("the notebook's saved outputs were not read (the grader runs the code again)")
    nb, count = _replace_surrogates(nb)
    if count:
        notes.append(f"{count} lone surrogate(s) in the notebook's text (a \\ud800-style escape, which no UTF-8 "
                     "text can hold) were read as U+FFFD")
    out = json.dumps(nb, ensure_ascii=False).encode("utf-8")
    if len(out) > CODE_BYTES:
        raise Unreadable(f"{path.name} holds {len(out) / 2**20:,.0f} MiB of code and text without its outputs, "
                         f"more than {CODE_BYTES >> 20} MiB: not an exercise notebook")
    try:
        with warnings.catch_warnings():  # nbformat's own (a cell without an id): not the teacher's concern
            warnings.simplefilter("ignore")
            nbformat.reads(out.decode("utf-8"), as_version=4)
    except MemoryError:  # past the bound inside nbformat (validation copies the notebook): read_submission's
        raise
    except Exception as err:  # noqa: BLE001 - nbformat's own reasons: a wrong version, a bad cell
        raise Unreadable(f"{path.name} is not a notebook nbformat can read ({type(err).__name__}: "
                         f"{clean_text(str(err))[:300]})") from None
    return out, notes


# --------------------------------------------------------------------------------------------
# Observations
# --------------------------------------------------------------------------------------------
def observation_problem(obj: Any, limits_: dict[str, int] | None = None) -> str | None:
    """Why the loaded observation ``obj`` is too large to judge (or contains itself), or None.
    One visit per distinct list, tuple or dict; leaves are counted along every path, so a list
    nested 60 deep whose levels share one child counts 2^60 leaves in 60 visits."""
    lim = dict(OBSERVATION_LIMITS, **(limits_ or {}))
    sizes: dict[int, tuple[int, int]] = {}  # id -> (depth, leaves)
    on_path: set[int] = set()
    keep = []  # the nodes visited stay alive, so that no id is reused during the walk

    def visit(x: Any, level: int) -> tuple[int, int]:
        if not isinstance(x, (list, tuple, dict)):
            if x is not None and not isinstance(x, (bool, int, float, str)) and type(x).__name__ != "Tensor":
                raise _TooLarge(f"it holds a {type(x).__name__}, which no observation has (data only: numbers, "
                                "strings, tensors, lists and dicts)")
            return 0, 1
        if isinstance(x, dict) and not all(isinstance(k, str) for k in x):
            raise _TooLarge("a dict in it has keys that are not strings (an observation's never have)")
        key = id(x)
        if key in sizes:
            return sizes[key]
        if key in on_path:
            raise _TooLarge("it contains itself (a list or dict inside its own items)")
        if level > lim["depth"]:
            raise _TooLarge(f"it is nested more than {lim['depth']} levels deep")
        if len(sizes) >= lim["nodes"]:
            raise _TooLarge(f"it has more than {lim['nodes']:,} lists and dicts")
        on_path.add(key)
        keep.append(x)
        items = list(x.values()) if isinstance(x, dict) else x
        depth, leaves = 0, 0
        for item in items:
            d, n = visit(item, level + 1)
            depth, leaves = max(depth, d + 1), leaves + n
            if leaves > lim["leaves"]:
                raise _TooLarge(f"it reaches more than {lim['leaves']:,} values (its lists share items, "
                                "which counts each item once per place it appears)")
        on_path.discard(key)
        sizes[key] = depth, leaves
        return depth, leaves

    try:
        visit(obj, 0)
    except _TooLarge as err:
        return f"the observation is too large to judge: {err}"
    except RecursionError:
        return "the observation is too large to judge: it is nested too deeply"
    return None


class _TooLarge(Exception):
    pass


def in_child(fn, timeout_s: float, extra_bytes: int) -> str:
    """``fn()`` (returning a short string) in a forked child of this process, with at most
    ``extra_bytes`` more address space than this process has and at most ``timeout_s`` seconds;
    returns its string, or why it gave none ("timeout", "memory", "crashed"). For a first look
    at data a submission wrote (``torch.load`` of a forged file can be made to allocate without
    bound, or to hash nested shared tuples for hours): only a child can be stopped in the middle."""
    bound = _address_space_bound(extra_bytes)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(r)
            if bound is not None:
                limit, _soft, hard = bound
                resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
            try:
                out = fn()
            except MemoryError:
                out = "memory"
            os.write(w, str(out).encode("utf-8", "backslashreplace")[:65536])
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + timeout_s
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return "timeout"
        else:
            time.sleep(0.005)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode("utf-8", "replace")
    return out if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else "crashed"


# --------------------------------------------------------------------------------------------
# A memory bound for the grader's own work on a submission
# --------------------------------------------------------------------------------------------
def _address_space() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@contextlib.contextmanager
def memory_window(extra_bytes: int):
    """While the block runs, this process may map at most ``extra_bytes`` more than now
    (``RLIMIT_AS``'s soft limit, restored after); a no-op where the size cannot be read."""
    bound = _address_space_bound(extra_bytes)
    if bound is None:
        yield
        return
    limit, soft, hard = bound
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _address_space_bound(extra_bytes: int) -> tuple[int, int, int] | None:
    """(the soft ``RLIMIT_AS`` for at most ``extra_bytes`` more than this process maps now, never
    above the limits already set; the soft limit now; the hard limit), or None where the size
    cannot be read."""
    now = _address_space()
    if now is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    bound = now + int(extra_bytes)
    for limit in (soft, hard):
        if limit != resource.RLIM_INFINITY:
            bound = min(bound, limit)
    return bound, soft, hard
