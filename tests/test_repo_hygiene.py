"""The habits `make lint` enforces (part of `make test`): ruff's rules, stripped notebooks, and
notebook metadata that JupyterLab leaves as it is."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import check_stripped  # noqa: E402


def _nb(path, outputs, count, metadata=None):
    cell = {"cell_type": "code", "id": "c0", "metadata": {}, "source": "1 + 1", "outputs": outputs, "execution_count": count}
    meta = check_stripped.LAB_METADATA if metadata is None else metadata
    path.write_text(json.dumps({"cells": [cell], "metadata": meta, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_check_stripped_flags_outputs_and_counts_and_names_the_fix(tmp_path, capsys):
    out = [{"output_type": "execute_result", "data": {"text/plain": "2"}, "metadata": {}, "execution_count": 1}]
    dirty, counted, clean = (_nb(tmp_path / "a.ipynb", out, 1), _nb(tmp_path / "b.ipynb", [], 3),
                             _nb(tmp_path / "c.ipynb", [], None))
    assert check_stripped.problems(dirty) == ["cell 0: outputs and execution_count"]
    assert check_stripped.problems(counted) == ["cell 0: execution_count"]
    assert check_stripped.problems(clean) == []
    assert check_stripped.main([str(dirty), str(clean)]) == 1
    assert "make strip" in capsys.readouterr().out
    assert check_stripped.main([str(clean)]) == 0


# what the repository's notebooks carried before issue 41: JupyterLab rewrote both on opening
OLD_LESSON = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
              "language_info": {"name": "python"}}
OLD_SOLUTION = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
                "language_info": {"name": "python", "pygments_lexer": "ipython3"}}


@pytest.mark.parametrize("old", [OLD_LESSON, OLD_SOLUTION, {}], ids=["lesson", "solution", "none"])
def test_metadata_jupyterlab_would_rewrite_fails_the_lint_and_fix_sets_it(tmp_path, capsys, old):
    """Opening a notebook in JupyterLab marked it modified and autosave rewrote the tracked file
    (issue 41): the lint fails on such metadata, naming the fix, and --fix writes what JupyterLab
    writes, keeping cells, ids and other metadata, in the course's JSON style."""
    out = [{"output_type": "stream", "name": "stdout", "text": "x\n"}]
    path = _nb(tmp_path / "a.ipynb", out, 4, metadata={**old, "nbgrader": {"keep": True}})
    assert check_stripped.metadata_problems(json.loads(path.read_text()))
    assert check_stripped.main([str(path)]) == 1
    said = capsys.readouterr().out
    assert "opening it in JupyterLab would rewrite it" in said and "check_stripped.py --fix" in said
    nb = json.loads(path.read_text())
    nb["cells"][0]["id"] = "kept-id"
    path.write_text(json.dumps(nb))
    assert check_stripped.main(["--fix", str(path)]) == 0 and check_stripped.main(["--fix", str(path)]) == 0
    text = path.read_text()
    fixed = json.loads(text)
    assert text == json.dumps(fixed, indent=1, ensure_ascii=False) + "\n"
    assert fixed["metadata"] == {**check_stripped.LAB_METADATA, "nbgrader": {"keep": True}}
    assert fixed["cells"][0] == {**nb["cells"][0], "outputs": [], "execution_count": None}
    capsys.readouterr()
    assert check_stripped.main([str(path)]) == 0


def test_lab_metadata_is_what_the_courses_kernel_reports():
    """JupyterLab copies the kernel's kernelspec and its kernel_info's language_info whole: read
    both off the course's kernel (ipykernel, the kernelspec make install installs). The Python
    version is the course's (environment.yml's pin), whatever Python runs this test."""
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    want = check_stripped.LAB_METADATA
    assert {**IPythonKernel.language_info, "version": check_stripped.LAB_PYTHON} == want["language_info"]
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert want["kernelspec"] == {"display_name": spec.display_name, "language": spec.language, "name": "python3"}
    pinned = re.search(r"python=(\d+\.\d+)", (ROOT / "environment.yml").read_text()).group(1)
    assert check_stripped.LAB_PYTHON.rsplit(".", 1)[0] == pinned, (
        f"environment.yml pins python={pinned}: set check_stripped.LAB_PYTHON to that Python's version")


def test_every_committed_notebook_is_stripped_and_recorded_runs_are_exempt():
    paths = check_stripped.repository_notebooks()
    names = {p.relative_to(ROOT).as_posix() for p in paths}
    assert {"notebooks", "exercises", "solutions"} <= {n.split("/")[0] for n in names}
    assert not any(n.startswith("docs/gpu-runs/") for n in names)
    assert {str(p): check_stripped.problems(p) for p in paths if check_stripped.problems(p)} == {}


def test_every_committed_notebook_has_the_metadata_jupyterlab_writes():
    """Opening a notebook in JupyterLab then changes nothing in git."""
    bad = {p.relative_to(ROOT).as_posix(): check_stripped.metadata_problems(json.loads(p.read_text()))
           for p in check_stripped.repository_notebooks()}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"{len(bad)} notebooks, e.g. {next(iter(bad.items()))}. Fix: python tools/check_stripped.py --fix"


def _recipe(target, *assignments):
    return subprocess.run(["make", "--no-print-directory", "-n", "-B", target, "STAMP=/dev/null", "BIN=B", *assignments],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_make_test_lints_first_and_runs_on_every_core():
    lines = [ln for ln in _recipe("test").splitlines() if ln.startswith("B/") and " pip " not in ln]
    assert lines[0] == "B/ruff check ." and lines[1] == "B/python tools/check_stripped.py"
    assert "-n auto --dist loadfile" in lines[-1] and "pytest" in lines[-1]
    assert "-p no:xdist" in _recipe("test", "JOBS=1").splitlines()[-1]


def test_ruff_rule_set_is_the_documented_one():
    import tomllib

    text = (ROOT / "pyproject.toml").read_text()
    lint = tomllib.loads(text)["tool"]["ruff"]["lint"]
    row = next(line for line in (ROOT / "CONTRIBUTING.md").read_text().splitlines() if line.startswith("| `make lint`"))
    documented = set(re.findall(r"`([A-Z]+[0-9]*)`", row.split(": see")[0]))
    assert set(lint["select"]) == documented, (f"pyproject selects {sorted(lint['select'])}, CONTRIBUTING.md's "
                                               f"make lint row names {sorted(documented)}: make them agree")
    for rule in lint["select"]:  # each rule says in pyproject why the course wants it
        assert re.search(rf'^\s*"{rule}",\s*# \S', text, re.M), f"pyproject.toml: {rule} needs a comment saying why"


def test_a_cell_without_an_id_fails_the_lint_and_fix_gives_it_one(tmp_path):
    """Cells added by a script without an id (nbformat 4.5 requires one) made nbformat warn
    MissingIDFieldWarning in five of CI's tests and JupyterLab add ids on opening (issue 46): the
    lint names them, --fix gives each an id no other cell has and keeps the ids there are."""
    path = _nb(tmp_path / "a.ipynb", [], 4, metadata=dict(check_stripped.LAB_METADATA))
    nb = json.loads(path.read_text())
    nb["nbformat"], nb["nbformat_minor"] = 4, 5
    nb["cells"] = [{**nb["cells"][0], "id": "c1w"}, {**nb["cells"][0]}, {**nb["cells"][0]}]
    for cell in nb["cells"][1:]:
        cell.pop("id", None)
    path.write_text(json.dumps(nb))
    assert check_stripped.metadata_problems(json.loads(path.read_text())) == ["cells [1, 2] have no id (nbformat 4.5)"]
    assert check_stripped.main(["--fix", str(path)]) == 0
    ids = [c["id"] for c in json.loads(path.read_text())["cells"]]
    assert ids[0] == "c1w" and len(set(ids)) == 3 and check_stripped.main([str(path)]) == 0
