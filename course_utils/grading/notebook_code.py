"""The graded objects of a notebook, rebuilt from its code (not taken from a kernel).

The grader never asks a learner's kernel what a function is: it reads the submitted notebook and
runs, cell by cell in notebook order, in a fresh namespace of the sandbox process:

* every top-level statement that *defines* something: imports, ``def``, ``class``, assignments of
  constants or lambdas, and ``try``/``if`` blocks made of these (an import with a fallback);
* every top-level statement that sets a name the kept code needs, whatever it computes: the
  names read by the graded functions and classes (their bodies, decorators, default values,
  class bodies) and, transitively, by the statements kept for them -- assignments, ``for``,
  ``with``, ``if``, ``try`` blocks, method calls on such a name (``TABLE.update(...)``), and
  calls of a notebook function that sets it with ``global``. A later cell's rebinding counts too.

Everything else (a training loop no graded code reads, plots, prints, IPython magics) is not
run, and is listed in ``Rebuilt.dropped`` with the reason. When a graded part fails with a
``NameError`` (or an ``AttributeError``) about a name that such a statement sets, or that a
statement failed to set, ``Rebuilt.explain`` names the statement and why (``Exercise.observe``
adds it to the part's message).

A graded name must be a function or class whose code is in the notebook, or an instance of such
a class that can be called (``tensor_nbytes = Sizer()``, graded as the function it is): one imported from
``course_utils`` (or anywhere else) is refused, whatever the kernel did while the notebook ran.
A decorated function (``@functools.lru_cache``, ``@torch.no_grad()``, a decorator of the
notebook's own) is graded when its ``__wrapped__`` chain ends in a notebook function and every
wrapper in it is a notebook function, an ``lru_cache`` wrapper, or a function that holds the
next one in its closure.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
import re
import symtable
from dataclasses import dataclass, field
from typing import Any, Iterable

from .core import Raised

#: every cell's code is compiled under this file name prefix (+ its code-cell number and ">")
FILENAME_PREFIX = "<notebook code cell "

#: comprehension scopes run at once, in the statement that holds them
_COMPREHENSIONS = {"listcomp", "dictcomp", "setcomp", "genexpr"}

#: why a statement was not run
WHY_MAGIC = "it is an IPython magic or shell command, and the grader runs Python only"
WHY_UNUSED = ("the grader runs a computed statement only when a function or class it grades reads "
              "its result by name")
WHY_DEL = "it is a `del`: the grader keeps every definition"


@dataclass
class CodeCell:
    """A code cell of the notebook: where it is, its number, and its source before and after its
    IPython magics are turned into Python."""

    index: int  # position among all cells
    number: int  # 1-based among code cells (JupyterLab's [n] when run top to bottom)
    source: str  # as written
    python: str  # IPython magics turned into Python


def code_cells(nb) -> list[CodeCell]:
    """The code cells of ``nb`` in order, numbered from 1 as JupyterLab shows them when run top to
    bottom."""
    cells, number = [], 0
    for i, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        number += 1
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        cells.append(CodeCell(i, number, src, _to_python(src)))
    return cells


#: cell magics that run their cell once, as Python, in the notebook's namespace
_RUNS_CELL = re.compile(r"\A(\s*\n)*%%(time|capture)\b[^\n]*(\n|\Z)")


def _to_python(src: str) -> str:
    m = _RUNS_CELL.match(src)
    if m:  # %%time: the cell's code, its lines where they were
        return "\n" * src[:m.end()].count("\n") + _to_python(src[m.end():])
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
    """Is this top-level statement a definition, run whatever the graded code needs?"""
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(stmt, ast.Assign):
        return all(isinstance(t, ast.Name) for t in stmt.targets) and _is_static(stmt.value)
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and stmt.value is not None and _is_static(stmt.value)
    if isinstance(stmt, (ast.Try, ast.If)):  # an import with a fallback, a definition per platform
        inner = [s for s in _blocks(stmt) if not isinstance(s, ast.Pass)
                 and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        return bool(inner) and all(keeps(s) for s in inner)
    return False


def _blocks(stmt: ast.stmt) -> list[ast.stmt]:
    """The statements directly inside a compound statement (not inside a def or class)."""
    out: list[ast.stmt] = []
    for name in ("body", "orelse", "finalbody"):
        out += getattr(stmt, name, [])
    for handler in getattr(stmt, "handlers", []):
        out += handler.body
    for case in getattr(stmt, "cases", []):
        out += case.body
    return out


# --------------------------------------------------------------------------------------------
# What a top-level statement sets and reads
# --------------------------------------------------------------------------------------------
@dataclass
class _Statement:
    cell: CodeCell
    node: ast.stmt
    binds: set[str] = field(default_factory=set)  # names it (re)binds
    changes: set[str] = field(default_factory=set)  # names whose object it changes: X.a = ..., X[k] = ...
    methods: set[str] = field(default_factory=set)  # names whose methods it calls as statements: X.update(...)
    attrs: set[tuple[str, str]] = field(default_factory=set)  # (X, a) of X.a = ...
    reads_now: set[str] = field(default_factory=set)  # global names read when it runs
    reads_later: set[str] = field(default_factory=set)  # read when its functions are called
    calls: set[str] = field(default_factory=set)  # names it calls when it runs
    sets_globals: dict[str, set[str]] = field(default_factory=dict)  # def name -> names it sets with `global`
    magic: bool = False

    @property
    def line(self) -> int:
        decorators = getattr(self.node, "decorator_list", [])
        return min([self.node.lineno] + [d.lineno for d in decorators])

    def first_line(self) -> str:
        lines = self.cell.source.splitlines() or [""]
        python = self.cell.python.splitlines()
        k = self.line - 1
        text = lines[k] if k < len(lines) and len(python) == len(lines) else (python[k] if k < len(python) else "")
        return _clip(text.strip())


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _now_nodes(node: ast.AST):
    """The nodes evaluated when ``node`` runs: not the bodies of defs and lambdas."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = n.args
            stack += n.decorator_list + a.defaults + [d for d in a.kw_defaults if d]
            stack += [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]
                      if x is not None and x.annotation is not None]
            stack += [n.returns] if n.returns is not None else []
        elif isinstance(n, ast.Lambda):
            stack += n.args.defaults + [d for d in n.args.kw_defaults if d]
        else:
            stack += list(ast.iter_child_nodes(n))


def _base(node: ast.AST) -> str | None:
    """``X`` of ``X.a``, ``X[k].b``, ``X.a.b``; None if it does not start at a name."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _targets(stmt: ast.AST) -> list[ast.AST]:
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
        targets = [stmt.target]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    else:
        return []
    out = []
    while targets:
        t = targets.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            targets += t.elts
        elif isinstance(t, ast.Starred):
            targets.append(t.value)
        else:
            out.append(t)
    return out


def _analyse(cell: CodeCell, stmt: ast.stmt) -> _Statement:
    s = _Statement(cell, stmt)
    deleted, stored, aug = set(), set(), set()
    for n in _now_nodes(stmt):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Name):
                s.calls.add(n.func.id)
            if _base(n.func) == "get_ipython":
                s.magic = True
        if isinstance(n, ast.Name):
            (deleted if isinstance(n.ctx, ast.Del) else stored if isinstance(n.ctx, ast.Store) else set()).add(n.id)
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            aug.add(n.target.id)  # read before it is set (symtable counts it as set only)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute):
            base = _base(n.value.func)
            if base is not None:
                s.methods.add(base)  # X.append(...), X.update(...), X.load_state_dict(...)
        for t in _targets(n) if isinstance(n, ast.stmt) else []:
            if isinstance(t, (ast.Attribute, ast.Subscript)) and _base(t) is not None:
                s.changes.add(_base(t))
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                    s.attrs.add((t.value.id, t.attr))
    try:
        table = symtable.symtable(ast.unparse(ast.Module(body=[stmt], type_ignores=[])),
                                  cell_filename(cell), "exec")
    except (SyntaxError, ValueError, RecursionError):  # should not happen: fall back on names alone
        names = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        s.binds, s.reads_now = stored, names
        return s
    for sym in table.get_symbols():
        if sym.is_imported() or sym.is_assigned():
            s.binds.add(sym.get_name())
        if sym.is_referenced():
            s.reads_now.add(sym.get_name())
    s.binds -= deleted - stored
    s.reads_now |= aug

    def scopes(t, now: bool, owner: str | None):
        for child in t.get_children():
            kind, name = child.get_type(), child.get_name()
            child_now = now and (kind == "class" or name in _COMPREHENSIONS)
            fn = owner if owner is not None else (name if kind == "function" and name not in _COMPREHENSIONS
                                                  else None)
            for sym in child.get_symbols():
                if sym.is_global() and sym.is_referenced():
                    (s.reads_now if child_now else s.reads_later).add(sym.get_name())
                if sym.is_declared_global() and sym.is_assigned() and fn is not None:
                    s.sets_globals.setdefault(fn, set()).add(sym.get_name())
                    s.reads_later.add(sym.get_name())  # `global x; x += 1` reads it too
            scopes(child, child_now, fn)

    scopes(table, True, None)
    return s


def cell_filename(cell: CodeCell) -> str:
    """The file name a cell's code is compiled under (``<notebook code cell N>``): how a function
    is known to come from the notebook, and what ``inspect.getsource`` reads it back from."""
    return f"{FILENAME_PREFIX}{cell.number}>"


# --------------------------------------------------------------------------------------------
# Rebuilding
# --------------------------------------------------------------------------------------------
@dataclass
class Dropped:
    """A top-level statement (or a cell) the grader did not run, and why."""

    cell: int  # code cell number
    line: int
    code: str  # its first line
    why: str
    names: tuple[str, ...] = ()  # names it sets or changes
    attrs: tuple[tuple[str, str], ...] = ()  # (X, a) of X.a = ...
    text: str = ""  # its source: a magic's or an unparsed cell's names are found in it
    whole_cell: bool = False  # a cell that does not parse

    def where(self) -> str:
        return f"code cell {self.cell}, line {self.line} (`{self.code}`)"

    def as_dict(self) -> dict:
        return {"cell": self.cell, "line": self.line, "code": self.code, "why": self.why, "names": list(self.names)}


@dataclass
class Rebuilt:
    """What ``rebuild`` made of a notebook: the namespace the kept statements built, the statements
    that failed or were not run (and why), and each graded name's source."""

    namespace: dict[str, Any]
    problems: list[str] = field(default_factory=list)  # statements that failed, cells that did not parse
    failed: dict[str, Raised] = field(default_factory=dict)  # name -> why the statement binding it failed
    sources: dict[str, str] = field(default_factory=dict)  # graded name -> its source, for review
    dropped: list[Dropped] = field(default_factory=list)  # statements not run, in notebook order

    def explain(self, err: BaseException) -> str | None:
        """For a graded part that raised ``err``: which statement of the notebook the grader did
        not run (or could not) sets the missing name, and why; None if none does."""
        if isinstance(err, UnboundLocalError):
            return None
        if isinstance(err, NameError):
            name = getattr(err, "name", None)
            if not name:
                m = re.search(r"name '(\w+)' is not defined", str(err))
                name = m.group(1) if m else None
            if not name:
                return None
            if name in self.failed:
                return self.failed[name].message
            label, found = name, [d for d in self.dropped if name in d.names]
        elif isinstance(err, AttributeError):
            attr, obj = getattr(err, "name", None), getattr(err, "obj", None)
            if not attr or obj is None:
                return None
            bases = [n for n, v in self.namespace.items() if v is obj and not n.startswith("__")]
            if not bases:
                return None
            found = [d for d in self.dropped if any((b, attr) in d.attrs for b in bases)]
            label = next((f"{b}.{attr}" for b in bases if found and (b, attr) in found[-1].attrs),
                         f"{bases[0]}.{attr}")
        else:
            return None
        if found:
            return f"{label} is set by {found[-1].where()}, which the grader did not run: {found[-1].why}"
        # a magic, or a cell that does not parse: the name in its text
        word = re.compile(rf"(?<![\w.]){re.escape(label)}\b")
        for d in reversed(self.dropped):
            if d.names or not d.text:
                continue
            for k, text in enumerate(d.text.splitlines()):
                if word.search(text):
                    if d.whole_cell:  # the line it is on
                        d = Dropped(d.cell, k + 1, _clip(text.strip()), d.why)
                    return f"{label} appears in {d.where()}, which the grader did not run: {d.why}"
        return None


def rebuild(nb, name: str = "__main__", graded: Iterable[str] | None = None) -> Rebuilt:
    """Run the notebook's definitions, and the statements they need, in a fresh namespace.

    ``graded``: the names the grader will grade; the computed statements kept are those these
    names need. Without it, those that any kept definition needs."""
    ns: dict[str, Any] = {"__name__": name, "__builtins__": __builtins__}
    out = Rebuilt(ns)
    statements: list[_Statement] = []
    cells = code_cells(nb)
    for cell in cells:
        try:
            tree = ast.parse(cell.python, cell_filename(cell))
            analysed = [_analyse(cell, stmt) for stmt in _unwrap_time(tree.body)]
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
            # a 100,000-term expression makes the parser itself recurse too deep: like a syntax error
            msg, line = (err.msg, err.lineno) if isinstance(err, SyntaxError) else \
                (f"{type(err).__name__}: too deeply nested or too large to analyse", 1)
            out.problems.append(f"code cell {cell.number} does not parse: {msg} (line {line})")
            first = next((ln.strip() for ln in cell.source.splitlines() if ln.strip()), "")
            out.dropped.append(Dropped(cell.number, 1, _clip(first), f"the cell does not parse ({msg}, line "
                                       f"{line}), so none of it was run", text=cell.source, whole_cell=True))
            continue
        filename = cell_filename(cell)  # for inspect.getsource
        linecache.cache[filename] = (len(cell.python), None, cell.python.splitlines(True), filename)
        statements += analysed

    kept = _needed(statements, graded)
    for k, s in enumerate(statements):
        if k not in kept:
            why = WHY_MAGIC if s.magic else WHY_DEL if isinstance(s.node, ast.Delete) else WHY_UNUSED
            out.dropped.append(Dropped(s.cell.number, s.line, s.first_line(), why,
                                       () if s.magic else tuple(sorted(s.binds | s.changes | s.methods)),
                                       tuple(sorted(s.attrs)),
                                       ast.get_source_segment(s.cell.python, s.node) or "" if s.magic else ""))
            continue
        _run(s, ns, out)
    return out


def _time_magic(node: ast.AST) -> str | None:
    """The code of ``%time CODE`` (IPython's ``get_ipython().run_line_magic('time', CODE)``)."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run_line_magic"
            and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "get_ipython" and len(node.args) == 2 and not node.keywords
            and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)
            and node.args[0].value == "time"):
        return node.args[1].value
    return None


def _unwrap_time(body: list[ast.stmt]) -> list[ast.stmt]:
    """``%time x = f()`` and ``y = %time f()`` run once, as Python: keep their code, on their line."""
    out: list[ast.stmt] = []
    for stmt in body:
        value = getattr(stmt, "value", None)
        code = _time_magic(value)
        try:
            if code is not None and isinstance(stmt, ast.Expr):
                inner = ast.parse(code).body
                for s in inner:
                    ast.increment_lineno(s, stmt.lineno - 1)
                out += inner
                continue
            if code is not None and isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                stmt.value = ast.increment_lineno(ast.parse(code.strip(), mode="eval").body, stmt.lineno - 1)
        except SyntaxError:
            pass  # left as the magic it is
        out.append(stmt)
    return out


def _needed(statements: list[_Statement], graded: Iterable[str] | None) -> set[int]:
    """Indices of the statements to run: the definitions, and every statement that sets or
    changes a name they (transitively) need."""
    setters: dict[str, set[str]] = {}
    for s in statements:
        for fn, names in s.sets_globals.items():
            setters.setdefault(fn, set()).update(names)
    imported = {b for s in statements if isinstance(s.node, (ast.Import, ast.ImportFrom)) for b in s.binds}
    sets = []
    for s in statements:  # what running it sets: its names, and those set by notebook functions it calls
        names = set(s.binds)
        for c in s.calls:
            names |= setters.get(c, set())
        sets.append(names | s.changes | (s.methods - imported))  # not torch.manual_seed(0), cu.plot(...)
    kept = {k for k, s in enumerate(statements) if keeps(s.node) and not s.magic}
    needed = set(graded) if graded is not None else {n for k in kept for n in statements[k].binds}
    for k in kept:
        needed |= statements[k].reads_now
    candidates = [k for k, s in enumerate(statements)
                  if not s.magic and not isinstance(s.node, ast.Delete)
                  and not (isinstance(s.node, ast.Expr) and not sets[k])]
    expanded: set[int] = set()
    changed = True
    while changed:
        changed = False
        for k in candidates:
            if sets[k] & needed:
                if k not in kept:
                    kept.add(k)
                    changed = True
                if k not in expanded:
                    expanded.add(k)
                    s = statements[k]
                    new = (s.reads_now | s.reads_later | s.calls) - needed
                    if new:
                        needed |= new
                        changed = True
        for k in kept - expanded:
            new = statements[k].reads_now - needed
            if new:
                needed |= new
                changed = True
    return kept


def _run(s: _Statement, ns: dict, out: Rebuilt) -> None:
    code = compile(ast.Module(body=[s.node], type_ignores=[]), cell_filename(s.cell), "exec")
    try:
        exec(code, ns)  # noqa: S102 - the learner's code, in the sandbox process
    except BaseException as err:  # noqa: BLE001 - a failing import, class body or computation
        if isinstance(err, KeyboardInterrupt):
            raise
        first = str(err).splitlines()[0] if str(err) else ""
        where = f"code cell {s.cell.number}, line {s.line}"
        out.problems.append(f"{where}: {type(err).__name__}: {first}")
        raised = Raised.from_exception(err)
        for bound in sorted(s.binds):
            ns.pop(bound, None)  # the notebook's last definition of it failed: not an older one
            out.failed[bound] = Raised(raised.type, f"{where} (`{s.first_line()}`), which sets {bound}, failed "
                                       f"when the grader ran it: {raised.explain()}",
                                       "refused" if raised.kind == "refused" else "check")


# --------------------------------------------------------------------------------------------
# The graded objects
# --------------------------------------------------------------------------------------------
class GradedObjects(dict):
    """The graded names' objects (or ``Raised``); ``explain(err)`` says which statement the
    grader did not run sets the name a part's ``NameError`` is about."""

    def __init__(self, rebuilt: Rebuilt):
        super().__init__()
        self.rebuilt = rebuilt

    def explain(self, err: BaseException) -> str | None:
        try:
            return self.rebuilt.explain(err)
        except Exception:  # noqa: BLE001 - a hint must never cost the part its own message
            return None


def _origin(obj: Any) -> str:
    mod = getattr(obj, "__module__", None)
    return f"module {mod}" if mod else "outside the notebook"


def _in_notebook(obj: Any) -> bool:
    return inspect.isfunction(obj) and obj.__code__.co_filename.startswith(FILENAME_PREFIX)


_LRU_WRAPPER = type(functools.lru_cache(maxsize=None)(lambda: None))


def _wrapped_function(obj: Any) -> tuple[Any, str]:
    """The notebook function that ``obj`` wraps (a decorated def), or None and why not."""
    chain = [obj]
    while hasattr(chain[-1], "__wrapped__"):
        nxt = chain[-1].__wrapped__
        if any(nxt is c for c in chain) or len(chain) > 50:
            return None, "wraps itself (its __wrapped__ chain loops)"
        chain.append(nxt)
    if len(chain) == 1 or not _in_notebook(chain[-1]):
        return None, ""
    for wrapper, inner in zip(chain[:-1], chain[1:], strict=True):
        if _in_notebook(wrapper) or isinstance(wrapper, _LRU_WRAPPER):
            continue
        cells = getattr(wrapper, "__closure__", None) or ()
        held = []
        for c in cells:
            try:
                held.append(c.cell_contents)
            except ValueError:  # an empty cell
                pass
        if inspect.isfunction(wrapper) and any(h is inner for h in held):
            continue
        return None, (f"is a {type(wrapper).__name__} object around your function, which the grader cannot "
                      "see calling it: it grades your def under functools.lru_cache, torch.no_grad() or a "
                      "decorator of your own")
    return chain[-1], ""


def graded_objects(rebuilt: Rebuilt, names) -> GradedObjects:
    """Each graded name's object, or a ``Raised`` that says why it cannot be graded."""
    ns = rebuilt.namespace
    out = GradedObjects(rebuilt)
    for name in names:
        if name not in ns and name in rebuilt.failed:
            out[name] = rebuilt.failed[name]
            continue
        if name not in ns:
            unrun = [d for d in rebuilt.dropped if name in d.names]
            note = (f": {unrun[-1].where()} sets it, but the grader did not run it: {unrun[-1].why}. Write"
                    if unrun else ": write")
            out[name] = Raised("NameError", f"{name} is not defined in the notebook{note} `def {name}` "
                               f"(or `class {name}`) at the top level of a code cell", "missing")
            continue
        obj = ns[name]
        why = ""
        if isinstance(obj, type):
            mine = obj.__module__ == ns["__name__"]
        elif inspect.isfunction(obj) and _in_notebook(obj):
            mine = True
        elif callable(obj) and type(obj).__module__ == ns["__name__"]:
            mine = True  # an instance of a notebook class with __call__ (tensor_nbytes = Sizer()): called as a function is
        else:
            inner, why = _wrapped_function(obj)
            mine = inner is not None
        if not mine:
            what = "a class or function" if not (isinstance(obj, type) or inspect.isfunction(obj)) else ""
            head = (f"{name} {why}. G" if why else
                    f"{name} is not {what or 'written'} in the notebook (it comes from {_origin(obj)}): g")
            out[name] = Raised("RefusedObject", f"{head}raded objects must be your own, defined with "
                               "def/class in a code cell", "refused")
            continue
        out[name] = obj
        try:
            shown = obj if isinstance(obj, type) or inspect.isfunction(obj) or hasattr(obj, "__wrapped__") else type(obj)
            rebuilt.sources[name] = inspect.getsource(shown)
        except (OSError, TypeError):
            pass
    return out
