"""course_utils' own layout holds together: a module split into a package keeps every public name
where the notebooks import it, the grader's sandbox still strips each exercise's answer from
the file it now lives in, the installed package ships every subpackage, the package docstring
lists every module in its layer, no import reaches a higher layer or closes a cycle, and
modules and functions stay short. (The course's parts agreeing: tests/test_course_layout.py; the
lint habits: tests/test_repo_hygiene.py.)"""

import ast
import functools
import importlib
import inspect
import pkgutil
import re
import shutil
import sys
from pathlib import Path

import pytest

import course_utils

PACKAGE_DIR = Path(course_utils.__file__).parent
SPLIT = ("course_utils.parallel", "course_utils.memory", "course_utils.tiling")


def _public_names(module) -> set[str]:
    """Public functions, classes and constants a module defines itself (not what it imports)."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize("package", SPLIT)
def test_a_split_package_re_exports_every_public_name_of_its_modules(package):
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name == "__main__":
            continue
        sub = importlib.import_module(f"{package}.{info.name}")
        for name in sorted(_public_names(sub)):
            assert name in pkg.__all__ and getattr(pkg, name, None) is getattr(sub, name), (
                f"{package}.{info.name}.{name} is not re-exported: import it in {package}/__init__.py "
                "and list it in __all__ (notebooks and tests import from the package)")


def _refused():
    from course_utils.grading.registry import load_all

    return [(nn_id, module, qual) for nn_id, ex in load_all().items()
            for module, names in ex.refused.items() for qual in names]


def test_the_sandbox_strips_every_refused_object_from_the_file_it_lives_in():
    from course_utils.grading.grader import Grader

    grader = Grader()
    try:
        for nn_id, module, qual in _refused():
            obj = importlib.import_module(module)
            for part in qual.split("."):
                obj = getattr(obj, part, None)
            assert obj is not None, f"exercise {nn_id} refuses {module}.{qual}, which does not exist"
            rel = str(Path(inspect.getsourcefile(inspect.unwrap(obj))).resolve().relative_to(PACKAGE_DIR))
            source = grader.sandbox_lib(nn_id)[rel].decode()
            nodes = {}
            for node in ast.walk(ast.parse(source)):
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, (ast.FunctionDef, ast.ClassDef)):
                        nodes.setdefault(child.name, []).append(child)
            stripped = [n for n in nodes.get(qual.split(".")[-1], [])
                        if "_Refused" in ast.get_source_segment(source, n)]
            assert stripped, (
                f"exercise {nn_id}: {module}.{qual} is defined in course_utils/{rel}, and the grader's "
                f"sandbox copy of that file still holds it: name the module it is defined in "
                f"({obj.__module__}) in the exercise's refused map (course_utils/grading/ex{nn_id}.py)")
    finally:
        shutil.rmtree(grader.workdir, ignore_errors=True)


def test_the_installed_package_includes_every_subpackage():
    """``pip install .`` ships what pyproject.toml's [tool.setuptools] selects: an explicit
    package list that misses a subpackage (course_utils.memory, .parallel...) installs a course
    that cannot import itself."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = pytest.importorskip("setuptools")
    root = PACKAGE_DIR.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    if "packages" in config and isinstance(config["packages"], list):
        shipped = set(config["packages"])
    else:
        find = config["packages"]["find"]
        shipped = set(setuptools.find_packages(where=str(root / find.get("where", ["."])[0]),
                                               include=find.get("include", ["*"]), exclude=find.get("exclude", ())))
    present = {".".join(p.parent.relative_to(root).parts) for p in PACKAGE_DIR.rglob("__init__.py")
               if "__pycache__" not in p.parts}
    assert present <= shipped, (f"pyproject.toml's [tool.setuptools] leaves out {sorted(present - shipped)}: "
                                "list them, or select course_utils* with [tool.setuptools.packages.find]")


def test_the_package_docstring_lists_every_module():
    """course_utils' docstring is the map a new teacher reads first: a module it leaves out is
    one they will not find."""

    listed = set()
    for line in course_utils.__doc__.splitlines():
        if line.startswith("* ") and " -- " in line:  # "* ``name`` -- what", "* ``a``, ``b`` -- what"
            listed.update(re.findall(r"``(\w+)``", line[2:].split(" -- ")[0]))
    modules = {m.name for m in pkgutil.iter_modules(course_utils.__path__)}
    assert modules <= listed, (f"course_utils/__init__.py's module index leaves out {sorted(modules - listed)}: "
                               "add a line '* ``name`` -- what it is for' to its docstring")
    assert listed <= modules, f"the index lists modules that do not exist: {sorted(listed - modules)}"


def test_importing_course_utils_leaves_memtracker_for_first_use():
    """``import course_utils`` (every kernel, grader sandbox and test worker) does not load PyTorch's
    MemTracker, whose import brings torch.distributed, DTensor, dynamo and inductor: 1.8 of 5.2 s of
    CPU measured on the 2-core machine. ``MemoryLog`` still resolves, to hook_table's class, on first
    use (PEP 562 ``__getattr__`` in ``course_utils`` and ``course_utils.memory``)."""
    import subprocess

    heavy = ("torch._dynamo", "torch.distributed._tools.mem_tracker")
    code = ("import sys, course_utils, course_utils.grading.grade, course_utils.grading.sandbox, "
            "course_utils.grading.kernel_launch\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
            "from course_utils import MemoryLog, log_step\n"
            "from course_utils.memory import hook_table\n"
            "assert MemoryLog is hook_table.MemoryLog and log_step is hook_table.log_step\n"
            "import course_utils.memory as m\n"
            "assert {'MemoryLog', 'Row', 'CATEGORIES'} <= set(dir(m)) and m.Row is hook_table.Row\n"
            f"print(all(n in sys.modules for n in {heavy!r}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["[]", "True"], r.stdout


# --------------------------------------------------------------------------------------------
# Layers: the package docstring's "Layer N" lists are the rule, every import is checked against it
# --------------------------------------------------------------------------------------------
def _layers() -> dict[str, int]:
    """{module or subpackage: its layer}, read from course_utils' docstring ("Layer N -- ..."
    headings, "* ``name`` -- ..." lines under them); the package itself re-exports layers 1-4."""

    layer, out = 0, {"course_utils": 4}
    for line in course_utils.__doc__.splitlines():
        heading = re.match(r"Layer (\d+) -- ", line)
        if heading:
            layer = int(heading.group(1))
        elif layer and line.startswith("* ") and " -- " in line:
            out.update({name: layer for name in re.findall(r"``(\w+)``", line[2:].split(" -- ")[0])})
    return out


def _module_name(path: Path, package_dir: Path) -> str:
    parts = ("course_utils", *path.relative_to(package_dir).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _course_imports() -> tuple[tuple[Path, int, str, str, tuple[str, ...], bool], ...]:
    """(file, line, importer, imported module, names, lazy) for every import of a course module in
    the package: relative or absolute, at module level or inside a function (``lazy``)."""
    return _imports_in(PACKAGE_DIR)


@functools.lru_cache(maxsize=None)
def _imports_in(package_dir: Path) -> tuple[tuple[Path, int, str, str, tuple[str, ...], bool], ...]:
    """``_course_imports`` of the package in ``package_dir``, parsed once per test process (half a
    CPU-second) for the four checks that read it."""
    modules = {_module_name(p, package_dir) for p in package_dir.rglob("*.py") if "templates" not in p.parts}
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        if "templates" in path.parts:
            continue
        me = _module_name(path, package_dir)
        tree = ast.parse(path.read_text())
        inside = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [(a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                targets = [(f"{base}.{a.name}", ()) if f"{base}.{a.name}" in modules else (base, (a.name,))
                           for a in node.names]
            else:
                continue
            for target, names in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != me:
                    found.append((path, node.lineno, me, target, names, id(node) in inside))
    return tuple(found)


def _unit(module: str) -> str:
    """The docstring's name for a module: its top-level module or subpackage."""
    return module.split(".")[1] if "." in module else module


def test_no_module_imports_from_a_higher_layer():
    layers = _layers()
    wrong = []
    for path, line, me, target, _, _ in _course_imports():
        mine, theirs = layers[_unit(me)], layers[_unit(target)]
        if theirs > mine:
            wrong.append(f"{path.relative_to(PACKAGE_DIR.parent)}:{line}: {me} (layer {mine}) imports {target} "
                         f"(layer {theirs})")
    assert not wrong, ("an import goes up the layers of course_utils/__init__.py's docstring -- move the shared "
                       "code down to a layer both can import, or move the importer up:\n" + "\n".join(wrong))


def test_no_import_cycle_among_modules_lazy_imports_included():
    graph: dict[str, set[str]] = {}
    for _, _, me, target, _, _ in _course_imports():
        graph.setdefault(me, set()).add(target)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt] if nxt in path else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            raise AssertionError("import cycle: " + " -> ".join(cycle) + " (give the shared code one owner "
                                 "in a lower layer; a function-level import does not break a cycle)")


def test_a_function_level_import_says_why_it_waits():
    unexplained = []
    for path, line, me, target, _, lazy in _course_imports():
        if not lazy:
            continue
        lines = path.read_text().splitlines()
        if "# lazy:" not in lines[line - 1] and "# lazy:" not in lines[line - 2]:
            unexplained.append(f"{path.relative_to(PACKAGE_DIR.parent)}:{line}: {me} imports {target}")
    assert not unexplained, ("import these at the top of the module, or say on the line above why the import "
                             "waits ('# lazy: <what it costs>'):\n" + "\n".join(unexplained))


def test_no_private_name_crosses_a_module_boundary():
    """A private name (``_x``) is its module's own (or its subpackage's): one that another module
    imports is a public name without the promise, so it is made public or the code moves."""
    crossing = []
    for path, line, me, target, names, _ in _course_imports():
        own_package = "." in me[len("course_utils."):] and _unit(me) == _unit(target)
        for name in names:
            if name.startswith("_") and not name.startswith("__") and not own_package:
                crossing.append(f"{path.relative_to(PACKAGE_DIR.parent)}:{line}: {me} imports {target}.{name}")
    assert not crossing, "make the name public where it is shared, or move the code:\n" + "\n".join(crossing)


def test_the_layer_checks_catch_what_they_are_for(tmp_path, monkeypatch):
    """The four checks above fail on a package that breaks each rule (a copy with one bad module)."""

    copy = tmp_path / "course_utils"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "config.py").write_text((copy / "config.py").read_text()
                                    + "\n\ndef _f():\n    from .explorer import Config\n    return Config\n")
    (copy / "cost.py").write_text((copy / "cost.py").read_text() + "\nfrom .memory.predict import _check_builder\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE_DIR", copy)
    for check, expected in ((test_no_module_imports_from_a_higher_layer, "course_utils.config (layer 1) imports "
                             "course_utils.explorer"),
                            (test_a_function_level_import_says_why_it_waits, "config.py"),
                            (test_no_private_name_crosses_a_module_boundary, "_check_builder"),
                            (test_no_import_cycle_among_modules_lazy_imports_included, "import cycle")):
        with pytest.raises(AssertionError, match=re.escape(expected)):
            check()


def test_modules_and_functions_stay_readable():
    """A module over 800 lines holds more than one concern; a function body over 80 lines (its
    docstring aside) more than one step: split them (CONTRIBUTING.md, "Where code goes")."""
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if "templates" in path.parts:
            continue
        text = path.read_text()
        name = path.relative_to(PACKAGE_DIR.parent)
        if text.count("\n") > 800:
            long_modules.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                if body and body[-1].end_lineno - body[0].lineno + 1 > 80:
                    long_functions.append(f"{name}:{node.lineno} {node.name}: "
                                          f"{body[-1].end_lineno - body[0].lineno + 1} lines")
    assert not long_modules, "split these modules (one concern each):\n" + "\n".join(long_modules)
    assert not long_functions, "split these functions into named steps:\n" + "\n".join(long_functions)
