"""Generate the exercise notebooks from the solutions: one source of truth, nbgrader's rules.

In ``solutions/NN_topic.ipynb`` every answer sits in a cell marked as an nbgrader *solution cell*
(cell metadata ``nbgrader.solution: true``), between a line containing ``BEGIN SOLUTION`` and one
containing ``END SOLUTION`` -- nbgrader's own rule: ``### BEGIN SOLUTION`` and ``# BEGIN SOLUTION``
both mark a region. Hints go *above* the region as ordinary comments, so that they survive both
this generator and ``nbgrader generate_assignment``::

    def tensor_nbytes(shape, dtype):
        # Hint: how many elements, and how many bytes each?
        ### BEGIN SOLUTION
        return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        ### END SOLUTION

``exercises/NN_topic_exercise.ipynb`` (``course_utils.layout``) gets nbgrader's stub in place of each region (``# YOUR CODE HERE`` /
``raise NotImplementedError()``; ``YOUR ANSWER HERE`` in a markdown solution cell; a solution
cell without a region is replaced whole), no outputs, no execution counts and no execution
metadata -- the same code nbgrader's ``generate_assignment`` releases. Errors (as nbgrader's):
a region in a cell that is not a solution cell, nested or unclosed regions; and, beyond
nbgrader, a ``### HINT:`` line inside a region (it would silently disappear).

    python -m course_utils.grading.generate            # (re)write exercises/ from solutions/
    python -m course_utils.grading.generate --check    # exit 1 if an exercise is stale or orphaned
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import nbformat

from ..layout import exercise_name

BEGIN, END = "BEGIN SOLUTION", "END SOLUTION"
CODE_STUB = ["# YOUR CODE HERE", "raise NotImplementedError()"]  # nbgrader's python code_stub
TEXT_STUB = "YOUR ANSWER HERE"  # nbgrader's text_stub
ROOT = Path(__file__).resolve().parents[2]
#: cell metadata that records a run (nbclient's timings, JupyterLab's execution state)
RUN_METADATA = ("execution", "collapsed", "scrolled")


class SolutionFormatError(ValueError):
    """A solution notebook breaks nbgrader's rules (a region outside a solution cell, nested or
    unclosed regions, a hint inside one); the message names the notebook and cell."""

    pass


def is_solution(cell) -> bool:
    """Whether ``cell`` is marked as an nbgrader solution cell (metadata ``nbgrader.solution``)."""
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution", False))


def stub_cell_source(source: str, cell_type: str = "code", where: str = "") -> tuple[str, bool]:
    """Replace each solution region by nbgrader's stub; returns (new source, found a region)."""
    out: list[str] = []
    inside, found = False, False
    for line in source.split("\n"):
        if BEGIN in line:
            if inside:
                raise SolutionFormatError(f"{where}: nested '{BEGIN}'")
            inside = found = True
            indent = re.match(r"\s*", line).group(0)
            stub = CODE_STUB if cell_type == "code" else [TEXT_STUB]
            out += [indent + s for s in stub]
        elif END in line:
            if not inside:
                raise SolutionFormatError(f"{where}: '{END}' without '{BEGIN}'")
            inside = False
        elif inside:
            if re.match(r"\s*#+\s*HINT", line, re.IGNORECASE):
                raise SolutionFormatError(f"{where}: a hint inside a solution region is removed with it: "
                                          "put hints as comments above the BEGIN SOLUTION line")
        else:
            out.append(line)
    if inside:
        raise SolutionFormatError(f"{where}: '{BEGIN}' without '{END}'")
    return "\n".join(out), found


def make_exercise(solution: nbformat.NotebookNode, name: str = "") -> nbformat.NotebookNode:
    """The exercise notebook of ``solution``: each solution region replaced by nbgrader's stub, no
    outputs, execution counts or run metadata (a copy: ``solution`` is not changed)."""
    nb = copy.deepcopy(solution)
    for i, cell in enumerate(nb.cells):
        where = f"{name} cell {i} ({cell.cell_type})"
        src, found = stub_cell_source(cell.source, cell.cell_type, where)
        if found and not is_solution(cell):
            raise SolutionFormatError(f"{where}: solution region in a cell that is not marked as an "
                                      "nbgrader solution cell (metadata nbgrader.solution: true)")
        if is_solution(cell) and not found:
            src = "\n".join(CODE_STUB) if cell.cell_type == "code" else TEXT_STUB
        cell.source = src
        for key in RUN_METADATA:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    return nb


def exercise_text(solution_path: Path) -> str:
    """The text of the exercise notebook generated from the solution at ``solution_path``."""
    nb = make_exercise(nbformat.read(solution_path, as_version=4), solution_path.name)
    return nbformat.writes(nb) + "\n"


def generate(check: bool = False, root: Path = ROOT) -> tuple[list[str], list[str]]:
    """Write (or with ``check`` only compare) every exercise. Returns (stale, orphaned): exercises
    that differ from their solution, and exercises whose solution no longer exists (removed
    unless ``check``)."""
    solutions = sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb"))
    stale = []
    for sol in solutions:
        ex = root / "exercises" / exercise_name(sol.name)
        text = exercise_text(sol)
        if not ex.exists() or ex.read_text() != text:
            stale.append(sol.name)
            if not check:
                ex.parent.mkdir(exist_ok=True)
                ex.write_text(text)
    names = {exercise_name(s.name) for s in solutions}
    orphaned = sorted(p.name for p in (root / "exercises").glob("*.ipynb") if p.name not in names)
    if not check:
        for name in orphaned:
            (root / "exercises" / name).unlink()
    return stale, orphaned


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils.grading.generate [--check]``; returns the exit status (1: ``--check``
    found a stale or orphaned exercise, 2: a solution breaks nbgrader's rules)."""
    ap = argparse.ArgumentParser(prog="python -m course_utils.grading.generate",
                                 description="exercises/ from solutions/ (nbgrader's rules)")
    ap.add_argument("--check", action="store_true", help="only report stale or orphaned exercises")
    args = ap.parse_args(argv)
    try:
        stale, orphaned = generate(check=args.check)
    except SolutionFormatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.check:
        if stale or orphaned:
            if stale:
                print("stale exercises (run: python -m course_utils.grading.generate):", ", ".join(stale))
            if orphaned:
                print("exercises without a solution (delete them, or restore the solution):", ", ".join(orphaned))
            return 1
        print("up to date")
        return 0
    print(f"wrote {len(stale)} exercise(s)" + (f": {', '.join(stale)}" if stale else "")
          + (f"; removed {', '.join(orphaned)} (no solution)" if orphaned else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
