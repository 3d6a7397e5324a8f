"""The explorer's estimates: batch scaling checked against direct predictions, the largest
batch, every switch, an uneven batch over ranks, DDP's buckets, bad input; the widget builds;
the capstone's margin, offloading's pinned bytes and the step time per card (notebook 10)."""

import json
import re
from dataclasses import replace

import pytest
import torch
from torch import nn

from course_utils import predict_step
from course_utils.checks import TechniqueError
from course_utils.explorer import PRECISIONS, Config, build, estimate, table
from course_utils.memory import GiB
from course_utils import budget, cost, explorer as ex
from course_utils.config import SEED000_VOLUME
from course_utils.memory import MiB

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
    with pytest.raises(TechniqueError, match="budget_gib=0 .*Fix: "):
        estimate(replace(SMALL, budget_gib=0))


@pytest.mark.parametrize("changes, match", [
    ({"levels": 1}, r"at least 2 levels"),  # the example: IndexError in unet.default_channels
    ({"levels": 6}, r"too small for 6 levels.*at least 2\*\*\(levels-1\) = 32"),
    ({"volume": (0, 32, 32)}, r"too small for 3 levels"),
    ({"volume": (16, 32)}, r"not three whole numbers"),
    ({"volume": (16.5, 32, 32)}, r"not three whole numbers"),
    ({"dp_ranks": 0}, r"at least one rank"),
])
def test_sizes_that_cannot_be_trained_are_refused_when_the_config_is_made(changes, match):
    """Issue 43: a Config with too few levels raised IndexError from inside the U-Net's builder,
    a volume of zero or two sides and zero ranks were taken, to fail (or not) later. Each is now
    refused where the Config is made, with the fix."""
    with pytest.raises(TechniqueError, match=match) as err:
        replace(SMALL, **changes)
    assert "Fix: " in str(err.value)


def test_the_explorer_says_what_a_refused_config_needs():
    """A setting the controls reach that no U-Net trains (6 levels on a 16-voxel depth) is printed
    under the figure with its fix; the controls keep working."""
    import matplotlib

    matplotlib.use("Agg")
    from course_utils.explorer import explorer

    state = explorer(SMALL).explorer_state
    n = state.updates
    state.controls["levels"].value = 6
    assert state.updates == n and state.shown is None
    state.controls["levels"].value = 4
    assert state.updates == n + 1 and state.estimate.config.levels == 4


def test_usable_is_the_card_less_the_context_and_workspaces_over_the_slack():
    """Without this test the mutant ``budget-usable-no-context`` of tools/mutants.py (``Overheads.usable``
    leaves the CUDA context out of what a card holds) survived every explorer test: ``estimate``
    corrects its largest batch down with ``needed``, which keeps the context. ``usable`` is
    ``needed``'s inverse, and what ``fit`` and ``margin`` report as the usable bytes."""
    over = budget.Overheads(500.0, 0.10, "test", workspace_bytes=8 * MiB)
    assert over.usable(8 * GiB) == pytest.approx((8 * GiB - 500 * MiB - 8 * MiB) / 1.10)
    assert over.needed(over.usable(8 * GiB)) == pytest.approx(8 * GiB)
    assert ex.margin(SMALL, ASSUMED)["usable MiB"] == round((8 * GiB - 500 * MiB) / 1.10 / MiB)
    for card in (8, 1000, -1.0, float("nan")):  # GiB where bytes are meant; not bytes
        with pytest.raises(TechniqueError, match="Fix: "):
            over.usable(card)
    assert over.usable(400 * MiB) == 0  # below the context: the card holds no step
    assert ex.estimate(replace(SMALL, budget_gib=1), replace(ASSUMED, context_mib=1100)).largest_batch == 0
    with pytest.raises(TechniqueError, match="Fix: "):
        over.needed(float("nan"))


def test_batch_model_sizes_a_batch_or_says_why_not():
    """A budget below the fixed part holds batch 0 (exercise 11's card too small); a budget that
    is not bytes (NaN: 0 before) and a line that does not grow with the batch
    (ZeroDivisionError before) are refused with the fix."""
    line = budget.BatchModel(fixed=1000, per_sample=100, breakdown={}, batch=2)
    assert line.largest_batch(999.0) == 0 and line.largest_batch(1250.5) == 2 and line.peak(0) == 1000
    for bad in (float("nan"), float("inf"), -1):
        with pytest.raises(TechniqueError, match="Fix: "):
            line.largest_batch(bad)
    with pytest.raises(TechniqueError, match="does not grow with the batch.*Fix: "):
        budget.BatchModel(fixed=1000, per_sample=0, breakdown={}, batch=2).largest_batch(10**9)
    with pytest.raises(TechniqueError, match="Fix: "):
        line.peak(-3)


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
    df = table([start, replace(start, inplace_abn=True)], columns="all")
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


# -- an uneven batch over ranks, the activation switches ----------------------------------------
def test_an_uneven_batch_is_sized_for_the_fullest_rank():
    """7 samples on 2 ranks: one rank gets 4, and the card must hold that rank's step.
    Without this test the mutant ``explorer-local-batch-floor`` of tools/mutants.py (an uneven batch split by floor)
    survived the other tests."""
    est = estimate(replace(SMALL, batch=7, dp_ranks=2))
    assert est.local_batch == 4
    # the same step; data parallelism adds only DDP's gradient buckets
    parts = {k: v for k, v in est.parts.items() if k != "DDP buckets"}
    assert set(est.parts) - set(parts) == {"DDP buckets"}
    assert parts == estimate(replace(SMALL, batch=4)).parts


def test_the_activation_switches_build_what_they_say():
    """Without this test the mutants ``explorer-inplace-relu-ignored`` and ``explorer-lean-up-ignored`` of
    tools/mutants.py (the in-place ReLU or lean Up switch building the plain net) survived the other tests."""
    def relus(cfg):
        return [m.inplace for m in build(cfg).modules() if isinstance(m, nn.ReLU)]

    assert relus(SMALL) and not any(relus(SMALL))
    assert all(relus(replace(SMALL, inplace_relu=True)))
    assert not any(up.lean for up in build(SMALL).ups)
    assert all(up.lean for up in build(replace(SMALL, lean_up=True, precision="autocast_fp16")).ups)


# -- DDP's gradient buckets in the estimate (notebook 08) -----------------------------------------
def test_explorer_counts_ddp_buckets():
    """Notebook 08's text rests on this: the explorer counts DDP's gradient buckets."""
    from dataclasses import replace

    from course_utils import explorer as ex

    cfg = ex.Config(levels=3, base_channels=8, volume=(16, 32, 32), seed000=False, batch=4,
                    precision="fp16_model", budget_gib=80)
    one, two = ex.estimate(cfg), ex.estimate(replace(cfg, dp_ranks=2))
    with torch.device("meta"):
        grads = sum(p.numel() * 2 for p in ex.build(cfg).parameters())
    assert "DDP buckets" not in one.parts
    assert two.parts["DDP buckets"] == grads
    assert two.total == sum(v for k, v in two.parts.items())


# -- the capstone's margin under two contexts, offloading's pinned bytes, the step time per card
# (notebook 10) --------------------------------------------------------------------------------
#: the capstone's batch-8 winner: seed 000's large net, autocast fp16, lean Up, In-Place ABN, offload
WINNER = ex.Config(volume=SEED000_VOLUME, batch=8, budget_gib=8, precision="autocast_fp16", lean_up=True,
                   inplace_abn=True, offload=True)
ASSUMED = budget.Overheads(500.0, 0.10, "assumed: the course's default")


def test_seed000_context_is_what_its_numbers_imply():
    """Notebook 10's text rests on this: seed 000's own CUDA context, from its hook table."""
    seed = budget.seed000_overheads(slack=0.10)
    assert budget.SEED000_PEAK_CACHED_BYTES / MiB == 5838  # its hook table's largest mem_cached
    assert seed.context_mib == 7000 - 5838 == 1162 and seed.slack == 0.10


def _fits(over, batch):
    """An independent check: the step predicted directly at ``batch`` (not scaled), plus context
    and slack written out, against the card."""
    peak = ex.direct_peak(replace(WINNER, batch=batch))
    return peak * (1 + over.slack) + over.context_mib * MiB <= 8 * GiB


def test_the_capstone_margin_and_largest_batch_under_both_contexts():
    """Notebook 10's text rests on this: the margin of "batch 8 in an 8 GiB card" under the assumed and under seed
    000's context."""
    assumed, seed = ex.margin(WINNER, ASSUMED), ex.margin(WINNER, budget.seed000_overheads(slack=0.10))
    peak = ex.direct_peak(WINNER)
    for row, over in ((assumed, ASSUMED), (seed, budget.seed000_overheads(slack=0.10))):
        left = 8 * GiB - (peak * 1.10 + over.context_mib * MiB)
        assert row["margin MiB"] == round(left / MiB)
        assert row["margin % of card"] == round(100 * left / (8 * GiB), 1)
        n = row["largest batch in 8 GiB"]
        assert _fits(over, n) and not _fits(over, n + 1)
        assert row["batch 8 fits up to a context of MiB"] == round(over.context_mib + left / MiB)
    # the claim and how thin it is: batch 8 under the assumed 500 MiB, by under 2 % of the card;
    # 7 with the ~1.1 GiB seed 000's numbers imply
    assert assumed["largest batch in 8 GiB"] == 8 and 0 < assumed["margin % of card"] < 2
    assert seed["largest batch in 8 GiB"] == 7 and seed["margin MiB"] < 0
    assert 500 < assumed["batch 8 fits up to a context of MiB"] < 1162


def test_elementwise_bytes_count_reads_and_writes_of_uncounted_ops_only():
    """Notebook 10's text rests on this: the element-wise bytes in the per-card step time."""
    x = torch.randn(4, 8, 6, 6, 6)
    w = torch.randn(8, 8, 3, 3, 3)
    with cost.ElementwiseBytes() as m:
        torch.relu(x)
    assert m.total == 2 * x.nbytes  # read x, write the output
    with cost.ElementwiseBytes() as m:
        torch.nn.functional.conv3d(x, w, padding=1)  # FlopCounterMode counts it: not here
        x.view(-1)
        x.transpose(0, 1)
    assert m.total == 0
    y = x.clone()
    with cost.ElementwiseBytes() as m:
        y.add_(x)
    assert m.total == 3 * x.nbytes  # read y and x, write y
    with cost.ElementwiseBytes() as m:
        y.copy_(x)
    assert m.total == 2 * x.nbytes  # read x, write y (y's old values are not read)
    a, b = [torch.zeros(10), torch.zeros(20)], [torch.ones(10), torch.ones(20)]
    with cost.ElementwiseBytes() as m:
        torch._foreach_add_(a, b)
    assert m.total == 3 * 30 * 4


def test_offload_moves_what_save_on_cpu_copies():
    """save_on_cpu copies every saved tensor once per save (on a CPU-only build its pinned copies
    are plain host tensors: aten.empty + copy_). Count the bytes of those copies in a real CPU step
    and compare with step_cost's offloaded bytes (the old code counted each storage once).
    Notebook 10's text rests on this: the bytes offloading pins on the host."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Empties(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.empty.memory_format:
                type(self).total += out.numel() * out.element_size()
            return out

    def forward_bytes(offload):
        torch.manual_seed(0)
        model = ex.build(SMALL)
        x = torch.randn(2, 1, *SMALL.volume)
        Empties.total = 0
        hooks = torch.autograd.graph.save_on_cpu(pin_memory=True) if offload else torch.autograd.graph.saved_tensors_hooks(
            lambda t: t, lambda t: t)
        with Empties(), hooks:
            out = model(x)
        del out
        return Empties.total

    copied = forward_bytes(True) - forward_bytes(False)
    est = ex.step_cost(replace(SMALL, offload=True))
    assert copied > 0 and est.offloaded_bytes == copied
    assert est.host_pinned_bytes == copied  # all held until backward
    # tensors saved by two ops are copied twice: more than the deduplicated saved bytes
    assert est.offloaded_bytes > ex.probe(SMALL)["saved"]


def test_step_time_per_card_adds_convolutions_elementwise_bytes_and_copies():
    """Notebook 10's text rests on this: the per-card step time with the element-wise work counted."""
    cfg = replace(SMALL, batch=4, offload=True, precision="autocast_fp16")
    gpu = cost.CARDS["RTX 2080"]
    est = ex.step_cost(cfg, "RTX 2080")
    assert est.elementwise_bytes > 0 and est.card == "RTX 2080"
    assert est.seconds == pytest.approx(est.flops / 40.3e12 + est.elementwise_bytes / 448e9
                                         + 2 * est.offloaded_bytes / gpu.pcie_bytes_per_s)
    assert gpu.pcie_bytes_per_s == pytest.approx(15.75e9, rel=1e-3)
    assert cost.CARDS["RTX 3070"].pcie_bytes_per_s == pytest.approx(31.5e9, rel=1e-3)
    # no tensor cores: PyTorch's fp16 convolutions run with fp32 math at the FP32 rate
    assert cost.CARDS["GTX 1080"].flops("autocast_fp16") == cost.CARDS["GTX 1080"].flops("fp32") == 8.87e12
    assert ex.step_cost(cfg).card == cost.DEFAULT_CARD
    with pytest.raises(ValueError, match="unknown card"):
        ex.step_cost(cfg, "RTX 9999")
    table = ex.cost_table([replace(cfg, offload=False), cfg])
    assert table.filter(like="rank,").shape == (2, len(cost.CARDS) + 1)


# -- notebook 10's tables: five columns, each row at its largest batch, the learner's choice, the
# three contexts -------------------------------------------------------------------------------
SHORT = ["configuration", "card needs MiB", "largest batch in 1 GiB", "step s", "method"]


def test_table_has_five_columns_and_the_rest_on_request():
    """Notebook 10's results table: five columns by default (configuration, card needs, largest
    batch, time, method), every column of ``Estimate.row`` with ``columns="all"``; rows in the
    order given, at each configuration's own batch."""
    cfgs = [replace(SMALL, budget_gib=1, batch=3), replace(SMALL, budget_gib=1, checkpointing="level", dp_ranks=2,
                                                           batch=4)]
    short, full = table(cfgs), table(cfgs, columns="all")
    assert list(short.columns) == SHORT
    assert list(full.columns[:5]) == SHORT and {"precision", "checkpointing", "activations MiB"} <= set(full.columns)
    for i, c in enumerate(cfgs):
        est = estimate(c)
        assert short.loc[i, "configuration"] == c.describe()
        assert short.loc[i, "card needs MiB"] == round(est.card_needs / MiB) == full.loc[i, "card needs MiB"]
        assert short.loc[i, "largest batch in 1 GiB"] == est.largest_batch
        assert short.loc[i, "step s"] == round(ex.step_cost(c).seconds, 2)
    assert short.loc[0, "method"].startswith("batch 3: predicted (scaled from 2); time est. for ")
    assert short.loc[1, "method"].startswith("batch 4 (2 / GPU on 2 GPUs): predicted; ")
    with pytest.raises(ValueError, match="columns must be 'short' or 'all'"):
        table(cfgs, columns="wide")


def test_table_at_the_largest_batch():
    """Notebook 10 ranks the search by what each configuration does at its largest batch: each
    row's card needs and time are at that batch (they fit the card; one more sample would not),
    and a configuration that fits no batch is shown at batch 1, needing more than the card."""
    fits = replace(SMALL, budget_gib=1)
    too_big = replace(SMALL, volume=(64, 128, 128), budget_gib=1)
    n = estimate(fits).largest_batch
    assert n > 2 and estimate(too_big).largest_batch == 0
    rows = table([fits, too_big], at_largest=True)
    at_n = replace(fits, batch=n)
    assert rows.loc[0, "card needs MiB"] == round(estimate(at_n).card_needs / MiB) <= 1024
    assert rows.loc[0, "card needs MiB"] < round(estimate(replace(fits, batch=n + 1)).card_needs / MiB)
    assert rows.loc[0, "step s"] == round(ex.step_cost(at_n).seconds, 2) > round(ex.step_cost(fits).seconds, 2)
    assert rows.loc[0, "method"].startswith(f"batch {n}: ")
    assert rows.loc[1, "method"].startswith("batch 1: ") and rows.loc[1, "card needs MiB"] > 1024


def test_choice_table_sets_the_choice_beside_the_winner():
    """Notebook 10's reveal: the learner's ``my_choice`` (Config fields applied to the base)
    beside the winner, each at its largest batch, with the predicted peak at that batch."""
    base = replace(SMALL, budget_gib=1)
    winner = replace(base, checkpointing="level")
    both = ex.choice_table(dict(precision="autocast_fp16"), base, winner)
    assert list(both.index) == ["your choice", "winner"]
    assert list(both.columns) == ["configuration", "predicted peak MiB", "card needs MiB", "largest batch in 1 GiB",
                                  "step s"]
    for name, c in (("your choice", replace(base, precision="autocast_fp16")), ("winner", winner)):
        n = estimate(c).largest_batch
        assert both.loc[name, "configuration"] == c.describe()
        assert both.loc[name, "largest batch in 1 GiB"] == n
        assert both.loc[name, "predicted peak MiB"] == round(ex.direct_peak(replace(c, batch=n)) / MiB)
        assert both.loc[name, "card needs MiB"] == round(estimate(replace(c, batch=n)).card_needs / MiB)
    assert list(ex.choice_table(None, base, winner).index) == ["winner"]
    assert ex.choice_table(winner, base, winner).loc["your choice"].equals(both.loc["winner"])
    with pytest.raises(ValueError, match=r"\['abn'\] are not fields of explorer.Config"):
        ex.choice_table(dict(abn=True), base, winner)
    with pytest.raises(ValueError, match="In-Place ABN overwrites"):
        ex.choice_table(dict(inplace_abn=True, checkpointing="selective"), base, winner)


def test_contexts_are_the_assumed_the_measured_and_seed_000s(monkeypatch, tmp_path):
    """Notebook 10 states up front that the largest batch depends on the CUDA context, and prints
    the three: the course's assumed 500 MiB, a recorded GPU run's (what ``overheads()`` then uses;
    none without a recording) and seed 000's ~1.1 GiB; each with the same slack."""
    from course_utils import recorded

    monkeypatch.setenv(recorded.SHOW_ENV_VAR, str(tmp_path))  # no recording
    assert list(budget.contexts()) == ["assumed", "seed 000"]
    assert budget.overheads().context_mib == budget.contexts()["assumed"].context_mib == 500
    assert budget.overheads().source.startswith("assumed (no GPU run recorded): CUDA context 500 MiB")
    assert budget.contexts()["seed 000"].context_mib == 1162
    figures = {"00/cuda_context": {"kind": "json", "data": {"context_MiB": 700.5, "method": "test"}}}
    (tmp_path / "GPU.json").write_text(json.dumps({"meta": {"gpu": "Some GPU", "torch": "2.x", "cuda": "13.0",
                                                            "date": "2026-01-01"}, "figures": figures}))
    found = budget.contexts()
    assert list(found) == ["assumed", "measured", "seed 000"]
    assert found["measured"] == budget.overheads() and found["measured"].context_mib == 700.5
    assert found["assumed"].context_mib == 500 and found["assumed"].source.startswith("assumed (the course's default")
    assert {o.slack for o in found.values()} == {budget.ASSUMED_SLACK}


def test_margin_table_under_each_named_context():
    """Notebook 10, section 4: one row per named context, five columns by default."""
    contexts = {"assumed": ASSUMED, "seed 000": budget.seed000_overheads(slack=0.10)}
    short = ex.margin_table(WINNER, contexts)
    assert list(short.index) == ["assumed", "seed 000"]
    assert list(short.columns) == ["context MiB", "margin MiB", "margin % of card", "largest batch in 8 GiB",
                                   "batch 8 fits up to a context of MiB"]
    for name, over in contexts.items():
        assert short.loc[name].to_dict() == {k: v for k, v in ex.margin(WINNER, over).items() if k in short.columns}
    assert list(ex.margin_table(WINNER, contexts, columns="all").columns) == list(ex.margin(WINNER, ASSUMED))


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _bench_meta(date, context):
    measured = (f"... largest batch under an allocator cap of 8 GiB - measured context ({context} MiB); ..."
                if context is not None else "not measured: no CUDA GPU")
    return {"device": "Some GPU", "date": date, "torch": "2.x", "cuda": "13.0", "measured": measured}


def test_context_readings_are_each_run_process_reading_once_lowest_first(tmp_path):
    """Notebook 10 states the measured context as the lowest of the runs' readings and shows the
    range (the context grows during a run): every reading of kit.json, limit.json and the
    benchmarks' meta, a resumed run's repeated kit.json counted once, a dry run's none."""
    runs = tmp_path / "gpu-runs"
    machine = {"gpu": "Some GPU", "date": "2026-01-02", "torch": "2.x", "cuda": "13.0", "context MiB": 628.8}
    for sub in ("run", "run-2"):  # the kit resumes a run: each call writes the machine it started with
        _write(runs / sub / "kit.json", {"machine": machine})
    _write(runs / "old" / "limit.json", {"machine": {**machine, "date": "2026-01-01"}, "overheads": {"context MiB": 600.0}})
    _write(runs / "run" / "details" / "benchmark-large-Some_GPU.json", {"meta": _bench_meta("2026-01-02", 773), "rows": []})
    _write(runs / "run" / "details" / "benchmark-small-Some_GPU.json", {"meta": _bench_meta("2026-01-02", 853), "rows": []})
    _write(runs / "dry" / "benchmark-large.json", {"meta": _bench_meta("2026-01-03", None), "rows": []})
    got = budget.context_readings(runs)
    assert [r.mib for r in got] == [600.0, 628.8, 773.0, 853.0]
    assert got[1].run == "Some GPU, 2026-01-02, torch 2.x" and got[1].when.startswith("at the kit's start")
    assert got[3].when == "before the benchmark of the small net"
    assert budget.benchmark_context_mib(_bench_meta("x", None)) is None
    assert budget.context_readings(tmp_path / "none") == []


def test_contexts_add_the_highest_reading_where_it_is_above_the_measured(monkeypatch, tmp_path):
    """Takeaway 1 of notebook 10: the largest batch under every context a run measured, the
    highest too; no such row where the runs measured nothing above the context used."""
    from course_utils import recorded

    monkeypatch.setenv(recorded.SHOW_ENV_VAR, str(tmp_path / "recorded"))
    figures = {"00/cuda_context": {"kind": "json", "data": {"context_MiB": 628.8, "method": "test"}}}
    _write(tmp_path / "recorded" / "GPU.json", {"meta": {"gpu": "Some GPU", "torch": "2.x", "cuda": "13.0",
                                                         "date": "2026-01-02"}, "figures": figures})
    machine = {"gpu": "Some GPU", "date": "2026-01-02", "torch": "2.x", "cuda": "13.0", "context MiB": 628.8}
    _write(tmp_path / "docs" / "gpu-runs" / "run" / "kit.json", {"machine": machine})
    assert list(budget.contexts()) == ["assumed", "measured", "seed 000"]
    _write(tmp_path / "docs" / "gpu-runs" / "run" / "details" / "benchmark-small-X.json",
           {"meta": _bench_meta("2026-01-02", 853), "rows": []})
    found = budget.contexts()
    assert list(found) == ["assumed", "measured", "measured, highest", "seed 000"]
    assert found["measured, highest"].context_mib == 853 and found["measured, highest"].slack == budget.ASSUMED_SLACK
    assert "before the benchmark of the small net" in found["measured, highest"].source


def test_the_course_runs_measured_629_to_853_mib():
    """Notebook 10's first cell: the context it uses (629 MiB) is the lowest reading of the
    course's GPU runs, and the runs measured up to 853 MiB later in a run."""
    got = budget.context_readings()
    assert round(got[0].mib) == round(budget.overheads().context_mib) == 629 and round(got[-1].mib) == 853


def test_recorded_benchmark_is_the_newest_measured_and_the_table_predicts_under_its_context(tmp_path):
    """Notebook 10, section 3: a GPU's largest batch was measured under a cap of the card less its
    own context, so the prediction beside it is made under that context; an unmeasured (dry) run
    and an older run are not read."""
    runs = tmp_path / "gpu-runs"
    row = {"technique": "tiny", "measured peak MiB": 123, "largest batch in 1 GiB (measured)": 5}
    _write(runs / "old" / "benchmark-large.json", {"meta": _bench_meta("2026-01-01", 629), "rows": [row]})
    _write(runs / "new" / "details" / "benchmark-large-X.json", {"meta": _bench_meta("2026-01-02", 700), "rows": [row]})
    _write(runs / "dry" / "benchmark-large.json", {"meta": _bench_meta("2026-01-03", None),
                                                   "rows": [{**row, "measured peak MiB": None}]})
    rec = ex.recorded_benchmark("large", runs)
    assert (rec.meta["date"], rec.context_mib, rec.label) == ("2026-01-02", 700, "Some GPU, 2026-01-02, torch 2.x")
    assert ex.recorded_benchmark("small", runs) is None
    cfg = replace(SMALL, budget_gib=1)
    t = ex.benchmark_table(rec, {"tiny": cfg, "not recorded": SMALL})
    assert list(t.index) == [cfg.describe()]
    under = replace(budget.overheads(), context_mib=700)
    peak = ex.probe(cfg)["peak"]
    assert t.iloc[0].to_dict() == {
        "largest batch in 1 GiB, predicted": estimate(cfg, under).largest_batch,
        "largest batch in 1 GiB, measured": 5, "batch-2 peak predicted MiB": round(peak / MiB),
        "batch-2 peak measured MiB": 123, "measured / predicted": round(123 * MiB / peak, 2)}
    assert estimate(cfg, under).largest_batch != estimate(replace(cfg), replace(under, context_mib=0)).largest_batch


def test_a_damaged_benchmark_record_is_skipped_by_recorded_benchmark(tmp_path):
    """Before: explorer.recorded_benchmark read each record with json.loads, so one file cut short
    stopped notebook 10's comparison with a JSONDecodeError naming no file."""
    from course_utils import explorer
    from course_utils.files import SkippedFile

    run = tmp_path / "2026-01-01-g"
    run.mkdir()
    meta = {"device": "G", "date": "2026-01-01", "torch": "2.13", "cuda": "13", "model": "large"}
    rows = [{"net": "large", "technique": "baseline fp32", "measured peak MiB": 100.0}]
    (run / "benchmark-large.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    (tmp_path / "2026-01-02-h").mkdir()
    (tmp_path / "2026-01-02-h" / "benchmark-large.json").write_text('{"meta": {"device": "H"')
    with pytest.warns(SkippedFile, match="2026-01-02-h/benchmark-large.json"):
        rec = explorer.recorded_benchmark("large", tmp_path)
    assert rec is not None and rec.meta["device"] == "G"


@pytest.mark.parametrize("context", [float("nan"), -5, "629", None])
def test_a_recorded_context_that_is_not_a_positive_number_falls_back_to_the_assumed_with_a_warning(
        monkeypatch, tmp_path, context):
    """Before: a NaN, negative or text context_MiB in recorded/ became the budget of every
    estimate (NaN: no batch fits; "629": a ValueError naming no file). Now the assumed context
    serves, with a warning naming the figure and the fix."""
    from course_utils import recorded
    from course_utils.files import SkippedFile

    monkeypatch.setenv(recorded.SHOW_ENV_VAR, str(tmp_path / "recorded"))
    figures = {"00/cuda_context": {"kind": "json", "data": {"context_MiB": context, "method": "test"}}}
    (tmp_path / "recorded").mkdir()
    (tmp_path / "recorded" / "GPU.json").write_text(json.dumps(
        {"meta": {"gpu": "Some GPU", "torch": "2.x", "cuda": "13.0", "date": "2026-01-02"}, "figures": figures}))
    with pytest.warns(SkippedFile, match=r"00/cuda_context .*Fix: record it again"):
        over = budget.overheads()
    assert over.context_mib == budget.ASSUMED_CONTEXT_MIB and "assumed" in over.source


def test_a_damaged_kit_record_leaves_the_other_context_readings(tmp_path):
    run = tmp_path / "2026-01-02-g"
    run.mkdir()
    machine = {"gpu": "G", "date": "2026-01-02", "torch": "2.x", "cuda": "13.0", "context MiB": 628.8}
    (run / "kit.json").write_text(json.dumps({"machine": machine}))
    (tmp_path / "2026-01-03-h").mkdir()
    (tmp_path / "2026-01-03-h" / "kit.json").write_text("{")
    from course_utils.files import SkippedFile

    with pytest.warns(SkippedFile, match="2026-01-03-h/kit.json"):
        readings = budget.context_readings(tmp_path)
    assert [(r.mib, r.run) for r in readings] == [(628.8, "G, 2026-01-02, torch 2.x")]


@pytest.mark.parametrize("gib", [0, 10**30])
def test_a_budget_no_card_has_is_refused_where_estimate_never_returned(gib):
    """Before: Config(budget_gib=10**30) was taken, and estimate's correction loop, stepping the
    batch down one at a time past float rounding, did not return."""
    with pytest.raises(TechniqueError, match="budget_gib=.*Fix:"):
        Config(budget_gib=gib)
