"""In-Place ABN: gradcheck, equality with BatchNorm3d + LeakyReLU, running stats, errors,
and the memory it saves."""

import pytest
import torch
from torch import nn

from course_utils import SavedTensorMeter, UNet3D
from course_utils.inplace_abn import InPlaceABN, InPlaceABNFunction, bn_leaky_relu, inplace_abn


@pytest.mark.parametrize("training", [True, False])
def test_gradcheck_float64(training):
    torch.manual_seed(0)
    x = torch.randn(3, 2, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(2, dtype=torch.float64) + 0.5).requires_grad_()
    b = torch.randn(2, dtype=torch.float64, requires_grad=True)
    rm, rv = torch.randn(2, dtype=torch.float64), torch.rand(2, dtype=torch.float64) + 0.5

    def f(x, w, b):  # clone: the op writes into its input, gradcheck reuses it
        return InPlaceABNFunction.apply(x.clone(), w, b, rm.clone(), rv.clone(), training,
                                        0.1, 1e-5, 0.1)

    assert torch.autograd.gradcheck(f, (x, w, b))


@pytest.mark.parametrize("training", [True, False])
def test_equal_to_batchnorm_plus_leaky_relu(training):
    torch.manual_seed(0)
    ref_bn, ref_act = bn_leaky_relu(4, slope=0.02)
    abn = InPlaceABN(4, slope=0.02)
    with torch.no_grad():
        for m in (ref_bn, abn):
            m.weight.copy_(torch.tensor([1.5, 0.7, -0.4, 2.0]))
            m.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
            m.running_mean.copy_(torch.tensor([0.1, 0.2, -0.1, 0.0]))
            m.running_var.copy_(torch.tensor([1.2, 0.8, 1.0, 2.0]))
    ref_bn.train(training), abn.train(training)
    x = torch.randn(2, 4, 5, 6, 7)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref = ref_act(ref_bn(x1))
    out = abn(x2.clone())  # clone: a non-leaf, as a conv output would be
    torch.testing.assert_close(out, out_ref)
    g = torch.randn_like(out)
    out_ref.backward(g)
    out.backward(g)
    torch.testing.assert_close(x2.grad, x1.grad)
    torch.testing.assert_close(abn.weight.grad, ref_bn.weight.grad)
    torch.testing.assert_close(abn.bias.grad, ref_bn.bias.grad)
    torch.testing.assert_close(abn.running_mean, ref_bn.running_mean)
    torch.testing.assert_close(abn.running_var, ref_bn.running_var)
    assert abn.num_batches_tracked == ref_bn.num_batches_tracked


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
    abn = InPlaceABN(3)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        abn(torch.randn(1, 3, 1, 1, 1))
    abn.eval()
    assert abn(torch.randn(1, 3, 1, 1, 1)).shape == (1, 3, 1, 1, 1)
    with pytest.raises(ValueError, match="3 channels"):
        abn(torch.randn(1, 4, 2, 2, 2))
