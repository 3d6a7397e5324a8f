"""The course on a hosted GPU notebook (course_utils.hosted): the setup cell every notebook starts
with, make dist's zip, and docs/hosted-gpu.md's tiers table. The wheel installed into fresh venvs
is tests/test_hosted_install.py (make test-hosted)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from course_utils import hosted
from course_utils.markdown import links

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------------
# The setup cell, run with find_spec, torch's version and pip replaced
# --------------------------------------------------------------------------------------------
@pytest.fixture
def cell(monkeypatch, tmp_path):
    """Run SETUP_CELL as a notebook would, in an empty folder; returns run(installed, torch) ->
    (pip calls, constraint files' text, printed text)."""
    calls, constraints = [], []
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COURSE_UTILS_SOURCE", raising=False)

    def check_call(cmd, *a, **k):
        calls.append(list(cmd))
        if "-c" in cmd:
            constraints.append(Path(cmd[cmd.index("-c") + 1]).read_text())
        return 0

    def run(installed: set[str], torch_version: str | None, capsys):
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: real("json") if name in installed else None)
        monkeypatch.setattr(importlib.metadata, "version", lambda name: torch_version)
        monkeypatch.setattr(subprocess, "check_call", check_call)
        temp = tmp_path / "temp"
        temp.mkdir(exist_ok=True)
        monkeypatch.setattr(tempfile, "tempdir", str(temp))
        exec(compile(hosted.SETUP_CELL, "<setup cell>", "exec"), {"__name__": "__main__"})
        assert not list(temp.iterdir()), "the setup cell left a temporary file behind (a learner's /tmp fills up)"
        return calls, constraints, capsys.readouterr().out

    return run


def test_on_a_checkout_the_cell_does_nothing_and_says_nothing(cell, capsys):
    calls, _, out = cell({"course_utils", "torch"}, "2.13.0", capsys)
    assert calls == [] and out == ""


def test_the_wheel_beside_the_notebook_is_installed_with_torch_held(cell, capsys, tmp_path):
    (tmp_path / "course_utils-0.1.0-py3-none-any.whl").write_bytes(b"")
    calls, constraints, out = cell({"torch"}, "2.11.0+cu126", capsys)
    assert calls == [[sys.executable, "-m", "pip", "install", "-q", "-c", calls[0][6],
                      "course_utils-0.1.0-py3-none-any.whl"]]
    assert constraints == ["torch==2.11.0+cu126\n"]  # pip can never replace this torch
    assert "torch 2.11.0+cu126 kept" in out and "course_utils-0.1.0-py3-none-any.whl" in out


def test_the_wheel_one_folder_up_is_found(cell, capsys, tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "course_utils-0.1.0-py3-none-any.whl").write_bytes(b"")
    import os

    os.chdir(tmp_path / "notebooks")  # a notebook's kernel starts in its folder
    calls, _, _ = cell({"torch"}, "2.15.0", capsys)
    assert calls[0][-1] == "../course_utils-0.1.0-py3-none-any.whl"


def test_a_torch_outside_the_tested_range_is_kept_and_said(cell, capsys, tmp_path):
    (tmp_path / "course_utils-0.1.0-py3-none-any.whl").write_bytes(b"")
    calls, constraints, out = cell({"torch"}, "2.9.1+cu128", capsys)
    assert calls[0][-2:] == ["--no-deps", "course_utils-0.1.0-py3-none-any.whl"]
    assert "-c" in calls[1] and "course_utils-0.1.0-py3-none-any.whl" not in calls[1]
    assert constraints == ["torch==2.9.1+cu128\n"]
    assert "outside the versions the course is tested on (>=2.11,<2.16)" in out and "2.9.1+cu128 kept" in out


def test_the_range_edges(cell, capsys, tmp_path):
    (tmp_path / "course_utils-0.1.0-py3-none-any.whl").write_bytes(b"")
    calls, _, _ = cell({"torch"}, "2.16.0", capsys)
    assert "--no-deps" in calls[0]  # the upper bound is excluded, as in pyproject.toml


def test_source_from_the_environment_wins(cell, capsys, monkeypatch):
    monkeypatch.setenv("COURSE_UTILS_SOURCE", "git+https://example.org/course.git")
    calls, _, _ = cell({"torch"}, "2.13.0", capsys)
    assert calls[0][-1] == "git+https://example.org/course.git"


def test_nothing_to_install_is_an_error_that_names_the_fix(cell, capsys):
    with pytest.raises(RuntimeError, match="Fix: upload and unzip the course's zip .*COURSE_UTILS_SOURCE"):
        cell({"torch"}, "2.13.0", capsys)


def test_the_tested_range_is_pyprojects():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_dep = next(d for d in deps if d.startswith("torch"))
    lo, hi = hosted.TORCH_RANGE
    assert torch_dep == f"torch>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}", (
        f"pyproject.toml says {torch_dep!r}: set course_utils.hosted.TORCH_RANGE to match and run "
        "python -m course_utils.hosted --update-cells")


# --------------------------------------------------------------------------------------------
# Every notebook carries the current cell
# --------------------------------------------------------------------------------------------
def test_every_notebook_starts_with_the_current_setup_cell():
    problems = hosted.cell_problems()
    assert not problems, "\n".join(problems)
    assert len(hosted.notebook_paths()) >= 2 * 11 + 2  # notebooks, solutions, the two templates


def _copy(tmp_path: Path) -> Path:
    for sub in ("notebooks", "solutions", "exercises", "course_utils/templates"):
        shutil.copytree(ROOT / sub, tmp_path / sub, ignore=shutil.ignore_patterns("*.py*", "*.tmpl"))
    return tmp_path


def _edit(path: Path, fn) -> None:
    nb = json.loads(path.read_text())
    fn(nb)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def test_a_missing_stale_or_late_cell_is_named_with_its_fix(tmp_path):
    root = _copy(tmp_path)
    _edit(root / "notebooks/05_inplace_relu.ipynb", lambda nb: nb["cells"].pop(hosted.setup_cell_index(nb)))

    def stale(nb):
        nb["cells"][hosted.setup_cell_index(nb)]["source"] = "# an old setup cell\n"
    _edit(root / "exercises/03_memory_limit_test_exercise.ipynb", stale)

    def late(nb):
        nb["cells"].insert(3, nb["cells"].pop(hosted.setup_cell_index(nb)))
    _edit(root / "solutions/07_checkpointing.ipynb", late)
    problems = "\n".join(hosted.cell_problems(root))
    assert "notebooks/05_inplace_relu.ipynb: no setup cell" in problems
    assert "exercises/03_memory_limit_test_exercise.ipynb: its setup cell differs" in problems
    assert "solutions/07_checkpointing.ipynb: the setup cell is code cell" in problems
    assert "--update-cells" in problems
    hosted.update_cells(root)  # the fix puts the first two right (exercises: after the generator)
    left = hosted.cell_problems(root)
    assert not any("05_inplace_relu" in p for p in left)


def test_update_inserts_after_the_title_once_and_keeps_the_files_style():
    nb = {"nbformat": 4, "nbformat_minor": 5, "cells": [
        {"cell_type": "markdown", "id": "t", "metadata": {}, "source": ["# 00 · Title\n"]},
        {"cell_type": "code", "execution_count": None, "id": "i", "metadata": {}, "outputs": [],
         "source": ["import course_utils\n"]}]}
    once = hosted.with_setup_cell(json.loads(json.dumps(nb)))
    twice = hosted.with_setup_cell(json.loads(json.dumps(once)))
    assert once == twice and len(once["cells"]) == 3
    assert once["cells"][1]["metadata"]["tags"] == [hosted.TAG] and isinstance(once["cells"][1]["source"], list)
    assert "".join(once["cells"][1]["source"]) == hosted.SETUP_CELL


# --------------------------------------------------------------------------------------------
# make dist's zip: links between notebooks and exercises still resolve inside it
# --------------------------------------------------------------------------------------------
def test_the_zip_holds_notebooks_exercises_and_the_wheel_and_its_links_resolve(tmp_path):
    wheel = tmp_path / "course_utils-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    with zipfile.ZipFile(hosted.build_zip(wheel, tmp_path)) as z:
        names = set(z.namelist())
        top = hosted.ZIP_TOP
        assert f"{top}/{wheel.name}" in names  # one folder up from notebooks/: the setup cell's "../"
        assert not any("/solutions/" in n for n in names)
        for sub in ("notebooks", "exercises"):
            assert {f"{top}/{sub}/{p.name}" for p in (ROOT / sub).glob("[0-9][0-9]_*.ipynb")} <= names
        broken = []
        for name in sorted(n for n in names if n.endswith(".ipynb")):
            for c in json.loads(z.read(name))["cells"]:
                if c["cell_type"] != "markdown":
                    continue
                # the course's own link parser: code spans skipped (exercise 07's `downs[0](...)`),
                # URLs and anchors left out
                for link in links("".join(c["source"])):
                    target = str(Path(name).parent / link)
                    while "/../" in target:
                        target = re.sub(r"[^/]+/\.\./", "", target, count=1)
                    if target not in names:
                        broken.append(f"{name}: {link}")
        assert not broken, broken


# --------------------------------------------------------------------------------------------
# docs/hosted-gpu.md's tiers table, computed
# --------------------------------------------------------------------------------------------
def _block(text: str) -> str:
    return re.search(r"<!-- BEGIN tiers -->\n(.*?)<!-- END tiers -->", text, re.S).group(1)


def test_the_tiers_table_and_its_copies_are_what_the_predictor_says():
    doc = (ROOT / "docs" / "hosted-gpu.md").read_text()
    assert _block(doc) == hosted.render_tiers(), (
        "docs/hosted-gpu.md's tiers table is stale: run python -m course_utils.hosted --tiers")
    assert hosted.SITE_PAGE.read_text() == hosted.site_page(doc), (
        f"{hosted.SITE_PAGE.relative_to(ROOT)} is not docs/hosted-gpu.md: run python -m course_utils.hosted --tiers")
    rows = hosted.tiers()
    summary = "a 16 GB T4 holds the full preset of notebooks 00-07 and 10, and two T4s\nthe NCCL parts of 08-09"
    assert (summary in (ROOT / "README.md").read_text()) == all(r["fits"] for r in rows), (
        "README's 'Run on a hosted GPU' summary disagrees with the tiers table: rewrite it from docs/hosted-gpu.md")


def test_the_tiers_verdict_follows_the_card():
    rows = {r["notebooks"]: r for r in hosted.tiers()}
    unet = rows["01, 02, 04, 05, 06, 07, 10"]
    assert unet["fits"] and unet["card needs MiB"] > 8 * 1024  # seed 000's net does not fit seed 000's 8 GiB card
    small = {r["notebooks"]: r for r in hosted.tiers(total_gib=8)}
    assert not small["01, 02, 04, 05, 06, 07, 10"]["fits"] and small["00"]["fits"]
    assert "does not fit" in hosted.render_tiers(total_gib=8)
