"""The package's layout holds together: a module split into a package keeps every public name
where the notebooks import it, and the grader's sandbox still strips each exercise's answer
from the file it now lives in."""

import ast
import importlib
import inspect
import pkgutil
import shutil
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
    from course_utils.grading.grade import Grader

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
    import re

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
    import sys

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
