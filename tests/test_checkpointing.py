"""Checkpointing and offload: same gradients, BN statistics updated once, the pitfalls reproduced,
recomputed FLOPs counted, the memory ordering of the frontier options, timing reported with its
noise; why the sqrt(n) fit's k exceeds Chen's, and README's checkpointing figure (notebook 07)."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from course_utils import UNet3D, predict_step, seed000_unet
from course_utils.checkpointing import (
    ASSUMED_GPU_FLOPS, ASSUMED_PCIE_BYTES_PER_S, SegmentedStack, checkpoint_segments,
    cost_estimate, deep_stack, frozen_bn_stats, offload_saved, recompute_fraction, report_times,
    save_convolutions, sqrt_fit, step_flops, time_steps,
)
from course_utils.densenet import DenseBlock
from course_utils.inplace_abn import inplace_abn
from course_utils.config import SEED000_VOLUME

VARIANTS = {
    "none": {},
    "full": dict(checkpoint="level"),
    "selective": dict(checkpoint="level", checkpoint_policy=save_convolutions),
    "double_conv": dict(checkpoint="double_conv"),
    "conv": dict(checkpoint="conv"),
    "offload": dict(offload_activations=True),
    "conv + offload": dict(checkpoint="conv", offload_activations=True),
}


def _step(kw, state, dtype=torch.float64):
    net = UNet3D(levels=3, channels=4, **kw).to(dtype)
    net.load_state_dict(state)
    torch.manual_seed(1)
    x, y = torch.randn(2, 1, 8, 16, 16, dtype=dtype), torch.randint(0, 5, (2, 8, 16, 16))
    nn.functional.cross_entropy(net(x), y).backward()
    return net


@pytest.fixture(scope="module")
def nets():
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in UNet3D(levels=3, channels=4).double().state_dict().items()}
    out = {k: _step(kw, state) for k, kw in VARIANTS.items()}
    out["full, no BN fix"] = _step(dict(checkpoint="level", checkpoint_fix_bn=False), state)
    return out


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "none"] + ["full, no BN fix"])
def test_gradients_equal_the_baseline(nets, variant):
    for (name, a), b in zip(nets["none"].named_parameters(), nets[variant].parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-12, rtol=1e-10, msg=name)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "none"])
def test_bn_running_stats_updated_once(nets, variant):
    for (name, a), b in zip(nets["none"].named_buffers(), nets[variant].buffers(), strict=True):
        torch.testing.assert_close(b, a, msg=name)


def test_bn_stats_updated_twice_without_the_fix(nets):
    bn = nets["full, no BN fix"].inc.double_conv[1]
    assert int(bn.num_batches_tracked) == 2
    assert not torch.allclose(bn.running_mean, nets["none"].inc.double_conv[1].running_mean)


@pytest.mark.parametrize("mode", ["level", "double_conv", "conv"])
def test_full_checkpointing_with_inplace_abn(mode):
    """Full checkpointing (every granularity) works with In-Place ABN: same gradients, BN stats
    updated once."""
    torch.manual_seed(0)
    ref = UNet3D(levels=3, channels=4, norm_act=inplace_abn).double()
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    net = UNet3D(levels=3, channels=4, norm_act=inplace_abn, checkpoint=mode).double()
    net.load_state_dict(state)
    x, y = torch.randn(2, 1, 8, 16, 16, dtype=torch.float64), torch.randint(0, 5, (2, 8, 16, 16))
    for m in (ref, net):
        nn.functional.cross_entropy(m(x), y).backward()
    for (name, a), b in zip(ref.named_parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-12, rtol=1e-10, msg=name)
    for (name, a), b in zip(ref.named_buffers(), net.buffers(), strict=True):
        torch.testing.assert_close(b, a, msg=name)


def test_selective_with_inplace_abn_is_refused_clearly():
    with pytest.raises(ValueError, match="cannot be combined with In-Place ABN.*Fix: full"):
        UNet3D(levels=3, channels=4, norm_act=inplace_abn, checkpoint="level",
               checkpoint_policy=save_convolutions)


def test_checkpoint_options_validated():
    with pytest.raises(ValueError, match="checkpoint must be one of"):
        UNet3D(levels=3, channels=4, checkpoint="block")
    with pytest.raises(ValueError, match="needs checkpoint='level'"):
        UNet3D(levels=3, channels=4, checkpoint="conv", checkpoint_policy=save_convolutions)
    # one spelling: the old checkpoint_levels= names its replacement
    for old in (True, False):
        with pytest.raises(TypeError, match='write checkpoint="level"'):
            UNet3D(levels=3, channels=4, checkpoint_levels=old)
    net = UNet3D(levels=3, channels=4, checkpoint="level")
    assert net.checkpoint == "level" and not hasattr(net, "checkpoint_levels")


def test_frozen_bn_stats_restores_everything():
    bn = nn.BatchNorm3d(3)
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    with frozen_bn_stats(bn):
        bn(torch.randn(2, 3, 4, 4, 4))
    assert bn.momentum == 0.1
    for k, v in bn.state_dict().items():
        torch.testing.assert_close(v, before[k])


def test_reentrant_checkpoint_loses_gradients_without_requires_grad_input():
    """The course's claim in 07: without use_reentrant, torch 2.13 still runs the reentrant
    variant (with a warning), which gives the block's weights no gradient when no input requires
    grad; the non-reentrant one does."""
    block = nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), nn.ReLU())
    x = torch.randn(1, 1, 4, 4, 4)
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"):
        out = checkpoint(block, x)
    assert not out.requires_grad  # no graph: the block's weights would get no gradient
    checkpoint(block, x, use_reentrant=False).sum().backward()
    assert block[0].weight.grad is not None


# --------------------------------------------------------------------------------------------
# checkpoint_sequential and the BN-safe segments
# --------------------------------------------------------------------------------------------
def _stack_step(segments, bn_safe, state=None):
    torch.manual_seed(0)
    net = SegmentedStack(deep_stack(8, 4), segments, bn_safe=bn_safe).double()
    if state is not None:
        net.load_state_dict(state)
    x = torch.randn(2, 1, 4, 6, 6, dtype=torch.float64)
    nn.functional.cross_entropy(net(x), torch.randint(0, 5, (2, 4, 6, 6))).backward()
    return net


def test_checkpoint_sequential_updates_bn_twice_and_segments_once():
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in SegmentedStack(deep_stack(8, 4)).double().state_dict().items()}
    plain = _stack_step(0, True, state)
    torch_seq = _stack_step(4, False, state)
    ours = _stack_step(4, True, state)
    first_bn = "stack.0.1.num_batches_tracked"
    assert int(torch_seq.state_dict()[first_bn]) == 2  # the pitfall, in torch's own function
    assert int(ours.state_dict()[first_bn]) == 1
    for (k, a), b in zip(plain.state_dict().items(), ours.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=k)
    for (k, a), b in zip(plain.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-12, rtol=1e-10, msg=k)


def test_checkpoint_segments_validates():
    with pytest.raises(ValueError, match="segments must be between 1 and 3"):
        checkpoint_segments(nn.Sequential(nn.ReLU(), nn.ReLU(), nn.ReLU()), 4, torch.randn(2))


@pytest.mark.parametrize("s", [1, 2, 4, 8])
def test_recomputed_flops_are_one_minus_one_over_s_of_the_stack(s):
    """checkpoint_sequential recomputes every segment but the last: (1 - 1/s) of the stack's
    forward, not "one extra forward whatever s"."""
    n, shape = 8, (1, 1, 4, 8, 8)
    r = recompute_fraction(lambda: SegmentedStack(deep_stack(n, 4), 0),
                           lambda: SegmentedStack(deep_stack(n, 4), s), shape)
    stack_fwd = step_flops(lambda: deep_stack(n, 4), (1, 4, 4, 8, 8), backward=False)
    assert r.recomputed * s == (s - 1) * stack_fwd
    assert 0 <= r.fraction_of_forward < 1


def test_sqrt_n_segments_beat_none_and_one():
    peak = {s: predict_step(lambda s=s: SegmentedStack(deep_stack(16, 8), s), (1, 1, 16, 32, 32),
                            n_classes=5).peak for s in (0, 4, 16)}
    assert peak[4] < peak[0] and peak[4] <= peak[16]


def test_sqrt_fit_recovers_a_known_curve():
    ns = [4, 9, 16, 25, 36]
    k, c = sqrt_fit(ns, [3 * n**0.5 + 2 for n in ns])
    assert abs(k - 3) < 1e-9 and abs(c - 2) < 1e-9


# --------------------------------------------------------------------------------------------
# Offload and the frontier
# --------------------------------------------------------------------------------------------
def test_offload_on_a_real_cpu_changes_nothing_and_simulation_needs_fake_tensors():
    from course_utils.checkpointing import _pack_simulated

    from torch._subclasses.fake_tensor import FakeTensorMode

    packed = []

    def count(t):
        packed.append(t)
        return t

    def saved_inside_offload(x):
        """How many tensors an outer saved_tensors_hooks sees when ``x.sigmoid()`` runs inside
        ``offload_saved(x)`` (hooks nest: an inner pair hides the outer one)."""
        packed.clear()
        with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t), offload_saved(x):
            y = x.sigmoid()
        return len(packed), y

    n, y = saved_inside_offload(torch.randn(4, requires_grad=True))
    assert n == 1 and y.grad_fn._saved_result.data_ptr() == y.data_ptr()  # a CPU tensor: saved as is
    with FakeTensorMode():
        n, _ = saved_inside_offload(torch.randn(4, requires_grad=True))
    assert n == 0  # a fake tensor: the simulation packed it
    with pytest.raises(RuntimeError, match="FakeTensorMode only"):
        _pack_simulated(torch.randn(2))


@pytest.fixture(scope="module")
def frontier():
    """Predicted full-size peaks (seed 000 large U-Net with lean_up=True, batch 2, autocast fp16,
    CUDA rules, steady state). Without lean_up the top Up block's fp32 upsampled map and
    concatenation (CUDA autocast keeps trilinear upsampling in fp32) set every variant's peak."""
    kws = {"none": {}, "conv": dict(checkpoint="conv"), "double_conv": dict(checkpoint="double_conv"),
           "level": dict(checkpoint="level"), "offload": dict(offload_activations=True),
           "level + offload": dict(checkpoint="level", offload_activations=True)}
    return {k: predict_step(lambda kw=kw: seed000_unet("large", lean_up=True, **kw), (2, 1, *SEED000_VOLUME),
                            n_classes=5, autocast_dtype=torch.float16, module_peaks=False)
            for k, kw in kws.items()}


def test_frontier_memory_ordering(frontier):
    """The ordering notebook 07 states: coarser checkpoints save more; offload saves most."""
    peak = {k: p.peak for k, p in frontier.items()}
    assert peak["none"] > peak["conv"] > peak["double_conv"] > peak["level"] > peak["offload"]
    assert frontier["offload"].saved_peak < 0.05 * frontier["none"].saved_peak


def _every_save(build, shape):
    """The bytes of every tensor autograd saves in ``build()``'s forward, counted on real CPU
    tensors by a pack hook that sees each save (what save_on_cpu's pack_to_cpu copies)."""
    torch.manual_seed(0)
    model, total = build(), [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(torch.randn(shape))
    nn.functional.cross_entropy(out, torch.randint(0, 5, (shape[0], *shape[2:]))).backward()
    return total[0]


def test_cost_estimate_counts_flops_and_bytes():
    """Notebook 07's offload bytes: save_on_cpu copies every save (parameters and a tensor saved
    by two ops included), not the deduplicated saved_peak the old estimate moved (30 % less on
    this net: the old count fails the equality below)."""
    shape = (2, 1, 8, 16, 16)
    plain = lambda: UNet3D(levels=3, channels=4)  # noqa: E731
    ck = lambda: UNet3D(levels=3, channels=4, checkpoint="level")  # noqa: E731
    est = cost_estimate(plain, ck, shape, offload=True)
    fwd = step_flops(plain, shape, backward=False)
    outc = 2 * 2 * 8 * 16 * 16 * 4 * 5  # the 1x1 output conv is outside every checkpoint
    assert est.recomputed_flops == fwd - outc
    moved = _every_save(ck, shape)
    assert est.offloaded_bytes == moved
    assert est.extra_s == pytest.approx(est.recomputed_flops / ASSUMED_GPU_FLOPS
                                        + 2 * moved / ASSUMED_PCIE_BYTES_PER_S)  # element-wise not counted
    off = cost_estimate(plain, lambda: UNet3D(levels=3, channels=8), (1, 1, 16, 32, 32), offload=True)
    saved = predict_step(lambda: UNet3D(levels=3, channels=8), (1, 1, 16, 32, 32), n_classes=5,
                         optimizer=None).saved_peak
    assert off.offloaded_bytes == _every_save(lambda: UNet3D(levels=3, channels=8), (1, 1, 16, 32, 32))
    assert off.offloaded_bytes > 1.2 * saved  # the old count: saved_peak
    assert "estimate" in est.method


def test_cost_estimate_counts_the_elementwise_recomputation():
    """Notebook 07's selective row: no convolution recomputed, yet not free -- BatchNorm and ReLU
    run again, and their bytes at the card's bandwidth give a positive estimate."""
    shape = (2, 1, 8, 16, 16)
    plain = lambda: UNet3D(levels=3, channels=4)  # noqa: E731
    sel = lambda: UNet3D(levels=3, channels=4, checkpoint="level", checkpoint_policy=save_convolutions)  # noqa: E731
    est = cost_estimate(plain, sel, shape, memory_bytes_per_s=448e9)
    assert est.recomputed_flops == 0 and est.elementwise_bytes > 0
    assert est.extra_s == pytest.approx(est.elementwise_bytes / 448e9)
    assert cost_estimate(plain, sel, shape).extra_s == 0  # without a bandwidth: not counted


def test_time_steps_reports_medians_and_noise():
    builds = {"plain": lambda: UNet3D(levels=2, channels=2),
              "checkpointed": lambda: UNet3D(levels=2, channels=2, checkpoint="level")}
    df = time_steps(builds, (2, 1, 4, 4, 4), reps=3)
    assert list(df.variant) == ["plain", "checkpointed"]
    assert (df["median s"] > 0).all() and (df["min s"] <= df["median s"]).all()
    assert df.attrs["noise %"] == df["spread %"].max()
    shown = report_times(df)
    assert shown["vs first %"].iloc[0].startswith("within noise")
    with pytest.raises(ValueError, match="reps must be >= 3"):
        time_steps(builds, (2, 1, 4, 4, 4), reps=2)


def test_efficient_dense_block_same_gradients_less_memory():
    # seed 004's dense block (course_utils.densenet), its bottlenecks recomputed or not
    torch.manual_seed(0)
    naive, eff = DenseBlock(3, 8, 4), DenseBlock(3, 8, 4, memory_efficient=True)
    eff.load_state_dict(naive.state_dict())
    x = torch.randn(2, 8, 16, 16, requires_grad=True)
    for net in (naive, eff):
        net(x).sum().backward()
    for a, b in zip(naive.parameters(), eff.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4)
    for (k, a), b in zip(naive.state_dict().items(), eff.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=k)


# -- the sqrt(n) fit, README's checkpointing figure (notebook 07) ---------------------------------
ROOT = Path(__file__).resolve().parents[1]


def test_sqrt_sweep_says_why_its_k_exceeds_chens():
    """Notebook 07's two sentences on the sqrt(n) fit rest on this: Chen's count over the divisors
    the sweep tries fits a k above 2 sqrt(2), the predicted peak's k is larger still, and the
    parameters and buffers at the peak grow by one layer's (in 512-byte blocks) per layer."""
    import numpy as np

    from course_utils import checkpointing as ck

    sweep, a = ck.sqrt_sweep(ns=(4, 8, 16))
    assert list(sweep["hand count / a"]) == [5.0, 7.0, 11.0]  # min (s - 1) + 2n/s over the tried s
    n = sweep["layers n"]
    k_chen, _ = ck.sqrt_fit(n, sweep["hand count / a"])
    k_fit, _ = ck.sqrt_fit(n, sweep["checkpointed peak / a"])
    assert 2 * 2**0.5 < k_chen < k_fit
    layer = ck.deep_stack(1, 4)
    per_layer = sum(-(-t.numel() * t.element_size() // 512) * 512 for t in (*layer.parameters(), *layer.buffers()))
    slope = np.polyfit(n, sweep["parameters + buffers / a"], 1)[0]
    assert abs(slope - per_layer / a) < 1e-9


@pytest.fixture(scope="module")
def notebook07_peaks():
    from course_utils.checkpointing import save_convolutions
    from course_utils.config import SEED000_VOLUME
    from course_utils.memory import predict_step
    from course_utils.unet import seed000_unet

    variants = {"none": {}, "level": dict(checkpoint="level"),
                "selective": dict(checkpoint="level", checkpoint_policy=save_convolutions)}
    # notebook 07's configuration, written out independently: lean Up, autocast fp16, batch 2
    return {k: predict_step(lambda kw=kw: seed000_unet("large", lean_up=True, **kw), (2, 1, *SEED000_VOLUME),
                            n_classes=5, autocast_dtype=torch.float16, module_peaks=False).peak
            for k, kw in variants.items()}


def test_readme_checkpointing_figure_is_notebook_07s_configuration(notebook07_peaks):
    """README's checkpointing figure is computed in notebook 07's configuration, written out here independently."""
    from course_utils import readme

    p = {k: round(100 * (v / notebook07_peaks["none"] - 1), 1) for k, v in notebook07_peaks.items()}
    expected = f"peak {p['level']:+.1f} % per level, {p['selective']:+.1f} % selective (save convs)"
    figure, method = readme._seed004_checkpointing()
    assert figure == expected and "autocast fp16" in method and "lean Up" in method
    committed = {r["key"]: r for r in json.loads((ROOT / "results" / "figures.json").read_text())["rows"]}
    assert committed["seed004_checkpointing"]["course"] == expected


def test_recorded_benchmarks_read_the_gpu_runs():
    """Notebook 07's recorded step times and offload peaks rest on this reading of docs/gpu-runs/:
    selective checkpointing, which adds no FLOPs, measured a quarter or more slower on both GPUs;
    offload's measured peak 1.3-1.4 x its prediction on the H200; the H100's disowned memory left out."""
    from course_utils import checkpointing as ck

    rec = ck.recorded_benchmarks(techniques=None)
    sel = rec[rec.technique == "selective checkpointing"]
    assert len(sel) == 2 and (sel["GFLOP vs baseline %"] == 0).all() and (sel["vs baseline %"] > 24).all()
    assert rec[rec.technique == "baseline fp32"]["vs baseline %"].eq(0).all()
    h100 = rec[rec.run.str.contains("H100")]
    assert h100["measured peak MiB"].isna().all()  # recorded.ONLY_STEP: a failed attempt's graph stayed allocated
    off = rec[rec.technique.str.contains("offload") & rec["measured peak MiB"].notna()]
    assert len(off) == 2 and off["measured / predicted"].between(1.25, 1.45).all()
    assert list(ck.recorded_benchmarks(folder=ROOT / "tests").columns) == []  # no record: an empty table


def test_frontier_table_rows():
    """Notebook 07's frontier: each configuration's peak (given or predicted), counted work and
    estimate; offload only where the configuration asks for it."""
    from course_utils import checkpointing as ck

    shape = (2, 1, 8, 16, 16)
    build = lambda **kw: UNet3D(levels=3, channels=4, **kw)  # noqa: E731
    cfgs = {"none": {}, "level": dict(checkpoint="level"), "offload": dict(offload_activations=True)}
    t = ck.frontier_table(cfgs, build, shape, peaks={"none": 2**20}, pcie_bytes_per_s=1e6)  # a slow link: visible
    assert list(t.index) == list(cfgs) and t.loc["none", "peak MiB (predicted)"] == 1
    assert t.loc["level", "recomputed TFLOP (counted)"] >= 0 and t.loc["level", "moved GiB each way (counted)"] == 0
    assert t.loc["offload", "extra s per step (estimate)"] > 0 == t.loc["none", "extra s per step (estimate)"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer: a GPU measures")
def test_measure_offload_peaks_needs_a_gpu():
    """Notebook 07's GPU branch of section 6 measures with ck.measure_offload_peaks; on a CPU it
    says it needs CUDA instead of failing inside the step."""
    from course_utils import checkpointing as ck

    with pytest.raises(RuntimeError, match="CUDA"):
        ck.measure_offload_peaks(lambda **kw: UNet3D(levels=2, channels=2, **kw), (2, 1, 4, 8, 8))
