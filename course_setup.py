"""Install the course's package, ``course_utils``, on a hosted notebook (Colab, Kaggle, a JupyterHub)
without ever replacing the torch that is there. See docs/hosted-gpu.md.

Every notebook's first cell (``course_utils.hosted.SETUP_CELL``) finds this file -- beside the
notebook, one folder up, one folder down, under ``/content/`` or ``/kaggle/input/`` -- and runs it
(``runpy.run_path``) only when ``course_utils`` cannot be imported: on a checkout of the course
nothing runs. It ships at the root of ``make dist``'s zip, beside the wheel, as it sits at the root
of the repository (the one copy; ``tests/test_hosted.py`` runs it with pip replaced by a recorder).

What it installs: ``$COURSE_UTILS_SOURCE`` if set (a wheel's path, or ``git+https://...`` of the
course), else the newest ``course_utils-*.whl`` beside this file, else one found where the cell
looked. pip runs with a constraint ``torch==<the installed version>``, so it can install or keep
anything except another torch; a torch outside the tested range is kept too, the wheel installed
without its dependencies. ``python course_setup.py`` does the same from a terminal.
"""

from __future__ import annotations

import glob
import importlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

#: the torch versions the course is tested on: pyproject.toml's ``torch>=2.11,<2.16`` (a test checks)
TESTED = ((2, 11), (2, 16))
#: where the notebooks' cell looks for this file, and where this file looks for the wheel
#: (relative to the notebook's folder, the kernel's working directory)
PLACES = ("", "../", "*/", "/content/*/", "/content/drive/MyDrive/*/", "/kaggle/input/*/", "/kaggle/input/*/*/")
WHEEL = "course_utils-*.whl"
#: the packages course_utils needs besides torch (pyproject.toml's dependencies)
DEPENDENCIES = ("numpy", "pandas", "matplotlib", "tqdm")


def source(here: str | None = None) -> str:
    """What pip installs: ``$COURSE_UTILS_SOURCE``, else the newest wheel in ``here`` (this file's
    folder), else the last wheel (in name order) found in ``PLACES``; a RuntimeError naming the fix
    when there is none."""
    if os.environ.get("COURSE_UTILS_SOURCE"):
        return os.environ["COURSE_UTILS_SOURCE"]
    beside = sorted(glob.glob(os.path.join(here, WHEEL))) if here is not None else []
    found = beside or sorted(w for p in PLACES for w in glob.glob(p + WHEEL))
    if not found:
        raise RuntimeError(
            f"course_utils is not installed and no {WHEEL} is beside {os.path.abspath(here or os.curdir)}, beside this "
            "notebook, one folder up or under /content or /kaggle/input. Fix: unzip the whole course zip "
            "(make dist; the wheel sits at its top), or set COURSE_UTILS_SOURCE to a wheel or 'git+https://...' "
            "of the course. On a checkout of the repository: make lab (its kernel has the course installed).")
    return found[-1]


def in_range(version: str, tested: tuple = TESTED) -> bool:
    """Whether torch ``version`` (``2.11.0+cu126``) is in ``[tested[0], tested[1])`` by major.minor."""
    return tested[0] <= tuple(int(x) for x in re.findall(r"\d+", version)[:2]) < tested[1]


def install(src: str) -> str:
    """pip-install ``src`` into this Python, keeping its torch; returns what was done, in words."""
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    if importlib.util.find_spec("torch") is None:
        subprocess.check_call(pip + [src])
        return f"installed course_utils from {src}, with a torch in the tested range (there was none)"
    torch_v = importlib.metadata.version("torch")
    with tempfile.TemporaryDirectory() as tmp:  # pip's constraint file, removed after
        keep = os.path.join(tmp, "keep-torch.txt")
        with open(keep, "w") as f:
            f.write(f"torch=={torch_v}\n")
        if in_range(torch_v):
            subprocess.check_call(pip + ["-c", keep, src])
            return f"installed course_utils from {src}; torch {torch_v} kept (pip was constrained to it)"
        subprocess.check_call(pip + ["--no-deps", src])
        subprocess.check_call(pip + ["-c", keep, *DEPENDENCIES])
    (lo, hi) = TESTED
    return (f"torch {torch_v} is outside the versions the course is tested on (>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}): "
            f"installed course_utils from {src} without its dependencies, torch {torch_v} kept; some cells may fail")


def main(here: str | None = None) -> None:
    """Install course_utils unless it can be imported already; print what was done."""
    if importlib.util.find_spec("course_utils"):
        return
    print(install(source(here)))
    importlib.invalidate_caches()  # the notebook's next `import course_utils` finds it


if __name__ in ("__main__", "<run_path>"):  # run by the notebooks' first cell, or from a terminal
    main(os.path.dirname(__file__) if "__file__" in globals() else None)
