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
and times the new notebook; ``problems()`` (run by tests/test_course_layout.py) names every part
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

from .checks import ScaffoldError, guard
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
    """A notebook's title from its first heading: '# 05 · In-place ReLU' -> 'In-place ReLU'."""
    return notebook_title(root / entry.notebook)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


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
    return re.findall(r'\bEX\.part\(\s*"([^"]+)"', (root / e.grading).read_text())


def check_timings(root: Path = ROOT) -> list[str]:
    """results/timings.json: one row per notebook, with its run and its solution's."""
    path = root / "results" / "timings.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else {}
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


def problems(root: Path = ROOT) -> list[str]:
    """Every disagreement between the course's parts, each with the file to edit and the fix."""
    return check_files(root) + check_tables(root) + check_timings(root) + check_links(root) + check_points(root)


def release_problems(root: Path = ROOT) -> list[str]:
    """``problems()`` and every placeholder of the templates left in a notebook's files: what
    ``python -m course_utils.scaffold --check`` lists. A fresh scaffold passes the tests (``make
    test-scaffold``) but not this: its example text is there to be replaced."""
    return problems(root) + check_placeholders(root)


# --------------------------------------------------------------------------------------------
# The scaffold
# --------------------------------------------------------------------------------------------
def slug(text: str) -> str:
    """'Activation offloading!' -> 'activation_offloading'."""
    s = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    if not s:
        raise ValueError(f"the title {text!r} has no letter or digit to name the files with")
    return s


def _fill(text: str, values: dict[str, str], where: str) -> str:
    try:
        return string.Template(text).substitute(values)
    except (KeyError, ValueError) as err:
        raise ValueError(f"{where}: unknown placeholder {err} (known: ${', $'.join(values)}; "
                         "write $$ for a dollar sign)") from None


def _write_notebook(template: Path, dest: Path, values: dict[str, str]) -> None:
    nb = json.loads(template.read_text(encoding="utf-8"))
    for k, cell in enumerate(nb["cells"]):
        text = _fill(_source(cell), values, f"{template.name}, cell {k}")
        cell["source"] = text.splitlines(keepends=True)
    dest.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _insert_row(text: str, heading: str, row_re: str, nn: str, row: str, path: str) -> str:
    """``row`` in the table under ``heading``, after the rows numbered below ``nn`` (rows of
    that section only: a later section's numbered table, the GPU kit's plan say, is not it)."""
    if heading not in text:
        raise ValueError(f"{path} has no section '{heading}' to add the row {row!r} to")
    head, rest = text.split(heading, 1)
    lines = rest.split("\n")
    end = next((i for i, line in enumerate(lines) if i and line.startswith("## ")), len(lines))
    rows = [i for i, line in enumerate(lines[:end]) if re.match(row_re, line)]
    if not rows:
        raise ValueError(f"{path}, section '{heading}': no table rows found to add {row!r} after")
    after = max((i for i in rows if lines[i][2:4] < nn), default=rows[0] - 1)
    lines.insert(after + 1, row)
    return head + heading + "\n".join(lines)


def _link_from_previous(root: Path, prev: Entry, new: Entry, new_title: str) -> bool:
    """Add "**Next:** [NN · title](NN_topic.ipynb)." to the previous notebook's last cell (before
    its "**Back to the start:**" line, if any). False if it links to the new one already."""
    path = root / prev.notebook
    nb = json.loads(path.read_text(encoding="utf-8"))
    if any(f"{new.stem}.ipynb" in links(_source(c)) for c in nb["cells"] if c["cell_type"] == "markdown"):
        return False
    cell = nb["cells"][-1]
    line = f"**Next:** [{new.nn} · {new_title}]({new.stem}.ipynb)."
    text = _source(cell)
    if "**Back to the start:**" in text:
        text = text.replace("**Back to the start:**", line + "\n**Back to the start:**", 1)
    else:
        text = text.rstrip("\n") + "\n" + line
    cell["source"] = text.splitlines(keepends=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


def scaffold(nn: str, title_text: str | None = None, root: Path = ROOT, timings: bool = True) -> list[str]:
    """Create what notebook ``nn`` lacks (all of it for a new notebook, which needs ``title_text``);
    returns what was done, one line each."""

    if not re.fullmatch(r"\d\d", nn):
        raise ValueError(f"the number must have two digits, e.g. 11, not {nn!r}")
    if not (root / "notebooks").is_dir():
        raise ValueError(f"{root} has no notebooks/: run the scaffold from a checkout of the course")
    course = entries(root)
    existing = [e for e in course if e.nn == nn]
    nxt = next_number(root)
    if existing:
        entry = existing[0]
        if title_text and title_text.strip() and slug(title_text) != entry.stem[3:]:
            raise ValueError(f"notebook {nn} exists already ({entry.notebook}, '{title(root, entry)}'): a new "
                             f"notebook takes the next free number, {nxt}: `{_python(root)} -m course_utils.scaffold "
                             f"{nxt} \"{title_text.strip()}\"` (or make new-notebook NN={nxt} TITLE=...); "
                             f"`{_python(root)} -m course_utils.scaffold {nn}`, without a title, writes only the "
                             f"parts notebook {nn} lacks. Nothing was written")
        title_text = title(root, entry)
    else:
        if nn != nxt:
            raise ValueError(f"notebook {nn} does not exist, and a new notebook takes the next number, {nxt} "
                             "(to insert one between, renumber the later notebooks by hand)")
        if not title_text or not title_text.strip():
            raise ValueError(f'a new notebook needs a title: {_python(root)} -m course_utils.scaffold {nn} "Its title"')
        if re.search(r"[|\n$`]", title_text):
            raise ValueError(f"the title {title_text!r} must not contain |, $, ` or a line break (it goes "
                             "into markdown tables and Python strings)")
        title_text = title_text.strip()
        entry = Entry(nn, f"{nn}_{slug(title_text)}")
    values = {"NN": nn, "TITLE": title_text, "STEM": entry.stem, "TITLE_PY": json.dumps(title_text),
              "FIRST_STEM": course[0].stem if course else entry.stem,
              "FIRST_TITLE": title(root, course[0]) if course else title_text}
    done = []
    for rel, template in ((entry.notebook, "notebook.ipynb"), (entry.solution, "solution.ipynb")):
        if not (root / rel).exists():
            _write_notebook(TEMPLATES / template, root / rel, values)
            done.append(f"wrote {rel}")
    for rel, template in ((entry.grading, "exercise.py.tmpl"), (entry.wrong, "wrong_answers.py.tmpl")):
        if not (root / rel).exists():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(_fill((TEMPLATES / template).read_text(), values, template))
            done.append(f"wrote {rel}")
    if not (root / entry.exercise).exists() or f"wrote {entry.solution}" in done:
        # lazy: grading.generate imports nbformat (1.5 CPU-s), paid only when an exercise is written
        from .grading.generate import exercise_text

        (root / entry.exercise).write_text(exercise_text(root / entry.solution))
        done.append(f"wrote {entry.exercise} (generated from the solution)")
    readme = root / "README.md"
    if entry.stem not in [s for _, s in _readme_rows(readme.read_text())]:
        readme.write_text(_insert_row(readme.read_text(), README_SECTION, r"\| \d\d \| `", nn,
                                      f"| {nn} | `{entry.stem}` | {title_text} |", "README.md"))
        done.append(f"added the row of {nn} to README.md's table '{README_SECTION}'")
    teaching = root / "docs" / "teaching.md"
    if nn not in dict(_teaching_rows(teaching.read_text())):
        names = re.search(r"names=\(([^)]*)\)", (root / entry.grading).read_text())
        writes = ", ".join(f"`{n}`" for n in re.findall(r'"(\w+)"', names.group(1))) if names else "-"
        teaching.write_text(_insert_row(teaching.read_text(), TEACHING_SECTION, r"\| \d\d \| ", nn,
                                        f"| {nn} | {writes} | {len(_parts(root, entry))} |", "docs/teaching.md"))
        done.append(f"added the row of exercise {nn} to docs/teaching.md's table '{TEACHING_SECTION}'")
    before = [e for e in course if e.nn < nn]
    if before and _link_from_previous(root, before[-1], entry, title_text):
        done.append(f"linked {before[-1].notebook} to it (**Next:**)")
    row = json.loads((root / "results" / "timings.json").read_text())["rows"].get(nn, {})
    if timings and not all(isinstance(row.get(f), int) for f in ("notebooks", "solutions")):
        _time(root, nn)
        done.append(f"timed {entry.notebook} and {entry.solution} into results/timings.json and docs/teaching.md")
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
        raise ValueError(f"timing notebook {nn} failed (python -m course_utils.readme --render --timings {nn}):\n"
                         + (r.stdout + r.stderr)[-3000:])


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
    if args.check or args.nn is None:
        found = release_problems(root)
        print("\n".join(found) or "the course's parts agree")
        return 1 if found else 0
    try:
        done = scaffold(args.nn, args.title, root=root, timings=not args.no_timings)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    e = next(e for e in entries(root) if e.nn == args.nn)
    if not done:
        said = (f"notebook {e.nn} ({e.notebook}) has all its parts already: nothing was written. A new notebook "
                f"takes the next free number, {next_number(root)}: `{_python(root)} -m course_utils.scaffold "
                f"{next_number(root)} \"Its title\"`")
        if args.title:  # asked to create, and nothing was created: not a success
            print(f"error: {said}", file=sys.stderr)
            return 1
        print(said)
        return 0
    print("\n".join(done))
    print(NEXT_STEPS.format(nn=e.nn, notebook=e.notebook, solution=e.solution, grading=e.grading, wrong=e.wrong,
                            py=_python(root), marker=PLACEHOLDER, after=next_number(root)))
    return 0


guard(globals(), ScaffoldError)


if __name__ == "__main__":
    sys.exit(main())
