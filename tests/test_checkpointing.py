"""Checkpointing: same gradients, BN statistics updated once, the pitfalls reproduced."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from course_utils import UNet3D, predict_step
from course_utils.checkpointing import (
    DenseBlock, SegmentedStack, deep_stack, frozen_bn_stats, save_convolutions,
)

VARIANTS = {
    "none": {},
    "full": dict(checkpoint_levels=True),
    "selective": dict(checkpoint_levels=True, checkpoint_policy=save_convolutions),
}


def _step(kw, state):
    net = UNet3D(levels=3, channels=4, **kw)
    net.load_state_dict(state)
    torch.manual_seed(1)
    x, y = torch.randn(2, 1, 8, 16, 16), torch.randint(0, 5, (2, 8, 16, 16))
    nn.functional.cross_entropy(net(x), y).backward()
    return net


@pytest.fixture(scope="module")
def nets():
    torch.manual_seed(0)
    state = UNet3D(levels=3, channels=4).state_dict()
    out = {k: _step(kw, state) for k, kw in VARIANTS.items()}
    out["full, no BN fix"] = _step(dict(checkpoint_levels=True, checkpoint_fix_bn=False), state)
    return out


@pytest.mark.parametrize("variant", ["full", "selective", "full, no BN fix"])
def test_gradients_equal_the_baseline(nets, variant):
    for (name, a), b in zip(nets["none"].named_parameters(), nets[variant].parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("variant", ["full", "selective"])
def test_bn_running_stats_equal_after_the_fix(nets, variant):
    for (name, a), b in zip(nets["none"].named_buffers(), nets[variant].buffers()):
        torch.testing.assert_close(b, a, msg=name)


def test_bn_stats_updated_twice_without_the_fix(nets):
    bn = nets["full, no BN fix"].inc.double_conv[1]
    assert int(bn.num_batches_tracked) == 2
    assert not torch.allclose(bn.running_mean, nets["none"].inc.double_conv[1].running_mean)


def test_frozen_bn_stats_restores_everything():
    bn = nn.BatchNorm3d(3)
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    with frozen_bn_stats(bn):
        bn(torch.randn(2, 3, 4, 4, 4))
    assert bn.momentum == 0.1
    for k, v in bn.state_dict().items():
        torch.testing.assert_close(v, before[k])


def test_reentrant_checkpoint_loses_gradients_without_requires_grad_input():
    block = nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), nn.ReLU())
    x = torch.randn(1, 1, 4, 4, 4)  # an input that does not require grad
    with pytest.warns(UserWarning, match="requires_grad"):
        out = checkpoint(block, x, use_reentrant=True)
    assert not out.requires_grad  # no graph: the block's weights would get no gradient
    out = checkpoint(block, x, use_reentrant=False)
    out.sum().backward()
    assert block[0].weight.grad is not None


def test_checkpointing_lowers_the_predicted_peak():
    peaks = {k: predict_step(lambda kw=kw: UNet3D(4, 16, **kw), (2, 1, 32, 64, 64),
                             n_classes=5).peak for k, kw in VARIANTS.items()}
    assert peaks["full"] < peaks["selective"] < peaks["none"]


def test_sqrt_n_segments_beat_none_and_one():
    peak = {s: predict_step(lambda s=s: SegmentedStack(deep_stack(16, 8), s), (1, 1, 16, 32, 32),
                            n_classes=5).peak for s in (0, 4, 16)}
    assert peak[4] < peak[0] and peak[4] <= peak[16]


def test_efficient_dense_block_same_gradients_less_memory():
    torch.manual_seed(0)
    naive, eff = DenseBlock(3, 8, 4), DenseBlock(3, 8, 4, efficient=True)
    eff.load_state_dict(naive.state_dict())
    x = torch.randn(2, 1, 16, 16)
    for net in (naive, eff):
        net(x).sum().backward()
    for a, b in zip(naive.parameters(), eff.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4)
    p = {e: predict_step(lambda e=e: DenseBlock(6, 32, 16, efficient=e), (4, 1, 128, 128),
                         n_classes=5).peak for e in (False, True)}
    assert p[True] < 0.85 * p[False]
