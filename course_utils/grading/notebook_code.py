"""The graded objects of a notebook, rebuilt from its code (not taken from a kernel).

The grader never asks a learner's kernel what a function is: it reads the submitted notebook,
keeps the top-level statements that *define* things -- imports, ``def``, ``class``, and
assignments of constants or lambdas (no calls: nothing computed by running cells) -- and runs
them, cell by cell, in a fresh namespace of the sandbox process. A graded name must then be a
function or class whose code is in the notebook: one imported from ``course_utils`` (or
anywhere else) is refused, whatever the kernel did while the notebook ran.
"""

from __future__ import annotations

import ast
import linecache
from dataclasses import dataclass, field
from typing import Any

from .core import Raised

#: every cell's code is compiled under this file name prefix (+ its code-cell number and ">")
FILENAME_PREFIX = "<notebook code cell "


@dataclass
class CodeCell:
    index: int  # position among all cells
    number: int  # 1-based among code cells (JupyterLab's [n] when run top to bottom)
    source: str  # as written
    python: str  # IPython magics turned into Python


def code_cells(nb) -> list[CodeCell]:
    cells, number = [], 0
    for i, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        number += 1
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        cells.append(CodeCell(i, number, src, _to_python(src)))
    return cells


def _to_python(src: str) -> str:
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # no IPython: magics stay, and the cell may not parse
        return src
    try:
        return TransformerManager().transform_cell(src)
    except Exception:  # noqa: BLE001 - a cell IPython cannot transform is parsed as it is
        return src


def _is_static(node: ast.AST) -> bool:
    """True if evaluating ``node`` calls nothing (lambda bodies are not evaluated)."""
    if isinstance(node, ast.Lambda):
        return all(_is_static(d) for d in node.args.defaults + [d for d in node.args.kw_defaults if d])
    if isinstance(node, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)):
        return False
    return all(_is_static(child) for child in ast.iter_child_nodes(node))


def keeps(stmt: ast.stmt) -> bool:
    """Does the grader run this top-level statement when it rebuilds the notebook's objects?"""
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(stmt, ast.Assign):
        return all(isinstance(t, ast.Name) for t in stmt.targets) and _is_static(stmt.value)
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and stmt.value is not None and _is_static(stmt.value)
    return False


@dataclass
class Rebuilt:
    namespace: dict[str, Any]
    problems: list[str] = field(default_factory=list)  # statements that failed, cells that did not parse
    failed: dict[str, Raised] = field(default_factory=dict)  # name -> why the statement binding it failed
    sources: dict[str, str] = field(default_factory=dict)  # graded name -> its source, for review


def rebuild(nb, name: str = "__main__") -> Rebuilt:
    """Run the notebook's defining statements in a fresh namespace."""
    ns: dict[str, Any] = {"__name__": name, "__builtins__": __builtins__}
    out = Rebuilt(ns)
    for cell in code_cells(nb):
        filename = f"{FILENAME_PREFIX}{cell.number}>"
        try:
            tree = ast.parse(cell.python, filename)
        except SyntaxError as err:
            out.problems.append(f"code cell {cell.number} does not parse: {err.msg} (line {err.lineno})")
            continue
        lines = cell.python.splitlines(True)
        linecache.cache[filename] = (len(cell.python), None, lines, filename)  # for inspect.getsource
        for stmt in tree.body:
            if not keeps(stmt):
                continue
            code = compile(ast.Module(body=[stmt], type_ignores=[]), filename, "exec")
            try:
                exec(code, ns)  # noqa: S102 - the learner's definitions, in the sandbox process
            except BaseException as err:  # noqa: BLE001 - a failing import or class body
                if isinstance(err, KeyboardInterrupt):
                    raise
                first = str(err).splitlines()[0] if str(err) else ""
                where = f"code cell {cell.number}, line {stmt.lineno}"
                out.problems.append(f"{where}: {type(err).__name__}: {first}")
                raised = Raised.from_exception(err)
                for bound in _bound_names(stmt):
                    ns.pop(bound, None)  # the notebook's last definition of it failed: not an older one
                    out.failed[bound] = Raised(raised.type, f"defining {bound} ({where}) failed: "
                                               f"{raised.explain()}", "refused" if raised.kind == "refused" else "check")
    return out


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    return []


def _origin(obj: Any) -> str:
    mod = getattr(obj, "__module__", None)
    return f"module {mod}" if mod else "outside the notebook"


def graded_objects(rebuilt: Rebuilt, names) -> dict[str, Any]:
    """Each graded name's object, or a ``Raised`` that says why it cannot be graded."""
    import inspect

    ns = rebuilt.namespace
    out: dict[str, Any] = {}
    for name in names:
        if name not in ns and name in rebuilt.failed:
            out[name] = rebuilt.failed[name]
            continue
        if name not in ns:
            out[name] = Raised("NameError", f"{name} is not defined in the notebook: write `def {name}` "
                               f"(or `class {name}`) at the top level of a code cell", "missing")
            continue
        obj = ns[name]
        if isinstance(obj, type):
            mine = obj.__module__ == ns["__name__"]
        elif inspect.isfunction(obj):
            mine = obj.__code__.co_filename.startswith(FILENAME_PREFIX)
        else:
            mine = False
        if not mine:
            what = "a class or function" if not (isinstance(obj, type) or inspect.isfunction(obj)) else ""
            out[name] = Raised("RefusedObject", f"{name} is not {what or 'written'} in the notebook "
                               f"(it comes from {_origin(obj)}): graded objects must be your own, "
                               "defined with def/class in a code cell", "refused")
            continue
        out[name] = obj
        try:
            rebuilt.sources[name] = inspect.getsource(obj)
        except (OSError, TypeError):
            pass
    return out
