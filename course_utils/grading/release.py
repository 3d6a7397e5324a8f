"""What learners get for graded work: ``python -m course_utils.grading.release OUT``.

The course repository holds the answers (``solutions/``, and the grading references that compute
them). Learners who clone it can copy them; for graded work hand out this release instead:

* ``notebooks/`` (outputs cleared) and ``exercises/`` (generated from the solutions now);
* ``course_utils/`` -- the teaching library the notebooks use, **with the U-Net, the workers and
  every instrument kept** (the notebooks need them; the grader refuses graded objects taken from
  them, see docs/teaching.md), and with the bodies of the grading functions marked ``@answer``
  removed: the values of the reasoning parts (a segment count, a batch size, which ops are safe,
  a formula) are nowhere in the release. Those parts say "checked by your teacher's grader" in
  the learner's notebook; every other part still checks itself;
* README, install files (``pyproject.toml`` with the notebooks as its only test path, Makefile,
  ``constraints.txt``, environment.yml), ``benchmarks/``, ``recorded/``;
* no ``solutions/``, no ``tests/`` (they hold the answers), no ``docs/teaching.md``.

``--nbgrader-course DIR`` instead lays out an nbgrader course (``source/exNN/`` with the solution
notebooks, ``nbgrader_config.py``, a ``course_utils`` copy) on which ``nbgrader generate_assignment
exNN`` and ``nbgrader autograde exNN`` run as they are.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

import nbformat

from .generate import ROOT, SolutionFormatError, make_exercise
from .strip import strip_source

KEEP_FILES = ("README.md", "Makefile", "environment.yml", "pyproject.toml", "constraints.txt")
KEEP_DIRS = ("benchmarks", "recorded")


def _ignore(_dir, names):
    # templates/: the scaffold's, for teachers (its example solution holds its answer)
    return [n for n in names if n in ("__pycache__", "templates") or n.endswith((".pyc", ".pyo"))]


def release_course_utils(src: Path, dest: Path) -> list[str]:
    """Copy course_utils without the ``@answer`` bodies; returns the files changed."""
    shutil.copytree(src, dest, ignore=_ignore)
    changed = []
    for path in sorted((dest / "grading").glob("ex*.py")):
        text = path.read_text()
        if "@answer" not in text:
            continue
        path.write_text(strip_source(text, strip_marked={"answer"},
                                     marked_message="not in the student release: your teacher's grader checks this part"))
        changed.append(str(path.relative_to(dest.parent)))
    return changed


def clean_notebook(path: Path, dest: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, dest)


def _fresh_folder(out: Path, force: bool) -> Path:
    """``out`` as a Path, removed first if it exists and ``force`` (refused otherwise)."""
    out = Path(out)
    if out.exists():
        if not force:
            raise FileExistsError(f"{out} exists: choose a new folder, or --force to replace it")
        shutil.rmtree(out)
    return out


def release(out: Path, root: Path = ROOT, force: bool = False) -> dict:
    out = _fresh_folder(out, force)
    out.mkdir(parents=True)
    (out / "notebooks").mkdir()
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        clean_notebook(nb, out / "notebooks" / nb.name)
    (out / "exercises").mkdir()
    for sol in sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nb = make_exercise(nbformat.read(sol, as_version=4), sol.name)
        nbformat.write(nb, out / "exercises" / sol.name)
    stripped = release_course_utils(root / "course_utils", out / "course_utils")
    for name in KEEP_FILES:
        if (root / name).exists():
            shutil.copy2(root / name, out / name)
    for name in KEEP_DIRS:
        if (root / name).is_dir():
            shutil.copytree(root / name, out / name, ignore=_ignore)
    pyproject = out / "pyproject.toml"
    if pyproject.exists():
        text = pyproject.read_text()
        # the release has no tests/ (they hold the answers): its pytest runs the notebooks only
        text, n = re.subn(r"(?m)^testpaths = \[.*\]$", 'testpaths = ["notebooks"]', text)
        if n != 1:
            raise RuntimeError(f"{pyproject}: expected one 'testpaths = [...]' line to point at notebooks/, "
                               f"found {n}: update grading/release.py to pyproject.toml's layout")
        pyproject.write_text(text)
    leaks = check_release(out, root)
    if leaks:
        raise RuntimeError("the release contains answers: " + "; ".join(leaks))
    return {"out": str(out), "stripped": stripped}


def check_release(out: Path, root: Path = ROOT) -> list[str]:
    """Lines of the solutions' answer regions found anywhere in the release's text files."""
    answers = set()
    for sol in sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(sol, as_version=4).cells:
            inside = False
            for line in cell.source.splitlines():
                if "BEGIN SOLUTION" in line:
                    inside = True
                elif "END SOLUTION" in line:
                    inside = False
                elif inside and len(line.strip()) > 30:
                    answers.add(line.strip())
    leaks = []
    if (out / "solutions").exists() or (out / "tests").exists():
        leaks.append("solutions/ or tests/ in the release")
    import ast

    for path in (out / "course_utils" / "grading").glob("ex*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Name) and d.id == "answer" for d in node.decorator_list):
                if not any(isinstance(n, ast.Raise) for n in node.body):
                    leaks.append(f"{path.relative_to(out)}: {node.name} keeps its answer")
    # course_utils keeps what the notebooks use (the U-Net's blocks, the workers) and the references
    # the code parts' checks compare with; the grader refuses graded objects that use them
    for path in (out / "exercises").glob("*.ipynb"):
        text = path.read_text()
        for line in answers:
            if line in text:
                leaks.append(f"{path.relative_to(out)}: {line[:60]}")
    return leaks


NBGRADER_CONFIG = '''# nbgrader course made by python -m course_utils.grading.release --nbgrader-course
c = get_config()  # noqa: F821
c.CourseDirectory.root = "."
c.CourseDirectory.db_assignments = [{assignments}]
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}
c.Execute.timeout = 600
'''


def nbgrader_course(out: Path, root: Path = ROOT, force: bool = False) -> list[str]:
    """source/exNN/<solution notebook> for each exercise, nbgrader_config.py and course_utils."""
    out = _fresh_folder(out, force)
    names = []
    for sol in sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb")):
        name = f"ex{sol.name[:2]}"
        (out / "source" / name).mkdir(parents=True)
        clean_notebook(sol, out / "source" / name / sol.name)
        names.append(name)
    shutil.copytree(root / "course_utils", out / "course_utils", ignore=_ignore)
    (out / "nbgrader_config.py").write_text(NBGRADER_CONFIG.format(
        assignments=", ".join(f'{{"name": "{n}"}}' for n in names)))
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course_utils.grading.release",
                                 description="Write what learners get for graded work (no answers).")
    ap.add_argument("out", help="a new folder")
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    ap.add_argument("--nbgrader-course", action="store_true",
                    help="write an nbgrader course folder (for the teacher) instead")
    args = ap.parse_args(argv)
    try:
        if args.nbgrader_course:
            names = nbgrader_course(Path(args.out), force=args.force)
            print(f"nbgrader course in {args.out}: assignments {', '.join(names)}.\n"
                  f"  cd {args.out} && PYTHONPATH=$PWD nbgrader generate_assignment ex00")
            return 0
        info = release(Path(args.out), force=args.force)
    except (FileExistsError, SolutionFormatError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"student release in {info['out']}: notebooks/, exercises/, course_utils/ "
          f"(answers removed from {len(info['stripped'])} grading modules), no solutions/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
