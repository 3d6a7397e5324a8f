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

from course_utils import hosted, recorded
from course_utils.checks import ScaffoldError
from course_utils.layout import exercise_name
from course_utils.markdown import links

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------------
# The bootstrap (course_setup.py), run as the cell runs it, with find_spec, torch's version and
# pip replaced
# --------------------------------------------------------------------------------------------
WHEEL = "course_utils-0.1.0-py3-none-any.whl"


@pytest.fixture
def hosted_env(monkeypatch, tmp_path):
    """A learner's folder: the zip's layout in ``tmp_path/course`` (course_setup.py at its top,
    ``notebooks/``, the kernel started there) with find_spec, torch's version and pip replaced.
    ``run(installed, torch, capsys, code)`` runs ``code`` (the setup cell by default) as a notebook
    would and returns (pip calls, constraint files' text, printed text)."""
    calls, constraints = [], []
    course = tmp_path / "course"
    (course / "notebooks").mkdir(parents=True)
    shutil.copy(hosted.BOOTSTRAP, course / "course_setup.py")
    monkeypatch.chdir(course / "notebooks")  # a notebook's kernel starts in its folder
    monkeypatch.delenv("COURSE_UTILS_SOURCE", raising=False)

    def check_call(cmd, *a, **k):
        calls.append(list(cmd))
        if "-c" in cmd:
            constraints.append(Path(cmd[cmd.index("-c") + 1]).read_text())
        return 0

    def run(installed: set[str], torch_version: str | None, capsys, code: str = hosted.SETUP_CELL):
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: real("json") if name in installed else None)
        monkeypatch.setattr(importlib.metadata, "version", lambda name: torch_version)
        monkeypatch.setattr(subprocess, "check_call", check_call)
        temp = tmp_path / "temp"
        temp.mkdir(exist_ok=True)
        monkeypatch.setattr(tempfile, "tempdir", str(temp))
        exec(compile(code, "<setup cell>", "exec"), {"__name__": "__main__"})
        assert not list(temp.iterdir()), "the bootstrap left a temporary file behind (a learner's /tmp fills up)"
        return calls, constraints, capsys.readouterr().out

    run.course = course
    return run


def test_on_a_checkout_the_cell_does_nothing_and_says_nothing(hosted_env, capsys):
    (hosted_env.course / "course_setup.py").write_text("raise AssertionError('the bootstrap ran')\n")
    calls, _, out = hosted_env({"course_utils", "torch"}, "2.13.0", capsys)
    assert calls == [] and out == ""


def test_the_cell_runs_the_bootstrap_that_installs_the_wheel_one_folder_up_with_torch_held(hosted_env, capsys):
    (hosted_env.course / WHEEL).write_bytes(b"")  # the zip: wheel and bootstrap at its top
    calls, constraints, out = hosted_env({"torch"}, "2.11.0+cu126", capsys)
    assert calls == [[sys.executable, "-m", "pip", "install", "-q", "-c", calls[0][6], f"../{WHEEL}"]]
    assert constraints == ["torch==2.11.0+cu126\n"]  # pip can never replace this torch
    assert f"installed course_utils from ../{WHEEL}; torch 2.11.0+cu126 kept" in out


def test_the_cell_takes_the_first_bootstrap_in_its_search_order(hosted_env, capsys):
    here = Path.cwd() / "course_setup.py"
    here.write_text("print('the one beside the notebook')\n")
    _, _, out = hosted_env({"torch"}, "2.13.0", capsys)
    assert out == "the one beside the notebook\n"  # "./" before "../"
    here.unlink()
    (hosted_env.course / "course_setup.py").write_text("print('the one up')\n")
    (Path.cwd() / "sub").mkdir()
    (Path.cwd() / "sub" / "course_setup.py").write_text("print('the one down')\n")
    _, _, out = hosted_env({"torch"}, "2.13.0", capsys)
    assert out == "the one up\n"


def test_no_bootstrap_is_an_error_that_names_the_fix(hosted_env, capsys):
    (hosted_env.course / "course_setup.py").unlink()
    with pytest.raises(RuntimeError, match="no course_setup.py here, one folder up, .*Fix: unzip the course zip"):
        hosted_env({"torch"}, "2.13.0", capsys)


def test_the_setup_cell_is_six_lines_or_fewer():
    assert len(hosted.SETUP_CELL.splitlines()) <= 6, hosted.SETUP_CELL


def test_the_cell_searches_where_the_bootstrap_searches_for_the_wheel():
    """Colab's /content, Drive, Kaggle's inputs: one list, in the cell and in the bootstrap."""
    boot = _bootstrap()
    cell = re.search(r'for w in "([^"]*)"\.split\(\)', hosted.SETUP_CELL).group(1).split()
    assert ["" if w == "./" else w for w in cell] == list(boot.PLACES)


def _bootstrap():
    spec = importlib.util.spec_from_file_location("course_setup", hosted.BOOTSTRAP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imported under its own name: it installs nothing
    return module


def test_the_wheel_beside_the_notebook_is_found(hosted_env, capsys):
    """Colab: the bootstrap unzipped in /content/<folder>/, the wheel uploaded beside the notebook."""
    (Path.cwd() / WHEEL).write_bytes(b"")
    calls, _, _ = hosted_env({"torch"}, "2.15.0", capsys)
    assert calls[0][-1] == WHEEL and "-c" in calls[0]


def test_a_torch_outside_the_tested_range_is_kept_and_said(hosted_env, capsys):
    (hosted_env.course / WHEEL).write_bytes(b"")
    calls, constraints, out = hosted_env({"torch"}, "2.9.1+cu128", capsys)
    assert calls[0][-2:] == ["--no-deps", f"../{WHEEL}"]
    assert "-c" in calls[1] and f"../{WHEEL}" not in calls[1] and "pandas" in calls[1]
    assert constraints == ["torch==2.9.1+cu128\n"]
    assert "outside the versions the course is tested on (>=2.11,<2.16)" in out and "2.9.1+cu128 kept" in out


def test_the_range_edges(hosted_env, capsys):
    (hosted_env.course / WHEEL).write_bytes(b"")
    calls, _, _ = hosted_env({"torch"}, "2.16.0", capsys)
    assert "--no-deps" in calls[0]  # the upper bound is excluded, as in pyproject.toml
    boot = _bootstrap()
    assert boot.in_range("2.11.0") and boot.in_range("2.15.9+cu128") and not boot.in_range("2.10.1")


def test_without_torch_the_wheel_brings_one(hosted_env, capsys):
    (hosted_env.course / WHEEL).write_bytes(b"")
    calls, constraints, out = hosted_env(set(), None, capsys)
    assert calls == [[sys.executable, "-m", "pip", "install", "-q", f"../{WHEEL}"]] and constraints == []
    assert "with a torch in the tested range (there was none)" in out


def test_source_from_the_environment_wins(hosted_env, capsys, monkeypatch):
    (hosted_env.course / WHEEL).write_bytes(b"")
    monkeypatch.setenv("COURSE_UTILS_SOURCE", "git+https://example.org/course.git")
    calls, _, _ = hosted_env({"torch"}, "2.13.0", capsys)
    assert calls[0][-1] == "git+https://example.org/course.git"


def test_no_wheel_is_an_error_that_names_the_fix(hosted_env, capsys):
    with pytest.raises(RuntimeError, match="no course_utils-.*whl is beside .*Fix: unzip the whole course zip"
                                           ".*COURSE_UTILS_SOURCE.*make lab"):
        hosted_env({"torch"}, "2.13.0", capsys)


def test_the_tested_range_is_pyprojects():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_dep = next(d for d in deps if d.startswith("torch"))
    lo, hi = _bootstrap().TESTED
    assert torch_dep == f"torch>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}", (
        f"pyproject.toml says {torch_dep!r}: set TESTED in course_setup.py to match")


# --------------------------------------------------------------------------------------------
# Every notebook carries the current cell
# --------------------------------------------------------------------------------------------
def test_every_notebook_starts_with_the_current_setup_cell():
    problems = hosted.cell_problems()
    assert not problems, "\n".join(problems)
    assert len(hosted.notebook_paths()) >= 2 * 11 + 2  # notebooks, solutions, the two templates


def _copy(tmp_path: Path) -> Path:
    """The notebooks, solutions, exercises and templates, each with the current setup cell."""
    for sub in ("notebooks", "solutions", "exercises", "course_utils/templates"):
        shutil.copytree(ROOT / sub, tmp_path / sub, ignore=shutil.ignore_patterns("*.py*", "*.tmpl", "*.md"))
    hosted.update_cells(tmp_path)
    for path in tmp_path.glob("exercises/*.ipynb"):  # as python -m course_utils.grading.generate would
        _edit(path, hosted.with_setup_cell)
    assert not hosted.cell_problems(tmp_path)
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


def test_a_notebook_that_is_not_json_is_named_and_no_cell_is_written_before(tmp_path):
    """Issue 43: --update-cells wrote the notebooks before a truncated one, then stopped at it with
    a JSONDecodeError that named no file; --check-cells stopped there too."""
    root = _copy(tmp_path)
    _edit(root / "notebooks/05_inplace_relu.ipynb", lambda nb: nb["cells"].pop(hosted.setup_cell_index(nb)))
    before = (root / "notebooks/05_inplace_relu.ipynb").read_bytes()
    (root / "solutions/07_checkpointing.ipynb").write_text('{"cells": [{"cell_type": "markd')
    with pytest.raises(ScaffoldError, match=r"solutions/07_checkpointing.ipynb should be a notebook.*cut short.*Fix:"):
        hosted.update_cells(root)
    assert (root / "notebooks/05_inplace_relu.ipynb").read_bytes() == before
    problems = hosted.cell_problems(root)
    assert any(p.startswith("solutions/07_checkpointing.ipynb should be a notebook") for p in problems), problems
    assert any(p.startswith("notebooks/05_inplace_relu.ipynb: no setup cell") for p in problems), problems


def test_the_commands_dist_folder_is_checked_before_anything_is_done(tmp_path, monkeypatch, capsys):
    """Issue 43: `--update-cells --dist FILE` rewrote the notebooks, then failed at the folder;
    `--dist ''` was taken for no --dist at all."""
    def nothing_yet(*args, **kwargs):  # noqa: ARG001 - stands in for every action
        raise AssertionError("an action ran before --dist's folder was checked")
    for name in ("update_cells", "cell_problems", "update_tiers", "dist"):
        monkeypatch.setattr(hosted, name, nothing_yet)
    (tmp_path / "a_file").write_text("x")
    for folder in (str(tmp_path / "a_file"), str(tmp_path / "a_file" / "dist"), "", "x\0y"):
        assert hosted.main(["--update-cells", "--check-cells", "--dist", folder]) == 2, folder
        err = capsys.readouterr().err
        assert err.startswith("error: --dist ") and len(err.strip().splitlines()) == 1 and "Fix:" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


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
def _zip(tmp_path: Path) -> tuple[zipfile.ZipFile, set[str]]:
    wheel = tmp_path / WHEEL
    wheel.write_bytes(b"wheel")
    z = zipfile.ZipFile(hosted.build_zip(wheel, tmp_path))
    return z, set(z.namelist())


def _resolve(name: str, link: str) -> str:
    target = str(Path(name).parent / link)
    while "/../" in target:
        target = re.sub(r"[^/]+/\.\./", "", target, count=1)
    return target.removeprefix("./").replace("/./", "/")


def test_the_zip_holds_notebooks_exercises_the_bootstrap_and_the_wheel_and_its_links_resolve(tmp_path):
    z, names = _zip(tmp_path)
    top = hosted.ZIP_TOP
    # one folder up from notebooks/: the setup cell's "../" finds the bootstrap, the bootstrap the wheel
    assert {f"{top}/{WHEEL}", f"{top}/course_setup.py"} <= names
    assert z.read(f"{top}/course_setup.py") == hosted.BOOTSTRAP.read_bytes()
    assert not any("/solutions/" in n for n in names)
    # what notebook 00 reads of each GPU run (recorded.gpu_runs), beside recorded/'s figures
    runs = {p for g in recorded.RUN_FILES for p in ROOT.glob(g)} | set(ROOT.glob("recorded/*.json"))
    assert runs and {f"{top}/{p.relative_to(ROOT).as_posix()}" for p in runs} <= names
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
                if _resolve(name, link) not in names:
                    broken.append(f"{name}: {link}")
    assert not broken, broken


def test_the_zips_readme_is_its_own_and_every_link_in_it_resolves_inside_the_zip(tmp_path):
    """The repository's README speaks of make lab, make test and CONTRIBUTING.md, none of which
    the zip holds: the zip gets its own, each relative link to a file in the zip."""
    z, names = _zip(tmp_path)
    name = f"{hosted.ZIP_TOP}/README.md"
    readme = z.read(name).decode()
    assert readme != (ROOT / "README.md").read_text()
    targets = links(readme)
    broken = [t for t in targets if _resolve(name, t) not in names]
    assert not broken, f"links in the zip's README that lead nowhere inside the zip: {broken}"
    assert "course_setup.py" in targets and "docs/hosted-gpu.md" in targets
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):  # every lesson and its exercise
        assert f"notebooks/{nb.name}" in targets and f"exercises/{exercise_name(nb)}" in targets
    for gone in ("make lab", "make test", "CONTRIBUTING", "{{", "$"):
        assert gone not in readme.replace(f"{WHEEL}", ""), f"the zip's README says {gone!r}"
    assert WHEEL in readme and "Colab" in readme and "Kaggle" in readme
    # notebook 10 sends the learner to "the README for the figures of the whole course"
    figures = re.search(r"<!-- BEGIN figures -->\n(.*?)<!-- END figures -->", (ROOT / "README.md").read_text(), re.S)
    assert figures.group(1).strip() in readme


def test_a_broken_link_in_the_zips_readme_is_caught(tmp_path, monkeypatch):
    """The check above can fail: a template that links the repository's CONTRIBUTING.md."""
    template = tmp_path / "zip_README.md"
    template.write_text(hosted.ZIP_README.read_text() + "\n[how it is built](CONTRIBUTING.md)\n")
    monkeypatch.setattr(hosted, "ZIP_README", template)
    z, names = _zip(tmp_path)
    name = f"{hosted.ZIP_TOP}/README.md"
    assert [t for t in links(z.read(name).decode()) if _resolve(name, t) not in names] == ["CONTRIBUTING.md"]


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
