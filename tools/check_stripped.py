"""Fails when a notebook of the checkout (committed, or new and not ignored) carries outputs, or
metadata other than what JupyterLab writes (``make lint``, part of ``make test``).

Notebooks are committed stripped: outputs are machine-specific (timings, memory addresses, a CPU
learner's "predicted" where a GPU says "measured"), make diffs unreadable and can leak a
solution's results into an exercise. Recorded results meant to be read without running live
under docs/gpu-runs/ and are exempt. Fix: ``make strip`` (or ``python tools/check_stripped.py
--fix FILE``).

Their metadata is what JupyterLab itself writes into a notebook it opens with the course's kernel
(``LAB_METADATA``): with anything else, opening a notebook marks it modified and autosave rewrites
the tracked file two minutes later. Fix: ``python tools/check_stripped.py --fix``.

    python tools/check_stripped.py [FILE ...]     # default: every .ipynb of the checkout
    python tools/check_stripped.py --list         # those notebooks' paths, one a line
    python tools/check_stripped.py --dirty        # those of them that carry outputs (make strip clears them)
    python tools/check_stripped.py --fix [FILE ...]  # outputs cleared and LAB_METADATA set, in place

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

#: The Python of the course's kernel: ``.venv`` as ``make install`` builds it on the course's
#: machines and in CI (environment.yml pins python=3.11; a test checks the two agree). JupyterLab
#: writes the kernel's full version, so a learner whose kernel runs another Python sees this one
#: value change when a notebook opens (nothing else): ``--fix`` sets it back before a commit.
LAB_PYTHON = "3.11.7"
#: What JupyterLab 4 (4.6.6, .venv) writes into a notebook's metadata when it opens it with the
#: course's kernel (ipykernel 7.4.0's "Python 3 (ipykernel)", the kernelspec ``make install``
#: installs) and autosaves: the kernelspec, and the kernel's ``language_info`` whole. Read off a
#: real JupyterLab in headless Chromium on 2026-11-28: a notebook with ``{"display_name": "Python
#: 3"}`` and ``{"name": "python"}`` was marked modified and rewritten with exactly this (its cells
#: untouched); a notebook that carried exactly this was neither marked modified nor written in
#: 200 s (autosave's interval is 120 s).
LAB_METADATA = {
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                      "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                      "pygments_lexer": "ipython3", "version": LAB_PYTHON},
}


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
    return output_problems(json.loads(path.read_text()))


def output_problems(nb: dict) -> list[str]:
    """``problems`` of a notebook already read."""
    found = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        what = [w for w, bad in (("outputs", cell.get("outputs")),
                                 ("execution_count", cell.get("execution_count") is not None)) if bad]
        if what:
            found.append(f"cell {i}: {' and '.join(what)}")
    return found


def metadata_problems(nb: dict) -> list[str]:
    """How a notebook's kernelspec and language_info differ from ``LAB_METADATA`` (what JupyterLab
    would write on opening it), one line per key; and its cells without an ``id`` (nbformat 4.5
    requires one: JupyterLab adds it on opening, and nbformat warns "MissingIDFieldWarning")."""
    found = []
    for key, want in LAB_METADATA.items():
        have = nb.get("metadata", {}).get(key)
        if have != want:
            found.append(f"metadata.{key} is {json.dumps(have)}, JupyterLab writes {json.dumps(want)}")
    if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) >= (4, 5):
        missing = [i for i, cell in enumerate(nb.get("cells", [])) if not cell.get("id")]
        if missing:
            found.append(f"cells {missing} have no id (nbformat 4.5)")
    return found


def with_lab_metadata(nb: dict) -> dict:
    """``nb`` with its kernelspec and language_info set to ``LAB_METADATA`` (its other metadata kept)."""
    nb.setdefault("metadata", {}).update(json.loads(json.dumps(LAB_METADATA)))
    return nb


def fix(path: Path) -> bool:
    """Clear ``path``'s outputs and execution counts and set ``LAB_METADATA``, in the course's style
    (``json.dumps(indent=1, ensure_ascii=False)``, a final newline; cell ids kept, a missing one
    added); True if the file changed."""
    text = path.read_text(encoding="utf-8")
    nb = with_lab_metadata(json.loads(text))
    taken = {cell.get("id") for cell in nb.get("cells", [])}
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
        if not cell.get("id") and (nb.get("nbformat"), nb.get("nbformat_minor", 0)) >= (4, 5):
            cell["id"] = next(f"c{i}{s}" for s in ("w", *map(str, range(len(taken) + 1))) if f"c{i}{s}" not in taken)
            taken.add(cell["id"])
    new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def _name(p: Path) -> str:
    return str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["--list"], ["--dirty"]):  # --dirty: make strip rewrites only these, leaving the rest as they are
        paths = [p for p in repository_notebooks(root) if argv == ["--list"] or problems(p)]
        print("\n".join(p.relative_to(root).as_posix() for p in paths))
        return 0
    if argv[:1] == ["--fix"]:
        paths = [Path(a).resolve() for a in argv[1:]] or repository_notebooks(root)
        changed = [p for p in paths if fix(p)]
        print(f"{len(changed)} of {len(paths)} notebooks rewritten (outputs cleared, JupyterLab's metadata)"
              + "".join(f"\n  {_name(p)}" for p in changed))
        return 0
    paths = [Path(a).resolve() for a in argv] or repository_notebooks(root)
    notebooks = {p: json.loads(p.read_text()) for p in paths}
    bad = {p: b for p, nb in notebooks.items() if (b := output_problems(nb))}
    for p, b in bad.items():
        shown = "; ".join(b[:3]) + (f"; ... {len(b) - 3} more" if len(b) > 3 else "")
        print(f"{_name(p)}: not stripped ({shown})")
    meta = {p: m for p, nb in notebooks.items() if (m := metadata_problems(nb))}
    for p, m in meta.items():
        print(f"{_name(p)}: opening it in JupyterLab would rewrite it: {'; '.join(m)}")
    if bad:
        print(f"{len(bad)} notebook(s) carry outputs. Fix: make strip "
              "(or python tools/check_stripped.py --fix FILE), then commit again.")
    if meta:
        print(f"{len(meta)} notebook(s) lack the metadata JupyterLab writes. Fix: python tools/check_stripped.py "
              "--fix (or --fix FILE), then commit again.")
    if bad or meta:
        return 1
    print(f"{len(paths)} notebooks, all stripped, with JupyterLab's metadata")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
