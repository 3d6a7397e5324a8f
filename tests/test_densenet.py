"""Seed 004's DenseNet-169: the parameter count against torchvision's documented figure and an
independent formula, memory-efficient and checkpointed variants equal to the naive one (gradients
and BN statistics), the batch model against direct predictions, the out-of-memory case, and what a
memory-efficient dense layer stores (notebook 12)."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from course_utils.densenet import (
    CARDS_GIB, DENSENET169, SEED004_BATCH, TORCHVISION_DENSENET169_PARAMS, DenseNet, densenet169,
    parameter_count, predict_seed004,
)
from course_utils.budget import batch_model, steady_state, usable_bytes
from course_utils.memory import predict_step
from course_utils.unet import count_parameters

SMALL = dict(growth_rate=4, block_config=(2, 3, 2, 2), num_init_features=8, bn_size=2)


def test_parameter_count_matches_torchvision_and_the_formula():
    assert parameter_count(**DENSENET169, in_channels=3, num_classes=1000) == \
        TORCHVISION_DENSENET169_PARAMS
    for kw in (dict(in_channels=3, num_classes=1000), dict()):
        assert count_parameters(densenet169(**kw)) == parameter_count(**DENSENET169, **kw)
    # the course's choice: 1 channel, 14 outputs
    # the course's choice, 1 channel and 14 outputs: one input channel of conv0 (2 x 64 x 7 x 7)
    # fewer, and a 1664 -> 14 classifier instead of 1664 -> 1000
    expected = 14_149_480 - 2 * 64 * 7 * 7 - (1664 * 1000 + 1000) + (1664 * 14 + 14)
    assert count_parameters(densenet169()) == expected == 12_501_518


def test_architecture_shapes():
    net = densenet169()
    assert net.num_features == 1664
    assert [len(s[0].layers) for s in net.stages] == [6, 12, 32, 32]
    with torch.device("meta"):
        m = densenet169()
        assert m(torch.empty(2, 1, 512, 512)).shape == (2, 14)
        with pytest.raises(ValueError, match="expects .batch, 1, height, width."):
            m(torch.empty(2, 3, 512, 512))


@pytest.mark.parametrize("kw", [dict(memory_efficient=True), dict(checkpoint_blocks=True),
                                dict(memory_efficient=True, checkpoint_blocks=True)])
def test_variants_equal_the_naive_net(kw):
    torch.manual_seed(0)
    naive = DenseNet(**SMALL).double()
    state = {k: v.clone() for k, v in naive.state_dict().items()}
    net = DenseNet(**SMALL, **kw).double()
    net.load_state_dict(state)
    x = torch.randn(3, 1, 32, 32, dtype=torch.float64)
    y = torch.rand(3, 14, dtype=torch.float64)
    for m in (naive, net):
        nn.functional.binary_cross_entropy_with_logits(m(x), y).backward()
    for (k, a), b in zip(naive.named_parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-12, rtol=1e-10, msg=k)
    for (k, a), b in zip(naive.state_dict().items(), net.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=k)  # BN statistics updated once


def test_batch_model_matches_direct_predictions():
    build = lambda: DenseNet(**SMALL, memory_efficient=True)  # noqa: E731

    def pred(b):
        return predict_step(build, (b, 1, 64, 64), (b, 14), module_peaks=False,
                            loss_fn=nn.functional.binary_cross_entropy_with_logits)

    model = batch_model(pred(4), batch=4)
    for b in (2, 7):  # the peak's moment can shift a little with the batch: 1 %
        assert model.peak(b) == pytest.approx(steady_state(pred(b).breakdown)["Total"], rel=0.01)


def test_steady_state_adds_adam_once():
    b = {"Parameter": 10, "Optstate": 0, "Total": 100}
    assert steady_state(b)["Total"] == 120
    assert steady_state(steady_state(b))["Total"] == 120


@pytest.mark.sweep  # notebook 12 asserts each of these in make test (sections 1 and 2): make test-sweep, not CI
def test_seed004_runs_out_of_memory_at_batch_8_and_the_techniques_fix_it():
    """DenseNet-169, batch 8, 512 x 512, fp32, Adam: the predicted peak does not fit a 6 GB card
    (after the stated context and workspace allowance); the memory-efficient net does, with room
    for more than 1.5 times the batch."""
    naive = batch_model(predict_seed004(densenet169), SEED004_BATCH)
    eff = batch_model(predict_seed004(lambda: densenet169(memory_efficient=True)), SEED004_BATCH)
    six = usable_bytes(CARDS_GIB["6 GB (GTX 1060 / RTX 2060)"])
    assert naive.peak(8) > six and naive.largest_batch(six) < 8
    assert eff.peak(8) < 0.5 * naive.peak(8)
    assert eff.largest_batch(six) > 1.5 * 8


def test_a_variant_is_predicted_once_per_session_and_its_copy_drops_only_the_log(monkeypatch, tmp_path):
    """``predict_densenet169``: the switches name the variant whatever their order, one prediction
    per variant for every process of a session (``session_cache``), the copy whole but its log."""
    import course_utils.densenet as dn
    from course_utils.memory.predict import Prediction

    built = []

    def fake_predict(build, batch):
        net = build()
        built.append((net.memory_efficient, net.checkpoint_blocks, batch))
        return Prediction(peak=batch, breakdown={"Total": batch}, saved_peak=0, after_forward={},
                          parameters=1, log=lambda: None, method="stub")  # a lambda: not picklable

    monkeypatch.setattr(dn, "predict_seed004", fake_predict)
    monkeypatch.setattr(dn, "densenet169", lambda **kw: SimpleNamespace(
        memory_efficient=kw.get("memory_efficient", False), checkpoint_blocks=kw.get("checkpoint_blocks", False)))
    monkeypatch.setenv("COURSE_SESSION_CACHE", str(tmp_path))
    dn._densenet169_step.cache_clear()
    try:
        a = dn.predict_densenet169(4, checkpoint_blocks=True, memory_efficient=True)
        dn._densenet169_step.cache_clear()  # another process of the session: reads the file
        b = dn.predict_densenet169(4, memory_efficient=True, checkpoint_blocks=True)
        assert built == [(True, True, 4)] and a == b and a.log is None and (a.peak, a.method) == (4, "stub")
        dn.predict_densenet169(4)
        assert built[-1] == (False, False, 4) and len(list(tmp_path.iterdir())) == 2
        with pytest.raises(TypeError, match="unknown switch.*memory_efficient=True"):
            dn.predict_densenet169(memory_eficient=True)
    finally:
        dn._densenet169_step.cache_clear()


# -- what a memory-efficient dense layer stores (notebook 12) -------------------------------------
def test_memory_efficient_dense_layer_stores_two_bottleneck_maps_and_its_new_channels():
    """Notebook 12's text rests on this: what a memory-efficient dense layer stores."""
    from course_utils.densenet import stored_per_layer

    eff = stored_per_layer(True, n_layers=4).set_index("layer")["stored maps (channels)"]
    assert eff["block input"] == [64]
    assert [eff[str(i)] for i in range(3)] == [[128, 128, 32]] * 3 and eff["3"] == [128, 128]
    naive = stored_per_layer(False, n_layers=4).set_index("layer")
    for i in range(4):
        c = 64 + 32 * i
        assert naive.loc[str(i), "stored maps (channels)"] == sorted([c, c, 128, 128], reverse=True)


def test_recorded_kit_rows_read_the_h200_densenet_run(tmp_path):
    """Notebook 12 shows the GPU kit's DenseNet-169 (batch 8, 512^2, fp32) beside its prediction:
    the record holds both nets, measured within 3 % above the prediction, with the run's label
    and context; no record gives an empty table."""
    from course_utils.densenet import recorded_kit_rows

    kit = recorded_kit_rows()
    assert len(kit) == 2 and all("(8, 1, 512, 512)" in c for c in kit.index)
    assert ((kit["measured / predicted"] > 1) & (kit["measured / predicted"] < 1.03)).all()
    assert "H200" in kit.attrs["run"] and kit.attrs["context MiB"] > 0
    assert recorded_kit_rows(folder=tmp_path).empty
