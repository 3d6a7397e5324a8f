"""Split the volume, not the network: the tiled step (course_utils.tiling) and spatial
parallelism on 2 gloo ranks (course_utils.spatial) give the untiled step's gradient, exactly in
float64; a wrong halo, an inexact BatchNorm scheme and untileable models fail loudly."""

import matplotlib
import pytest
import torch
from torch import nn

from course_utils import UNet3D
from course_utils.limit_test import LimitTestNet, input_bytes
from course_utils.memory import GiB, default_dtype, predict_step
from course_utils.parallel import launch
from course_utils.checks import ParallelError
from course_utils.spatial import spatial_reference, spatial_worker
from course_utils.tiling import (
    TilingError, compare_with_untiled, conv_chain, draw_shrinking, draw_tiles, largest_tiled_n,
    measure_tiled_step, plan_tiles, predict_tiled_step, probe_halo, relative_error, representative, tiled_step,
    work_factor,
)

matplotlib.use("Agg")
EXACT = 1e-12  # float64: rounding only (observed 1e-16 .. 2e-15)
FP32 = 1e-5  # float32: observed 1.4e-7 .. 8e-7 relative to the largest gradient


def plain_stack():
    """A conv stack unlike seed 003's: a 5x5x5 kernel, a dilated one, an anisotropic one."""
    return nn.Sequential(nn.Conv3d(1, 3, 5, padding=2), nn.Tanh(),
                         nn.Conv3d(3, 2, 3, padding=2, dilation=2), nn.GELU(),
                         nn.Conv3d(2, 1, (1, 3, 3), padding=(0, 1, 1)))


def bn_net():
    return nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.BatchNorm3d(4), nn.ReLU(),
                         nn.Conv3d(4, 3, 3, padding=1), nn.BatchNorm3d(3), nn.LeakyReLU(0.1),
                         nn.Conv3d(3, 1, 3, padding=1))


def volume(shape, batch=1, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 1, *shape, generator=g, dtype=dtype),
            torch.randn(batch, 1, *shape, generator=g, dtype=dtype))


def compare(build, x, t, tiles, **kw):
    with default_dtype(x.dtype):
        return compare_with_untiled(build, x, t, tiles, **kw)


# -- the halo ----------------------------------------------------------------------------------
def test_halo_is_derived_from_the_modules_and_matches_a_gradient_probe():
    assert conv_chain(LimitTestNet()).halo == (3, 3, 3)  # three 3x3x3 convs: 1 + 1 + 1
    assert conv_chain(plain_stack()).halo == (4, 5, 5)  # 2 + 2 (dilated) + (0, 1, 1)
    assert probe_halo(LimitTestNet(), size=11) == (3, 3, 3)
    assert probe_halo(plain_stack(), size=13) == (4, 5, 5)


def test_the_probe_sees_that_batch_statistics_are_global():
    with pytest.raises(TilingError, match="global"):
        probe_halo(bn_net(), size=11)


# -- equality ----------------------------------------------------------------------------------
@pytest.mark.parametrize("tiles", [2, 3, 5, 12, (2, 2, 1), (2, 2, 2)])
def test_tiled_gradient_equals_untiled_limit_net(tiles):
    x, t = volume((12, 10, 9))
    r = compare(LimitTestNet, x, t, tiles)
    assert r["grad_error"] < EXACT
    assert r["loss"] == pytest.approx(r["loss_untiled"], rel=EXACT)


@pytest.mark.parametrize("tiles", [2, 3, (2, 2, 2)])
def test_tiled_gradient_equals_untiled_plain_stack(tiles):
    x, t = volume((12, 12, 12))
    assert compare(plain_stack, x, t, tiles)["grad_error"] < EXACT


@pytest.mark.parametrize("build, halo", [(LimitTestNet, 2), (LimitTestNet, 0),
                                         (plain_stack, (3, 5, 5)), (plain_stack, (4, 4, 5))])
def test_a_too_small_halo_fails_the_equality(build, halo):
    x, t = volume((10, 10, 10))
    assert compare(build, x, t, (2, 2, 2), halo=halo)["grad_error"] > 1e-3


def test_a_larger_halo_changes_nothing():
    x, t = volume((12, 10, 9))
    assert compare(LimitTestNet, x, t, 3, halo=5)["grad_error"] < EXACT


def test_fp32_tolerance():
    x, t = volume((24, 24, 24), dtype=torch.float32)
    r = compare(LimitTestNet, x, t, 4)
    assert 0 < r["grad_error"] < FP32


def test_the_plan_partitions_the_volume_and_reads_within_it():
    shape = (13, 7, 5)
    plan = plan_tiles(shape, (3, 2, 1), (3, 2, 2))
    owned = torch.zeros(shape, dtype=torch.int64)
    for tile in plan:
        owned[tile.own] += 1
        for o, r, n in zip(tile.own, tile.read, shape, strict=True):
            assert 0 <= r.start <= o.start and o.stop <= r.stop <= n
    assert bool((owned == 1).all())


def test_work_factor_counts_the_recomputed_halo():
    chain = conv_chain(LimitTestNet())
    assert work_factor(chain, plan_tiles((20, 4, 4), 1, 3)) == 1.0
    # 2 slabs: conv 1 computes 2 x 2 extra depth slices for the next layers, conv 2 2 x 1,
    # conv 3 none; and each slab pads symmetrically (zeros at the border side), so every conv
    # also computes 1 wasted slice on its cut side. Cost per voxel (x 27): 1*4, 4*8, 8*1.
    extra = (4 * 1 * 4 + 2 * 4 * 8 + 2 * (1 * 4 + 4 * 8 + 8 * 1)) / (20 * (1 * 4 + 4 * 8 + 8 * 1))
    assert work_factor(chain, plan_tiles((20, 4, 4), 2, 3)) == pytest.approx(1 + extra)


# -- BatchNorm ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tiles", [2, 3, (2, 2, 2)])
def test_batchnorm_exact_in_sweeps(tiles):
    x, t = volume((12, 10, 9), batch=2)
    with default_dtype(torch.float64):
        torch.manual_seed(0)
        ref = bn_net()
        nn.functional.mse_loss(ref(x), t).backward()
        torch.manual_seed(0)
        net = bn_net()
        step = tiled_step(net, x, t, tiles)
    assert step.sweeps == 5  # 2 BatchNorm layers: 2 forward-statistics + loss + 2 backward
    assert relative_error([p.grad for p in net.parameters()], [p.grad for p in ref.parameters()]) < EXACT
    for a, b in zip(net.buffers(), ref.buffers(), strict=True):  # running mean/var, batches tracked
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)


def test_batchnorm_with_detached_statistics_is_wrong():
    x, t = volume((12, 10, 9), batch=2)
    assert compare(bn_net, x, t, 2, bn_backward="detached")["grad_error"] > 1e-2


def test_batchnorm_in_eval_mode_is_pointwise():
    x, t = volume((12, 10, 9))

    def frozen():
        net = bn_net()
        for m in net.modules():
            if isinstance(m, nn.BatchNorm3d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.eval()
        return net

    assert compare(frozen, x, t, 3)["grad_error"] < EXACT


# -- refused models and bad input --------------------------------------------------------------
@pytest.mark.parametrize("model, match", [
    (nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), nn.GroupNorm(1, 2)), "whole volume"),
    (nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), nn.InstanceNorm3d(2)), "whole volume"),
    (UNet3D(levels=2, channels=4), "align_corners"),
    (nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), nn.MaxPool3d(2)), "resolution"),
    (nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), nn.Flatten(), nn.Linear(8, 1)), "receptive field"),
    (nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), nn.Dropout3d()), "eval"),
    (nn.Sequential(nn.Conv3d(1, 2, 3, padding=1, stride=2)), "stride"),
    (nn.Sequential(nn.Conv3d(1, 2, 4, padding=2)), "odd kernels"),
    (nn.Sequential(nn.Conv3d(1, 2, 3, padding=0)), r"padding=\(1, 1, 1\)"),
    (nn.Sequential(nn.Conv3d(1, 2, 3, padding=1, padding_mode="circular")), "zeros"),
])
def test_untileable_models_are_refused_with_the_reason(model, match):
    with pytest.raises(TilingError, match=match):
        conv_chain(model)


def test_a_module_with_its_own_forward_is_refused():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(1, 1, 3, padding=1)

        def forward(self, x):
            return x + self.conv(x)

    with pytest.raises(TilingError, match="own forward"):
        conv_chain(Residual())


@pytest.mark.parametrize("tiles, halo, match", [
    (11, 3, "at most 10 slabs"),  # more slabs than voxels
    ((1, 2, 1), 3, "do not split axis 1"),  # axis of 5 voxels < 2 x halo
    ((2, 2), 3, "one count per axis"),
])
def test_bad_plans_name_the_fix(tiles, halo, match):
    with pytest.raises(TilingError, match=match):
        plan_tiles((10, 5, 20), tiles, halo)


@pytest.mark.parametrize("call, match", [
    (lambda: plan_tiles((10, 5, 20), 2, 3, axis=5), "axis=5"),  # IndexError
    (lambda: plan_tiles((10.5, 5, 20), 2, 3), "shape="),  # cut as 10 voxels
    (lambda: plan_tiles((10, 5, 20), 2, 3, only=[(2, 0, 0)]), "only="),  # a slab outside the volume
    (lambda: plan_tiles((10, 5, 20), 2, (3, -1, 3)), "halo"),  # no fix in the message
    (lambda: tiled_step(LimitTestNet(), *volume((8, 8, 8), dtype=torch.float32), bn_backward="both"),
     "bn_backward"),  # a bare ValueError
    (lambda: draw_shrinking(LimitTestNet(), size=16, tiles=3, slab=3), "slab 3 of a 3-slab plan"),  # IndexError
    (lambda: measure_tiled_step(8, 0, device="cpu"), "owned=0"),  # ZeroDivisionError
    (lambda: predict_tiled_step(LimitTestNet, (8, 0, 8), 2), "n=\\(8, 0, 8\\)"),
])
def test_numbers_a_plan_cannot_use_name_the_fix(call, match):
    """Each raised a raw error (IndexError, ZeroDivisionError, ValueError) or was taken silently."""
    with pytest.raises(TilingError, match=match) as err:
        call()
    assert "Fix: " in str(err.value)


def test_a_budget_outside_the_search_is_refused_with_what_it_holds():
    """Issue 43's example: ``largest_tiled_n(0)`` answered 15 -- one below the search's start, as
    if N = 15 fitted; a budget of a few bytes did the same. Slabs owning 0 voxels divided by zero;
    a search start of 0 and a budget that holds the limit raised memory's bare ValueError."""
    with pytest.raises(TilingError, match="budget_bytes=0 .*Fix: "):
        largest_tiled_n(0)
    with pytest.raises(TilingError, match="does not hold the tiled step at N = 16: it needs .*Fix: a budget of at least"):
        largest_tiled_n(1000)
    with pytest.raises(TilingError, match="even at N = 32 .*Fix: raise limit"):
        largest_tiled_n(8 * GiB, limit=32)
    for kw in ({"owned": 0}, {"start": 0}, {"start": 64, "limit": 32}):
        with pytest.raises(TilingError, match="Fix: "):
            largest_tiled_n(8 * GiB, **kw)


def test_bad_volumes_name_the_fix():
    net = LimitTestNet()
    with pytest.raises(TilingError, match="x\\[None, None\\]"):
        tiled_step(net, torch.randn(8, 8, 8), torch.randn(8, 8, 8))
    with pytest.raises(TilingError, match="does not match"):
        tiled_step(net, torch.randn(1, 1, 8, 8, 8), torch.randn(1, 1, 8, 8, 9))


# -- spatial parallelism on 2 gloo ranks --------------------------------------------------------
RUNS = [
    {"net": "limit", "exchange": "per_layer"},
    {"net": "limit", "exchange": "input_once"},
    {"net": "plain", "exchange": "per_layer"},
    {"net": "bn", "exchange": "per_layer", "batch": 2},
    {"net": "bn", "exchange": "input_once", "batch": 2},
    {"net": "plain", "exchange": "per_layer", "volume": (3, 10, 10)},  # 1-2 voxels < halo 2
]


@pytest.fixture(scope="module")
def spatial():
    return launch(spatial_worker, 2, {"volume": (16, 10, 10), "runs": RUNS})


@pytest.mark.parametrize("i", range(len(RUNS) - 1))
def test_spatial_parallel_equals_single_process(spatial, i):
    cfg = {"volume": (16, 10, 10), **RUNS[i]}
    r0, r1 = spatial[0][i], spatial[1][i]
    ref = spatial_reference(cfg)
    assert r0["owned"] == (0, 8) and r1["owned"] == (8, 16)
    assert all(torch.equal(a, b) for a, b in zip(r0["grads"], r1["grads"], strict=True))  # all-reduced
    assert relative_error(r0["grads"], ref["grads"]) < EXACT
    assert r0["loss"] == pytest.approx(ref["loss"], rel=EXACT)
    for a, b in zip(r0["running"], ref["running"], strict=True):  # BatchNorm's running statistics
        assert torch.allclose(a.to(b.dtype), b, rtol=1e-12, atol=1e-14)


def test_per_layer_exchange_sends_r_voxels_per_conv(spatial):
    r0 = spatial[0][0]
    plane = 10 * 10 * 8  # one depth slice of one channel, float64
    # LimitTestNet: convs take 1, 4 and 8 channels, radius 1: forward sends 13 slices; the
    # backward sends the same amount back, minus the first conv's (its input needs no gradient)
    assert r0["sent_bytes"] == {"forward": 13 * plane, "backward": 12 * plane}
    assert spatial[0][1]["sent_bytes"] == {"forward": 3 * plane, "backward": 0}  # input halo once


def test_spatial_parallel_refuses_slabs_thinner_than_a_layers_halo(spatial):
    assert "fewer ranks" in spatial[0][-1]["error"]


@pytest.mark.parametrize("config, match", [
    ({"net": "resnet"}, "net='resnet'"),  # a bare ValueError
    ({"volume": (0, 10, 10)}, "volume=\\(0, 10, 10\\)"),  # an empty volume, taken
    ({"batch": -1}, "batch=-1"),  # torch's RuntimeError
    ({"dtype": "int64"}, "dtype='int64'"),  # an integer volume
    ({"dim": 5}, "dim=5"),  # IndexError in every rank
    ({"exchange": "never"}, "exchange='never'"),
])
def test_spatial_configs_are_checked_before_any_message(config, match):
    """The spatial demos' config is read in every rank: refused (ParallelError, with the fix) before
    a rank builds its net or sends a message, and the single-process reference refuses it too."""
    with pytest.raises(ParallelError, match=match) as err:
        spatial_worker(0, 2, torch.device("cpu"), config)
    assert "Fix: " in str(err.value)
    with pytest.raises(ParallelError, match=match):
        spatial_reference(config)


# -- memory: seed 003 past N = 700 ---------------------------------------------------------------
@pytest.mark.parametrize("tiles, stream", [(5, False), (7, True), (32, False), (31, True)])
def test_prediction_runs_representative_slabs_and_matches_real_tensors(tiles, stream):
    some = predict_tiled_step(LimitTestNet, 32, tiles, stream=stream)
    every = predict_tiled_step(LimitTestNet, 32, tiles, stream=stream, all_tiles=True)
    real = predict_tiled_step(LimitTestNet, 32, tiles, stream=stream, all_tiles=True, fake=False)
    assert some.peak == every.peak == real.peak
    assert len(representative(plan_tiles((32,) * 3, tiles, 3))) == 3


def test_resident_volume_and_streaming():
    n = 200
    on_device = predict_tiled_step(LimitTestNet, n, n)
    streamed = predict_tiled_step(LimitTestNet, n, n, stream=True)
    assert on_device.breakdown["Other"] == 2 * input_bytes(n)  # input + target, exactly
    assert streamed.breakdown["Other"] == 0
    # streaming removes the resident volumes and adds the slab's copies: at most its read
    # region (owned + 2 x halo = 7 depth slices) and its target slice
    added = streamed.peak - (on_device.peak - 2 * input_bytes(n))
    assert 0 < added <= (1 + 2 * 3 + 1) * n * n * 4
    # per-slab memory grows like N^2 at fixed slab thickness
    double = predict_tiled_step(LimitTestNet, 2 * n, 2 * n, stream=True)
    assert double.peak / streamed.peak == pytest.approx(4, rel=0.05)


def test_seed003_tiled_passes_700_and_the_untiled_limit():
    budget = 8 * GiB
    tiled = largest_tiled_n(budget)
    untiled = predict_step(LimitTestNet, (1, 1, 410, 410, 410), (1, 1, 410, 410, 410),
                           optimizer=None, module_peaks=False).peak
    assert untiled <= budget  # the untiled limit, 410 (notebook 03), for comparison
    assert tiled >= 700
    assert 2 * input_bytes(tiled) <= budget < 2 * input_bytes(1025)  # input + target bound it


def test_drawings():
    ax = draw_tiles((24, 16), 3, 3)
    # per slab: owned area, owned bar, one halo (border slabs) or two; the volume's border
    assert len(ax.patches) == 3 * 2 + (1 + 2 + 1) + 1
    ax = draw_tiles((24, 16), (2, 2), 3)
    assert len(ax.patches) == 4 * 2 + 1  # owned area and a dashed frame per block; the border
    ax = draw_shrinking(LimitTestNet(), 16, 3, 1)
    assert [round(p.get_width()) for p in ax.patches[::2]] == [11, 9, 7, 5]
    import matplotlib.pyplot as plt
    plt.close("all")


def test_measure_runs_the_real_step_on_cpu():
    from course_utils.tiling import measure_tiled_step

    row = measure_tiled_step(16, 4, device="cpu")
    assert row["fits"] and row["slabs"] == 4 and "peak allocated MiB" not in row  # no allocator on CPU


@pytest.mark.gpu
def test_tiled_step_on_cuda_matches_the_prediction():
    from course_utils.tiling import measure_tiled_step

    n = 256
    predicted = predict_tiled_step(LimitTestNet, n, n // 4).peak / 2**20
    row = measure_tiled_step(n, 4, device="cuda")
    assert row["fits"]
    # the allocator rounds blocks and cuDNN may take a workspace: within 10 % above, never below
    assert predicted * 0.98 <= row["peak allocated MiB"] <= predicted * 1.1


def test_measure_caps_the_current_cuda_device_by_its_index(monkeypatch):
    """Notebook 03's last GPU cell crashed on the H200 run of 2026-11-27: ``measure_tiled_step``
    handed ``set_per_process_memory_fraction`` a ``torch.device("cuda")`` without an index, which
    torch refuses (``ValueError: Expected a torch.device with a specified index``). The fake here
    validates its device the way torch does (torch's own ``_get_device_index``), then stops the
    step before anything touches a GPU; the code before issue 41 failed it (checked by running
    this test against that module)."""
    from types import SimpleNamespace

    from torch.cuda._utils import _get_device_index

    from course_utils.tiling import measure_tiled_step

    class Capped(Exception):
        pass

    caps = []

    def set_fraction(fraction, device=None):
        caps.append((fraction, _get_device_index(device)))  # what torch's own function does first
        raise Capped

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=16 * GiB))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    for device in ("cuda", torch.device("cuda"), "cuda:0"):
        with pytest.raises(Capped):
            measure_tiled_step(64, budget_bytes=GiB, device=device)
    assert caps == [(1 / 16, 0)] * 3


@pytest.mark.gpu
def test_measure_under_a_cap_on_cuda():
    """Notebook 03's ``measure_seed003_cuda`` path: the step capped at a budget on ``"cuda"``
    (no index)."""
    from course_utils.tiling import measure_tiled_step

    row = measure_tiled_step(64, budget_bytes=GiB, device="cuda")
    assert row["fits"] and row["peak reserved MiB"] <= 1024
