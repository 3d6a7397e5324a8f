"""What a submission hands the grader, at the edges (issue 42): no learner's text stops the class
or loses another's result, files that are not notebooks are listed apart (never a 0), honest
work in an unusual form is graded, and an observation huge in memory is refused before a judge
reads it.

The unit tests read files and observations in this process (fast); ``test_the_class_report``
grades one small class end to end through the command line (marker ``grader``: make
test-grader), and each case's docstring says what the grader did with it before."""

import copy
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from course_utils.grading import core, intake
from course_utils.grading.grade import report_names, submissions_in, summary
from course_utils.grading.grader import Result, _load_observation
from course_utils.grading.registry import exercise
from course_utils.grading.sandbox import observe_notebook

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = json.loads((ROOT / "solutions" / "00_gpu_memory_basics.ipynb").read_text())
SIGNATURE = "def tensor_nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:"
SIZER = ("import numpy as np\n\nclass Sizer:\n    def __call__(self, shape, dtype):\n"
         "        return np.int64(math.prod(shape) * torch.empty((), dtype=dtype).element_size())\n\n"
         "tensor_nbytes = Sizer()\n\n\ndef _unused(shape, dtype):")
BOOM = 'class Boom:\n    raise RuntimeError("boom \\ud800")\n'  # a lone surrogate at run time, ASCII in the file


def notebook(extra: str | None = None, replace: tuple[str, str] | None = None) -> dict:
    """Exercise 00's solution as JSON, with an extra code cell or one text replaced."""
    nb = copy.deepcopy(SOLUTION)
    if replace is not None:
        cell = next(c for c in nb["cells"] if replace[0] in "".join(c["source"]))
        cell["source"] = "".join(cell["source"]).replace(*replace)
    if extra is not None:
        nb["cells"].append({"cell_type": "code", "id": "extra", "metadata": {}, "outputs": [],
                            "execution_count": None, "source": extra})
    return nb


def write(path: Path, nb) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(nb if isinstance(nb, str) else json.dumps(nb))
    return path


# --------------------------------------------------------------------------------------------
# The sanitiser
# --------------------------------------------------------------------------------------------
def test_clean_text_makes_every_learner_text_printable_and_encodable():
    text = intake.clean_text("boom \ud800 \x1b[2J\x07 ok\n\tnext")
    text.encode("utf-8")  # would raise UnicodeEncodeError on a lone surrogate
    assert text == "boom \\ud800 \\x1b[2J\\x07 ok\n\tnext"
    assert intake.clean({"k\udc00": ["a\ud800", ("b",)]}) == {"k\\udc00": ["a\\ud800", ("b",)]}


def test_the_summary_of_a_surrogate_note_prints():
    """Before: a note holding a lone surrogate made the summary's print raise UnicodeEncodeError."""
    r = Result("00_a.ipynb", "00", notes=[intake.clean_text("boom \ud800")])
    out = subprocess.run([sys.executable, "-c", f"print({summary([r])!r})"], capture_output=True,
                         env=dict(os.environ, PYTHONIOENCODING="utf-8"), timeout=60)
    assert out.returncode == 0 and b"boom \\ud800" in out.stdout


# --------------------------------------------------------------------------------------------
# The submitted file
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, content, reason", [
    ("00_corrupt.ipynb", json.dumps(SOLUTION)[:500], "is not JSON"),
    ("00_latin1.ipynb", json.dumps(SOLUTION).encode().replace(b"Bytes", b"B\xe9tes", 1), "is not UTF-8"),
    ("00_deep.ipynb", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("00_list.ipynb", "[1, 2]", "is a JSON list"),
    ("00_nocells.ipynb", '{"metadata": {}}', "without a list of cells"),
    ("00_badcell.ipynb", '{"cells": [{"cell_type": "nonsense"}], "metadata": {}, "nbformat": 4, '
                         '"nbformat_minor": 5}', "not a notebook nbformat can read"),
])
def test_a_file_that_is_not_a_notebook_is_unreadable_with_its_reason(tmp_path, name, content, reason):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(intake.Unreadable, match=reason):
        intake.read_submission(path, tmp_path)


def test_links_are_followed_inside_the_class_folder_only(tmp_path):
    """Before: every link was "a link, not a file" (0), even one the teacher made in the class folder."""
    klass = tmp_path / "class"
    real = write(klass / "store" / "00_real.ipynb", SOLUTION)
    os.symlink(real, klass / "00_link.ipynb")
    data, _notes = intake.read_submission(klass / "00_link.ipynb", klass)
    assert len(json.loads(data)["cells"]) == len(SOLUTION["cells"])
    os.symlink(write(tmp_path / "elsewhere.ipynb", SOLUTION), klass / "00_out.ipynb")
    with pytest.raises(intake.Unreadable, match="outside the class folder"):
        intake.read_submission(klass / "00_out.ipynb", klass)
    os.symlink("/dev/zero", klass / "00_dev.ipynb")
    with pytest.raises(intake.Unreadable):
        intake.read_submission(klass / "00_dev.ipynb", klass)


def test_saved_outputs_do_not_count_against_the_size_cap(tmp_path):
    """Before: the 64 MiB cap read the whole file, and a correct notebook with a large saved
    output was "unreadable" (0)."""
    nb = notebook()
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x" * (intake.CODE_BYTES + 2**20)}]
    data, notes = intake.read_submission(write(tmp_path / "00_big.ipynb", nb), tmp_path)
    assert len(data) < 2**20 and "outputs were not read" in notes[0]
    assert all(not c.get("outputs") for c in json.loads(data)["cells"])


def test_a_lone_surrogate_in_the_file_is_read_as_the_replacement_character(tmp_path):
    """Before: the notebook run could not send the cell to its kernel ("the notebook could not run")."""
    text = json.dumps(notebook("x = 1  # \ud800\n"))
    assert "\\ud800" in text
    data, notes = intake.read_submission(write(tmp_path / "00_s.ipynb", text), tmp_path)
    assert "x = 1  # \ufffd" in data.decode("utf-8") and "lone surrogate" in notes[0]


def test_two_files_of_one_name_in_two_folders_are_two_names(tmp_path):
    """Before: both rows were "00_a.ipynb"."""
    for d in "AB":
        write(tmp_path / d / "00_a.ipynb", SOLUTION)
    found = submissions_in([str(tmp_path / "A"), str(tmp_path / "B")])
    assert report_names(found) == ["A/00_a.ipynb", "B/00_a.ipynb"]
    assert report_names(submissions_in([str(tmp_path / "A")])) == ["00_a.ipynb"]


def test_unreadable_files_are_listed_apart_and_not_in_the_mean():
    rows = [Result("00_a.ipynb", "00", "t", score=5, max_score=5),
            Result("00_b.ipynb", "00", "t", status="not graded", max_score=5, notes=["unreadable: x"])]
    text = summary(rows)
    assert "1 submission(s), mean 100.0 %" in text and "not graded (1):\n  00_b.ipynb: unreadable: x" in text


# --------------------------------------------------------------------------------------------
# Honest forms: a callable object, a NumPy integer
# --------------------------------------------------------------------------------------------
def test_a_callable_object_returning_numpy_integers_is_graded():
    """Before: 2/5, "not a class or function in the notebook (it comes from module __main__)", and
    "your code raised TypeError" for the NumPy int64 the learner's code returned."""
    import nbformat

    nb = nbformat.reads(json.dumps(notebook(replace=(SIGNATURE, SIZER))), as_version=4)
    ex = exercise("00")
    obs = observe_notebook(nb, "00", [p.key for p in ex.parts], seed=3)
    assert obs["__rebuild__"]["problems"] == []
    assert [ex.judge(p.key, obs[p.key], 3).passed for p in ex.parts] == [True] * len(ex.parts)


def test_numbers_python_treats_as_the_same_are_data_and_others_are_not_blamed_on_the_code():
    assert core.as_data([np.int64(3), np.float32(0.5), np.bool_(True)]) == [3, 0.5, True]
    assert [type(v) for v in core.as_data([np.int64(3), np.float32(0.5), np.bool_(True)])] == [int, float, bool]
    ex = exercise("00")
    part = ex.parts[0]
    got = ex.observe(part.key, {n: (lambda *a: object()) for n in part.needs}, seed=0)
    raised = core.Raised.from_data(got)
    assert raised.kind == "check" and "not data the grader can check" in raised.explain()
    assert "your code raised" not in raised.explain()


# --------------------------------------------------------------------------------------------
# Observations huge in memory
# --------------------------------------------------------------------------------------------
def shared_levels(depth: int) -> list:
    node: list = [1]
    for _ in range(depth):
        node = [node, node]
    return node


def test_an_observation_whose_levels_share_one_child_is_refused_before_judging(tmp_path):
    """Before: 1.7 KB on disk, 2^60 leaves in memory; exercise 10's judge formatted its repr and
    the grader was killed for memory, on the retry too (no report)."""
    buf = io.BytesIO()
    torch.save({"volume": shared_levels(60), "budget": 1, "config": {}}, buf)
    assert len(buf.getvalue()) < 4096
    path = tmp_path / "design.pt"
    path.write_bytes(buf.getvalue())
    got = core.Raised.from_data(_load_observation(path))
    assert got is not None and "too large to judge" in got.message and "share items" in got.message
    small = tmp_path / "ok.pt"
    torch.save({"volume": [[1, 2], [3, 4]], "t": torch.zeros(3)}, small)
    assert core.Raised.from_data(_load_observation(small)) is None


def test_observation_limits_count_depth_nodes_and_cycles():
    deep: list = []
    node = deep
    for _ in range(intake.OBSERVATION_LIMITS["depth"] + 5):
        node.append([])
        node = node[0]
    assert "levels deep" in intake.observation_problem(deep)
    loop: list = [1]
    loop.append(loop)
    assert "contains itself" in intake.observation_problem(loop)
    assert "lists and dicts" in intake.observation_problem([[i] for i in range(50)], {"nodes": 10})
    assert intake.observation_problem({"a": [1, 2, {"b": torch.ones(2)}]}) is None


def test_short_bounds_a_repr_without_building_it():
    assert len(core.short(shared_levels(60), 80)) <= 83
    assert core.short("x" * 10**7, 20).endswith("...")
    assert core.fmt(10**5000).startswith("<int")  # past Python's 4,300 digits: no ValueError


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
def test_memory_window_turns_an_allocation_past_it_into_a_memory_error():
    code = ("from course_utils.grading.intake import memory_window\n"
            "try:\n    with memory_window(256 << 20):\n        b = bytearray(2 << 30)\n    print('allocated')\n"
            "except MemoryError:\n    print('memory error')\nb = bytearray(512 << 20)\nprint('after', len(b))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.stdout.split("\n")[:2] == ["memory error", f"after {512 << 20}"], out.stderr[-2000:]


# --------------------------------------------------------------------------------------------
# A class, end to end
# --------------------------------------------------------------------------------------------
@pytest.mark.grader
@pytest.mark.timeout(900)
def test_the_class_report(tmp_path):
    """Before: the surrogate in BOOM's note stopped the class at its summary (exit 1, CSV and JSON
    left at 0 bytes); the surrogate in the file made "the notebook could not run"; the link was
    "a link, not a file" (0); the unreadable files were 0 % in the exercise's mean; the two
    ``00_list.ipynb`` were two rows of one name."""
    a, b = tmp_path / "A", tmp_path / "B"
    write(a / "00_boom.ipynb", notebook(BOOM))
    write(a / "00_surrogate.ipynb", json.dumps(notebook("x = 1  # \ud800\n")))
    os.symlink(write(a / "store" / "00_real.ipynb", SOLUTION), a / "00_link.ipynb")
    write(a / "00_list.ipynb", "[1]")
    write(b / "00_list.ipynb", "{}")
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([sys.executable, "-m", "course_utils.grading.grade", str(a), str(b), "--jobs", "1",
                           "--no-progress", "--csv", str(out / "class.csv"), "--json", str(out / "class.json")],
                          cwd=ROOT, capture_output=True, timeout=840,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="utf-8", TMPDIR=str(tmp)))
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    rows = {r["submission"]: r for r in json.loads((out / "class.json").read_text())}
    assert sorted(rows) == ["A/00_boom.ipynb", "A/00_link.ipynb", "A/00_list.ipynb", "A/00_surrogate.ipynb",
                            "B/00_list.ipynb"]
    for name in ("A/00_boom.ipynb", "A/00_link.ipynb", "A/00_surrogate.ipynb"):
        assert (rows[name]["status"], rows[name]["score"]) == ("graded", 5), rows[name]["notes"]
    assert not any("could not run" in n or "nested" in n for n in rows["A/00_surrogate.ipynb"]["notes"])
    assert any("boom \\ud800" in n for n in rows["A/00_boom.ipynb"]["notes"])
    for name in ("A/00_list.ipynb", "B/00_list.ipynb"):
        assert rows[name]["status"] == "not graded" and "unreadable" in rows[name]["notes"][0]
    stdout = proc.stdout.decode("utf-8")
    assert "3 submission(s), mean 100.0 %" in stdout and "not graded (2):" in stdout
    assert (out / "class.csv").read_text().count("\n") == 6
    assert not list(out.glob(".class.*"))  # no half report (files.atomic_write's temporary files)
    assert not [p for p in tmp.iterdir() if p.name.startswith("course-grader")]  # no grader folder left


# --------------------------------------------------------------------------------------------
# Forged observations and notebooks costly to read (an adversarial review of the above)
# --------------------------------------------------------------------------------------------
def hash_bomb(depth: int) -> bytes:
    """A torch.save file whose pickle is a dict keyed by a tuple of ``depth`` levels that share one
    child: loading it hashes 2^depth tuples (depth 20: 6 ms; 40: hours). Written by hand, since
    making such a dict in Python would hash it here."""
    pkl = bytearray(b"\x80\x02)q\x00")  # PROTO 2, EMPTY_TUPLE, BINPUT 0
    for i in range(depth):
        pkl += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86q" + bytes([i + 1])  # (t_i, t_i) as t_{i+1}
    pkl += b"}h" + bytes([depth]) + b"K\x01s."  # {t_depth: 1}
    plain = io.BytesIO()
    torch.save({"k": 1}, plain)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(plain.getvalue())) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for name in src.namelist():
            dst.writestr(name, bytes(pkl) if name.endswith("data.pkl") else src.read(name))
    return out.getvalue()


def test_a_forged_observation_that_loads_for_hours_is_stopped(tmp_path):
    """A 1 KB file that takes hours to load (``hash_bomb(44)``): its first load runs in a child,
    stopped at the time limit; the same file built 12 levels deep loads, and is refused as data
    (a dict key that is not a string)."""
    (tmp_path / "bomb.pt").write_bytes(hash_bomb(44))
    got = core.Raised.from_data(_load_observation(tmp_path / "bomb.pt", timeout_s=2))
    assert got is not None and "took more than 2 s" in got.message, got
    (tmp_path / "small.pt").write_bytes(hash_bomb(12))
    got = core.Raised.from_data(_load_observation(tmp_path / "small.pt", timeout_s=2))
    assert got is not None and "not strings" in got.message, got


@pytest.mark.parametrize("value, why", [({"x": bytearray(8)}, "holds a bytearray"), ({1: 2}, "not strings"),
                                        ([{3, 4}], "holds a set")])
def test_an_observation_of_anything_but_plain_data_is_refused(tmp_path, value, why):
    torch.save(value, tmp_path / "odd.pt")
    got = core.Raised.from_data(_load_observation(tmp_path / "odd.pt"))
    assert got is not None and why in got.message, got


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
def test_a_notebook_costly_to_parse_is_read_under_a_memory_bound(tmp_path):
    """3 MB of empty dicts take ~600 MB parsed: past the bound, the file is unreadable, and the
    grader's process goes on."""
    nb = notebook()
    nb["metadata"]["junk"] = [{}] * 1_500_000
    path = write(tmp_path / "00_heavy.ipynb", nb)
    with pytest.raises(intake.Unreadable, match="needs more than"):
        intake.read_submission(path, tmp_path, memory_bytes=64 << 20)
    deep = notebook()
    deep["metadata"]["deep"] = json.loads("[" * 900 + "]" * 900)
    with pytest.raises(intake.Unreadable, match="nested too deeply"):
        intake.read_submission(write(tmp_path / "00_deep_meta.ipynb", deep), tmp_path)


def test_a_result_that_cannot_be_copied_is_not_data_and_the_judge_bounds_its_message():
    ex = exercise("00")
    part = ex.parts[0]
    for value in (torch.empty(3, device="meta"), torch.zeros(1).expand(2**40)):
        got = core.Raised.from_data(ex.observe(part.key, {n: (lambda *a, v=value: v) for n in part.needs}, seed=0))
        assert got is not None and got.kind == "check" and "could not be copied as data" in got.message, got
    fake = core.Exercise("99", "t", names=("f",))
    loud, hungry = fake.part("loud", "loud", 1, ["f"]), fake.part("hungry", "hungry", 1, ["f"])
    loud.judge(lambda got, seed: (_ for _ in ()).throw(core.CheckFailed("x" * 100_000)))
    hungry.judge(lambda got, seed: (_ for _ in ()).throw(MemoryError()))
    assert len(fake.judge("loud", 1, 0).message) <= core.JUDGE_CHARS + 10
    assert "too large to check" in fake.judge("hungry", 1, 0).message


def test_a_file_given_twice_is_graded_once(tmp_path):
    write(tmp_path / "A" / "00_a.ipynb", SOLUTION)
    found = submissions_in([str(tmp_path / "A"), str(tmp_path / "A" / "00_a.ipynb")])
    assert [p.name for p, _ in found] == ["00_a.ipynb"]
