"""Generate the exercise notebooks from the solutions: one source of truth.

In ``solutions/NN_topic.ipynb`` every answer sits between nbgrader's markers, inside a function
or method body::

    def tensor_nbytes(shape, dtype):
        ### BEGIN SOLUTION
        ### HINT: numel x element size; torch.empty((), dtype=dtype).element_size()
        return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        ### END SOLUTION

``exercises/NN_topic.ipynb`` gets, in place of each region, its hints as comments and a stub
that raises ``NotImplementedError``; outputs are cleared. Teachers using nbgrader can take the
solutions as they are.

    python -m course_utils.exercises            # (re)write exercises/ from solutions/
    python -m course_utils.exercises --check    # exit 1 if a committed exercise is stale
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import nbformat

BEGIN, END, HINT = "### BEGIN SOLUTION", "### END SOLUTION", "### HINT:"
ROOT = Path(__file__).resolve().parent.parent


def stub_source(source: str, where: str = "") -> str:
    """Replace every solution region in one cell's source by its hints and a stub."""
    out: list[str] = []
    region: list[str] | None = None
    indent = ""
    for line in source.splitlines():
        stripped = line.strip()
        if stripped == BEGIN:
            if region is not None:
                raise ValueError(f"{where}: nested '{BEGIN}'")
            region, indent = [], line[: len(line) - len(line.lstrip())]
        elif stripped == END:
            if region is None:
                raise ValueError(f"{where}: '{END}' without '{BEGIN}'")
            hints = [ln.strip()[len(HINT):].strip() for ln in region if ln.strip().startswith(HINT)]
            out += [f"{indent}# Hint: {h}" for h in hints]
            out.append(f'{indent}# YOUR CODE HERE')
            out.append(f'{indent}raise NotImplementedError("replace this line with your code")')
            region = None
        elif region is not None:
            region.append(line)
        else:
            out.append(line)
    if region is not None:
        raise ValueError(f"{where}: '{BEGIN}' without '{END}'")
    return "\n".join(out)


def make_exercise(solution: nbformat.NotebookNode, name: str = "") -> nbformat.NotebookNode:
    nb = copy.deepcopy(solution)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.source = stub_source(cell.source, f"{name} cell {i}")
            cell.outputs, cell.execution_count = [], None
    return nb


def generate(check: bool = False, root: Path = ROOT) -> list[str]:
    """Write (or, with ``check``, compare) every exercise; returns the stale ones' names."""
    stale = []
    for sol in sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb")):
        ex = root / "exercises" / sol.name
        text = nbformat.writes(make_exercise(nbformat.read(sol, as_version=4), sol.name)) + "\n"
        if not ex.exists() or ex.read_text() != text:
            stale.append(sol.name)
            if not check:
                ex.parent.mkdir(exist_ok=True)
                ex.write_text(text)
    return stale


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report stale exercises")
    args = ap.parse_args(argv)
    stale = generate(check=args.check)
    if args.check and stale:
        print("stale exercises (run: python -m course_utils.exercises):", ", ".join(stale))
        return 1
    print(("up to date" if args.check else f"wrote {len(stale)} exercise(s)") +
          (f": {', '.join(stale)}" if stale and not args.check else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
