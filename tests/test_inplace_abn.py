"""In-Place ABN: gradcheck, equality with BatchNorm + LeakyReLU (scale |gamma| + eps), running
stats with the user's momentum and eps, gamma = 0, fp32 accumulation for fp16/bf16 input,
errors, and the memory it saves; in-place LeakyReLU as its baseline and the fp16 hazard of
per-channel sums (notebook 06)."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from course_utils import SavedTensorMeter, UNet3D
from course_utils.inplace_abn import (
    compare_with_reference,
    InPlaceABN, InPlaceABNFunction, bn_leaky_relu, channel_stats, inplace_abn,
)


def _apply(x, w, b, rm, rv, training, momentum=0.1, eps=1e-5, slope=0.1):
    # clone: the op writes into its input, gradcheck reuses it
    return InPlaceABNFunction.apply(x.clone(), w, b, rm.clone(), rv.clone(), training,
                                    momentum, eps, slope)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_gradcheck_float64(training, sign):
    torch.manual_seed(0)
    x = torch.randn(3, 2, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    w = (sign * (torch.rand(2, dtype=torch.float64) + 0.5)).requires_grad_()
    b = torch.randn(2, dtype=torch.float64, requires_grad=True)
    rm, rv = torch.randn(2, dtype=torch.float64), torch.rand(2, dtype=torch.float64) + 0.5
    assert torch.autograd.gradcheck(lambda x, w, b: _apply(x, w, b, rm, rv, training), (x, w, b))


def _reference(x, weight, bias, rm, rv, training, momentum, eps, slope):
    """BatchNorm with the scale |weight| + eps, then leaky ReLU -- written with explicit
    constants, so a module that ignores its own momentum or eps cannot agree with it."""
    scale = weight.abs() + eps
    return F.leaky_relu(F.batch_norm(x, rm, rv, scale, bias, training, momentum, eps), slope)


@pytest.mark.parametrize("training", [True, False])
def test_honours_momentum_eps_and_slope(training):
    """Non-default momentum, eps and slope, gamma of both signs: outputs, gradients and running
    statistics equal the reference built from those numbers."""
    torch.manual_seed(0)
    momentum, eps, slope = 0.3, 0.05, 0.02
    abn = InPlaceABN(4, slope=slope, eps=eps, momentum=momentum).train(training)
    w0 = torch.tensor([1.5, 0.7, -0.4, 2.0])
    b0 = torch.tensor([0.1, -0.2, 0.3, 0.0])
    rm0, rv0 = torch.tensor([0.1, 0.2, -0.1, 0.0]), torch.tensor([1.2, 0.8, 1.0, 2.0])
    with torch.no_grad():
        abn.weight.copy_(w0), abn.bias.copy_(b0)
        abn.running_mean.copy_(rm0), abn.running_var.copy_(rv0)
    w, b = w0.clone().requires_grad_(), b0.clone().requires_grad_()
    rm, rv = rm0.clone(), rv0.clone()
    x = torch.randn(2, 4, 5, 6, 7) * 3 + 1
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref = _reference(x1, w, b, rm, rv, training, momentum, eps, slope)
    out = abn(x2 * 1)  # * 1: a non-leaf, as a conv output would be
    torch.testing.assert_close(out, out_ref)
    g = torch.randn_like(out)
    out_ref.backward(g)
    out.backward(g)
    torch.testing.assert_close(x2.grad, x1.grad)
    torch.testing.assert_close(abn.weight.grad, w.grad)
    torch.testing.assert_close(abn.bias.grad, b.grad)
    torch.testing.assert_close(abn.running_mean, rm)
    torch.testing.assert_close(abn.running_var, rv)
    if training:  # the statistics really moved, by the user's momentum
        assert not torch.allclose(abn.running_mean, rm0)
    assert int(abn.num_batches_tracked) == int(training)


def test_equals_batchnorm_plus_leaky_relu_for_positive_gamma():
    """For gamma >= 0 the scale |gamma| + eps differs from BN's gamma by eps only."""
    torch.manual_seed(0)
    bn, act = bn_leaky_relu(3)
    abn = InPlaceABN(3)
    abn.load_state_dict(bn.state_dict())
    x = torch.randn(2, 3, 4, 5, 6)
    ref = act(bn(x.clone()))
    out = abn(x.clone())
    assert (out - ref).abs().max() < 1e-4
    torch.testing.assert_close(abn.running_var, bn.running_var)


@pytest.mark.parametrize("gamma", [0.0, 1e-9, -1e-9])
def test_zero_gamma_gives_finite_correct_gradients(gamma):
    """gamma = 0 used to give NaN gradients (backward divided by gamma)."""
    torch.manual_seed(0)
    eps = 1e-5
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    w = torch.full((3,), gamma, dtype=torch.float64, requires_grad=True)
    b = torch.tensor([0.5, -0.5, 0.0], dtype=torch.float64, requires_grad=True)
    rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    x1 = x.clone().requires_grad_()
    out = _apply(x1, w, b, rm, rv, True, eps=eps, slope=0.1)
    g = torch.randn_like(out)
    out.backward(g)
    for t in (x1.grad, w.grad, b.grad):
        assert torch.isfinite(t).all()
    # reference: BN with the scale as a leaf; d|gamma|/dgamma is taken as +1 at 0 (the paper's)
    x2 = x.clone().requires_grad_()
    scale = (w.detach().abs() + eps).requires_grad_()
    b2 = b.detach().clone().requires_grad_()
    F.leaky_relu(F.batch_norm(x2, rm.clone(), rv.clone(), scale, b2, True, 0.1, eps), 0.1).backward(g)
    sign = torch.where(w.detach() < 0, -1.0, 1.0).double()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(w.grad, scale.grad * sign)
    torch.testing.assert_close(b.grad, b2.grad)


def test_slope_zero_in_the_function_is_a_clear_error():
    x = torch.randn(2, 2, 3, requires_grad=True)
    w, b = torch.ones(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    for slope in (0.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"slope.*finite number"):
            InPlaceABNFunction.apply(x * 1, w, b, torch.zeros(2), torch.ones(2), True, 0.1,
                                     1e-5, slope)
    with pytest.raises(ValueError, match=r"eps.* > 0"):
        InPlaceABNFunction.apply(x * 1, w, b, torch.zeros(2), torch.ones(2), True, 0.1, 0.0, 0.1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_precision_accumulates_in_fp32(dtype):
    """An fp16/bf16 input (what a conv under autocast hands over) with more values per channel
    than fp16 can count (65,504), a variance above fp16's range, and dz = 1 everywhere:
    statistics, running stats and parameter gradients must come out as in fp64."""
    torch.manual_seed(0)
    count = 2 * 80_000  # values per channel: seed 000's full size has 2,496,000
    x64 = torch.randn(2, 2, 80_000, dtype=torch.float64) * torch.tensor([300.0, 1.0]).view(1, 2, 1)
    abn = InPlaceABN(2)
    abn64 = InPlaceABN(2).double()
    xh = x64.to(dtype).requires_grad_()
    out = abn(xh * 1)
    assert out.dtype == dtype
    out.backward(torch.ones_like(out))
    x2 = x64.to(dtype).double().requires_grad_()  # the same (rounded) values, in fp64
    out64 = abn64(x2 * 1)
    out64.backward(torch.ones_like(out64))
    # running statistics: finite (fp16 var * count overflowed to inf) and as in fp64
    assert abn.running_var.dtype == torch.float32
    torch.testing.assert_close(abn.running_var.double(), abn64.running_var, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(abn.running_mean.double(), abn64.running_mean, rtol=1e-5, atol=1e-6)
    # parameter gradients: sums of 160,000 values (dbias about 81,000 > 65,504)
    assert abn.bias.grad.dtype == torch.float32
    torch.testing.assert_close(abn.bias.grad.double(), abn64.bias.grad, rtol=2e-3, atol=1.0)
    assert abn64.bias.grad[0] > 65_504 and torch.isfinite(abn.weight.grad).all()
    torch.testing.assert_close(abn.weight.grad.double(), abn64.weight.grad, rtol=2e-2, atol=5.0)
    # the output itself: fp16/bf16 rounding of the fp64 result
    tol = 1e-2 if dtype == torch.float16 else 4e-2
    torch.testing.assert_close(out.double(), out64.detach(), rtol=tol, atol=tol)
    assert count > 65_504


def test_channel_stats_fp32_in_chunks():
    torch.manual_seed(0)
    x = torch.randn(2, 19, 30).half() * 400
    var, mean = channel_stats(x)
    ref_var, ref_mean = torch.var_mean(x.double(), dim=[0, 2], correction=0)
    assert var.dtype == torch.float32 and var.shape == (19,)
    torch.testing.assert_close(var.double(), ref_var, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-5, atol=1e-3)


def test_unet_with_inplace_abn_trains_and_saves_memory():
    x = torch.randn(2, 1, 8, 16, 16)
    y = torch.randint(0, 5, (2, 8, 16, 16))
    saved = {}
    for name, norm_act in (("bn+leaky", bn_leaky_relu), ("abn", inplace_abn)):
        torch.manual_seed(0)
        net = UNet3D(levels=3, channels=4, norm_act=norm_act)
        with SavedTensorMeter(net.parameters()) as m:
            loss = nn.functional.cross_entropy(net(x), y)
        saved[name] = m.current
        loss.backward()
        assert all(p.grad is not None for p in net.parameters())
    assert saved["abn"] < 0.75 * saved["bn+leaky"]


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="ReLU .slope 0. is not invertible"):
        InPlaceABN(4, slope=0.0)
    with pytest.raises(ValueError, match=r"eps.* > 0"):
        InPlaceABN(4, eps=0)
    with pytest.raises(ValueError, match="momentum"):
        InPlaceABN(4, momentum=None)
    with pytest.raises(ValueError, match="momentum must be a number in"):
        InPlaceABN(4, momentum=1.5)
    abn = InPlaceABN(3)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        abn(torch.randn(1, 3, 1, 1, 1))
    abn.eval()
    assert abn(torch.randn(1, 3, 1, 1, 1)).shape == (1, 3, 1, 1, 1)
    with pytest.raises(ValueError, match="3 channels"):
        abn(torch.randn(1, 4, 2, 2, 2))


# -- in-place LeakyReLU as the baseline, the fp16 hazard of per-channel sums (notebook 06) -------
def test_inplace_leaky_relu_stores_two_tensors_per_unit_like_inplace_relu():
    """Notebook 06's text rests on this: in-place LeakyReLU, In-Place ABN's baseline, stores what in-place ReLU stores."""
    from course_utils.inplace_abn import bn_leaky_relu, bn_leaky_relu_inplace, stored_per_unit
    from course_utils.unet import bn_relu_inplace

    inplace = stored_per_unit(bn_leaky_relu_inplace)
    assert inplace == stored_per_unit(bn_relu_inplace) == {"BN outputs": 1.0, "conv outputs": 1.0}
    assert round(sum(stored_per_unit(bn_leaky_relu).values())) == 3  # out of place: saves its input
    act = bn_leaky_relu_inplace(4)[1]
    assert isinstance(act, torch.nn.LeakyReLU) and act.inplace


def test_channel_sums_held_in_fp16_overflow_and_fp32_does_not():
    """Notebook 06's text rests on this: the fp16 hazard of per-channel sums, and fp32 accumulation's fix."""
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


def test_compare_with_reference_agrees_and_sees_the_scale_eps():
    """Notebook 06, section 3, rests on this: In-Place ABN equals F.batch_norm (scale |gamma| +
    eps) + F.leaky_relu to 1e-5 in output, every gradient and the running variance, and differs
    from plain BatchNorm3d + LeakyReLU by the eps on the scale (visible, below 1e-4)."""
    table = compare_with_reference(slope=0.02, eps=1e-3, momentum=0.3).set_index("compared")["max abs difference"]
    assert list(table.index[:5]) == ["output", "d input", "d gamma", "d beta", "running var"]
    assert table.iloc[:5].max() < 1e-5
    assert 0 < table.iloc[5] < 1e-4
