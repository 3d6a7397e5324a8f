"""Remove code from a copy of ``course_utils``, at the source level.

Used twice:

* the grader's **sandbox** (where a submission's graded code runs) gets, per exercise, a copy in
  which the objects that hold that exercise's answer (``Exercise.refused``, e.g.
  ``unet.DoubleConv`` for exercise 01) are stubs raising ``RefusedObject``, and in which every
  reference and judge of ``course_utils/grading`` has no body: nothing the graded code could call,
  subclass or read holds the answer;
* the **student release** gets a copy whose ``@answer`` bodies are removed the same way, and
  whose ``@reference`` bodies become a lookup in their results recorded for the notebooks' checks
  (``recorded``; see ``release`` and ``expected``).

Stripping the source (not patching objects at run time) leaves no original object in the
process for the learner's code to find.
"""

from __future__ import annotations

import ast
from typing import Iterable

IMPORT = "from course_utils.grading.core import RefusedObject as _Refused"
LOOKUP = "from course_utils.grading.expected import recorded as _recorded"


def _decorators(node: ast.AST) -> set[str]:
    out = set()
    for d in getattr(node, "decorator_list", []):
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Name):
            out.add(target.id)
        elif isinstance(target, ast.Attribute):
            out.add(target.attr)
            if isinstance(target.value, ast.Name):
                out.add(f"{target.value.id}.{target.attr}")
    return out


def _is_marked(node: ast.AST, marks: set[str]) -> bool:
    """Decorated with one of ``marks`` ("reference", "judge", "NAIVE.judge", ...)."""
    return bool(_decorators(node) & marks)


def _walk(tree: ast.AST, prefix: str = ""):
    """(qualname, node) of every function and class, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            q = f"{prefix}{node.name}"
            yield q, node
            yield from _walk(node, q + ".")


JUDGE_SIDE = frozenset({"reference", "answer", "judge"})


def _lookup(node: ast.FunctionDef | ast.AsyncFunctionDef, qual: str, module: str) -> list[str]:
    """The body of a ``recorded`` stub: the function's arguments, by name, looked up in the recording."""
    if "." in qual or not module:
        raise ValueError(f"{qual}: only a module's top-level function, with its module named, becomes a lookup")
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)] + ([a.vararg.arg] if a.vararg else []) \
        + [x.arg for x in a.kwonlyargs] + ([a.kwarg.arg] if a.kwarg else [])
    args = "{" + ", ".join(f"{n!r}: {n}" for n in names) + "}"
    col = " " * node.body[0].col_offset
    return [f"{col}{LOOKUP}\n", f"{col}return _recorded({f'{module}.{qual}'!r}, {args})\n"]


def strip_source(source: str, qualnames: Iterable[str] = (), *, message: str = "",
                 strip_marked: bool | Iterable[str] = False, marked_message: str = "",
                 recorded: Iterable[str] = (), module: str = "") -> str:
    """``source`` with the named classes turned into stubs and the named functions' bodies (and,
    with ``strip_marked``, every body decorated ``@reference`` / ``@answer`` / ``@x.judge``, or
    with the decorators named in ``strip_marked``) replaced by a raise; the bodies of the functions
    decorated with one of ``recorded`` (module ``module``) replaced by ``expected.recorded``."""
    lookups = set(recorded)
    marks = set(JUDGE_SIDE if strip_marked is True else (strip_marked or ())) | lookups
    wanted = set(qualnames)
    tree = ast.parse(source)
    lines = source.splitlines(True)
    edits: list[tuple[int, int, list[str]]] = []  # (first line, last line) 1-based, new lines
    found = set()
    for qual, node in _walk(tree):
        hit = qual in wanted
        marked = bool(marks) and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_marked(node, marks)
        if not (hit or marked):
            continue
        found.add(qual)
        why = (message or f"{qual} is not available here") if hit else (marked_message or "grading code is not available here")
        col = " " * node.col_offset
        if isinstance(node, ast.ClassDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            stub = [f"{col}class {node.name}:  # removed\n",
                    f"{col}    def __init__(self, *args, **kwargs):\n",
                    f"{col}        {IMPORT}\n", f"{col}        raise _Refused({why!r})\n",
                    f"{col}    def __init_subclass__(cls, **kwargs):\n",
                    f"{col}        {IMPORT}\n", f"{col}        raise _Refused({why!r})\n"]
            edits.append((start, node.end_lineno, stub))
        else:
            body_col = " " * node.body[0].col_offset
            if node.body[0].lineno == node.lineno:
                raise ValueError(f"{qual}: cannot strip a one-line function")
            stub = [f"{body_col}{IMPORT}\n", f"{body_col}raise _Refused({why!r})\n"]
            if not hit and _is_marked(node, lookups) and not _is_marked(node, marks - lookups):  # a raise wins
                stub = _lookup(node, qual, module)
            edits.append((node.body[0].lineno, node.end_lineno, stub))
    missing = wanted - found
    if missing:
        raise ValueError(f"nothing to strip named {sorted(missing)}")
    # nested edits: keep the outermost
    edits.sort()
    kept: list[tuple[int, int, list[str]]] = []
    for e in edits:
        if kept and e[0] <= kept[-1][1]:
            continue
        kept.append(e)
    for start, end, new in reversed(kept):
        lines[start - 1:end] = new
    out = "".join(lines)
    ast.parse(out)  # still valid Python
    return out
