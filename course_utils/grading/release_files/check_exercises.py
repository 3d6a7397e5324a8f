"""Your exercises, checked part by part: ``python check_exercises.py [NN ...]`` (``make check EX=NN``).

Runs each exercise notebook in ``exercises/`` (or the ones named: ``03``, or a path) top to bottom
in a fresh kernel -- the file is not changed -- and prints every part's result, the cells that
raised and the exercise's points. The exit status is 1 while a part that this release can check
does not pass, or a cell raises; the parts checked by your teacher's grader are listed, not counted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
MARK = "__check_exercises__"
REPORT = """
import json as _json
from course_utils.grading.registry import exercise as _exercise
_ex = _exercise({nn!r})
print({mark!r} + _json.dumps([
    dict(name=_p.name, points=_p.points,
         state="not run" if _p.key not in _ex.latest else
               "teacher" if not _ex.latest[_p.key].checked else
               "pass" if _ex.latest[_p.key].passed else "fail",
         message=_ex.latest[_p.key].message if _p.key in _ex.latest else "")
    for _p in _ex.parts]))
"""


def notebooks(args: list[str]) -> list[Path]:
    """The exercise notebooks to check: all of ``exercises/``, or those named by number or path."""
    if not args:
        return sorted((HERE / "exercises").glob("[0-9][0-9]_*.ipynb"))
    out = []
    for arg in args:
        path = Path(arg)
        found = [path] if path.suffix == ".ipynb" else sorted((HERE / "exercises").glob(f"{arg}_*.ipynb"))
        if not found or not found[0].exists():
            raise SystemExit(f"no exercise {arg!r}: give its number (03) or its file (exercises/03_....ipynb)")
        out += found
    return out


def check(path: Path, timeout: int = 600) -> bool:
    """Run ``path`` and print its parts' results; True when every part this release can check passes."""
    nn = path.name[:2]
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    raised = []
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            client.execute_cell(cell, index)
            for out in cell.outputs:
                if out.output_type == "error":
                    raised.append(f"cell [{cell.execution_count}] raised {out.ename}: {out.evalue}")
        report = nbformat.v4.new_code_cell(REPORT.format(nn=nn, mark=MARK))
        nb.cells.append(report)
        client.execute_cell(report, len(nb.cells) - 1)
    text = "".join(o.get("text", "") for o in report.outputs if o.output_type == "stream")
    if MARK not in text:
        errors = [f"{o.ename}: {o.evalue}" for o in report.outputs if o.output_type == "error"]
        print(f"{path.name}: could not read the results ({'; '.join(errors) or 'no output'})")
        return False
    parts = json.loads(text.split(MARK, 1)[1].splitlines()[0])
    checkable = [p for p in parts if p["state"] != "teacher"]
    score = sum(p["points"] for p in checkable if p["state"] == "pass")
    teacher = [p for p in parts if p["state"] == "teacher"]
    note = f" ({len(teacher)} more checked by your teacher's grader)" if teacher else ""
    print(f"{path.name}: {score}/{sum(p['points'] for p in checkable)} points{note}")
    for p in parts:
        label = {"pass": "PASS", "fail": "FAIL", "not run": "NOT RUN", "teacher": "TEACHER"}[p["state"]]
        reason = {"not run": "its check cell did not run", "teacher": "checked by your teacher's grader"}.get(
            p["state"], p["message"])
        print(f"  [{label}] {p['name']} ({p['points']})" + (f": {reason}" if reason else ""))
    for line in raised:
        print(f"  {line}")
    return not raised and all(p["state"] == "pass" for p in checkable)


def main(argv: list[str] | None = None) -> int:
    """Check every exercise named (all by default); returns 1 while one has a part to fix, else 0."""
    # the kernels import this folder's course_utils, installed or not
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    paths = notebooks(sys.argv[1:] if argv is None else argv)
    results = [check(path) for path in paths]
    if not all(results):
        print(f"{results.count(False)} of {len(results)} exercises have parts to fix (above).")
        return 1
    print(f"all {len(results)} exercises pass every part this release can check.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
