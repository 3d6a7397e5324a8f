"""course_utils' foundation: setup and the size presets (config), the U-Net (unet), data, and
training (train: the step's gradients, autocast and GradScaler, Dice, train()'s loop)."""

import pytest
import torch
from torch.utils.data import DataLoader
from torch import nn
from torch.nn import functional as F

from course_utils import (
    PRESETS, SyntheticVolumes, UNet3D, count_parameters, dice_score, make_volume, seed000_unet,
    setup, train,
)
from course_utils.config import SEED000_VOLUME, resolve_device
from course_utils import unet
from course_utils.unet import block_table, draw_u, level_shapes
from course_utils.config import resolve_preset
from course_utils.checks import MeasureError
from course_utils.train import training_step


# -- setup ---------------------------------------------------------------------------------
def test_setup_defaults_to_tiny_on_cpu(monkeypatch):
    monkeypatch.delenv("COURSE_SIZE", raising=False)
    cfg = setup(device="cpu", verbose=False)
    assert cfg.device.type == "cpu" and cfg.preset.name == "tiny"


def test_env_var_overrides_preset(monkeypatch):
    monkeypatch.setenv("COURSE_SIZE", "full")
    cfg = setup(device="cpu", verbose=False)
    assert cfg.preset is PRESETS["full"] and cfg.preset.volume == SEED000_VOLUME == (26, 150, 320)
    assert cfg.preset.batch == 2


def test_unknown_preset_names_the_fix(monkeypatch):
    monkeypatch.setenv("COURSE_SIZE", "huge")
    with pytest.raises(ValueError, match=r"unknown size preset 'huge'.*one of \['full', 'tiny'\]"):
        setup(device="cpu", verbose=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_requested_but_absent():
    with pytest.raises(RuntimeError, match="requested but torch.cuda.is_available.. is False.*Fix"):
        resolve_device("cuda")


def test_setup_prints_device_and_preset(capsys):
    setup(device="cpu", size="tiny")
    out = capsys.readouterr().out
    assert "device: cpu" in out and "preset: tiny" in out


# -- the U-Net -----------------------------------------------------------------------------
def test_seed000_parameter_counts_are_exact():
    assert count_parameters(seed000_unet("large")) == 40_158_853
    assert count_parameters(seed000_unet("small")) == 14_496_517


def test_the_blocks_compute_what_the_layout_says():
    """Values, not only counts: Up upsamples trilinearly (align_corners), pads the short side
    at the end (d // 2 before, the rest after), and concatenates [skip, upsampled]."""
    import torch.nn.functional as F
    from course_utils.unet import Up

    torch.manual_seed(0)
    up = Up(6, 4)
    deep, skip = torch.randn(1, 2, 3, 4, 5), torch.randn(1, 4, 7, 9, 10)
    x = F.interpolate(deep, scale_factor=2, mode="trilinear", align_corners=True)
    x = F.pad(x, [0, 0, 0, 1, 0, 1])  # (6, 8, 10) -> (7, 9, 10): one voxel after, none before
    expected = up.conv(torch.cat([skip, x], dim=1))
    assert torch.equal(up(deep, skip), expected)


@pytest.mark.parametrize("volume", [(26, 150, 320), (16, 16, 16), (17, 33, 40), (64, 64, 64)])
def test_shapes_per_level_on_meta(volume):
    rows = dict(level_shapes(seed000_unet("large"), volume, batch=2))
    assert rows["outc"] == (2, 5, *volume)
    assert rows["inc"] == (2, 64, *volume)
    assert rows["downs.3"][1] == 512
    assert rows["downs.3"][2:] == tuple(s // 16 for s in volume)


def test_full_size_shapes_match_the_seed():
    rows = dict(level_shapes(seed000_unet("small"), SEED000_VOLUME, batch=2))
    assert rows["downs.2"] == (2, 256, 3, 18, 40)
    assert rows["ups.0"] == (2, 256, 6, 37, 80)


def test_blocks_pair_by_place_not_by_name():
    """Notebook 01 pairs the two seed nets' blocks by side and resolution (``block_side``): by name,
    ``ups.2`` would put the large net's 13x75x160 map beside the small net's 26x150x320 one."""
    place = {v: {r["block"]: f"{r['side']} {r['resolution']}" for r in block_table(seed000_unet(v), SEED000_VOLUME)}
             for v in ("large", "small")}
    assert place["large"]["ups.2"] == place["small"]["ups.1"] == "decoder 13x75x160"
    assert place["large"]["ups.3"] == place["small"]["ups.2"] == "decoder 26x150x320"
    assert place["large"]["outc"] == "output 26x150x320" and place["large"]["inc"] == "encoder 26x150x320"
    assert set(place["small"].values()) < set(place["large"].values())  # small's places: a subset
    assert len(set(place["large"].values())) == len(place["large"])     # one block per place


def test_the_place_helpers_pair_both_nets_and_key_a_logs_modules():
    """Notebooks 01 and 02 pair the seed nets by place with ``unet``'s helpers (they were cell code
    written twice, with two keys: 02 put ``outc`` on the decoder side, 01 on the output side)."""
    nets = {v: unet.places(seed000_unet(v), SEED000_VOLUME) for v in ("large", "small")}
    table = unet.side_by_side(nets, "block", "parameters")
    assert list(table.columns) == ["large block", "large parameters", "small block", "small parameters"]
    assert list(table.index) == list(nets["large"])  # the large net's own order: the U's path
    assert table.loc["decoder 26x150x320"].tolist() == ["ups.3", 332160, "ups.2", 442752]
    assert table.loc["encoder 1x9x20", "small block"] == "-" and table.loc["decoder 3x18x40", "small parameters"] == "-"
    summary = unet.output_summary(nets)
    assert summary["largest output B"].tolist() == [2 * 64 * 26 * 150 * 320 * 2] * 2
    assert summary.loc["large", "largest at"] == "encoder 26x150x320" and summary["its channels"].tolist() == [64, 64]
    assert 1.0 < summary.loc["small", "block outputs MiB"] / summary.loc["large", "block outputs MiB"] < 1.1
    key = unet.place_of(seed000_unet("small"), SEED000_VOLUME)
    assert [key(m) for m in ("inc.double_conv.0", "downs.0.maxpool_conv.1.double_conv.3", "ups.2.conv.double_conv.0",
                             "outc.conv", "")] == ["encoder 26x150x320", "encoder 13x75x160", "decoder 26x150x320",
                                                   "output 26x150x320", "model"]
    shuffled = sorted(nets["large"], key=lambda w: w[::-1])
    assert sorted(shuffled, key=unet.u_order) == list(nets["large"])


def test_draw_u_is_computed_from_the_net():
    """Notebook 01's drawing of the U: the channels of every block, in the concatenation's order
    (skip first), read from the net; the small net's top Up takes 64 + 128 = 192 channels."""
    large, small = draw_u(seed000_unet("large"), SEED000_VOLUME), draw_u(seed000_unet("small"), SEED000_VOLUME)
    assert "26x150x320  inc      1 -> 64" in large and "ups.3  64 + 64 -> 64  --> outc 64 -> 5" in large
    assert "ups.0  512 + 512 -> 256" in large and large.splitlines()[-1].startswith("1x9x20      downs.3  512 -> 512")
    assert "ups.2  64 + 128 -> 64" in small and "ups.1  128 + 256 -> 128" in small
    assert small.splitlines()[-1].startswith("3x18x40     downs.2  256 -> 256")
    assert len(large.splitlines()) == 1 + 5 + 4 and len(small.splitlines()) == 1 + 4 + 3
    net = UNet3D(levels=3, channels=(3, 5, 7), decoder_channels=(6, 4), in_channels=2, n_classes=9)
    drawn = draw_u(net, (8, 8, 8))
    assert "inc      2 -> 3" in drawn and "ups.0  5 + 7 -> 6" in drawn and "ups.1  3 + 6 -> 4  --> outc 4 -> 9" in drawn


def test_tiny_forward_backward_real():
    net = UNet3D(levels=3, channels=4)
    x = torch.randn(2, 1, 8, 12, 10)
    out = net(x)
    assert out.shape == (2, 5, 8, 12, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_default_channel_rule():
    net = UNet3D(levels=5, channels=64)
    assert net.encoder_channels == (64, 128, 256, 512, 512)
    assert net.decoder_channels == (256, 128, 64, 64)
    assert count_parameters(net) == 40_158_853


@pytest.mark.parametrize("shape,match", [
    ((16, 16, 16), r"5D tensor.*got 3D.*x\[None, None\]"),
    ((1, 16, 16, 16), r"5D tensor.*got 4D.*unsqueeze\(0\)"),
    ((1, 2, 16, 16, 16), r"built for 1 input channel.*has 2.*in_channels=2"),
    ((1, 1, 8, 16, 16), r"too small for 5 levels.*at least 2\*\*\(levels-1\) = 16"),
])
def test_bad_input_names_the_fix(shape, match):
    net = UNet3D(levels=5, channels=2)
    with pytest.raises(ValueError, match=match):
        net(torch.zeros(shape))


def test_bad_construction():
    with pytest.raises(ValueError, match="one width per level"):
        UNet3D(levels=4, channels=(8, 16, 32))
    with pytest.raises(ValueError, match="unknown variant"):
        seed000_unet("medium")


# -- data ----------------------------------------------------------------------------------
def test_data_is_deterministic_and_has_five_classes():
    a = SyntheticVolumes(4, (16, 32, 32), seed=3)
    b = SyntheticVolumes(4, (16, 32, 32), seed=3)
    for i in range(4):
        (xa, ya), (xb, yb) = a[i], b[i]
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    x, y = a[0]
    assert x.shape == (1, 16, 32, 32) and x.dtype == torch.float32
    assert y.shape == (16, 32, 32) and y.dtype == torch.int64
    labels = torch.cat([a[i][1].flatten() for i in range(4)])
    assert set(labels.unique().tolist()) == {0, 1, 2, 3, 4}
    assert not torch.equal(a[0][1], SyntheticVolumes(4, (16, 32, 32), seed=4)[0][1])


def test_data_bad_shape_and_index():
    with pytest.raises(ValueError, match=r"\(D, H, W\)"):
        make_volume((16, 16), 0)
    with pytest.raises(IndexError):
        SyntheticVolumes(2, (8, 8, 8))[2]


# -- training ------------------------------------------------------------------------------
def test_dice_perfect_and_wrong():
    target = torch.randint(0, 5, (1, 4, 4, 4))
    perfect = torch.nn.functional.one_hot(target, 5).permute(0, 4, 1, 2, 3).float()
    assert dice_score(perfect, target) == pytest.approx(1.0)
    wrong = torch.nn.functional.one_hot((target + 1) % 5, 5).permute(0, 4, 1, 2, 3).float()
    assert dice_score(wrong, target) == pytest.approx(0.0)


def test_training_reduces_the_loss():
    torch.manual_seed(0)
    ds = SyntheticVolumes(4, (16, 16, 16), seed=0)
    hist = train(UNet3D(levels=3, channels=4), DataLoader(ds, batch_size=2), steps=15,
                 progress=False)
    assert len(hist.loss) == 15
    assert sum(hist.loss[-3:]) / 3 < sum(hist.loss[:3]) / 3


# -- bad input: errors that name the fix, raised where the mistake is made --------------------
@pytest.mark.parametrize("device", ["mps", "meta", "xla", "gpu"])
def test_unsupported_devices_are_refused_clearly(device):
    with pytest.raises(ValueError, match="Fix: "):
        setup(device=device, verbose=False)


def test_course_size_is_normalised(monkeypatch):
    monkeypatch.setenv("COURSE_SIZE", "  Tiny ")
    assert setup(device="cpu", verbose=False).preset.name == "tiny"


def test_batch_one_at_the_minimum_size_is_refused_before_batchnorm_fails():
    net = UNet3D(levels=3, channels=4)
    with pytest.raises(ValueError, match="BatchNorm in training mode needs more than one"):
        net(torch.randn(1, 1, 4, 4, 4))
    net(torch.randn(2, 1, 4, 4, 4))  # two values per channel: fine
    net(torch.randn(1, 1, 8, 4, 4))  # two deepest voxels: fine
    net.eval()
    net(torch.randn(1, 1, 4, 4, 4))  # eval mode uses the running statistics


def test_count_parameters_frozen():
    net = UNet3D(levels=3, channels=4)
    total = sum(p.numel() for p in net.parameters())
    net.inc.requires_grad_(False)
    frozen = sum(p.numel() for p in net.inc.parameters())
    assert count_parameters(net) == total - frozen
    assert count_parameters(net, trainable_only=False) == total


def test_train_refuses_bad_steps_and_reads_generators_lazily():
    net = UNet3D(levels=3, channels=4)
    batch = (torch.randn(2, 1, 8, 8, 8), torch.randint(0, 5, (2, 8, 8, 8)))
    for steps in (0, -3, 2.5):
        with pytest.raises(MeasureError, match="steps") as e:
            train(net, [batch], steps=steps, progress=False)
        assert "Fix:" in str(e.value)

    def endless():
        while True:
            yield batch
    hist = train(net, endless(), steps=3, progress=False)  # used to hang in list(batches)
    assert len(hist.loss) == 3
    with pytest.raises(ValueError, match="batches is empty"):
        train(net, iter([]), steps=1, progress=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_train_on_cuda_without_a_gpu_names_the_fix():
    with pytest.raises(RuntimeError, match="Fix"):
        train(UNet3D(levels=3, channels=4), [], steps=1, device="cuda", progress=False)


# -- config: COURSE_SIZE and the default preset --------------------------------------------------
def test_an_empty_course_size_means_unset(monkeypatch):
    """``COURSE_SIZE= make test`` (set but empty) picks the default, not an unknown preset ''.
    Without this test the mutant ``course-size-empty-not-unset`` of tools/mutants.py (an empty COURSE_SIZE taken for
    a preset's name) survived the other tests."""
    monkeypatch.setenv("COURSE_SIZE", "")
    preset, reason = resolve_preset(None, torch.device("cpu"))
    assert preset is PRESETS["tiny"] and "default for cpu" in reason


def test_the_default_preset_follows_the_device(monkeypatch):
    """full on a GPU, tiny on a CPU (a device object is enough: no GPU is needed to ask).
    Without this test the mutant ``preset-default-ignores-cuda`` of tools/mutants.py (tiny by default on a GPU)
    survived the other tests."""
    monkeypatch.delenv("COURSE_SIZE", raising=False)
    assert resolve_preset(None, torch.device("cuda"))[0] is PRESETS["full"]
    assert resolve_preset(None, torch.device("cpu"))[0] is PRESETS["tiny"]
    monkeypatch.setenv("COURSE_SIZE", "TINY")
    assert resolve_preset(None, torch.device("cuda"))[0] is PRESETS["tiny"]  # the variable wins


# -- train: the step's gradients, autocast and GradScaler; Dice; train()'s batches and lr -------
def _linear():
    torch.manual_seed(0)
    return nn.Linear(4, 3), torch.randn(5, 4), torch.randint(0, 3, (5,))


def _reference_grad(lin, x, y):
    w, b = lin.weight.detach().clone().requires_grad_(), lin.bias.detach().clone()
    F.cross_entropy(F.linear(x, w, b), y).backward()
    return w.grad


def test_each_step_starts_from_fresh_gradients():
    """lr=0: the weights stay put, so two steps on one batch must leave one step's gradient,
    not the sum of two.
    Without this test the mutant ``train-step-no-zero-grad`` of tools/mutants.py (gradients accumulated across
    steps) survived the other tests."""
    lin, x, y = _linear()
    opt = torch.optim.SGD(lin.parameters(), lr=0.0)
    training_step(lin, x, y, opt)
    training_step(lin, x, y, opt)
    torch.testing.assert_close(lin.weight.grad, _reference_grad(lin, x, y))


def test_the_step_runs_under_the_autocast_dtype_it_is_given():
    """Without this test the mutant ``train-step-autocast-off`` of tools/mutants.py (autocast_dtype ignored) survived
    the other tests."""
    lin, x, y = _linear()
    seen = []
    training_step(lin, x, y, None, autocast_dtype=torch.bfloat16, after_backward=seen.append)
    assert seen[0].dtype == torch.bfloat16
    training_step(lin, x, y, None, after_backward=seen.append)
    assert seen[1].dtype == torch.float32


def test_with_a_grad_scaler_the_loss_is_scaled_and_the_step_unscaled():
    """Without this test the mutants ``train-step-loss-not-scaled`` and ``train-step-no-optimizer-step`` of
    tools/mutants.py (the loss not scaled, or no optimizer.step()) survived the other tests."""
    lin, x, y = _linear()
    ref = _reference_grad(lin, x, y)
    w0 = lin.weight.detach().clone()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    grads = []
    training_step(lin, x, y, torch.optim.SGD(lin.parameters(), lr=1.0), scaler=scaler,
                  after_backward=lambda logits: grads.append(lin.weight.grad.clone()))
    torch.testing.assert_close(grads[0], 1024.0 * ref)  # backward of the scaled loss
    torch.testing.assert_close(lin.weight.detach(), w0 - ref)  # the step: unscaled


def test_dice_of_an_empty_volume_predicted_empty_is_perfect():
    """Without this test the mutant ``dice-empty-is-zero`` of tools/mutants.py (Dice 0 for an empty volume predicted
    empty) survived the other tests."""
    target = torch.zeros(1, 4, 4, 4, dtype=torch.long)
    logits = torch.zeros(1, 5, 4, 4, 4)
    logits[:, 0] = 1.0  # background everywhere, as in the target
    assert dice_score(logits, target) == 1.0


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 1, 8, 8, 8, generator=g), torch.randint(0, 5, (2, 8, 8, 8), generator=g)


def test_a_short_generator_is_cycled():
    """Without this test the mutant ``train-one-pass-over-a-generator`` of tools/mutants.py (one pass over a finite
    generator) survived the other tests."""
    seen = []

    def two_batches():
        for s in (0, 1):
            seen.append(s)
            yield _batch(s)

    hist = train(UNet3D(levels=3, channels=4), two_batches(), steps=5, progress=False)
    assert len(hist.loss) == 5 and seen == [0, 1]  # read once, lazily, then replayed


def test_train_uses_its_learning_rate():
    """Without this test the mutant ``train-ignores-lr`` of tools/mutants.py (lr ignored) survived the other tests."""
    net = UNet3D(levels=3, channels=4)
    before = [p.detach().clone() for p in net.parameters()]
    train(net, [_batch(0)], steps=1, lr=0.0, progress=False)
    assert all(torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))
    train(net, [_batch(0)], steps=1, lr=1e-2, progress=False)
    assert not all(torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))


def test_a_model_on_the_meta_device_is_refused_before_a_step():
    """Issue 43: a model built on the meta device (shapes, no data) reached torch's internals in
    train_step (a device check), train (``Module.to``: "Cannot copy out of meta tensor") and
    training_step; each now refuses it first, naming the meta device and the fix."""
    import importlib

    train_module = importlib.import_module("course_utils.train")  # course_utils.train is also the function
    with torch.device("meta"):
        net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(2, 4), torch.randint(0, 3, (2,))
    opt = torch.optim.Adam(net.parameters())
    for where, call in [("train_step", lambda: train_module.train_step(net, x, y, opt)),
                        ("training_step", lambda: training_step(net, x, y, opt)),
                        ("train", lambda: train(net, [(x, y)], steps=1, progress=False))]:
        with pytest.raises(MeasureError, match=rf"^{where} needs tensors with data, and the Sequential's parameters "
                                               r"are on the meta device.*Fix: build the model on the CPU"):
            call()
    with pytest.raises(MeasureError, match="the batch is on the meta device"):
        training_step(nn.Linear(4, 3), x.to("meta"), y)
