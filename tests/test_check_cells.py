"""Every check cell of every exercise runs the parts its points promise: the cell's nbgrader
points are the sum of the points of the parts its ``check_*`` call runs, and every part of the
exercise is run by some check cell (exercise 07's `bn` part was worth a point that no cell checked:
the cell said 4 points and could return 3)."""

import ast
import importlib
from pathlib import Path

import nbformat
import pytest

from course_utils.grading.registry import MODULES

ROOT = Path(__file__).resolve().parent.parent


def _check_cells(nb):
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            yield cell, meta


@pytest.mark.parametrize("nn", sorted(MODULES))
def test_each_check_cell_runs_the_parts_its_points_say(nn, monkeypatch):
    mod = importlib.import_module(f"course_utils.grading.ex{nn}")
    ex = mod.EX
    ran: list[list[str]] = []
    monkeypatch.setattr(type(ex), "run", lambda self, keys, objects, seed=0, verbose=True: ran.append(list(keys)))
    points = {p.key: p.points for p in ex.parts}
    covered: set[str] = set()
    nb = nbformat.read(next((ROOT / "solutions").glob(f"{nn}_*.ipynb")), as_version=4)
    cells = list(_check_cells(nb))
    assert cells, f"solutions/{nn}: no check cell"
    for cell, meta in cells:
        calls = [n for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Name) and n.func.id.startswith("check_")]
        ran.clear()
        for call in calls:
            getattr(mod, call.func.id)(*[None] * len(call.args))
        keys = [k for r in ran for k in r]
        assert sum(points[k] for k in keys) == meta["points"], (meta["grade_id"], keys, meta["points"])
        covered.update(keys)
    assert covered == set(points), f"exercise {nn}: parts no check cell runs: {sorted(set(points) - covered)}"
