"""The student release holds no reference and no answer (issue 42, item 7): not their source, not
their values for the grader's seeds, and nothing a graded part may call to compute them.

``python -m course_utils.grading.release`` replaces each ``@reference`` body by a lookup in the
results recorded for the notebooks' checks (seed 0, ``grading/expected.py``) and each ``@answer``
body by a raise. Here, against a release built once:

* no line of a reference's or an answer's body is in the release's files;
* their results for another seed are not in it (in its text nor its recording), and its check
  code cannot compute them: judged in the release at that seed, a part whose references' results
  differ from seed 0's is left to the teacher's grader;
* exercise 03's ``sigmoid_net_step`` tells the peak only: a submission that returns its
  ``saved_peak`` for the "by reasoning" part scores 0 there in the real grader.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import os
import re
import subprocess
import sys

import nbformat
import pytest
import torch

from course_utils.grading import release as release_module
from course_utils.grading.core import roundtrip
from course_utils.grading.registry import MODULES, exercise
from course_utils.grading.release import ROOT, release
from course_utils.grading.sandbox import observe_notebook

# Only what the release code had before issue 42 is imported here (and no test relies on the new
# recorder): run against the old code (a worktree on PYTHONPATH), these tests must fail, not error.
GRADING = ROOT / "course_utils" / "grading"
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
#: the release's recording of the references' results for seed 0 (``expected.FILE``)
RECORDING = "course_utils/grading/expected_seed0.pt"
#: not 0 (the seed the release's recording is for): a seed of the grader's kind, and one no other
#: test uses (the references' lru caches, keyed by seed, must miss here for their calls to be seen)
SEED = 31_415_926
#: a body line shorter than this says nothing of the reference it is in (``return rows``, ``try:``)
SHORTEST = 16
TEXT = (".py", ".ipynb", ".md", ".txt", ".json", ".toml", ".yml", ".yaml", ".csv", ".in", ".cfg")

pytestmark = pytest.mark.timeout(900)
#: what CI leaves to make test-sweep (CI's budget): every exercise at another seed (CI: exercise 11,
#: test_the_release_leaves_exercise_11_at_another_seed_to_the_teacher) and the shortcut through the
#: whole grader (CI: test_the_formula_from_sigmoid_net_step_fails_its_part)
SWEEP = pytest.mark.sweep


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "course-release"
    release(out)
    return out


@pytest.fixture(scope="module")
def texts(built) -> dict[str, str]:
    """The release's text files, by path relative to it."""
    return {p.relative_to(built).as_posix(): p.read_text(errors="replace") for p in sorted(built.rglob("*"))
            if p.is_file() and p.suffix in TEXT and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def recording(built) -> dict[str, list]:
    """{function: its results} in the release's recording (none in the release before issue 42)."""
    path = built / RECORDING
    data = torch.load(path, weights_only=True) if path.is_file() else {}
    return {name: [r for results in by_key.values() for r in results] for name, by_key in data.items()}


def _marked_bodies(path) -> list[tuple[str, int, int]]:
    """(name, first line, last line) of the body of every ``@reference`` and ``@answer`` of a
    grading module, 1-based, after the docstring."""
    out = []
    for node in ast.parse(path.read_text()).body:
        marks = {d.id for d in getattr(node, "decorator_list", ()) if isinstance(d, ast.Name)}
        if marks & {"reference", "answer"}:
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            if body:
                out.append((node.name, body[0].lineno, node.end_lineno))
    return out


@contextlib.contextmanager
def calls_recorded(calls: list):
    """Every call of a reference or an answer (nested ones included) appended to ``calls`` as
    (module.function, result): each is wrapped in its module, and put back after."""
    saved = []
    for nn_id, name in MODULES.items():
        module = importlib.import_module(name)
        for fn, _, _ in _marked_bodies(GRADING / f"ex{nn_id}.py"):
            real = getattr(module, fn)

            def wrapper(*args, _real=real, _name=f"{name}.{fn}", **kwargs):
                result = _real(*args, **kwargs)
                calls.append((_name, result))
                return result

            saved.append((module, fn, real))
            setattr(module, fn, wrapper)
    try:
        yield calls
    finally:
        for module, fn, real in saved:
            setattr(module, fn, real)


@pytest.fixture(scope="module")
def at_seed() -> dict[tuple[str, str], dict]:
    """``judged_at_seed`` for every exercise (make test-sweep: ~25 CPU-s)."""
    return judged_at_seed()


def judged_at_seed(exercises=None) -> dict[tuple[str, str], dict]:
    """{(exercise, part): {"observed": the solution's observation, "calls": [(function, result)]
    of its judge's references and answers}} at ``SEED``, in this (the teacher's) process, for every
    part whose judge uses one (``parts_using``; every part, for the code before it), of
    ``exercises`` (default: all)."""
    parts_using = getattr(release_module, "parts_using", None)
    out = {}
    for sol in SOLUTIONS:
        nn_id = sol.name[:2]
        if exercises is not None and nn_id not in exercises:
            continue
        ex = exercise(nn_id)
        used = parts_using(GRADING / f"ex{nn_id}.py", {"reference", "answer"}) if parts_using else None
        keys = [p.key for p in ex.parts if used is None or p.key in used]
        if not keys:
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            observed = observe_notebook(nbformat.read(sol, as_version=4), nn_id, keys, SEED)
        for key in keys:
            data = roundtrip(observed[key])
            with calls_recorded([]) as calls:
                result = ex.judge(key, data, SEED)
            assert result.passed, (nn_id, key, result.message)
            if calls:
                out[(nn_id, key)] = {"observed": data, "calls": calls}
    return out


# -- (a) no body's source --------------------------------------------------------------------------------
def bodies() -> dict[str, list[str]]:
    """{exNN.function: its body's lines, stripped, at least SHORTEST characters} for every
    ``@reference`` and ``@answer`` of the grading modules."""
    out = {}
    for path in sorted(GRADING.glob("ex[0-9][0-9].py")):
        lines = path.read_text().splitlines()
        for name, first, last in _marked_bodies(path):
            out[f"{path.stem}.{name}"] = [line.strip() for line in lines[first - 1:last] if len(line.strip()) >= SHORTEST]
    return out


def teaches(rel: str) -> str:
    """The teacher's own copy of release file ``rel`` as far as the course ships it on purpose:
    a library module or a lesson whole, a grading module without its references' and answers'
    bodies, an exercise not at all (it is made from a solution)."""
    own = ROOT / rel
    if rel.startswith("exercises/") or not own.is_file():
        return ""
    lines = own.read_text(errors="replace").splitlines()
    if re.fullmatch(r"course_utils/grading/ex\d\d\.py", rel):
        for _name, first, last in _marked_bodies(own):
            lines[first - 1:last] = [""] * (last - first + 1)
    return "\n".join(lines)


def test_every_reference_and_answer_has_a_body_to_look_for():
    found = bodies()
    assert len(found) >= 22 and all(found.values()), {k: v for k, v in found.items() if not v}
    assert "ex11.reference_split" in found and "ex03.sigmoid_saved" in found


def test_no_line_of_a_reference_or_an_answer_is_in_the_release(texts):
    """A body line found in a release file is a leak, unless the teacher's copy of that file has it
    outside every reference and answer (``teaches``: a library module, a lesson, an observe
    function that builds the same inputs)."""
    taught = {rel: teaches(rel) for rel in texts}
    leaks = []
    for function, lines in bodies().items():
        for line in lines:
            leaks += [f"{function}: {line!r} in {rel}" for rel, text in texts.items()
                      if line in text and line not in taught[rel]]
    assert not leaks, f"{len(leaks)} lines of references and answers in the release: " + "; ".join(leaks[:20])


# -- (b) no value for another seed -----------------------------------------------------------------------------
def _flat(value, path=()):
    """(path, value) of the numbers and tensors in a result."""
    if isinstance(value, (list, tuple)):
        for k, v in enumerate(value):
            yield from _flat(v, (*path, k))
    elif isinstance(value, (set, frozenset)):
        for v in value:
            yield from _flat(v, (*path, "in"))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _flat(v, (*path, k))
    elif isinstance(value, torch.Tensor) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        yield path, value


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _at_seed_0(name: str, result, recording: dict) -> bool:
    """The release's recording has this result of this function."""
    return any(_same(result, r) for r in recording.get(name, ()))


#: the references whose results the seed does not change (exercise 01's blocks, 05's nets, 07's
#: plans, 08's configurations; 02's hook table, whose bytes depend on the shapes only): their
#: results for any seed are the recording's for seed 0
SEED_FREE = {"ex01._reference_count", "ex01._up_reference", "ex01._seed000_reference", "ex02.reference_rows",
             "ex02.reference_log_hooks", "ex05.peak_of", "ex07.plan_saved", "ex08.full_batch_grads",
             "ex08._full_batch_grads"}


def _telling(v) -> bool:
    """A value that could not be in the release by chance: a tensor of several elements, a float,
    an int of at least 4 digits."""
    if isinstance(v, torch.Tensor):
        return v.numel() > 1
    return isinstance(v, float) or abs(v) >= 1000


def _digits(text: str) -> set[str]:
    """The whole numbers written in ``text``, with or without separators (1,048,576 or 1_048_576)."""
    return {m.replace(",", "").replace("_", "") for m in re.findall(r"(?<![\d.])\d[\d,_]*\d(?![\d])", text)}


@SWEEP
def test_the_seed_free_references_return_at_any_seed_what_the_release_recorded(recording, at_seed):
    """``SEED_FREE`` is right (and the release has their results: its check cells judge these parts
    at any seed)."""
    calls = [(".".join(name.rsplit(".", 2)[1:]), name, result) for found in at_seed.values()
             for name, result in found["calls"]]
    assert SEED_FREE <= {short for short, _, _ in calls}
    assert [short for short, name, result in calls if short in SEED_FREE
            and not _at_seed_0(name, result, recording)] == []


@SWEEP
def test_no_value_for_another_seed_is_in_the_release(texts, recording, at_seed):
    """What a reference or an answer returned at SEED is not in the release: no int of at least 4
    digits in a text file (unless the teacher's copy of the file has it: a GPU run's record, see
    ``teaches``); in the recording, not every result of a function (some inputs are the same at
    every seed: the first case of exercise 11's split), and no float, int or tensor of one --
    except where seed 0's result has the same value in the same place (the bytes a checkpointed
    encoder saves, a bias's gradient: what the seed does not change). ``SEED_FREE``'s are left out."""
    by_place = {name: [pv for r in results for pv in _flat(r)] for name, results in recording.items()}
    recorded = [v for pairs in by_place.values() for _, v in pairs]
    numbers = {v for v in recorded if not isinstance(v, torch.Tensor)}
    tensors = [v for v in recorded if isinstance(v, torch.Tensor)]
    shipped = {rel: (_digits(text), _digits(teaches(rel))) for rel, text in texts.items()}
    leaks, looked, whole = [], 0, {}  # whole: function -> [its results, how many in the recording]
    for (nn_id, key), found in at_seed.items():
        for name, result in found["calls"]:
            short = ".".join(name.rsplit(".", 2)[1:])
            values = [(place, v) for place, v in _flat(result) if _telling(v)]
            for _, v in values:
                if isinstance(v, int):
                    leaks += [f"{nn_id}/{key} {short}: {v} in {rel}" for rel, (has, taught) in shipped.items()
                              if str(abs(v)) in has and str(abs(v)) not in taught]
            if short in SEED_FREE:
                continue
            if values:
                count = whole.setdefault(short, [0, 0])
                count[0] += 1
                count[1] += _at_seed_0(name, result, recording)
            for place, v in values:
                if any(p == place and _same(v, r) for p, r in by_place.get(name, ())):
                    continue  # the same at seed 0
                looked += 1
                if isinstance(v, torch.Tensor) and any(_same(v.detach(), t) for t in tensors):
                    leaks.append(f"{nn_id}/{key} {short}: a tensor {tuple(v.shape)} in the recording")
                elif not isinstance(v, torch.Tensor) and v in numbers:
                    leaks.append(f"{nn_id}/{key} {short}: {v!r} in the recording")
    leaks += [f"{short}: its {n} results at seed {SEED} are in the recording" for short, (n, found) in
              whole.items() if found == n]
    assert not leaks, f"{len(leaks)} values for seed {SEED} in the release: " + "; ".join(leaks[:20])
    assert looked > 100, looked  # the values looked for: most of them


@SWEEP
def test_the_release_cannot_judge_another_seed(built, recording, at_seed, tmp_path):
    """Judged by the release's own course_utils at SEED, every part whose references or answers
    returned a result not recorded for seed 0 is left to the teacher's grader (the release before
    issue 42 ran its references, and judged every one of them)."""
    judged = judged_in_release(built, at_seed, tmp_path)
    dependent = {f"{nn_id}/{key}" for (nn_id, key), found in at_seed.items()
                 if not all(_at_seed_0(name, result, recording) for name, result in found["calls"])}
    assert len(dependent) >= 20, sorted(dependent)
    checked = {name: judged[name] for name in sorted(dependent) if judged[name][0]}
    assert not checked, f"the release judged {len(checked)} parts at seed {SEED} by itself: {checked}"


def test_the_release_leaves_exercise_11_at_another_seed_to_the_teacher(built, tmp_path):
    """CI's share of the test above (exercise 11: pure-Python references, ~2 CPU-s): its three
    parts, judged by the release at SEED, are "checked by your teacher's grader" -- the release
    before issue 42 held the references' code and judged them itself."""
    found = judged_at_seed({"11"})
    assert sorted(found) == [("11", "card"), ("11", "choose"), ("11", "split")]
    judged = judged_in_release(built, found, tmp_path)
    assert {name: checked for name, (checked, _passed, _message) in judged.items()} == dict.fromkeys(judged, False)
    assert all("teacher" in message for _checked, _passed, message in judged.values()), judged


def judged_in_release(built, found: dict, tmp_path) -> dict[str, list]:
    """{exercise/part: [checked, passed, message]} of ``found``'s observations judged at SEED by
    the release's own course_utils, in a process of its own."""
    torch.save({f"{nn_id}/{key}": f["observed"] for (nn_id, key), f in found.items()}, tmp_path / "observed.pt")
    code = ("import json, torch\n"
            "from course_utils.grading.registry import exercise\n"
            f"observed = torch.load({str(tmp_path / 'observed.pt')!r}, weights_only=True)\n"
            "out = {}\n"
            "for name, data in observed.items():\n"
            "    nn_id, key = name.split('/')\n"
            f"    r = exercise(nn_id).judge(key, data, {SEED})\n"
            "    out[name] = [r.checked, r.passed, r.message[:200]]\n"
            "print('__JUDGED__' + json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=built, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(built)))
    assert r.returncode == 0 and "__JUDGED__" in r.stdout, r.stderr[-3000:]
    return json.loads(r.stdout.split("__JUDGED__", 1)[1])


# -- (d) exercise 03's "by reasoning" part: sigmoid_net_step tells the peak only -------------------------------
SHORTCUT = "    return sigmoid_net_step(n).saved_peak\n"


def shortcut_notebook():
    """Exercise 03's solution with the "by reasoning" part answered by ``sigmoid_net_step``."""
    sol = next(p for p in SOLUTIONS if p.name.startswith("03_"))
    nb = nbformat.read(sol, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "def saved_formula" in c.source)
    start, end = cell.source.index("    ### BEGIN SOLUTION\n"), cell.source.index("    ### END SOLUTION\n")
    assert "def largest_n_sigmoid" not in cell.source[start:end]  # only saved_formula's answer replaced
    cell.source = cell.source[:start] + SHORTCUT + cell.source[end + len("    ### END SOLUTION\n"):]
    return nb


def test_the_formula_from_sigmoid_net_step_fails_its_part():
    """The shortcut, rebuilt and judged in this process (the check the grader's sandbox and judge
    make; the whole grader: the sweep test below): the "by reasoning" part fails."""
    ex = exercise("03")
    with contextlib.redirect_stdout(io.StringIO()):
        observed = observe_notebook(shortcut_notebook(), "03", ["formula"], SEED)
    result = ex.judge("formula", roundtrip(observed["formula"]), SEED)
    assert not result.passed and "saved_peak" in result.message, result.message


@SWEEP
def test_the_formula_from_sigmoid_net_step_scores_0_in_the_grader(tmp_path):
    """The test above through the real grader (~17 CPU-s)."""
    nb = shortcut_notebook()
    folder = tmp_path / "class"
    folder.mkdir()
    nbformat.write(nb, folder / "03_shortcut.ipynb")
    r = subprocess.run([sys.executable, "-m", "course_utils.grading.grade", str(folder), "--jobs", "1",
                        "--json", str(tmp_path / "out.json"), "--seed", str(SEED), "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (row,) = json.loads((tmp_path / "out.json").read_text())
    parts = {p["key"]: p for p in row["parts"]}
    assert parts["formula"]["score"] == 0 and "saved_peak" in parts["formula"]["message"], parts["formula"]
    # the rest is the solution's: largest_n_sigmoid still uses sigmoid_net_step(n).peak, for full marks
    assert all(p["score"] == p["points"] for k, p in parts.items() if k != "formula"), parts
