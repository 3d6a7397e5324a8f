"""Forged observations: every judge rejects an observation that is incomplete or of the wrong form.

The observing code shares a process with the learner's code (the parts observe *how* that code
runs), so the data a judge receives may have been replaced there (five lines in a class body that
made ``Exercise.observe`` return ``[]`` once won 22 points). Each judge therefore recomputes from
the seed which inputs the observation must cover and checks its count, keys, types and tensor
shapes against that before it compares a value.

* ``test_junk_observations_fail_every_part`` (fast): ``[]``, ``{}``, ``None``, ... fail every part.
* ``test_mutated_solution_observations_fail`` (grader and sweep: ``make test-sweep``, 1,000 s on a
  2-core machine at load 15, not in CI): each solution's real observation passes;
  every mutant of it (a list cut short or padded, a key dropped, a tensor reshaped or cast, an int
  + 1, a bool flipped, a NaN, a list swapped for a dict) fails, unless ``ALLOWED`` says why not.
* ``test_forged_observations_score_zero_in_the_grader`` (grader): the two forgeries below,
  graded for real on exercises 00 and 03, score 0; ``..._on_every_exercise_...`` (grader and sweep)
  the class-body forgery on the other exercises.
"""

from __future__ import annotations

import copy
import re
import time
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell

from course_utils.grading.core import Raised, roundtrip
from course_utils.grading.registry import MODULES, exercise

ROOT = Path(__file__).resolve().parent.parent
SEED = 20261123

JUNK = [[], {}, None, 0, "", True, [[]], {"": None}, Raised("Forged", "forged").to_data()]


# -- fast: junk -------------------------------------------------------------------------------------
@pytest.mark.parametrize("nn_id", sorted(MODULES))
def test_junk_observations_fail_every_part(nn_id):
    ex = exercise(nn_id)
    for part in ex.parts:
        for junk in JUNK:
            result = ex.judge(part.key, copy.deepcopy(junk), SEED)  # never raises
            assert not result.passed and result.score == 0, (nn_id, part.key, junk)
            assert result.message, (nn_id, part.key, junk)


def test_form_helpers_name_what_is_missing():
    from course_utils.grading.core import CheckFailed, expect_items, expect_keys, expect_tensor

    with pytest.raises(CheckFailed, match=r"covers 3 of the 4 volumes N \(8, 50, 333, 2,000\)"):
        expect_items("saved_formula", [[8, 1], [50, 2], [333, 3]], [8, 50, 333, 2000], what="volumes N")
    with pytest.raises(CheckFailed, match=r"row 2 is for \[51\], not for the seed's \[50\]"):
        expect_items("naive_estimate", [[8, 1], [51, 2]], [8, 50])
    with pytest.raises(CheckFailed, match=r"row 1 is for \[True\]"):  # True is not 1
        expect_items("f", [[True, 1]], [1])
    with pytest.raises(CheckFailed, match="1 of the 2 nets missing: small"):
        expect_keys("seed 000's nets", {"large": 1}, ("large", "small"), "nets")
    with pytest.raises(CheckFailed, match="unexpected keys: 'x'"):
        expect_keys("fixed", {"y": 1, "grad": 2, "x": 3}, ("y", "grad"))
    with pytest.raises(CheckFailed, match=r"expected dtype torch.float64, got torch.float32"):
        expect_tensor("dx", torch.zeros(3), (3,), torch.float64)


def test_secret_parts_never_show_the_expected_value_for_a_wrong_form():
    # a bool for an int, a float for an int: the message names the type, never the answer
    ex = exercise("07")
    r = ex.judge("segments", [[8, True], [18, 6]], SEED)
    assert not r.passed and "expected an int, got bool" in r.message, r.message
    ex03 = exercise("03")
    from course_utils.grading.ex03 import naive_ns

    r = ex03.judge("naive", [[n, 1.0] for n in naive_ns(SEED)], SEED)
    assert not r.passed and "expected an int, got float" in r.message, r.message


# -- thorough: mutants of the solutions' real observations -------------------------------------------
#: (exercise, part, path regex, mutant kinds, why the mutant may pass). A path is the keys and
#: indices into the observation, joined by "/"; kinds: trunc, extend, drop, swap, reshape, cast,
#: int, flip, nan. Every mutant not listed must fail its part.
ALLOWED = [
    # exercise 02: the three log_hooks parts judge one run each; a row's bytes are the bytes
    # part's, the count of hooks left the cleanup part's
    ("02", "events|cleanup", r"rows/\d+/2", {"int"}, "the bytes at a hook are the bytes part's answer"),
    ("02", "events|bytes", r"hooks_left", {"int"}, "the hooks left are the cleanup part's answer"),
    # exercise 03: the number of predictions is a bound (at most 40), and only the few_calls part's
    ("03", "largest_n", r"\d+/2", {"int"}, "the number of predictions is the few_calls part's"),
    ("03", "few_calls", r"\d+/2", {"int"}, "one prediction more stays under the bound of 40"),
    # exercise 04: five parts judge one observed step, each its own field
    ("04", "autocast|scaled|step|overflow", r"loss", {"nan"}, "the loss is the runs part's"),
    ("04", "runs|autocast|step|overflow", r"raw_grad", {"nan"}, "the raw gradient is the scaled part's"),
    ("04", "runs|autocast|scaled", r"params/\d+", {"nan"}, "the parameters are the step and overflow parts'"),
    ("04", "runs|autocast|scaled|overflow", r"updated", {"flip"}, "scaler.update() is the step part's"),
    ("04", "runs|autocast|scaled|step|overflow", r"dtypes", {"extend"},
     "a second forward: the number of forwards is the learner's; the autocast part reads the first"),
    ("04", "runs|autocast|scaled|step", r"scale", {"nan"}, "the scale after the step is the overflow part's"),
    # exercise 07: four parts judge one run of encoder_forward, each its own field; the skips are
    # the learner's return value, their number and shapes the skips part's
    ("07", "grads|less|bn", r"skips(/\d+)?", {"trunc", "extend", "reshape", "nan"}, "the skips are the skips part's"),
    ("07", "skips|grads|bn", r"saved", {"int"}, "the saved bytes are the less part's"),
    ("07", "less", r"saved", {"int"}, "one byte more is still under half the plain encoder's"),
    ("07", "skips|grads|less", r"bn_batches/\d+", {"int"}, "the BatchNorms' counts are the bn part's"),
    ("07", "skips|less|bn", r"grads/\d+", {"nan"}, "the gradients are the grads part's"),
    ("07", "skips|grads|less", r"bn_running/\d+", {"nan"}, "the running statistics are the bn part's"),
    # exercise 08: three parts judge one launch; the gradients are the learner's return value
    # (the grads part checks their number and shapes), the batch sizes the shard part's
    ("08", "runs|shard", r"ranks/\d+/grads(/\d+)?", {"trunc", "extend", "reshape", "cast", "nan", "swap"},
     "the gradients are the grads part's"),
    ("08", "runs|grads", r"ranks/\d+/batch_seen(/\d+)?", {"int", "trunc", "extend"},
     "the batch sizes are the shard part's"),
    # exercise 09: three parts judge one split
    ("09", "output|grads", r"shared|covered|total", {"int"}, "the parameter counts are the disjoint part's"),
    ("09", "disjoint|grads", r"out", {"nan", "reshape", "cast"}, "the output is the output part's"),
    ("09", "disjoint|output", r"grads/.*", {"nan"}, "the gradients are the grads part's"),
    # exercise 10: the configuration *is* the answer: the judge estimates the one it receives, so
    # a changed switch is judged as another design, which may meet the part's bar as well
    ("10", "valid|beats|best", r"0/config/(batch|inplace_relu|inplace_abn|lean_up|offload)", {"int", "flip"},
     "another valid design; the judge estimates the configuration it received"),
]


def allowed(nn_id: str, part: str, path: str, kind: str) -> int | None:
    """The index of the ``ALLOWED`` entry that lets this mutant pass, or None."""
    return next((k for k, (nn, parts, rx, kinds, _) in enumerate(ALLOWED)
                 if nn == nn_id and re.fullmatch(parts, part) and re.fullmatch(rx, path) and kind in kinds), None)


#: a list (a dict) longer than this has only its first and last items (keys) mutated inside: its
#: items are alike (rows, gradients), and so are their mutants
WIDE, WIDE_DICT = 4, 16


def mutants(obs, path: str = ""):
    """(path, kind, mutated copy) for every generic mutant of the observation ``obs``."""
    def at(value, kind):
        return path, kind, value

    if isinstance(obs, bool):
        yield at(not obs, "flip")
    elif isinstance(obs, int):
        yield at(obs + 1, "int")
    elif isinstance(obs, float):
        yield at(float("nan"), "nan")
    elif isinstance(obs, torch.Tensor):
        yield at(obs.reshape(-1) if obs.dim() != 1 else obs.reshape(1, -1), "reshape")
        yield at(obs.to(torch.float32 if obs.dtype == torch.float64 else torch.float64), "cast")
        if obs.is_floating_point() and obs.numel():
            nan = obs.clone()
            nan.view(-1)[0] = float("nan")
            yield at(nan, "nan")
    elif isinstance(obs, list):
        if obs:
            yield at(obs[:-1], "trunc")
            yield at(obs + [copy.deepcopy(obs[-1])], "extend")
        yield at({str(k): v for k, v in enumerate(obs)}, "swap")
        inner = range(len(obs)) if len(obs) <= WIDE else (0, len(obs) - 1)
        for k in inner:
            for p, kind, v in mutants(obs[k], f"{path}/{k}".lstrip("/")):
                yield p, kind, obs[:k] + [v] + obs[k + 1:]
    elif isinstance(obs, dict):
        keys = list(obs)
        inner = keys if len(keys) <= WIDE_DICT else (keys[0], keys[-1])
        for key in inner:
            yield f"{path}/{key}".lstrip("/"), "drop", {k: v for k, v in obs.items() if k != key}
        yield at(list(obs.values()), "swap")
        for key in inner:
            for p, kind, v in mutants(obs[key], f"{path}/{key}".lstrip("/")):
                yield p, kind, dict(obs, **{key: v})


def solution_observations(nn_id: str) -> dict:
    from course_utils.grading.sandbox import observe_notebook

    ex = exercise(nn_id)
    keys = [p.key for p in ex.parts]
    nb = nbformat.read(next((ROOT / "solutions").glob(f"{nn_id}_*.ipynb")), as_version=4)
    obs = observe_notebook(nb, nn_id, keys, SEED)
    return {k: roundtrip(obs[k]) for k in keys}


def judge_mutants(nn_id: str, observations: dict) -> tuple[list, list, int, set]:
    """(mutants that passed though not allowed, parts whose real observation failed, mutants
    judged, the ``ALLOWED`` entries used)."""
    ex = exercise(nn_id)
    passed, broken, count, used = [], [], 0, set()
    for part in ex.parts:
        real = ex.judge(part.key, observations[part.key], SEED)
        if not real.passed:
            broken.append((part.key, real.message))
            continue
        for path, kind, mutant in mutants(observations[part.key]):
            entry = allowed(nn_id, part.key, path, kind)
            if entry is not None:  # may pass or fail: not judged, to save time
                used.add(entry)
                continue
            count += 1
            if ex.judge(part.key, mutant, SEED).passed:
                passed.append(f"{part.key}: {kind} at {path or '(top)'}")
    return passed, broken, count, used


@pytest.mark.grader
@pytest.mark.sweep
@pytest.mark.timeout(900)
@pytest.mark.parametrize("nn_id", sorted(MODULES))
def test_mutated_solution_observations_fail(nn_id):
    t0 = time.monotonic()
    observations = solution_observations(nn_id)
    t1 = time.monotonic()
    passed, broken, count, used = judge_mutants(nn_id, observations)
    print(f"exercise {nn_id}: observed in {t1 - t0:.1f} s, {count} mutants judged in {time.monotonic() - t1:.1f} s")
    assert not broken, f"the solution's own observation fails: {broken}"
    assert not passed, f"exercise {nn_id}: mutants that passed (fix the judge, or add to ALLOWED with why): {passed}"
    stale = [entry[:3] for k, entry in enumerate(ALLOWED) if entry[0] == nn_id and k not in used]
    assert not stale, f"ALLOWED entries that no mutant of exercise {nn_id} matches (remove them): {stale}"


# -- end to end: two forgeries, graded for real ---------------------------------------------------------
FORGED_OBSERVE = """
class _F:
    import course_utils.grading.core as c
    c.Exercise.observe = lambda self, key, objects, seed: []
"""

#: the graded function writes every part's observation itself, then ends the sandbox
FORGED_FILES = {"03": ("naive_estimate", "n")}


def forged_files(nn_id: str) -> str:
    name, args = FORGED_FILES[nn_id]
    keys = [p.key for p in exercise(nn_id).parts]
    return f"""
def {name}({args}):
    import os, torch
    for key in {keys!r}:
        torch.save([], os.path.join("obs", key + ".pt"))
    os._exit(0)
"""


#: the class-body forgery on these exercises, and the file forgery of FORGED_FILES, graded for
#: real: CI grades exercise 00's class-body forgery and exercise 03's file forgery (two submissions of
#: the cheapest notebooks); make test-sweep grades the forgery on the other exercises (ex08's ranks and
#: ex10's sweep make their notebook runs the most expensive of the course's)
E2E_FORGED_OBSERVE = ("00", "01", "03", "07", "08", "10")
E2E_IN_CI = {"00_forged_observe.ipynb", "03_forged_files.ipynb"}


def _forged_class(folder: Path, names: set[str]) -> dict:
    from course_utils.grading.grade import Options, grade_many

    for name in names:
        nn_id = name[:2]
        nb = nbformat.read(next((ROOT / "exercises").glob(f"{nn_id}_*.ipynb")), as_version=4)
        nb.cells.append(new_code_cell(FORGED_OBSERVE if name.endswith("_forged_observe.ipynb") else forged_files(nn_id)))
        nbformat.write(nb, folder / name)
    t0 = time.monotonic()
    results = grade_many([str(folder)], Options(cell_timeout=60), progress=False)
    print(f"graded {len(results)} forged submissions in {time.monotonic() - t0:.0f} s:",
          {r.submission: r.seconds for r in results})
    return {r.submission: r for r in results}


def _all_forged() -> set[str]:
    return {f"{nn}_forged_observe.ipynb" for nn in E2E_FORGED_OBSERVE} | {f"{nn}_forged_files.ipynb" for nn in FORGED_FILES}


def _assert_no_points(graded: dict, expected: set[str]) -> None:
    assert set(graded) == expected
    won = {}
    for name, r in sorted(graded.items()):
        assert r.status == "graded", (name, r.status, r.notes)
        assert len(r.parts) == len(exercise(name[:2]).parts), (name, r.parts)
        if r.score or any(p["score"] for p in r.parts):
            won[name] = f"{r.score}/{r.max_score}: " + ", ".join(p["key"] for p in r.parts if p["score"])
    assert not won, f"forged observations won points: {won}"


@pytest.mark.grader
@pytest.mark.timeout(1200)
def test_forged_observations_score_zero_in_the_grader(tmp_path):
    """Exercise 00's class-body forgery and exercise 03's file forgery, graded for real, score 0
    (the old grader gave 03 7/7 for both)."""
    assert E2E_IN_CI <= _all_forged()
    _assert_no_points(_forged_class(tmp_path, E2E_IN_CI), E2E_IN_CI)


@pytest.mark.grader
@pytest.mark.sweep  # make test-sweep, not CI (CI's CPU: see .ci/run)
@pytest.mark.timeout(1800)
def test_forged_observations_on_every_exercise_score_zero_in_the_grader(tmp_path):
    """The class-body forgery on exercises 01, 03, 07, 08 and 10 too (the old grader gave 07 3/7,
    08 2/6 and 10 4/4)."""
    rest = _all_forged() - E2E_IN_CI
    _assert_no_points(_forged_class(tmp_path, rest), rest)
