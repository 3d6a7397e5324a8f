"""The built wheel where a hosted notebook would install it: a fresh venv that already has a torch
other than the course's pinned 2.13. ``make test-hosted`` (not in CI: slow, and the first test
needs ``make test-compat``'s torch 2.11 venv).

Each test unzips ``dist/gpu-memory-course.zip`` (``make dist``) outside the checkout, runs the
notebooks' setup cell (``hosted.SETUP_CELL``) with the venv's Python in ``notebooks/`` -- it must
find the bootstrap ``course_setup.py`` one folder up, which finds the wheel beside it and installs
it with pip constrained to the installed torch -- and checks that torch is the same version, from
the same place, afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from course_utils import hosted

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
pytestmark = [pytest.mark.hosted, pytest.mark.timeout(2400)]

#: what the fresh venv's Python prints about its torch and the course's package
PROBE = ("import importlib.metadata, importlib.util, json, torch; s = importlib.util.find_spec('course_utils'); "
         "print(json.dumps({'torch': torch.__version__, 'torch_file': torch.__file__, "
         "'torch_dist': importlib.metadata.version('torch'), "
         "'course_utils': s.origin if s else None}))")


def _env() -> dict[str, str]:
    """No PYTHONPATH (the checkout must not be importable), no GPU, the tiny preset."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "COURSE_UTILS_SOURCE")}
    return {**env, "COURSE_SIZE": "tiny", "CUDA_VISIBLE_DEVICES": "", "MPLBACKEND": "Agg"}


def _run(cmd: list[str], cwd: Path, timeout: int = 1500) -> str:
    p = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def _probe(python: Path, cwd: Path) -> dict:
    return json.loads(_run([str(python), "-c", PROBE], cwd).strip().splitlines()[-1])


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """The learner's zip, unzipped outside the checkout; returns its folder."""
    zpath = DIST / f"{hosted.ZIP_TOP}.zip"
    if not zpath.exists():
        pytest.fail(f"{zpath} is missing. Fix: make dist (make test-hosted runs it first)")
    out = tmp_path_factory.mktemp("learner")
    with zipfile.ZipFile(zpath) as z:
        z.extractall(out)
    return out / hosted.ZIP_TOP


def _setup_cell(python: Path, course: Path) -> str:
    """The notebooks' first cell, run by ``python`` in notebooks/ as a kernel would (it runs
    ``../course_setup.py``)."""
    return _run([str(python), "-c", hosted.SETUP_CELL], course / "notebooks")


def _link_torch(compat: Path, venv: Path) -> Path:
    """Put the compat venv's torch and the packages it needs (not the rest) on the fresh venv's
    path: a folder of links, named in a .pth file. Returns that folder."""
    closure = r"""
import importlib.metadata as md, json, re
from pip._vendor.packaging.requirements import Requirement
seen, todo, tops = set(), ["torch"], set()
while todo:
    name = todo.pop()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        continue
    seen.add(key)
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    for f in dist.files or []:
        if not str(f).startswith(".."):
            tops.add(str(f).split("/")[0])
    for r in dist.requires or []:
        req = Requirement(r)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            todo.append(req.name)
print(json.dumps({"site": [p for p in __import__("sys").path if p.endswith("site-packages")][0], "tops": sorted(tops)}))
"""
    info = json.loads(subprocess.run([str(compat / "bin" / "python"), "-c", closure], capture_output=True,
                                     text=True, check=True, env=_env()).stdout)
    links = venv.parent / "torch-only"
    links.mkdir()
    for top in info["tops"]:
        src = Path(info["site"]) / top
        if src.exists() and not top.endswith(".pth") and top != "__pycache__":
            (links / top).symlink_to(src)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "torch-only.pth").write_text(f"{links}\n")
    return links


def _record(name: str, text: str) -> None:
    out = ROOT / "build" / "test-hosted"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.txt").write_text(text)


def test_torch_2_11_is_kept_and_notebook_00_runs(course, tmp_path):
    """A fresh Python 3.12 venv holding only the compat venv's torch 2.11 (a CUDA build, as on a
    hosted GPU): the setup cell installs the wheel, torch is unchanged, notebook 00 passes nbval."""
    compat = Path(os.environ.get("COURSE_COMPAT_VENV", ROOT / ".venv-torch-2.11.0"))
    if not (compat / "bin" / "python").exists():
        pytest.fail(f"no venv with torch 2.11 at {compat}. Fix: make test-compat TORCH=2.11.0, or "
                    "make test-hosted COMPAT_VENV=<a venv with another torch>")
    t0 = time.time()
    base = _run([str(compat / "bin" / "python"), "-c", "import sys; print(sys._base_executable)"], tmp_path).strip()
    venv = tmp_path / "venv"
    _run([base, "-m", "venv", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    links = _link_torch(compat, venv)
    before = _probe(python, tmp_path)
    assert before["course_utils"] is None and not before["torch"].startswith("2.13"), before
    said = _setup_cell(python, course)
    assert f"torch {before['torch_dist']} kept" in said and "../course_utils-" in said, said
    # what nbval and a kernel need, under the same constraint (a hosted notebook has them)
    keep = tmp_path / "keep-torch.txt"
    keep.write_text(f"torch=={before['torch_dist']}\n")
    _run([str(python), "-m", "pip", "install", "-q", "-c", str(keep), "nbval", "ipykernel"], tmp_path)
    _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--nbval-lax",
          "--nbval-cell-timeout=600", "notebooks/00_gpu_memory_basics.ipynb"], course)
    after = _probe(python, tmp_path)
    assert (after["torch"], after["torch_dist"], after["torch_file"]) == (
        before["torch"], before["torch_dist"], before["torch_file"]), (before, after)
    assert Path(after["torch_file"]).parent.parent == links and str(venv) in after["course_utils"]
    _record("torch-2.11", f"torch {after['torch']} kept ({after['torch_file']}); course_utils from "
            f"{after['course_utils']}; setup cell said: {said.strip()}; notebook 00 passed nbval; "
            f"{time.time() - t0:.0f} s")


def test_torch_2_13_from_the_index_and_import_outside_the_checkout(course, tmp_path):
    """The fast variant (any machine with pip's index): a fresh venv, no system site packages,
    torch 2.13.0 from pip, then the setup cell; torch unchanged and course_utils importable
    from outside the checkout, from the venv."""
    t0 = time.time()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0"], tmp_path)
    before = _probe(python, tmp_path)
    said = _setup_cell(python, course)
    assert f"torch {before['torch_dist']} kept" in said, said
    after = _probe(python, tmp_path)
    assert (after["torch"], after["torch_dist"], after["torch_file"]) == (
        before["torch"], before["torch_dist"], before["torch_file"]), (before, after)
    assert after["course_utils"] and str(venv) in after["course_utils"], after
    out = _run([str(python), "-c", "import course_utils as cu; print(cu.setup(size='tiny'))"], tmp_path)
    assert "preset: tiny" in out
    _record("torch-2.13", f"torch {after['torch']} kept; course_utils from {after['course_utils']}; "
            f"{time.time() - t0:.0f} s")
