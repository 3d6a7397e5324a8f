"""What learners get for graded work: ``python -m course_utils.grading.release OUT``.

The course repository holds the answers (``solutions/``, and the grading references that compute
them). Learners who clone it can copy them; for graded work hand out this release instead:

* ``notebooks/`` (outputs cleared) and ``exercises/`` (generated from the solutions now);
* ``course_utils/`` -- the teaching library the notebooks use, **with the U-Net, the workers and
  every instrument kept** (the notebooks need them; the grader refuses graded objects taken from
  them, see docs/teaching.md), and with the bodies of the grading functions marked ``@answer``
  removed: the values of the reasoning parts (a segment count, a batch size, which ops are safe,
  a formula) are nowhere in the release. Those parts say "checked by your teacher's grader" in
  the learner's notebook. Every ``@reference`` body (a reference's source is often the answer of
  a code part) is a lookup in ``grading/expected_seed0.pt``: the references' results recorded
  here for the inputs of the notebooks' checks, seed 0 (``record_expected``: each solution
  rebuilt, observed and judged; see ``expected``). So every other part still checks itself in
  the notebook, and nothing in the release computes a reference for another seed (the grader's);
* a README and a Makefile of its own (``release_files/``: the notebook table is made from the
  notebooks, the parts from the grading modules), ``check_exercises.py`` (``make check``), the
  install files (``pyproject.toml`` with the notebooks and exercises as its test paths,
  ``constraints.txt``, environment.yml, conftest.py), ``benchmarks/``, ``recorded/``,
  ``docs/gpu-runs/`` (the GPU run a notebook links to);
* no ``solutions/``, no ``tests/`` (they hold the answers), no ``docs/teaching.md``.

``check_release`` reports answers found in the release (a solution's line, an ``@answer`` or
``@reference`` body kept, no recording), and a README or Makefile that links to, names or runs a
file or make target the release does not contain.

OUT is a new folder. ``--force`` replaces an existing one only if a release made it (it holds
``.course-release``, the first file a release writes) or it is empty; never the current folder,
the repository or a folder that holds either, whatever it holds (``_fresh_folder``).

``--nbgrader-course DIR`` instead lays out an nbgrader course (``source/exNN/`` with the solution
notebooks, ``nbgrader_config.py``, a ``course_utils`` copy) on which ``nbgrader generate_assignment
exNN`` and ``nbgrader autograde exNN`` run as they are.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import re
import shutil
import string
import sys
from pathlib import Path

import nbformat
import torch

from ..checks import CourseError
from ..files import cannot_make, shown_path
from ..gpu_kit.plan import checked_timings
from ..layout import exercise_name, lesson_stem
from ..markdown import CODE, links
from ..session_cache import shared
from .core import roundtrip
from .expected import FILE, SEED, Recorder
from .generate import ROOT, SolutionFormatError, make_exercise
from .registry import exercise
from .sandbox import observe_notebook
from .strip import strip_source

#: the release's own README (a template: the tables are made by write_readme), Makefile and
#: ``make check``'s script
RELEASE_FILES = Path(__file__).resolve().parent / "release_files"
KEEP_FILES = ("environment.yml", "pyproject.toml", "constraints.txt", "conftest.py")
KEEP_DIRS = ("benchmarks", "recorded", "docs/gpu-runs")
#: what pytest runs in the release (``make test``): pyproject.toml's testpaths there
TESTPATHS = ("notebooks", "exercises")
#: the README's table of what is in the release (the entries it contains, in this order)
CONTENTS = {
    "notebooks/": "the lessons, in order",
    "exercises/": "your exercises: write, check, hand in",
    "course_utils/": "the library the notebooks use (`course_utils.setup()`, the U-Net, the memory instruments)",
    "check_exercises.py": "`make check`: your exercises run and checked part by part",
    "benchmarks/": "every technique on seed 000's two nets (`python benchmarks/run.py`) and its results",
    "recorded/": "figures recorded on a GPU, shown on a CPU",
    "docs/gpu-runs/": "the record of a GPU run of the course that the notebooks cite",
    "Makefile": "`make lab`, `make test`, `make check`, `make clean`",
    "pyproject.toml": "the package, its dependencies and the test settings of `make test`",
    "constraints.txt": "the torch version `make install` installs",
    "environment.yml": "the same environment for conda",
    "conftest.py": "pytest settings: one torch thread per worker, notebooks 08 and 09 on TF32 ranks",
}


def _ignore(_dir, names):
    # templates/: the scaffold's, for teachers (its example solution holds its answer);
    # release_files/: what this module writes at the release's top level
    return [n for n in names if n in ("__pycache__", "templates", "release_files") or n.endswith((".pyc", ".pyo"))]


def release_course_utils(src: Path, dest: Path, expected: dict | None = None) -> list[str]:
    """Copy course_utils without the ``@answer`` bodies, each ``@reference`` body a lookup in
    ``expected`` (``record_expected``'s recording, written beside them; None: no recording, every
    lookup refused -- the grader's notebook run, whose check cells do nothing); returns the files
    changed."""
    shutil.copytree(src, dest, ignore=_ignore)
    changed = []
    for path in sorted((dest / "grading").glob("ex[0-9][0-9].py")):
        text = path.read_text()
        if "@answer" not in text and "@reference" not in text:
            continue
        path.write_text(strip_source(text, strip_marked={"answer"},
                                     marked_message="not in the student release: your teacher's grader checks this part",
                                     recorded={"reference"}, module=f"{src.name}.grading.{path.stem}"))
        changed.append(str(path.relative_to(dest.parent)))
    if expected is not None:
        torch.save(expected, dest / "grading" / FILE)
    return changed


def recorded_parts(nn_id: str, module: Path) -> list[str]:
    """The parts of exercise ``nn_id`` (grading module ``module``) the release checks with recorded
    results: those whose judge uses a ``@reference``, neither secret nor ``teacher_checked``."""
    keys = parts_using(module, {"reference"}) - teacher_checked(module)
    return [p.key for p in exercise(nn_id).parts if p.key in keys and not p.secret]


def record_expected(root: Path = ROOT, seed: int = SEED) -> Recorder:
    """The references' results for ``seed``: for each exercise, its solution rebuilt and observed
    once for all the parts of ``recorded_parts``, and their judges run with a ``Recorder`` on.
    RuntimeError when the solution fails one of them (its recording would be wrong)."""
    recorder = Recorder()
    for sol in sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nn_id = sol.name[:2]
        ex = exercise(nn_id)
        keys = recorded_parts(nn_id, root / "course_utils" / "grading" / f"ex{nn_id}.py")
        if not keys:
            continue
        with contextlib.redirect_stdout(io.StringIO()):  # the solution's own prints
            observed = observe_notebook(nbformat.read(sol, as_version=4), nn_id, keys, seed)
            with recorder:
                results = [ex.judge(key, roundtrip(observed[key]), seed) for key in keys]
        failed = [f"{r.key}: {r.message}" for r in results if not r.passed]
        if failed:
            raise RuntimeError(f"{sol.relative_to(root)} fails at seed {seed}, so its references' results "
                               f"cannot be recorded for the release: {'; '.join(failed)}")
    return recorder


@shared("release-recording")
def recording(root: str, seed: int = SEED) -> dict:
    """``record_expected(root, seed).data()``: computed once per test session (``session_cache``:
    several tests build the release), each time elsewhere."""
    return record_expected(Path(root), seed).data()


def clean_notebook(path: Path, dest: Path) -> None:
    """Write ``path`` to ``dest`` without outputs, execution counts or run metadata."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, dest)


#: the file a release (and an nbgrader course) writes first in its folder: ``--force`` replaces
#: only a folder that has it, or an empty one -- never the current folder, the repository or a
#: folder of someone's work given by mistake
MARKER = ".course-release"
MARKER_HEAD = "made by python -m course_utils.grading.release"
MARKER_TEXT = f"{MARKER_HEAD}: --force may replace this folder (a folder without this file it never replaces)\n"
MADE = "what the release made (--force replaces the folder only while it holds nothing else):"
#: the repository's folders the release reads: OUT inside one would be copied into itself
SOURCES = ("course_utils", "notebooks", "solutions", "exercises", *KEEP_DIRS)
def made_by_release(out: Path) -> set[str] | None:
    """What a release (or an nbgrader course) wrote into ``out``, read from its ``MARKER`` (a file,
    not a link, that starts with ``MARKER_HEAD``): the top-level names it made, listed there when
    it finished (``_seal``); every name in ``out`` while that release never finished (it failed
    half-way: nothing else was put there). None if ``out`` has no such marker."""
    marker = out / MARKER
    try:
        if marker.is_symlink() or not marker.is_file():
            return None
        lines = marker.read_text(errors="replace").splitlines()
        if not lines or not lines[0].startswith(MARKER_HEAD):
            return None
        if MADE in lines:
            return {MARKER, *lines[lines.index(MADE) + 1:]}
        return {p.name for p in out.iterdir()}
    except OSError:
        return None


def _seal(out: Path) -> None:
    """List in ``MARKER`` the top-level names the release made: ``--force`` replaces the folder
    only while it holds nothing else (a teacher's submitted/, gradebook.db or .git stays safe)."""
    names = sorted(p.name for p in out.iterdir() if p.name != MARKER)
    (out / MARKER).write_text(MARKER_TEXT + MADE + "\n" + "".join(f"{n}\n" for n in names))


def _fresh_folder(out: str | Path, force: bool, root: Path = ROOT) -> Path:
    """``out`` as a Path, checked before any work (CourseError), and removed first if it exists
    and ``force``. The rule: OUT is never the current folder, a folder that holds it, the
    repository (or a folder that holds it) or inside a folder the release reads; an existing OUT
    is replaced only with ``force``, only if it is a folder (not a link) that a release made
    (``MARKER``) or an empty one."""
    fix = "give a new folder, e.g. build/student-release"
    problem = cannot_make(out, folder=True)
    if problem:
        raise CourseError(f"OUT {shown_path(out)}: no release can be written there ({problem}).", fix)
    out = Path(out)
    full, cwd, top = Path(os.path.realpath(out)), Path.cwd().resolve(), root.resolve()
    for what, there in (("the current folder", cwd), ("the repository", top)):
        if there == full or there.is_relative_to(full):
            raise CourseError(f"OUT {shown_path(out)} is {what} or holds it: the release would replace it.", fix)
    for name in SOURCES:
        if full.is_relative_to(top / name):
            raise CourseError(f"OUT {shown_path(out)} is inside the repository's {name}/, which the release reads.", fix)
    if not (out.exists() or out.is_symlink()):
        return out
    made = made_by_release(out) if out.is_dir() and not out.is_symlink() else None
    if made is not None and (extra := sorted(p.name for p in out.iterdir() if p.name not in made)):
        raise CourseError(f"OUT {shown_path(out)} is a release's folder that now holds what no release made: "
                          f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}; --force would remove it.",
                          f"{fix}, or move those out of {shown_path(out)} first")
    ours = not out.is_symlink() and out.is_dir() and (made is not None or not any(out.iterdir()))
    if not ours:
        kind = ("a link" if out.is_symlink() else f"a folder no release made (no {MARKER} in it)" if out.is_dir()
                else "a file")
        raise CourseError(f"OUT {shown_path(out)} exists and is {kind}: --force replaces only a release's folder "
                          "or an empty one.", f"{fix}, or remove {shown_path(out)} yourself if it may go")
    if not force:
        raise CourseError(f"OUT {shown_path(out)} exists.", "choose a new folder, or add --force to replace it")
    shutil.rmtree(out)
    return out


def _new_folder(out: Path) -> None:
    """Make the release's folder, its ``MARKER`` written first: a release that fails half-way
    can be replaced with ``--force``."""
    out.mkdir(parents=True)
    (out / MARKER).write_text(MARKER_TEXT)


def release(out: str | Path, root: Path = ROOT, force: bool = False) -> dict:
    """Write the student release into ``out`` (replaced only with ``force``): the lessons, the
    exercises, ``course_utils`` without answers, the release's own files; returns the folder and the
    grading modules stripped. CourseError, before any work, for an OUT ``_fresh_folder`` refuses;
    RuntimeError when ``check_release`` finds an answer or a broken link."""
    out = _fresh_folder(out, force, root)
    _new_folder(out)
    (out / "notebooks").mkdir()
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        clean_notebook(nb, out / "notebooks" / nb.name)
    (out / "exercises").mkdir()
    for sol in sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nb = make_exercise(nbformat.read(sol, as_version=4), sol.name)
        nbformat.write(nb, out / "exercises" / exercise_name(sol.name))
    stripped = release_course_utils(root / "course_utils", out / "course_utils", recording(str(root)))
    for name in KEEP_FILES:
        if (root / name).exists():
            shutil.copy2(root / name, out / name)
    for name in KEEP_DIRS:
        if (root / name).is_dir():
            shutil.copytree(root / name, out / name, ignore=_ignore)
    for name in ("Makefile", "check_exercises.py"):
        shutil.copy2(RELEASE_FILES / name, out / name)
    pyproject = out / "pyproject.toml"
    if pyproject.exists():
        # its comments speak of the repository (make test-grader, tests/, site/): not kept
        text = re.sub(r"(?m)^[ \t]*#.*\n", "", pyproject.read_text())
        # no tests/ or solutions/ here (they hold the answers): pytest runs the lessons and exercises
        paths = ", ".join(f'"{p}"' for p in TESTPATHS)
        text, n = re.subn(r"(?m)^testpaths = \[.*\]$",
                          f"# make test: every lesson and exercise, run top to bottom by nbval\ntestpaths = [{paths}]",
                          text)
        if n != 1:
            raise RuntimeError(f"{pyproject}: expected one 'testpaths = [...]' line to point at "
                               f"{', '.join(TESTPATHS)}, found {n}: update grading/release.py to "
                               "pyproject.toml's layout")
        pyproject.write_text("# The course's package and its test settings (the student release)\n" + text)
    write_readme(out, root)
    _seal(out)
    problems = check_release(out, root)
    if problems:
        raise RuntimeError("the release is not fit to hand out: " + "; ".join(problems))
    return {"out": str(out), "stripped": stripped}


def _heading(path: Path) -> str:
    """The first ``# `` heading of a notebook's markdown, without the ``NN · `` before it."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return re.sub(r"^\d\d\s*·\s*", "", line[2:].strip())
    raise RuntimeError(f"{path}: no '# NN · Title' heading in its markdown: the release's README lists "
                       "each notebook by it")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _part_name(name: str) -> str:
    head = name.split(":", 1)[0]
    return f"`{head}`" if head.isidentifier() else head


def teacher_checked(module: Path) -> set[str]:
    """The keys of the parts of grading module ``module`` (``exNN.py``) whose judge uses a function
    marked ``@answer``, directly or through the module's other functions: the release removes
    those bodies, so its check cells say "checked by your teacher's grader" for these parts."""
    return parts_using(module, {"answer"})


def parts_using(module: Path, marks: set[str]) -> set[str]:
    """The keys of the parts of grading module ``module`` whose judge uses a function decorated
    with one of ``marks`` (``answer``, ``reference``), directly or through the module's other functions."""
    tree = ast.parse(module.read_text())
    parts, functions, marked, judges = {}, {}, set(), []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "part"
                and node.value.args and isinstance(node.value.args[0], ast.Constant)):
            parts.update({t.id: node.value.args[0].value for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.FunctionDef):
            if any(isinstance(d, ast.Name) and d.id in marks for d in node.decorator_list):
                marked.add(node.name)
            judges += [(d.value.id, node) for d in node.decorator_list if isinstance(d, ast.Attribute)
                       and d.attr == "judge" and isinstance(d.value, ast.Name)]
            if node.name != "_":
                functions[node.name] = node

    def uses(node, seen: set[str]) -> bool:
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if names & marked:
            return True
        todo = (names & functions.keys()) - seen
        seen |= todo
        return any(uses(functions[name], seen) for name in todo)

    return {parts[var] for var, node in judges if var in parts and uses(node, set())}


def notebook_rows(out: Path) -> list[str]:
    """The README's table rows: each notebook of ``out`` with its title, its exercise, the
    exercise's points and the parts the release cannot check (their answer is the teacher's)."""
    stems = sorted({lesson_stem(p) for folder in ("notebooks", "exercises") for p in (out / folder).glob("*.ipynb")})
    rows = []
    for stem in stems:
        nb, ex = out / "notebooks" / f"{stem}.ipynb", out / "exercises" / exercise_name(stem)
        lesson = f"[{_cell(_heading(nb))}](notebooks/{stem}.ipynb)" if nb.exists() else "-"
        points = teacher = "-"
        exercise_link = "-"
        if ex.exists():
            spec = exercise(stem[:2])
            exercise_link = f"[{_cell(spec.title)}](exercises/{ex.name})"
            points = str(spec.max_score)
            keys = teacher_checked(out / "course_utils" / "grading" / f"ex{stem[:2]}.py")
            teacher = ", ".join(f"{_part_name(p.name)} ({p.points})" for p in spec.parts if p.key in keys) or "-"
        rows.append(f"| {stem[:2]} | {lesson} | {exercise_link} | {points} | {_cell(teacher)} |")
    return rows


def _readme_block(root: Path, name: str) -> str:
    """The generated block ``name`` of the repository's README (between its BEGIN/END markers)."""
    readme = root / "README.md"
    m = re.search(rf"<!-- BEGIN {name} -->\n(.*?)<!-- END {name} -->", readme.read_text() if readme.exists() else "",
                  re.S)
    return m.group(1).strip() if m else ""


def write_readme(out: Path, root: Path = ROOT) -> Path:
    """``out/README.md`` from ``release_files/README.md.in``: the notebooks, their exercises and
    the files of ``out``, the course's run time (results/timings.json) and figures (README's block)."""
    readme = root / "README.md"
    first = readme.read_text().splitlines()[0] if readme.exists() else ""
    heading = first if first.startswith("# ") else "# The course"
    timing = ""
    timings = root / "results" / "timings.json"
    if timings.exists():
        data = checked_timings(timings)  # RecordError naming the file and the fix where it is damaged
        seconds = sum(r.get("notebooks", 0) for r in data["rows"].values())
        cores = data["meta"].get("cores")
        on = f"a {cores}-core CPU" if cores else "a CPU"
        timing = (f"\nOne after the other, the notebooks run in about {max(1, round(seconds / 60))} minutes on "
                  f"{on} at the `tiny` preset, the exercises in less; `make test` spreads them over every\n"
                  "core (`make test JOBS=1`: one at a time).\n")
    figures = _readme_block(root, "figures")
    if figures:
        figures = f"\n## What the course found\n\n{figures}\n"
    files = [f"| `{name}` | {what} |" for name, what in CONTENTS.items() if (out / name.rstrip("/")).exists()]
    text = string.Template((RELEASE_FILES / "README.md.in").read_text()).substitute(
        heading=heading, timing=timing, rows="\n".join(notebook_rows(out)), figures=figures, files="\n".join(files))
    (out / "README.md").write_text(text)
    return out / "README.md"


def check_release(out: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the release ``out``: lines of the solutions' answer regions found in it,
    an ``@answer`` or ``@reference`` body kept, no recording of the references' results, and
    (``check_release_files``) a README or Makefile that names what it does not contain."""
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
    for path in (out / "course_utils" / "grading").glob("ex[0-9][0-9].py"):
        for node in ast.walk(ast.parse(path.read_text())):
            marks = {d.id for d in getattr(node, "decorator_list", ()) if isinstance(d, ast.Name)}
            if "answer" in marks and not any(isinstance(n, ast.Raise) for n in node.body):
                leaks.append(f"{path.relative_to(out)}: {node.name} keeps its answer")
            elif "reference" in marks and (len(node.body) != 2 or "_recorded(" not in ast.unparse(node.body[-1])):
                leaks.append(f"{path.relative_to(out)}: {node.name} keeps its reference")
    if not (out / "course_utils" / "grading" / FILE).is_file():
        leaks.append(f"course_utils/grading/{FILE} is missing: the check cells could not check the code parts")
    # course_utils keeps what the notebooks use (the U-Net's blocks, the workers): the grader
    # refuses graded objects that use them
    for path in (out / "exercises").glob("*.ipynb"):
        text = path.read_text()
        for line in answers:
            if line in text:
                leaks.append(f"{path.relative_to(out)}: {line[:60]}")
    return leaks + check_release_files(out, root)


_SKIP = ("__pycache__", "build")


def _absent(root: Path, out: Path, depth: int = 3) -> list[str]:
    """The repository's paths (``dir/`` for a folder) that ``out`` lacks, down to ``depth``
    levels inside the folders both have: ``solutions/``, ``tests/``, ``docs/teaching.md``, ..."""
    found = []
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") or path.name in _SKIP or path.name.endswith(".egg-info"):
            continue
        rel = path.relative_to(root)
        if not (out / rel).exists():
            found.append(rel.as_posix() + ("/" if path.is_dir() else ""))
        elif path.is_dir() and depth > 1:
            found += [f"{rel.as_posix()}/{p}" for p in _absent(path, out / rel, depth - 1)]
    return found


def makefile_targets(text: str) -> set[str]:
    """The targets a Makefile's rules name (``a b: deps``; not ``X := ...``, not ``$(VAR):``)."""
    return {name for m in re.finditer(r"(?m)^([A-Za-z0-9_][A-Za-z0-9_ .-]*?)\s*:(?!=)", text)
            for name in m.group(1).split()}


_MAKE = re.compile(r"\bmake\s+(?:-\S+\s+)*(?:[A-Z_]+=\S*\s+)*([a-z][\w-]*)")


def check_release_files(out: Path, root: Path = ROOT) -> list[str]:
    """The release's README and Makefile name only what it contains: every relative link of the
    README, the notebooks and the exercises resolves inside ``out``; no path of the repository
    that the release lacks (``docs/teaching.md``, ``solutions/``, ``tests/``, ``tools/``, ...) is
    named; every ``make X`` they give is a target of its Makefile; every file a Makefile rule uses
    is there."""
    problems = []
    texts = {}
    for name in ("README.md", "Makefile"):
        if (out / name).is_file():
            texts[name] = (out / name).read_text()
        else:
            problems.append(f"{name} is missing: write it with python -m course_utils.grading.release")
    documents = [(out / "README.md", texts.get("README.md", ""))]
    for folder in ("notebooks", "exercises"):
        for path in sorted((out / folder).glob("*.ipynb")):
            cells = nbformat.read(path, as_version=4).cells
            documents.append((path, "\n".join(c.source for c in cells if c.cell_type == "markdown")))
    top = out.resolve()
    for path, text in documents:
        for target in links(text):
            resolved = (path.parent / target).resolve()
            if not resolved.exists() or not resolved.is_relative_to(top):
                problems.append(f"{path.relative_to(out)} links to {target}, which the release does not contain")
    for missing in _absent(root, out):
        end = "" if missing.endswith("/") else r"(?![\w-])"  # CONTRIBUTING.md, not CONTRIBUTING.mdx
        pattern = re.compile(rf"(?<![\w./-]){re.escape(missing)}{end}")
        for name, text in texts.items():
            if pattern.search(text):
                problems.append(f"{name} names {missing}, which the release does not contain")
    makefile = texts.get("Makefile", "")
    targets = makefile_targets(makefile)
    commands = [("README.md", "\n".join(m.group(0) for m in CODE.finditer(texts.get("README.md", ""))))]
    pyproject = (out / "pyproject.toml").read_text() if (out / "pyproject.toml").is_file() else ""
    for name, text in (("Makefile", makefile), ("pyproject.toml", pyproject)):  # their comments
        commands.append((name, "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))))
    for name, text in commands:
        for target in dict.fromkeys(m.group(1) for m in _MAKE.finditer(text)):
            if target not in targets:
                problems.append(f"{name} gives `make {target}`, but the release's Makefile has no target {target}")
    rules = "\n".join(line for line in makefile.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    for used in dict.fromkeys(re.findall(r"(?<![\w$/.-])([\w./-]+\.(?:py|txt|toml|yml|yaml|md|ipynb|sh|cfg))\b", rules)):
        if not (out / used).exists():
            problems.append(f"Makefile uses {used}, which the release does not contain")
    return list(dict.fromkeys(problems))


#: nbgrader >= 0.6 has no ``db_assignments``/``db_students`` (0.9 warns "Config option
#: `db_assignments` not recognized"): an assignment is its folder ``source/exNN/``, entered in the
#: gradebook by ``generate_assignment`` and its students by ``autograde`` (both by default since
#: nbgrader 0.6, PR #1116; said here so that the config shows it)
NBGRADER_CONFIG = '''# nbgrader course made by python -m course_utils.grading.release --nbgrader-course
# assignments: {assignments} (each is its folder source/exNN/; generate_assignment adds it to the gradebook)
c = get_config()  # noqa: F821
c.GenerateAssignment.create_assignment = True
c.Autograde.create_student = True
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}
c.Execute.timeout = 600
'''


def nbgrader_course(out: str | Path, root: Path = ROOT, force: bool = False) -> list[str]:
    """source/exNN/<solution notebook> for each exercise, nbgrader_config.py and course_utils."""
    out = _fresh_folder(out, force, root)
    _new_folder(out)
    names = []
    for sol in sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb")):
        name = f"ex{sol.name[:2]}"
        (out / "source" / name).mkdir(parents=True)
        clean_notebook(sol, out / "source" / name / sol.name)
        names.append(name)
    shutil.copytree(root / "course_utils", out / "course_utils", ignore=_ignore)
    (out / "nbgrader_config.py").write_text(NBGRADER_CONFIG.format(assignments=", ".join(names)))
    _seal(out)
    return names


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils.grading.release OUT [--force] [--nbgrader-course]``; returns the exit
    status (2 when OUT exists without ``--force`` or the release cannot be made)."""
    ap = argparse.ArgumentParser(prog="python -m course_utils.grading.release",
                                 description="Write what learners get for graded work (no answers).")
    ap.add_argument("out", help="a new folder")
    ap.add_argument("--force", action="store_true",
                    help=f"replace OUT if it exists: only a folder a release made (it holds {MARKER}) or an empty one")
    ap.add_argument("--nbgrader-course", action="store_true",
                    help="write an nbgrader course folder (for the teacher) instead")
    args = ap.parse_args(argv)
    try:
        if args.nbgrader_course:
            names = nbgrader_course(args.out, force=args.force)  # a str: '' is not '.'
            bindir = Path(sys.executable).parent  # nbgrader runs alembic by name: this venv on PATH
            print(f"nbgrader course in {args.out}: assignments {', '.join(names)}.\n"
                  f"  cd {args.out} && PATH={bindir}:$PATH PYTHONPATH=$PWD nbgrader generate_assignment ex00\n"
                  "(docs/teaching.md, \"With nbgrader\": collecting and autograde)")
            return 0
        info = release(args.out, force=args.force)
    except (CourseError, SolutionFormatError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"student release in {info['out']}: notebooks/, exercises/, course_utils/ "
          f"(answers and references removed from {len(info['stripped'])} grading modules), no solutions/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
