"""Every check cell of every exercise runs the parts its points promise: the cell's nbgrader
points are the sum of the points of the parts its ``check_*`` call runs, and every part of the
exercise is run by some check cell (exercise 07's `bn` part was worth a point that no cell checked:
the cell said 4 points and could return 3). `python -m course_utils.scaffold --check` checks the
total (the cells' points add up to the exercise's max_score) without importing the exercise; this
file checks each cell, and each failure names the file, the cell and the fix."""

import ast
import importlib
import json
from pathlib import Path
from unittest import mock

import nbformat
import pytest

from course_utils import scaffold
from course_utils.grading.registry import MODULES

ROOT = Path(__file__).resolve().parent.parent


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def cell_problems(nn: str, path: Path) -> list[str]:
    """What disagrees between the check cells of solution ``path`` and exercise ``nn``'s parts,
    one message each, naming the file, the cell and the fix."""
    mod = importlib.import_module(f"course_utils.grading.ex{nn}")
    ex, grading = mod.EX, f"course_utils/grading/ex{nn}.py"
    points = {p.key: p.points for p in ex.parts}
    ran: list[list[str]] = []
    nb = nbformat.read(path, as_version=4)
    cells = scaffold.check_cells(path)  # the cells scaffold --check adds up
    if not cells:
        return [f"{_rel(path)}: no check cell (an nbgrader test cell with points that calls check_*): add one, "
                "as course_utils/templates/solution.ipynb does"]
    out, covered = [], set()
    with mock.patch.object(type(ex), "run", lambda self, keys, objects, seed=0, verbose=True: ran.append(list(keys))):
        for k, grade_id, cell_points in cells:
            calls = [n for n in ast.walk(ast.parse(nb.cells[k].source)) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Name) and n.func.id.startswith("check_")]
            ran.clear()
            for call in calls:
                getattr(mod, call.func.id)(*[None] * len(call.args))
            keys = [key for r in ran for key in r]
            worth = sum(points[key] for key in keys)
            if worth != cell_points:
                names = ", ".join(f"{c.func.id}(...)" for c in calls) or "no check_* call"
                out.append(f"{_rel(path)}, check cell {k} '{grade_id}': its nbgrader points are "
                           f"{cell_points}, but {names} runs parts {keys} worth {worth} (their points in "
                           f"{grading}): set the cell's points (metadata.nbgrader.points) to {worth}, or change "
                           f"the parts' points in {grading}; the check cells' points add up to exercise {nn}'s "
                           f"max_score, {ex.max_score}. Then `.venv/bin/python -m course_utils.grading.generate`")
            covered.update(keys)
    missing = [key for key in points if key not in covered]
    if missing:
        out.append(f"{_rel(path)}: no check cell runs part(s) {missing} of {grading}: call the check_* function "
                   "that runs them in a check cell (or add them to its EX.run list), and add their points to "
                   "that cell's")
    return out


@pytest.mark.parametrize("nn", sorted(MODULES))
def test_each_check_cell_runs_the_parts_its_points_say(nn):
    found = cell_problems(nn, next((ROOT / "solutions").glob(f"{nn}_*.ipynb")))
    assert not found, "\n".join(found)


def test_a_wrong_points_total_is_named_with_the_file_the_cell_and_the_fix(tmp_path):
    """Issue 45: a check cell worth a point too many failed here with a bare tuple, and passed
    every check CONTRIBUTING.md gave."""
    path = next((ROOT / "solutions").glob("00_*.ipynb"))
    nb = json.loads(path.read_text(encoding="utf-8"))
    k, grade_id, pts = scaffold.check_cells(path)[0]
    nb["cells"][k]["metadata"]["nbgrader"]["points"] = pts + 1
    wrong = tmp_path / path.name
    wrong.write_text(json.dumps(nb), encoding="utf-8")
    (found,) = cell_problems("00", wrong)
    assert found.startswith(f"{wrong}, check cell {k} '{grade_id}': its nbgrader points are {pts + 1}"), found
    assert f"set the cell's points (metadata.nbgrader.points) to {pts}" in found, found
    assert "course_utils/grading/ex00.py" in found and "max_score, 5" in found, found


@pytest.mark.parametrize("nn", sorted(MODULES))
def test_the_scaffold_reads_each_parts_points_as_the_exercise_has_them(nn):
    """`scaffold --check` reads the points from the module's source (it must not import another
    checkout's module): what it reads is what the exercise holds."""
    ex = importlib.import_module(f"course_utils.grading.ex{nn}").EX
    entry = next(e for e in scaffold.entries() if e.nn == nn)
    assert scaffold.part_points(ROOT, entry) == {p.key: p.points for p in ex.parts}
