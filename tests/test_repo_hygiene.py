"""The habits `make lint` enforces (part of `make test`): ruff's rules and stripped notebooks."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import check_stripped  # noqa: E402


def _nb(path, outputs, count):
    cell = {"cell_type": "code", "metadata": {}, "source": "1 + 1", "outputs": outputs, "execution_count": count}
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
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


def test_every_committed_notebook_is_stripped_and_recorded_runs_are_exempt():
    paths = check_stripped.repository_notebooks()
    names = {p.relative_to(ROOT).as_posix() for p in paths}
    assert {"notebooks", "exercises", "solutions"} <= {n.split("/")[0] for n in names}
    assert not any(n.startswith("docs/gpu-runs/") for n in names)
    assert {str(p): check_stripped.problems(p) for p in paths if check_stripped.problems(p)} == {}


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
