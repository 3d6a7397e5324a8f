"""Fails when a notebook of the checkout (committed, or new and not ignored) carries outputs (``make lint``, part of ``make test``).

Notebooks are committed stripped: outputs are machine-specific (timings, memory addresses, a CPU
learner's "predicted" where a GPU says "measured"), make diffs unreadable and can leak a
solution's results into an exercise. Recorded results meant to be read without running live
under docs/gpu-runs/ and are exempt. Fix: ``make strip`` (or ``jupyter nbconvert
--clear-output --inplace FILE``).

    python tools/check_stripped.py [FILE ...]     # default: every .ipynb of the checkout
    python tools/check_stripped.py --list         # those notebooks' paths, one a line
    python tools/check_stripped.py --dirty        # those of them that carry outputs (make strip clears them)

"Every .ipynb of the checkout" is what git tracks and the new files it does not ignore: a notebook
not yet added to git is checked (and stripped) too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXEMPT = ("docs/gpu-runs/",)


def repository_notebooks(root: Path = ROOT) -> list[Path]:
    """Every .ipynb of the checkout: tracked, and new ones git does not ignore (git ls-files
    --cached --others --exclude-standard), that exist on disk; without git, every .ipynb under root
    outside hidden/build folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.ipynb"],
                             cwd=root, capture_output=True, text=True, check=True).stdout
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [p.relative_to(root).as_posix() for p in root.rglob("*.ipynb")
                 if not any(part.startswith(".") or part == "build" for part in p.relative_to(root).parts)]
    return [root / n for n in sorted(set(names)) if not n.startswith(EXEMPT) and (root / n).is_file()]


def problems(path: Path) -> list[str]:
    """What is not stripped in one notebook, one line per cell."""
    nb = json.loads(path.read_text())
    found = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        what = [w for w, bad in (("outputs", cell.get("outputs")),
                                 ("execution_count", cell.get("execution_count") is not None)) if bad]
        if what:
            found.append(f"cell {i}: {' and '.join(what)}")
    return found


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["--list"], ["--dirty"]):  # --dirty: make strip rewrites only these, leaving the rest as they are
        paths = [p for p in repository_notebooks(root) if argv == ["--list"] or problems(p)]
        print("\n".join(p.relative_to(root).as_posix() for p in paths))
        return 0
    paths = [Path(a).resolve() for a in argv] or repository_notebooks(root)
    bad = {p: problems(p) for p in paths}
    bad = {p: b for p, b in bad.items() if b}
    for p, b in bad.items():
        shown = "; ".join(b[:3]) + (f"; ... {len(b) - 3} more" if len(b) > 3 else "")
        print(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: not stripped ({shown})")
    if bad:
        print(f"{len(bad)} notebook(s) carry outputs. Fix: make strip "
              "(or jupyter nbconvert --clear-output --inplace FILE), then commit again.")
        return 1
    print(f"{len(paths)} notebooks, all stripped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
