"""The explorer's estimates: batch scaling checked against direct predictions, the largest
batch, every switch, bad input; the widget builds."""

import re
from dataclasses import replace

import pytest

from course_utils import predict_step
from course_utils.explorer import PRECISIONS, Config, build, estimate, table
from course_utils.memory import GiB

SMALL = Config(levels=3, base_channels=8, volume=(16, 32, 32), batch=2, precision="fp32", seed000=False)


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("batch", [3, 6])
def test_scaled_estimate_matches_a_direct_prediction(precision, batch):
    """The batch-2 step scaled to other batches against a direct steady-state prediction (the
    same one a GPU is compared with: Adam state resident, CUDA rules)."""
    cfg = replace(SMALL, precision=precision, batch=batch)
    dtype, ac = PRECISIONS[precision]
    p = predict_step(lambda: build(cfg), (batch, 1, *cfg.volume), n_classes=5, dtype=dtype,
                     autocast_dtype=ac)
    assert estimate(cfg).total == pytest.approx(p.peak, rel=0.03)


def test_the_probe_batch_is_exact():
    for precision in PRECISIONS:
        cfg = replace(SMALL, precision=precision, batch=2)
        dtype, ac = PRECISIONS[precision]
        p = predict_step(lambda: build(cfg), (2, 1, *cfg.volume), n_classes=5, dtype=dtype,
                         autocast_dtype=ac)
        assert abs(estimate(cfg).total - p.peak) <= 8  # rounding of each part to whole bytes


def test_steady_state_includes_adam_and_the_overheads_are_stated():
    est = estimate(replace(SMALL, precision="fp32"))
    assert est.parts["optimizer"] >= 2 * est.parts["params"] * 0.9  # Adam's two fp32 moments
    assert est.card_needs > est.total
    assert "assumed" in est.overheads.source or "measured" in est.overheads.source


def test_largest_batch_fits_and_one_more_does_not():
    cfg = replace(SMALL, budget_gib=1)
    n = estimate(cfg).largest_batch
    assert n > 1
    assert estimate(replace(cfg, batch=n)).fits and not estimate(replace(cfg, batch=n + 1)).fits
    assert estimate(replace(cfg, batch=n)).card_needs <= 1 * GiB


def test_ranks_split_the_batch_not_the_model():
    one, four = estimate(replace(SMALL, batch=8)), estimate(replace(SMALL, batch=8, dp_ranks=4))
    assert four.local_batch == 2
    assert four.parts["params"] == one.parts["params"]
    assert four.parts["activations"] * 4 == one.parts["activations"]
    assert four.largest_batch == 4 * estimate(SMALL).largest_batch


def test_techniques_lower_the_estimate():
    base = estimate(replace(SMALL, batch=4)).total
    for kw in (dict(inplace_abn=True), dict(checkpointing="level"), dict(precision="autocast_bf16")):
        assert estimate(replace(SMALL, batch=4, **kw)).total < base, kw


def test_every_field_is_in_the_cache_key_or_named_as_left_out():
    """A field added to Config is part of the cached prediction's key unless it is put in
    NOT_IN_MODEL_KEY on purpose: it cannot silently share another configuration's prediction."""
    from dataclasses import dataclass, fields

    from course_utils.explorer import NOT_IN_MODEL_KEY

    names = {f.name for f in fields(Config)}
    keyed = [name for name, _ in SMALL.model_key()]
    assert NOT_IN_MODEL_KEY == {"batch", "dp_ranks", "budget_gib"} and NOT_IN_MODEL_KEY < names
    assert set(keyed) == names - NOT_IN_MODEL_KEY and len(keyed) == len(set(keyed))
    assert replace(SMALL, batch=5, dp_ranks=3, budget_gib=40).model_key() == SMALL.model_key()
    for name, value in (("levels", 4), ("volume", (8, 32, 32)), ("precision", "autocast_fp16"),
                        ("inplace_relu", True), ("inplace_abn", True), ("checkpointing", "conv"),
                        ("seed000", True), ("lean_up", True), ("offload", True), ("base_channels", 16)):
        assert replace(SMALL, **{name: value}).model_key() != SMALL.model_key(), name

    @dataclass(frozen=True)
    class Wider(Config):
        kernel: int = 3  # a new switch of the model

    assert Wider(kernel=5).model_key() != Wider(kernel=3).model_key()


def test_seed000_configs_use_the_exact_nets():
    from course_utils import count_parameters

    assert count_parameters(build(Config())) == 40_158_853
    assert count_parameters(build(Config(levels=4))) == 14_496_517


def test_bad_configs():
    with pytest.raises(ValueError, match="precision must be one of"):
        estimate(replace(SMALL, precision="fp8"))
    with pytest.raises(ValueError, match="too small for 3 levels"):
        estimate(replace(SMALL, volume=(2, 32, 32)))
    with pytest.raises(ValueError, match="In-Place ABN overwrites"):
        estimate(replace(SMALL, inplace_abn=True, checkpointing="selective"))
    with pytest.raises(ValueError, match="checkpointing must be one of"):
        estimate(replace(SMALL, checkpointing="all"))
    with pytest.raises(ValueError, match="In-Place ABN replaces"):
        estimate(replace(SMALL, inplace_abn=True, inplace_relu=True))
    with pytest.raises(ValueError, match="budget_gib must be > 0"):
        estimate(replace(SMALL, budget_gib=0))


def test_keys_are_identifiers_and_labels_are_for_display():
    from course_utils.explorer import CHECKPOINTING, CHECKPOINTING_LABELS, PRECISION_LABELS, all_combinations

    assert list(PRECISION_LABELS) == list(PRECISIONS) and list(CHECKPOINTING_LABELS) == list(CHECKPOINTING)
    assert all(re.fullmatch(r"[a-z0-9_]+", key) for key in (*PRECISIONS, *CHECKPOINTING))
    # a notebook written with the old labels is told the key to write
    with pytest.raises(ValueError, match="display label.*write precision='autocast_fp16'"):
        Config(precision="autocast fp16")
    with pytest.raises(ValueError, match="write checkpointing='selective'"):
        replace(SMALL, checkpointing="selective (save convs)")
    with pytest.raises(ValueError, match="write precisions='fp16_model'"):
        all_combinations(SMALL, precisions=["fp16 model (seed 000)"])
    with pytest.raises(ValueError, match="write checkpointing='level'"):
        all_combinations(SMALL, checkpointing=("none", "every level"))
    cfg = replace(SMALL, precision="autocast_fp16", lean_up=True, checkpointing="double_conv", offload=True)
    assert cfg.describe() == "autocast fp16 + lean Up + checkpointing every DoubleConv + offload to host"
    assert replace(SMALL, checkpointing="selective").describe() == "fp32 + selective checkpointing (save convs)"


def test_table_and_widget_build():
    start = replace(SMALL, precision="autocast_bf16", checkpointing="conv")
    df = table([start, replace(start, inplace_abn=True)])
    assert list(df["In-Place ABN"]) == [False, True]
    assert Config(**{**vars(SMALL), "precision": df["precision"][0], "checkpointing": df["checkpointing"][0]}) \
        == replace(SMALL, precision="autocast_bf16", checkpointing="conv")  # rows hold keys
    from course_utils.explorer import CHECKPOINTING_LABELS, PRECISION_LABELS, explorer

    box = explorer(start)
    assert len(box.children) == 5
    drop = {c.description: c for row in box.children[:-1] for c in row.children}
    # the widgets show labels and hold keys
    assert drop["precision"].label == "autocast bf16" and drop["precision"].value == "autocast_bf16"
    assert list(drop["precision"]._options_labels) == list(PRECISION_LABELS.values())
    assert drop["checkpoint"].label == "every conv" and drop["checkpoint"].value == "conv"
    assert list(drop["checkpoint"]._options_labels) == list(CHECKPOINTING_LABELS.values())


def test_frontier_switches_build_the_right_net_and_cost_time():
    from course_utils.explorer import CHECKPOINTING, all_combinations, step_cost

    for ck in CHECKPOINTING:
        net = build(replace(SMALL, checkpointing=ck))
        assert (net.checkpoint is None) == (ck == "none")
        assert (net.checkpoint_policy is not None) == (ck == "selective")
    assert build(replace(SMALL, offload=True)).offload_activations
    plain, off = replace(SMALL, batch=4), replace(SMALL, batch=4, offload=True)
    assert estimate(off).total < estimate(plain).total
    assert step_cost(off).seconds > step_cost(plain).seconds and step_cost(off).offloaded_bytes > 0
    ck = replace(SMALL, batch=4, checkpointing="level")
    assert step_cost(ck).flops > step_cost(plain).flops  # the recomputed forward
    assert step_cost(replace(plain, batch=8)).flops == 2 * step_cost(plain).flops
    assert len(all_combinations(SMALL, precisions=["fp32"], checkpointing=CHECKPOINTING, offload=(False, True))) \
        == (3 * 5 - 1) * 2


def test_pareto():
    from course_utils.cost import pareto

    points = [(1.0, 10.0), (2.0, 5.0), (2.5, 6.0), (3.0, 1.0), (1.0, 12.0)]
    assert pareto(points) == [True, True, False, True, False]


def _card_label_and_bars(ax):
    label = [t for t in ax.texts if t.get_text().strip().endswith("GiB card")]
    assert len(label) == 1, [t.get_text() for t in ax.texts]
    return label[0], [p for p in ax.patches if p.get_width() > 0]


@pytest.mark.parametrize("budget", [8, 12, 24, 80])
@pytest.mark.parametrize("fill", ["small", "largest", "over"])
def test_card_label_never_overlaps_the_bar_or_legend(budget, fill):
    """The "8 GiB card" label and the legend are measured with matplotlib's renderer: neither
    intersects a bar segment (the hatched context + slack included), and the label stays in the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_utils.explorer import plot

    cfg = replace(SMALL, budget_gib=budget, volume=(32, 64, 64))
    largest = estimate(cfg).largest_batch  # the bar ends at the card's line: where the label is
    batch = {"small": 1, "largest": largest, "over": 2 * largest}[fill]
    est = estimate(replace(cfg, batch=batch))
    ax = plot(est)
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    label, bars = _card_label_and_bars(ax)
    box = label.get_window_extent(renderer)
    legend = ax.get_legend().get_window_extent(renderer)
    assert len(bars) >= 6
    for bar in bars:
        extent = bar.get_window_extent(renderer)
        assert not box.overlaps(extent), f"card label {box} on the bar {extent} ({budget} GiB, batch {batch})"
        assert not legend.overlaps(extent), f"legend {legend} on the bar {extent}"
    assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1)
    for other in (ax.xaxis.label, ax.title, *ax.get_xticklabels()):
        extent = other.get_window_extent(renderer)
        assert not legend.overlaps(extent) and not box.overlaps(extent), other.get_text()
    plt.close(fig)


def test_explorer_figure_follows_the_batch_slider():
    """Driven as the front end drives it: sliders report on release, one estimate per change, the
    figure's batch is the slider's, and an event queued behind a later one draws nothing stale."""
    import matplotlib

    matplotlib.use("Agg")
    from course_utils.explorer import explorer

    state = explorer(SMALL).explorer_state
    ctl = state.controls
    sliders = [c for c in ctl.values() if hasattr(c, "continuous_update")]
    assert len(sliders) >= 5 and not any(c.continuous_update for c in sliders)
    for b in (3, 4, 7, 5):
        n = state.updates
        ctl["batch"].value = b
        assert state.updates == n + 1
        assert state.estimate.config.batch == b
        assert f"fp32: batch {b} " in state.figure.axes[0].get_title(), state.figure.axes[0].get_title()
    # an event for batch 4, delivered after the slider reached 5: the figure stays at 5
    n = state.updates
    state.update({"owner": ctl["batch"], "old": 3, "new": 4, "name": "value"})
    assert state.updates == n and f"batch {ctl['batch'].value} " in state.figure.axes[0].get_title()
    ctl["dp_ranks"].value = 2
    ctl["batch"].value = 6
    assert "batch 6 (3/GPU on 2 GPUs)" in state.figure.axes[0].get_title()


def test_explorer_card_change_reads_as_a_budget():
    import matplotlib

    matplotlib.use("Agg")
    from course_utils.explorer import explorer

    state = explorer(SMALL).explorer_state
    state.controls["budget_gib"].value = 12
    text = "\n".join(state.lines)
    assert text.startswith("card: 12 GiB. The step needs ")
    assert "largest global batch on this card: " in text
    assert "touch the peak" not in text and "peak where it is" not in text and "change from" not in text
    state.controls["lean_up"].value = True  # fp32: lean Up changes nothing, and says where the peak is
    assert "leaves the peak where it is: in " in "\n".join(state.lines)
