"""Add a notebook to the course in one step, and check that the course's parts agree.

    .venv/bin/python -m course_utils.scaffold 12 "Activation offloading"  # a new notebook 12 (the next number)
    .venv/bin/python -m course_utils.scaffold 12                          # an existing 12: only what is missing
    .venv/bin/python -m course_utils.scaffold --check                     # every disagreement, with its fix

(``make install`` creates ``.venv``, with torch; ``make new-notebook NN=12 TITLE="..."`` runs the first.)

A notebook ``NN`` of the course is made of (``course_utils/templates/`` holds the templates):

* ``notebooks/NN_topic.ipynb``      -- the lesson
* ``solutions/NN_topic.ipynb``      -- its exercise with the answers (nbgrader solution and test cells)
* ``exercises/NN_topic_exercise.ipynb`` -- generated from the solution (``python -m course_utils.grading.generate``)
* ``course_utils/grading/exNN.py``  -- the exercise's parts and checks (``EX``, ``check_*``)
* ``tests/wrong_answers/exNN.py``   -- typical wrong answers, each must fail its part
* a row in README.md's table "The notebooks" and in docs/teaching.md's table "Exercises"
* its run time in ``results/timings.json`` (``python -m course_utils.readme --render --timings NN``)
* a "**Next:**" link to it from the notebook before.

The scaffold creates the files that are missing from the templates, adds the rows and the link,
and times the new notebook. It reads and checks everything first (the number, the title, every file
it reads: ``ScaffoldError`` with the fix, nothing written), and a write or timing that still fails
puts every file back as it was. ``problems()`` (run by tests/test_course_layout.py) names every part
that is missing or disagrees, with the file to edit and the fix. The templates' example text carries
the marker ``TODO(scaffold)``: a fresh scaffold passes the tests (``make test-scaffold``), but
``--check`` (``release_problems()``) refuses every marker left in a notebook's files.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import string
import sys
from dataclasses import dataclass
from pathlib import Path

from .checks import CourseError, RecordError, ScaffoldError, guard
from .files import atomic_write, read_notebook, write_error
from .gpu_kit.plan import checked_timings
from .layout import EXERCISE_SUFFIX, exercise_name, lesson_stem, notebook_title
from .markdown import links

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = Path(__file__).resolve().parent / "templates"
NAME = re.compile(r"(\d\d)_[a-z0-9]+(?:_[a-z0-9]+)*\.ipynb")
README_SECTION, TEACHING_SECTION = "## The notebooks", "## Exercises"
#: in the templates' example text: what a new notebook's author replaces (``--check`` refuses it)
PLACEHOLDER = "TODO(scaffold)"


@dataclass(frozen=True)
class Entry:
    """One notebook of the course and the paths of its parts (relative to the repository)."""

    nn: str
    stem: str  # e.g. "05_inplace_relu"

    @property
    def notebook(self) -> str:
        return f"notebooks/{self.stem}.ipynb"

    @property
    def solution(self) -> str:
        return f"solutions/{self.stem}.ipynb"

    @property
    def exercise(self) -> str:
        return f"exercises/{exercise_name(self.stem)}"

    @property
    def grading(self) -> str:
        return f"course_utils/grading/ex{self.nn}.py"

    @property
    def wrong(self) -> str:
        return f"tests/wrong_answers/ex{self.nn}.py"


def entries(root: Path = ROOT) -> list[Entry]:
    """The course's notebooks, from the files in notebooks/, in order."""
    return [Entry(p.name[:2], p.stem) for p in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))]


def title(root: Path, entry: Entry) -> str:
    """A notebook's title from its first heading: '# 05 · In-place ReLU' -> 'In-place ReLU';
    ``ScaffoldError`` naming the notebook where it has none to read."""
    try:
        return notebook_title(root / entry.notebook)
    except (OSError, ValueError, LookupError, TypeError, AttributeError) as err:
        raise ScaffoldError(f"{entry.notebook}: its title cannot be read (a first cell whose first line is "
                            f"'# {entry.nn} · Title'): {type(err).__name__}: {str(err)[:200]}.",
                            f"restore the notebook (`git checkout -- {entry.notebook}`) or give it that first "
                            "line") from None


def _cells(path: Path) -> list[dict]:
    return read_notebook(path)["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _scaffold_cmd(nn: str) -> str:
    return f"`python -m course_utils.scaffold {nn}` creates it from course_utils/templates/"


# --------------------------------------------------------------------------------------------
# The checks: each returns a list of problems, each naming the file to edit and the fix
# --------------------------------------------------------------------------------------------
def check_files(root: Path = ROOT) -> list[str]:
    """Names, numbering, and every notebook's solution, exercise, grading module and wrong answers."""
    out = []
    for folder in ("notebooks", "solutions", "exercises"):
        for p in sorted((root / folder).glob("*.ipynb")):
            if not NAME.fullmatch(p.name):
                out.append(f"{folder}/{p.name}: name it NN_topic.ipynb (two digits, then lower-case words "
                           "joined by _), as its notebook")
    course = entries(root)
    numbers = [e.nn for e in course]
    for nn in sorted({n for n in numbers if numbers.count(n) > 1}):
        out.append(f"notebooks/: {', '.join(e.notebook for e in course if e.nn == nn)} share number {nn}: renumber one")
    for k, nn in enumerate(sorted(set(numbers))):
        if int(nn) != k:
            out.append(f"notebooks/: no notebook {k:02d} before {nn}: the numbers run 00, 01, ... without gaps")
            break
    stems = {e.stem for e in course}
    for e in course:
        for path, fix in ((e.solution, _scaffold_cmd(e.nn) + " (an exercise with one part to rewrite)"),
                          (e.exercise, "`python -m course_utils.grading.generate` writes it from the solution"),
                          (e.grading, _scaffold_cmd(e.nn) + " (the parts and checks of the solution's check cells)"),
                          (e.wrong, _scaffold_cmd(e.nn) + " (WRONG: the typical wrong answers, each must fail)")):
            if not (root / path).exists():
                out.append(f"{path} is missing (notebook {e.notebook} has none): {fix}")
    for folder, what in (("solutions", "solution"), ("exercises", "exercise")):
        for p in sorted((root / folder).glob("[0-9][0-9]_*.ipynb")):
            named = exercise_name(p) if folder == "exercises" else f"{lesson_stem(p)}.ipynb"
            if lesson_stem(p) not in stems or p.name != named:
                out.append(f"{folder}/{p.name} has no notebook notebooks/{lesson_stem(p)}.ipynb: name the {what} "
                           f"after its notebook ({folder}/NN_topic{EXERCISE_SUFFIX if folder == 'exercises' else ''}"
                           ".ipynb), or remove it")
    known = {e.nn for e in course}
    for folder, pattern in (("course_utils/grading", "ex[0-9][0-9].py"), ("tests/wrong_answers", "ex[0-9][0-9].py")):
        for p in sorted((root / folder).glob(pattern)):
            if p.stem[2:] not in known:
                out.append(f"{folder}/{p.name} belongs to no notebook (no notebooks/{p.stem[2:]}_*.ipynb): "
                           "remove it, or add the notebook")
    for e in course:
        if (root / e.solution).exists():
            mods = set(re.findall(r"course_utils\.grading\.ex(\d\d)\b", (root / e.solution).read_text(encoding="utf-8")))
            for other in sorted(mods - {e.nn}):
                out.append(f"{e.solution} imports course_utils.grading.ex{other}: its checks are in ex{e.nn}")
        if (root / e.grading).exists():
            found = re.search(r'^EX = Exercise\(\s*"(\d\d)"', (root / e.grading).read_text(), re.M)
            if not found or found.group(1) != e.nn:
                out.append(f'{e.grading}: EX = Exercise("{e.nn}", ...) expected'
                           + (f', found "{found.group(1)}"' if found else ""))
    return out


def _section(text: str, heading: str) -> str:
    if heading not in text:
        return ""
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def _readme_rows(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^\| (\d\d) \| `(\d\d_[a-z0-9_]+)` \|", _section(text, README_SECTION), re.M)


def _teaching_rows(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^\| (\d\d) \| .* \| (\d+) \|$", _section(text, TEACHING_SECTION), re.M)


def check_tables(root: Path = ROOT) -> list[str]:
    """README's "The notebooks" and docs/teaching.md's "Exercises": one row each, in order."""
    out = []
    course = entries(root)
    rows = _readme_rows((root / "README.md").read_text())
    stems, known = [s for _, s in rows], {e.stem for e in course}
    for e in course:
        if e.stem not in stems:
            out.append(f"README.md, table under '{README_SECTION}': no row for {e.notebook}: add "
                       f"`| {e.nn} | `{e.stem}` | <what it answers> |` (`python -m course_utils.scaffold {e.nn}` adds it)")
    for nn, stem in rows:
        if stem not in known or nn != stem[:2]:
            out.append(f"README.md, table under '{README_SECTION}': the row `| {nn} | `{stem}` |` names no notebook: "
                       "fix the name, or remove the row")
    if [s for s in stems if s in known] != [e.stem for e in course if e.stem in stems]:
        out.append(f"README.md, table under '{README_SECTION}': order the rows by number")
    parts = {}
    for e in course:
        if (root / e.grading).exists():
            parts[e.nn] = len(_parts(root, e))
    trows = dict(_teaching_rows((root / "docs" / "teaching.md").read_text()))
    for nn, n in parts.items():
        if nn not in trows:
            out.append(f"docs/teaching.md, table under '{TEACHING_SECTION}': no row for exercise {nn}: add "
                       f"`| {nn} | <what the learner writes> | {n} |`")
        elif int(trows[nn]) != n:
            out.append(f"docs/teaching.md, table under '{TEACHING_SECTION}': exercise {nn} has {n} parts "
                       f"(course_utils/grading/ex{nn}.py), the row says {trows[nn]}: correct the row")
    for nn in sorted(set(trows) - set(parts)):
        out.append(f"docs/teaching.md, table under '{TEACHING_SECTION}': the row of exercise {nn} names no "
                   f"exercise (no course_utils/grading/ex{nn}.py): remove it")
    return out


def _parts(root: Path, e: Entry) -> list[str]:
    """The part keys of an exercise, read from its source (``X = EX.part("key", ...)``): the
    checks must not import a module of another checkout."""
    return _part_keys((root / e.grading).read_text())


def _part_keys(source: str) -> list[str]:
    return re.findall(r'\bEX\.part\(\s*"([^"]+)"', source)


def timing_rows(root: Path = ROOT) -> dict[str, dict]:
    """results/timings.json's rows ({} where the file is absent); ``ScaffoldError`` naming the file
    and the fix where it cannot be read or is not a timings file (``gpu_kit.plan.checked_timings``)."""
    path = root / "results" / "timings.json"
    try:
        data = checked_timings(path) or {"rows": {}}
    except RecordError as err:
        raise ScaffoldError(err.problem.replace(str(path), "results/timings.json"),
                            err.fix and err.fix.replace(str(path), "results/timings.json")) from None
    return data["rows"]


def check_timings(root: Path = ROOT) -> list[str]:
    """results/timings.json: one row per notebook, with its run and its solution's."""
    try:
        rows = timing_rows(root)
    except ScaffoldError as err:
        return [str(err)]
    course = entries(root)
    out = []
    for e in course:
        r = rows.get(e.nn, {})
        missing = [f for f in ("notebooks", "solutions") if not isinstance(r.get(f), int)]
        if missing:
            out.append(f"results/timings.json has no time for {' and '.join(missing)}/{e.stem}.ipynb: run "
                       f"`python -m course_utils.readme --render --timings {e.nn}` (about a minute)")
    extra = sorted(set(rows) - {e.nn for e in course})
    if extra:
        last = course[-1].nn if course else "00"
        out.append(f"results/timings.json has rows for {', '.join(extra)}, which have no notebook: "
                   f"`python -m course_utils.readme --render --timings {last}` drops them")
    return out


def _markdown(path: Path) -> list[str]:
    if path.suffix == ".ipynb":
        return [_source(c) for c in _cells(path) if c["cell_type"] == "markdown"]
    return [path.read_text(encoding="utf-8")]


def check_links(root: Path = ROOT) -> list[str]:
    """Relative links in the notebooks, exercises, solutions, README, CONTRIBUTING and docs
    resolve; each notebook links to its exercise and to the next notebook."""
    out = []
    files = [p for folder in ("notebooks", "exercises", "solutions") for p in sorted((root / folder).glob("*.ipynb"))]
    files += [root / n for n in ("README.md", "CONTRIBUTING.md") if (root / n).exists()]
    files += sorted((root / "docs").glob("*.md"))
    for path in files:
        for target in {t for text in _markdown(path) for t in links(text)}:
            if not (path.parent / target).exists():
                out.append(f"{path.relative_to(root)}: the link ({target}) leads to no file: fix it")
    course = entries(root)
    for k, e in enumerate(course):
        targets = {t for text in _markdown(root / e.notebook) for t in links(text)}
        if (root / e.exercise).exists() and f"../{e.exercise}" not in targets:
            out.append(f"{e.notebook}: no link to its exercise: end its last cell with "
                       f"`**Exercise:** [{e.exercise}](../{e.exercise}).`")
        if k + 1 < len(course) and f"{course[k + 1].stem}.ipynb" not in targets:
            nxt = course[k + 1]
            out.append(f"{e.notebook}: no link to the next notebook: add `**Next:** [{nxt.nn} · "
                       f"{title(root, nxt)}]({nxt.stem}.ipynb).` to its last cell")
    return out


def part_points(root: Path, e: Entry) -> dict[str, object]:
    """Each part's points, read from the source of the exercise's module (``X = EX.part("key",
    "name", points, ...)``, without importing it: the checks must not import another checkout's
    module). A points argument that is not a literal number is returned as its source text."""
    out: dict[str, object] = {}
    for node in ast.walk(ast.parse((root / e.grading).read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "part"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "EX"
                and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        arg = node.args[2] if len(node.args) > 2 else next((k.value for k in node.keywords if k.arg == "points"), None)
        try:
            out[node.args[0].value] = ast.literal_eval(arg) if arg is not None else None
        except ValueError:
            out[node.args[0].value] = ast.unparse(arg)
    return out


def check_cells(path: Path) -> list[tuple[int, str, object]]:
    """A solution's check cells (nbgrader ``grade`` cells that are not solutions): (cell index,
    grade_id, points)."""
    out = []
    for k, cell in enumerate(_cells(path)):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell["cell_type"] == "code" and meta.get("grade") and not meta.get("solution"):
            out.append((k, meta.get("grade_id", "?"), meta.get("points")))
    return out


def check_points(root: Path = ROOT) -> list[str]:
    """The points of each solution's check cells add up to its exercise's ``max_score`` (the sum of
    its parts' points). tests/test_check_cells.py checks each cell against the parts it runs."""
    out = []
    for e in entries(root):
        if not ((root / e.solution).exists() and (root / e.grading).exists()):
            continue  # check_files names it
        points = part_points(root, e)
        odd = {k: v for k, v in points.items() if not isinstance(v, int)}
        if odd:
            out.append(f"{e.grading}: the points of part(s) {', '.join(map(repr, odd))} are not a number "
                       f"({', '.join(map(str, odd.values()))}): write each part's points as a number, "
                       '`EX.part("key", "name", 2, [...])`')
            continue
        cells = check_cells(root / e.solution)
        if not cells:
            out.append(f"{e.solution}: no check cell (an nbgrader test cell with points that calls check_*): "
                       "add one per group of parts, as course_utils/templates/solution.ipynb does")
            continue
        total, max_score = sum(p if isinstance(p, int) else 0 for _, _, p in cells), sum(points.values())
        if total != max_score:
            listed = ", ".join(f"cell {k} '{gid}': {p}" for k, gid, p in cells)
            parts = ", ".join(f"{k} {v}" for k, v in points.items())
            out.append(f"{e.solution}: the points of its check cells ({listed}) add up to {total}, but exercise "
                       f"{e.nn}'s max_score is {max_score} (its parts' points in {e.grading}: {parts}): set each "
                       "check cell's nbgrader points (metadata.nbgrader.points) to the points of the parts its "
                       f"check_* call runs, so that they add up to {max_score}; then "
                       "`.venv/bin/python -m course_utils.grading.generate` (tests/test_check_cells.py checks "
                       "each cell)")
    return out


def check_placeholders(root: Path = ROOT) -> list[str]:
    """No notebook keeps the templates' example text: each ``TODO(scaffold)`` marker, with the file
    and what to replace (the rest of the marker's line says it)."""
    out = []
    for e in entries(root):
        for rel in (e.notebook, e.solution, e.grading, e.wrong):  # exercises/ follows the solution
            path = root / rel
            if not path.exists():
                continue
            texts = ([(f", cell {k}", _source(c)) for k, c in enumerate(_cells(path))] if path.suffix == ".ipynb"
                     else [("", path.read_text(encoding="utf-8"))])
            for where, text in texts:
                for line in text.splitlines():
                    if PLACEHOLDER in line:
                        what = line.split(PLACEHOLDER, 1)[1].strip(" :*_-").rstrip("*_ .\"")
                        out.append(f"{rel}{where}: the scaffold's placeholder is still there ({PLACEHOLDER}: "
                                   f"{what}): replace it with this notebook's own text and delete the marker "
                                   "(CONTRIBUTING.md, 'Adding a notebook')")
    return out


def check_readable(root: Path = ROOT) -> list[str]:
    """Every notebook, solution and exercise is a notebook's JSON (the other checks read them),
    README.md and docs/teaching.md are there, and results/timings.json reads as timings."""
    out = []
    for folder in ("notebooks", "solutions", "exercises"):
        for p in sorted((root / folder).glob("*.ipynb")):
            try:
                cells = _cells(p)
                if not (isinstance(cells, list) and all(isinstance(c, dict) and "cell_type" in c and "source" in c
                                                        for c in cells)):
                    raise ValueError("its cells are not a list of cells")
            except (OSError, ValueError, LookupError, TypeError) as err:
                out.append(f"{folder}/{p.name} cannot be read as a notebook ({type(err).__name__}: "
                           f"{str(err)[:120]}). Fix: restore it (`git checkout -- {folder}/{p.name}`) or "
                           "save it again from JupyterLab")
    for rel in ("README.md", "docs/teaching.md"):
        if not (root / rel).is_file():
            out.append(f"{rel} is missing. Fix: restore it (`git checkout -- {rel}`)")
    try:
        timing_rows(root)
    except ScaffoldError as err:
        out.append(str(err))
    return out


def problems(root: Path = ROOT) -> list[str]:
    """Every disagreement between the course's parts, each with the file to edit and the fix
    (first the files the checks cannot read, alone: the checks need them)."""
    unreadable = check_readable(root)
    if unreadable:
        return unreadable
    return check_files(root) + check_tables(root) + check_timings(root) + check_links(root) + check_points(root)


def release_problems(root: Path = ROOT) -> list[str]:
    """``problems()`` and every placeholder of the templates left in a notebook's files: what
    ``python -m course_utils.scaffold --check`` lists. A fresh scaffold passes the tests (``make
    test-scaffold``) but not this: its example text is there to be replaced."""
    return check_readable(root) or problems(root) + check_placeholders(root)


# --------------------------------------------------------------------------------------------
# The scaffold
# --------------------------------------------------------------------------------------------
def slug(text: str) -> str:
    """'Activation offloading!' -> 'activation_offloading'."""
    s = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    if not s:
        raise ScaffoldError(f"the title {text!r} has no letter or digit (a-z, 0-9) to name the files with.",
                            'give a title with words in it, e.g. "Activation offloading"')
    return s


#: the longest title a notebook takes (its file names hold it, and a heading, a table row and a link)
TITLE_MAX = 80
#: what a title may not hold: markdown's table cells, links, math and HTML; Python's strings
TITLE_FORBIDDEN = '|$`[]<>"\\'


def check_title(text: str) -> str:
    """A new notebook's title, stripped, or ``ScaffoldError`` saying what is wrong with it and the fix."""
    said = repr(text) if len(text) <= 60 else repr(text[:57]) + "..."
    stripped = text.strip()
    fix = 'give a title of plain words, e.g. "Activation offloading"'
    if not stripped:
        raise ScaffoldError("a new notebook needs a title, and this one is empty.", fix)
    if len(stripped) > TITLE_MAX:
        raise ScaffoldError(f"the title {said} has {len(stripped)} characters: the file names, heading and "
                            f"table rows take {TITLE_MAX} at most.", f"{fix}, of {TITLE_MAX} characters or fewer")
    bad = sorted({c for c in stripped if c in TITLE_FORBIDDEN or not c.isprintable()})
    if bad:
        raise ScaffoldError(f"the title {said} holds {', '.join(map(repr, bad))}: a title goes into markdown tables, "
                            f"links and a Python string, which cannot hold {' '.join(TITLE_FORBIDDEN)}, line "
                            "breaks, tabs or other control characters.", fix)
    slug(stripped)
    return stripped


def _fill(text: str, values: dict[str, str], where: str) -> str:
    try:
        return string.Template(text).substitute(values)
    except (KeyError, ValueError) as err:
        raise ScaffoldError(f"{where}: unknown placeholder {err} (known: ${', $'.join(values)}).",
                            "write $$ for a dollar sign in the template") from None


def _notebook_text(template: Path, values: dict[str, str]) -> str:
    nb = json.loads(template.read_text(encoding="utf-8"))
    for k, cell in enumerate(nb["cells"]):
        text = _fill(_source(cell), values, f"{template.name}, cell {k}")
        cell["source"] = text.splitlines(keepends=True)
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _module_text(template: str, values: dict[str, str]) -> str:
    text = _fill((TEMPLATES / template).read_text(), values, template)
    try:
        compile(text, template, "exec")
    except SyntaxError as err:
        raise ScaffoldError(f"the title {values['TITLE']!r} makes {template} invalid Python ({err.msg}).",
                            'give a title of plain words, e.g. "Activation offloading"') from None
    return text


def _insert_row(text: str, heading: str, row_re: str, nn: str, row: str, path: str) -> str:
    """``row`` in the table under ``heading``, after the rows numbered below ``nn`` (rows of
    that section only: a later section's numbered table, the GPU kit's plan say, is not it)."""
    fix = f"restore {path}'s table (`git checkout -- {path}`), then run the scaffold again"
    if heading not in text:
        raise ScaffoldError(f"{path} has no section '{heading}' to add the row {row!r} to.", fix)
    head, rest = text.split(heading, 1)
    lines = rest.split("\n")
    end = next((i for i, line in enumerate(lines) if i and line.startswith("## ")), len(lines))
    rows = [i for i, line in enumerate(lines[:end]) if re.match(row_re, line)]
    if not rows:
        raise ScaffoldError(f"{path}, section '{heading}': no table rows found to add {row!r} after.", fix)
    after = max((i for i in rows if lines[i][2:4] < nn), default=rows[0] - 1)
    lines.insert(after + 1, row)
    return head + heading + "\n".join(lines)


def _read(root: Path, rel: str) -> str:
    try:
        return (root / rel).read_text(encoding="utf-8")
    except (OSError, ValueError) as err:
        raise ScaffoldError(f"{rel} cannot be read ({type(err).__name__}: {err}).",
                            f"restore it (`git checkout -- {rel}`), then run the scaffold again") from None


def _linked_previous(root: Path, prev: Entry, new: Entry, new_title: str) -> str | None:
    """The previous notebook's text with "**Next:** [NN · title](NN_topic.ipynb)." in its last cell
    (before its "**Back to the start:**" line, if any); None if it links to the new one already."""
    nb = json.loads(_read(root, prev.notebook))
    if any(f"{new.stem}.ipynb" in links(_source(c)) for c in nb["cells"] if c["cell_type"] == "markdown"):
        return None
    cell = nb["cells"][-1]
    line = f"**Next:** [{new.nn} · {new_title}]({new.stem}.ipynb)."
    text = _source(cell)
    if "**Back to the start:**" in text:
        text = text.replace("**Back to the start:**", line + "\n**Back to the start:**", 1)
    else:
        text = text.rstrip("\n") + "\n" + line
    cell["source"] = text.splitlines(keepends=True)
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _entry(nn: str, title_text: str | None, root: Path, course: list[Entry]) -> tuple[Entry, str]:
    """The notebook ``nn`` names and its title; ``ScaffoldError`` for a number or title it cannot take."""
    py, nxt = _python(root), next_number(root)
    if not re.fullmatch(r"[0-9]{2}", nn):
        raise ScaffoldError(f"the number {nn!r} is not two digits.", f"give the next free number, e.g. "
                            f"`{py} -m course_utils.scaffold {nxt} \"Its title\"`")
    existing = [e for e in course if e.nn == nn]
    if existing:
        entry = existing[0]
        own = title(root, entry)
        if title_text and title_text.strip() and title_text.strip() != own:
            try:
                shown = check_title(title_text)  # (echoed in the fix only if it could be a title)
            except ScaffoldError:
                shown = "Its title"
            raise ScaffoldError(f"notebook {nn} exists already ({entry.notebook}, '{own}'). Nothing was written.",
                                f"a new notebook takes the next free number, {nxt}: `{py} -m course_utils.scaffold "
                                f"{nxt} \"{shown}\"` (or make new-notebook NN={nxt} TITLE=...); "
                                f"`{py} -m course_utils.scaffold {nn}`, without a title, writes only the parts "
                                f"notebook {nn} lacks")
        return entry, own
    if nn != nxt:
        raise ScaffoldError(f"notebook {nn} does not exist, and a new notebook takes the next number, {nxt}.",
                            f"`{py} -m course_utils.scaffold {nxt} \"Its title\"` (to insert a notebook between, "
                            "renumber the later notebooks by hand)")
    if title_text is None:
        raise ScaffoldError("a new notebook needs a title.", f'`{py} -m course_utils.scaffold {nn} "Its title"`')
    title_text = check_title(title_text)
    return Entry(nn, f"{nn}_{slug(title_text)}"), title_text


def _planned(nn: str, title_text: str | None, root: Path) -> tuple[Entry, list[tuple[str, str, str]], bool]:
    """What the scaffold of ``nn`` will write, every file read and checked first: (the notebook,
    [(path, its new text, the line that says so)], whether to time it). Nothing is written."""
    if not (root / "notebooks").is_dir():
        raise ScaffoldError(f"{root} has no notebooks/.", "run the scaffold from a checkout of the course")
    course = entries(root)
    entry, title_text = _entry(nn, title_text, root, course)
    rows = timing_rows(root)
    values = {"NN": nn, "TITLE": title_text, "STEM": entry.stem, "TITLE_PY": json.dumps(title_text),
              "FIRST_STEM": course[0].stem if course else entry.stem,
              "FIRST_TITLE": title(root, course[0]) if course else title_text}
    texts: dict[str, str] = {}
    for rel, template in ((entry.notebook, "notebook.ipynb"), (entry.solution, "solution.ipynb")):
        if not (root / rel).exists():
            texts[rel] = _notebook_text(TEMPLATES / template, values)
    for rel, template in ((entry.grading, "exercise.py.tmpl"), (entry.wrong, "wrong_answers.py.tmpl")):
        if not (root / rel).exists():
            texts[rel] = _module_text(template, values)
    plan = [(rel, text, f"wrote {rel}") for rel, text in texts.items()]
    if not (root / entry.exercise).exists() or entry.solution in texts:
        plan.append((entry.exercise, _exercise_text(entry, texts.get(entry.solution) or _read(root, entry.solution)),
                     f"wrote {entry.exercise} (generated from the solution)"))
    readme = _read(root, "README.md")
    if entry.stem not in [s for _, s in _readme_rows(readme)]:
        plan.append(("README.md", _insert_row(readme, README_SECTION, r"\| \d\d \| `", nn,
                                              f"| {nn} | `{entry.stem}` | {title_text} |", "README.md"),
                     f"added the row of {nn} to README.md's table '{README_SECTION}'"))
    teaching = _read(root, "docs/teaching.md")
    if nn not in dict(_teaching_rows(teaching)):
        grading = texts.get(entry.grading) or _read(root, entry.grading)
        names = re.search(r"names=\(([^)]*)\)", grading)
        writes = ", ".join(f"`{n}`" for n in re.findall(r'"(\w+)"', names.group(1))) if names else "-"
        plan.append(("docs/teaching.md", _insert_row(teaching, TEACHING_SECTION, r"\| \d\d \| ", nn,
                                                     f"| {nn} | {writes} | {len(_part_keys(grading))} |",
                                                     "docs/teaching.md"),
                     f"added the row of exercise {nn} to docs/teaching.md's table '{TEACHING_SECTION}'"))
    before = [e for e in course if e.nn < nn]
    linked = _linked_previous(root, before[-1], entry, title_text) if before else None
    if linked is not None:
        plan.append((before[-1].notebook, linked, f"linked {before[-1].notebook} to it (**Next:**)"))
    row = rows.get(nn, {})
    return entry, plan, not all(isinstance(row.get(f), int) for f in ("notebooks", "solutions"))


def _exercise_text(entry: Entry, solution: str) -> str:
    """The exercise generated from the solution's text, as ``grading.generate`` writes it."""
    import tempfile

    # lazy: grading.generate imports nbformat (1.5 CPU-s), paid only when an exercise is written
    from .grading.generate import exercise_text

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(entry.solution).name
        path.write_text(solution, encoding="utf-8")
        try:
            return exercise_text(path)
        except ValueError as err:  # SolutionFormatError: a region nbgrader refuses
            raise ScaffoldError(f"{entry.solution}: {err}.", "mark its solution regions as nbgrader's rules say "
                                "(`python -m course_utils.grading.generate --check` names them)") from None


#: what the timing run (``readme --render --timings NN``) rewrites: put back if the scaffold fails
TIMED_FILES = ("results/timings.json", "README.md", "docs/teaching.md", "docs/benchmark.md", "docs/gpu-kit.md")


def _put_back(root: Path, old: dict[str, bytes | None], folders: list[Path], wrote: dict[str, bytes]) -> list[str]:
    """Every file in ``old`` as it was (removed where it was not there), then the ``folders`` the
    scaffold made, if empty. A file the scaffold wrote (``wrote``) that someone changed since is
    left as it is; returns those."""
    changed = []
    for rel, data in old.items():
        path = root / rel
        now = path.read_bytes() if path.is_file() else None
        if rel in wrote and now not in (wrote[rel], data):
            changed.append(rel)
        elif data is None:
            path.unlink(missing_ok=True)
        elif now != data:
            atomic_write(path, data)
    for folder in reversed(folders):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return changed


def scaffold(nn: str, title_text: str | None = None, root: Path = ROOT, timings: bool = True) -> list[str]:
    """Create what notebook ``nn`` lacks (all of it for a new notebook, which needs ``title_text``);
    returns what was done, one line each. Every number, title and file it reads is checked before
    its first write (``ScaffoldError``, nothing written), and if a write or the timing fails, every
    file it wrote is put back as it was."""
    entry, plan, untimed = _planned(nn, title_text, root)
    timed = timings and untimed
    touched = [rel for rel, _, _ in plan] + [rel for rel in TIMED_FILES if timed]
    old = {rel: (root / rel).read_bytes() if (root / rel).is_file() else None for rel in touched}
    folders = sorted({p for rel in touched for p in (root / rel).parents
                      if root in p.parents and not p.exists()}, key=lambda p: len(p.parts))
    done, current, wrote = [], None, {}
    try:
        for current, text, said in plan:
            atomic_write(root / current, text)
            wrote[current] = text.encode() if isinstance(text, str) else text
            done.append(said)
        if timed:
            current = None
            _time(root, nn)
            done.append(f"timed {entry.notebook} and {entry.solution} into results/timings.json and docs/teaching.md")
    except BaseException as err:
        changed = _put_back(root, old, folders, wrote)
        if isinstance(err, OSError):  # (atomic_write's own are RecordErrors already)
            err = write_error(root / (current or "results/timings.json"), err)
        if isinstance(err, CourseError):
            kept = f" but {', '.join(changed)}, changed since it wrote them" if changed else ""
            raise ScaffoldError(f"{err.problem.rstrip('.')}; the scaffold put back every file it had written{kept}: "
                                "the tree is as it was.", err.fix) from err
        raise
    return done


def next_number(root: Path = ROOT) -> str:
    """The number a new notebook takes: the one after the last."""
    course = entries(root)
    return f"{int(course[-1].nn) + 1:02d}" if course else "00"


def _python(root: Path = ROOT) -> str:
    """How the documented commands call Python: the checkout's venv (``make install``) if it has one."""
    return ".venv/bin/python" if (root / ".venv" / "bin" / "python").exists() else "python"


def _time(root: Path, nn: str) -> None:
    """``python -m course_utils.readme --render --timings NN``, in a process of its own (its
    notebooks must import this checkout's course_utils)."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    r = subprocess.run([sys.executable, "-m", "course_utils.readme", "--render", "--timings", nn],
                       cwd=root, env=env, capture_output=True, text=True)
    if r.returncode:
        raise ScaffoldError(f"timing notebook {nn} failed (python -m course_utils.readme --render --timings {nn}):\n"
                            + (r.stdout + r.stderr)[-3000:].rstrip() + "\n",
                            f"run the scaffold again with --no-timings (it keeps the files), make the notebook and its "
                            f"solution run top to bottom, then time them: python -m course_utils.readme --render "
                            f"--timings {nn}")


NEXT_STEPS = """
Next (CONTRIBUTING.md, "Adding a notebook"): replace the template's example, marked {marker}:
  1. write the lesson in {notebook} (keep its shape: question, predict-then-measure, takeaways);
  2. write the exercise in {solution} and its parts in {grading}
     (its check cells' points add up to the parts' points), then
     {py} -m course_utils.grading.generate      # exercises/ from solutions/
  3. list the typical wrong answers in {wrong};
  4. describe it in README.md ('The notebooks') and docs/teaching.md ('Exercises'), and move the examples of
     CONTRIBUTING.md ('Adding a notebook') and the Makefile's new-notebook and check-notebook lines to the
     next free number, {after};
  5. {py} -m course_utils.readme --render --timings {nn}   # its run time
  6. make check-notebook NN={nn}    # scaffold --check (refuses every {marker} left), then its tests
"""


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    """``python -m course_utils.scaffold [NN "Title"] [--check]``: add notebook NN's missing parts,
    or list what disagrees. Exit status 1: ``--check`` found a problem, or a title was given and
    nothing was created; 2: an error."""
    ap = argparse.ArgumentParser(prog="python -m course_utils.scaffold", description=__doc__.splitlines()[0])
    ap.add_argument("nn", nargs="?", help="the notebook's number, two digits (the next one for a new notebook)")
    ap.add_argument("title", nargs="?", help="a new notebook's title, e.g. \"Activation offloading\"")
    ap.add_argument("--check", action="store_true",
                    help=f"only list what is missing or disagrees, and the templates' {PLACEHOLDER} markers left")
    ap.add_argument("--no-timings", action="store_true", help="do not time the new notebook (about a minute)")
    args = ap.parse_args(argv)
    if args.check and args.nn is not None:
        ap.error(f"--check takes no number or title (got {args.nn!r}): run it alone")
    if args.check or args.nn is None:
        found = release_problems(root)
        print("\n".join(found) or "the course's parts agree")
        return 1 if found else 0
    try:
        done = scaffold(args.nn, args.title, root=root, timings=not args.no_timings)
    except CourseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    e = next(e for e in entries(root) if e.nn == args.nn)
    if not done:
        said = f"notebook {e.nn} ({e.notebook}) has all its parts already: nothing was written."
        nxt = (f"a new notebook takes the next free number, {next_number(root)}: `{_python(root)} -m "
               f"course_utils.scaffold {next_number(root)} \"Its title\"`")
        if args.title:  # asked to create, and nothing was created: not a success
            print(f"error: {said} Fix: {nxt}", file=sys.stderr)
            return 1
        print(f"{said} {nxt[0].upper()}{nxt[1:]}")
        return 0
    print("\n".join(done))
    print(NEXT_STEPS.format(nn=e.nn, notebook=e.notebook, solution=e.solution, grading=e.grading, wrong=e.wrong,
                            py=_python(root), marker=PLACEHOLDER, after=next_number(root)))
    return 0


guard(globals(), ScaffoldError)


if __name__ == "__main__":
    sys.exit(main())
