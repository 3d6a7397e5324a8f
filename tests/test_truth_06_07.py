"""Truth pass 3, notebooks 06 and 07: in-place LeakyReLU as In-Place ABN's baseline, the fp16
hazard of per-channel sums, the sqrt(n) fit decomposed, what a memory-efficient dense layer
stores, and README's checkpointing figure in notebook 07's configuration."""

import json
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_inplace_leaky_relu_stores_two_tensors_per_unit_like_inplace_relu():
    from course_utils.inplace_abn import bn_leaky_relu, bn_leaky_relu_inplace, stored_per_unit
    from course_utils.unet import bn_relu_inplace

    inplace = stored_per_unit(bn_leaky_relu_inplace)
    assert inplace == stored_per_unit(bn_relu_inplace) == {"BN outputs": 1.0, "conv outputs": 1.0}
    assert round(sum(stored_per_unit(bn_leaky_relu).values())) == 3  # out of place: saves its input
    act = bn_leaky_relu_inplace(4)[1]
    assert isinstance(act, torch.nn.LeakyReLU) and act.inplace


def test_channel_sums_held_in_fp16_overflow_and_fp32_does_not():
    from course_utils.inplace_abn import channel_sums_fp16

    torch.manual_seed(0)
    x16 = torch.randn(2, 2, 80_000).half()
    sums = channel_sums_fp16(x16).groupby("sum")
    fp16, fp32 = sums["held in fp16"], sums["fp32 accumulation"]
    assert fp16.apply(lambda v: bool(v.abs().eq(math.inf).all()))["sum of x**2"]
    assert (fp16.max()["sum of dz (gradient of beta)"] == math.inf
            and fp32.max()["sum of dz (gradient of beta)"] == 160_000)
    assert fp32.apply(lambda v: bool(v.abs().lt(math.inf).all())).all()
    # the old demo's hazard, var * count, is not what an implementation computes: the variance
    # itself is finite and about 1 in fp16
    assert torch.isfinite(torch.var_mean(x16, dim=[0, 2], correction=0)[0]).all()


def test_per_layer_resident_bytes_counts_512_byte_blocks():
    from course_utils.checkpointing import per_layer_resident_bytes

    # conv weight 4*4*27 fp32 = 1728 -> 2048; BN weight, bias, running mean, var, counter: 512 each
    assert per_layer_resident_bytes(width=4) == 2048 + 5 * 512


def test_sqrt_sweep_parts_add_up_and_activations_follow_the_hand_count():
    import numpy as np

    from course_utils import checkpointing as ck

    sweep, a = ck.sqrt_sweep(ns=(4, 8, 16))
    parts = ck.sqrt_parts_fit(sweep)
    total = sum(sweep[c] for c in ck.SQRT_PARTS)
    assert np.allclose(total, sweep["checkpointed peak / a"])
    k_parts = parts.loc[[c.removesuffix(" / a") for c in ck.SQRT_PARTS], "k"].sum()
    assert abs(k_parts - parts.loc["checkpointed peak", "k"]) < 1e-9
    offset = sweep["activations at peak / a"] - sweep["hand count / a"]
    assert offset.max() - offset.min() < 0.15
    assert list(sweep["hand count / a"]) == [5.0, 7.0, 11.0]  # min (s - 1) + 2n/s over the tried s
    slope = np.polyfit(sweep["layers n"], sweep["parameters + buffers / a"], 1)[0]
    assert abs(slope - ck.per_layer_resident_bytes(width=4) / a) < 1e-9
    assert (sweep["weight gradients at peak / a"] == 0).all()


def test_memory_efficient_dense_layer_stores_two_bottleneck_maps_and_its_new_channels():
    from course_utils.densenet import stored_per_layer

    eff = stored_per_layer(True, n_layers=4).set_index("layer")["stored maps (channels)"]
    assert eff["block input"] == [64]
    assert [eff[str(i)] for i in range(3)] == [[128, 128, 32]] * 3 and eff["3"] == [128, 128]
    naive = stored_per_layer(False, n_layers=4).set_index("layer")
    for i in range(4):
        c = 64 + 32 * i
        assert naive.loc[str(i), "stored maps (channels)"] == sorted([c, c, 128, 128], reverse=True)


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
    from course_utils import readme

    p = {k: round(100 * (v / notebook07_peaks["none"] - 1), 1) for k, v in notebook07_peaks.items()}
    expected = f"peak {p['level']:+.1f} % per level, {p['selective']:+.1f} % selective (save convs)"
    figure, method = readme._seed004_checkpointing()
    assert figure == expected and "autocast fp16" in method and "lean Up" in method
    committed = {r["key"]: r for r in json.loads((ROOT / "results" / "figures.json").read_text())["rows"]}
    assert committed["seed004_checkpointing"]["course"] == expected
