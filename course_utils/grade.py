"""Grade exercise notebooks: ``python -m course_utils.grade PATH... [--json F] [--csv F]``.

Each submission runs top to bottom in a fresh kernel (nbclient), errors allowed, every cell
limited to ``--timeout`` seconds (a looping cell is interrupted, and the next cells still run).
A last cell, added by the grader, then

1. looks for tampering: a ``check_*`` name rebound in the notebook, or a function/class defined
   in the notebook planted into a ``course_utils`` module -- such a submission scores 0 for the
   exercise, with the reason;
2. re-imports ``course_utils.checks`` from disk and runs the exercise's checks on the names the
   notebook defined (the exercise is found from the file name's ``NN_`` prefix).

One broken submission never stops the others. PATH may be a notebook or a folder of them.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell

MARKER = "__COURSE_GRADE__"

GRADING_CELL = r'''
import importlib as _il, json as _json, sys as _sys
_tampered = []
for _name, _val in list(globals().items()):
    if _name.startswith("check_") and getattr(_val, "__module__", None) != "course_utils.checks":
        _tampered.append(f"the notebook redefines {_name}")
for _mname, _mod in list(_sys.modules.items()):
    if _mname == "course_utils" or _mname.startswith("course_utils."):
        for _k, _v in list(vars(_mod).items()):
            if callable(_v) and getattr(_v, "__module__", None) == "__main__":
                _tampered.append(f"{_mname}.{_k} was replaced by code from the notebook")
import course_utils.checks as _checks
_checks = _il.reload(_checks)
_reports = _checks.run_exercise(__NN__, globals(), verbose=False)
print(__MARKER__ + _json.dumps({"reports": [r.as_dict() for r in _reports], "tampered": _tampered}))
'''


@dataclass
class Result:
    submission: str
    exercise: str
    score: int = 0
    max_score: int = 0
    parts: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def percent(self) -> float:
        return round(100 * self.score / self.max_score, 1) if self.max_score else 0.0


def exercise_id(path: Path) -> str:
    m = re.match(r"(\d\d)_", path.name)
    if not m:
        raise ValueError(f"{path.name}: cannot tell the exercise; name it NN_topic.ipynb")
    return m.group(1)


def _max_score(nn_id: str) -> tuple[int, list[dict]]:
    """The parts and maximum of an exercise, from running its checks on nothing."""
    from . import checks

    reports = checks.run_exercise(nn_id, {}, verbose=False)
    parts = [p for r in reports for p in r.as_dict()["parts"]]
    return sum(p["points"] for p in parts), parts


def grade_notebook(path: str | Path, timeout: int = 120, kernel: str = "python3") -> Result:
    """Execute one submission in a fresh kernel and score it. Never raises for a bad notebook."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    path = Path(path)
    try:
        nn_id = exercise_id(path)
    except ValueError as err:
        return Result(path.name, "?", notes=[str(err)])
    max_score, blank_parts = _max_score(nn_id)
    result = Result(path.name, nn_id, max_score=max_score,
                    parts=[dict(p, score=0) for p in blank_parts])
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as err:  # not a notebook at all
        result.notes.append(f"unreadable notebook: {type(err).__name__}: {err}")
        return result
    code = GRADING_CELL.replace("__NN__", repr(nn_id)).replace("__MARKER__", repr(MARKER))
    nb.cells.append(new_code_cell(code))
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel, allow_errors=True,
                            interrupt_on_timeout=True,
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    try:
        client.execute()
    except DeadKernelError:
        result.notes.append("the kernel died (e.g. the notebook exited or ran out of memory)")
        return result
    except Exception as err:  # nbclient failure: report and move on
        result.notes.append(f"could not execute: {type(err).__name__}: {str(err)[:200]}")
        return result

    for i, cell in enumerate(nb.cells[:-1]):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                why = "timed out and was interrupted" if out.get("ename") == "KeyboardInterrupt" \
                    else f"raised {out.get('ename')}: {str(out.get('evalue', ''))[:120]}"
                result.notes.append(f"cell {i} {why}")
    payload = None
    for out in nb.cells[-1].get("outputs", []):
        for line in str(out.get("text", "")).splitlines():
            if line.startswith(MARKER):
                payload = json.loads(line[len(MARKER):])
        if out.get("output_type") == "error":
            result.notes.append(f"grading cell raised {out.get('ename')}: {out.get('evalue')}")
    if payload is None:
        result.notes.append("no score: the grading cell did not finish")
        return result
    if payload["tampered"]:
        result.notes.append("tampering: " + "; ".join(payload["tampered"]) + " -> 0 points")
        for p in result.parts:
            p["message"] = "not scored: tampering"
        return result
    result.parts = [p for r in payload["reports"] for p in r["parts"]]
    result.score = sum(p["score"] for p in result.parts)
    return result


def notebooks_in(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.glob("*.ipynb") if not q.name.startswith("."))
        elif p.exists():
            found.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return found


def grade_many(paths: list[str], timeout: int = 120, progress: bool = True) -> list[Result]:
    from tqdm.auto import tqdm

    results = []
    for nb in tqdm(notebooks_in(paths), desc="grading", unit="notebook", disable=not progress):
        results.append(grade_notebook(nb, timeout=timeout))
    return results


def summary(results: list[Result]) -> str:
    """A plain-text class table: one line per submission, then the class mean."""
    lines = [f"{'submission':<34} {'ex':>3} {'score':>9} {'%':>6}  notes"]
    for r in results:
        failed = [p["name"] for p in r.parts if p["score"] < p["points"]]
        note = "; ".join(r.notes) or (f"failed: {', '.join(failed)}" if failed else "all parts pass")
        lines.append(f"{r.submission:<34} {r.exercise:>3} {r.score:>4}/{r.max_score:<4} "
                     f"{r.percent:>6.1f}  {note[:120]}")
    if results:
        mean = sum(r.percent for r in results) / len(results)
        lines.append(f"{len(results)} submission(s), mean {mean:.1f} %")
    return "\n".join(lines)


def write_csv(results: list[Result], path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submission", "exercise", "score", "max_score", "percent", "failed_parts", "notes"])
        for r in results:
            failed = [f"{p['name']}: {p['message']}" for p in r.parts if p["score"] < p["points"]]
            w.writerow([r.submission, r.exercise, r.score, r.max_score, r.percent,
                        " | ".join(failed), " | ".join(r.notes)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course_utils.grade", description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="notebooks or folders of notebooks")
    ap.add_argument("--json", help="write every detail here")
    ap.add_argument("--csv", help="write the class report here")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per cell (default 120)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    try:
        results = grade_many(args.paths, args.timeout, progress=not args.no_progress)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary(results))
    if args.json:
        Path(args.json).write_text(json.dumps([dict(asdict(r), percent=r.percent) for r in results], indent=2))
    if args.csv:
        write_csv(results, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
