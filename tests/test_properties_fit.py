"""``fit`` and ``predict_step`` under generated arguments: a report (a prediction) whose every
figure is finite and >= 0, or the course's own error -- ``FitError``, ``MeasureError`` or
``LoopError`` -- with its fix in the message; never another exception type.

One tiny model (4 features -> Linear -> ReLU -> Linear -> 3 classes), its builder defined once
for the module. Measured on the shared 2-core machine: a fit of it costs 0.07 CPU-s without
techniques, 0.11 with one and 0.37 with all twelve, a ``predict_step`` 0.02, and a refusal before
the prediction (a bad shape, a bad card) 10 microseconds. So each generated call is a valid one
with one or two arguments changed, each change half the time to a value that must be refused;
the generated calls take at most two techniques (never ``None``, which means all), and the valid
paths that cost most (every technique, real CPU tensors) are explicit examples. ci profile: about
5 CPU-s beyond an empty run, 1.8 of them MemTracker's import (the first prediction's).
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from course_utils import fit
from course_utils.checks import FitError, LoopError, MeasureError
from course_utils.fit_report import FitReport
from course_utils.loops import Loop
from course_utils.memory import Prediction, predict_step

FEATURES, CLASSES = 4, 3
OURS = (FitError, MeasureError, LoopError)


def tiny() -> nn.Module:
    """The one model of the file: 4 features in, 3 class scores out."""
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, CLASSES))


# -- what the arguments may be ---------------------------------------------------------------------
def either(good: list, odd: list, *more_odd: st.SearchStrategy) -> st.SearchStrategy:
    """Half the draws a value the argument takes (a report follows), half a value it must refuse."""
    return st.one_of(st.sampled_from(good), st.one_of(st.sampled_from(odd), *more_odd))


dims = st.one_of(st.integers(1, 8), st.sampled_from([0, -1, 2**40, 2**62, 2.5, True, "4", None]))
shapes = either([(1, FEATURES), (8, FEATURES), "3,4", [5, FEATURES], (2**40, FEATURES), (2**46, FEATURES)],
                ["8,4,", "a,b", "", "8,,4", "-2,4", "8x4", 8, None, 2.5, b"8,4", [[2, 4]], (2**62, FEATURES),
                 (2**63 - 1, FEATURES), (2, 5), (2, FEATURES, 1)],
                st.lists(dims, max_size=4).map(tuple))
cards = either([1, 0.25, 80.0, 1e-300, 2**20], [0, -1, True, "8", None, 2**20 + 1],
               st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: not 0 < f <= 2**20))
classes = either([None, CLASSES], [0, -1, 1, 5, 3.0, True, "3"])
accumulates = either([1, 2], [0, -1, 1.5, True, "2", None])
techniques = either(["", "inplace", "autocast-bf16", "ddp-2", "inplace,ddp-2", "fsdp-2", " inplace , ",
                     "checkpoint-blocks", "selective", "offload", ["inplace"], []],
                    ["ddp-3", "bogus", ",", 3, b"inplace", {"inplace": 1}, ["x"], [1], [None], ["inplace", ""]])
losses = either(["cross_entropy", "mse", "bce"], ["hinge", "", ":", "os:path", "no.such.module:f", "math:pi",
                                                  "tests.test_properties_fit:tiny", 3, None])
modes = either(["train", "forward", "inference"], ["Train", "", None, 1])
outputs = either([None], [0, -1, 5, "logits", 1.5, True])
optimizers = either([None, "adam", "adamw", "sgd", "none"], ["lion", "", 3])
capabilities = either([None, "9.0", (8, 0)], ["nine", "99.9", (9,), (True, 0), 9.0])
time_cards = either([None, "RTX 3070"], ["no such card", "", 3])


def _numbers(data: Any, skip: frozenset[str] = frozenset({"output"})) -> Iterator[float]:
    """Every number in a nested dict / list (bools aside), leaving out the keys in ``skip``."""
    if isinstance(data, dict):
        for k, v in data.items():
            if k not in skip:
                yield from _numbers(v, skip)
    elif isinstance(data, (list, tuple)):
        for v in data:
            yield from _numbers(v, skip)
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        yield data


def check_report(rep: Any, timed: bool) -> None:
    """A FitReport whose figures are all finite and >= 0 (the CLI's --json writes them without
    NaN), whose time is estimated where techniques were asked for, and which prints."""
    assert isinstance(rep, FitReport)
    data = rep.to_dict()
    json.dumps(data, allow_nan=False)
    assert all(math.isfinite(v) and v >= 0 for v in _numbers(data)), data
    for r in rep.rows:
        assert r.peak >= 0 and r.card_needs >= 0 and r.largest_batch >= 0
        assert (math.isfinite(r.seconds) and r.seconds > 0) if timed else (math.isnan(r.seconds) or r.seconds > 0)
    assert rep.summary() and len(rep.table) == len(rep.rows)


def check_prediction(p: Any) -> None:
    assert isinstance(p, Prediction)
    assert isinstance(p.peak, int) and p.peak >= 0
    for figures in (p.breakdown, p.after_forward):
        assert all(isinstance(v, int) and v >= 0 for v in figures.values()), figures


def check_refusal(e: BaseException) -> None:
    assert isinstance(e, OURS), f"{type(e).__name__}: {e}"
    assert "Fix:" in str(e), str(e)


# -- fit -----------------------------------------------------------------------------------------
#: a call that reports; each generated call changes up to two of its arguments (a valid call is
#: most of what a fit costs, a changed one mostly fails before any prediction)
VALID = dict(input_shape=(2, FEATURES), card_gib=8.0, n_classes=None, accumulate=1, techniques="",
             loss="cross_entropy", mode="train", output=None, optimizer=None, compute_capability=None,
             time_card=None)
CHANGED = dict(input_shape=shapes, card_gib=cards, n_classes=classes, accumulate=accumulates, techniques=techniques,
               loss=losses, mode=modes, output=outputs, optimizer=optimizers, compute_capability=capabilities,
               time_card=time_cards)


@st.composite
def fit_arguments(draw) -> dict[str, Any]:
    kw = dict(VALID, input_shape=draw(st.tuples(st.integers(1, 8), st.just(FEATURES))))
    for name in draw(st.lists(st.sampled_from(sorted(CHANGED)), min_size=1, max_size=2, unique=True)):
        kw[name] = draw(CHANGED[name])
    return kw


@given(kw=fit_arguments())
def test_fit_reports_or_refuses_with_the_fix(kw):
    try:
        rep = fit.fit(tiny, progress=False, **kw)
    except Exception as e:  # noqa: BLE001 - the property is about which exceptions come out
        check_refusal(e)
    else:
        check_report(rep, timed=bool(fit.parse_techniques(kw["techniques"])))


@pytest.mark.parametrize("shape, kwargs", [
    ((2**40, FEATURES), dict(techniques=None, optimizer="sgd", accumulate=2)),  # every technique: 0.4 CPU-s
    ("2,4", dict(loss="mse", mode="forward", techniques="inplace,autocast-fp16", card_gib=0.25)),
])
def test_fit_on_valid_arguments_reports_finite_figures(shape, kwargs):
    check_report(fit.fit(tiny, shape, progress=False, **kwargs), timed=kwargs["techniques"] != [])


# -- predict_step --------------------------------------------------------------------------------
loops = st.one_of(st.none(), st.fixed_dictionaries({"mode": modes, "accumulate": accumulates, "output": outputs}))
PREDICT_VALID = dict(target_shape=None, n_classes=None, target=None, optimizer="adam", loop=None, steady_state=True,
                     dtype=torch.float32)
PREDICT_CHANGED = dict(
    input_shape=shapes, n_classes=classes, optimizer=optimizers, loop=loops, steady_state=st.sampled_from([False, 1]),
    target_shape=st.one_of(st.tuples(st.integers(1, 8)), st.sampled_from([(0,), (-1,), (2, 2), (2**62,), "2", 2.5])),
    target=st.sampled_from(["cuda", "cpu", "tpu", 1]), dtype=st.sampled_from([torch.bfloat16, "float32", None]))


@st.composite
def predict_arguments(draw) -> dict[str, Any]:
    kw = dict(PREDICT_VALID, input_shape=draw(st.tuples(st.integers(1, 8), st.just(FEATURES))))
    for name in draw(st.lists(st.sampled_from(sorted(PREDICT_CHANGED)), max_size=2, unique=True)):
        kw[name] = draw(PREDICT_CHANGED[name])
    return kw


@pytest.mark.filterwarnings("ignore:Using a target size")  # MSE broadcasts a float target of another shape, as torch does
@given(kw=predict_arguments())
def test_predict_step_predicts_or_refuses_with_the_fix(kw):
    try:
        if kw["loop"] is not None:
            kw["loop"] = Loop(**kw["loop"])
        p = predict_step(tiny, module_peaks=False, **kw)
    except Exception as e:  # noqa: BLE001 - the property is about which exceptions come out
        check_refusal(e)
    else:
        check_prediction(p)


def test_predict_step_on_real_cpu_tensors_and_on_the_meta_device():
    """The paths the generated calls leave out: real tensors (fake=False: real memory, so never a
    generated shape) and a model built on the meta device."""
    real = predict_step(tiny, (2, FEATURES), (2,), n_classes=CLASSES, fake=False, target="cpu", module_peaks=False)
    fake = predict_step(tiny, (2, FEATURES), (2,), n_classes=CLASSES, target="cpu", module_peaks=False)
    check_prediction(real)
    assert real.peak == fake.peak

    def on_meta():
        with torch.device("meta"):
            return tiny()

    check_prediction(predict_step(on_meta, (2, FEATURES), module_peaks=False))
    with pytest.raises(MeasureError, match="meta device") as e:
        predict_step(on_meta, (2, FEATURES), fake=False, target="cpu")
    check_refusal(e.value)
