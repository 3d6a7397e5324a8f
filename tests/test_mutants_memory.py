"""course_utils.memory: the checks that kill the mutants (tools/mutants.py) the other tests let
through -- the optimizer step inside the predicted step, CUDA's foreach Adam, where the peak is,
a weight saved twice, the CPU's own out-of-memory error, the edges of largest_that_fits."""

import gc

import pytest
import torch
from torch import nn

from course_utils import SavedTensorMeter, UNet3D, catch_oom, largest_that_fits, predict_step
from course_utils.memory import LiveBytes


def _param_heavy():
    """Many parameters, almost no activations: the step's peak is in the optimizer step."""
    return nn.Sequential(nn.Conv3d(1, 64, 1), nn.Conv3d(64, 256, 1), nn.Conv3d(256, 5, 1))


SHAPE = (2, 1, 2, 2, 2)


def test_the_first_step_creates_adams_state_in_the_optimizer_step():
    """steady_state=False: Adam's two moments appear in opt.step(), after the backward. For a
    net whose parameters outweigh its activations that is where the peak is, and the peak holds
    parameters, gradients and both moments (a prediction without the step would show no state)."""
    pred = predict_step(_param_heavy, SHAPE, n_classes=5, steady_state=False)
    bd = pred.breakdown
    assert pred.log.peak_location[1] == "optimizer/other"
    assert bd["Gradient"] == bd["Parameter"] > 0
    assert bd["Optstate"] >= 2 * bd["Parameter"]
    assert pred.peak >= 4 * bd["Parameter"]


def test_a_cuda_prediction_uses_foreach_adam_and_a_cpu_one_does_not():
    """CUDA's default Adam is the multi-tensor (foreach) one; its temporaries differ from the
    single-tensor Adam the CPU uses, and here (peak in the step) the peak shows it."""
    def adam(foreach):
        return lambda params: torch.optim.Adam(params, lr=1e-3, foreach=foreach)

    kw = dict(n_classes=5)
    cuda = predict_step(_param_heavy, SHAPE, **kw)
    assert cuda.peak == predict_step(_param_heavy, SHAPE, optimizer=adam(True), **kw).peak
    single = predict_step(_param_heavy, SHAPE, optimizer=adam(False), **kw).peak
    assert single != cuda.peak
    cpu = predict_step(_param_heavy, SHAPE, target="cpu", **kw)
    assert cpu.peak == predict_step(_param_heavy, SHAPE, target="cpu", optimizer=adam(False), **kw).peak


def test_the_peak_is_named_with_its_phase():
    """The tiny U-Net peaks in backward (activations dominate); the parameter-heavy net in the
    optimizer step."""
    unet = predict_step(lambda: UNet3D(levels=3, channels=4), (2, 1, 8, 8, 8), n_classes=5)
    assert unet.log.peak_location[1] == "backward"
    assert predict_step(_param_heavy, SHAPE, n_classes=5).log.peak_location[1] == "optimizer/other"


def test_a_weight_saved_twice_is_one_parameter_storage():
    conv = nn.Conv3d(2, 2, 3, padding=1)
    x = torch.randn(1, 2, 6, 6, 6)
    with SavedTensorMeter(conv.parameters()) as m:
        y = conv(torch.relu(conv(x)))  # the same weight saved by two convolutions
    assert m.n_saved == 5  # x and the weight; ReLU's output; that output again and the weight
    assert m.param_bytes == conv.weight.nbytes
    assert m.current == 2 * x.nbytes  # x and ReLU's output, once each
    del y


def test_views_and_in_place_results_share_one_live_storage():
    with LiveBytes() as live:
        a = torch.ones(1000)
        b, c = a.view(10, 100), a[:5]
        a.add_(1)
        assert live.current == live.peak == a.nbytes
        del a, b, c
        gc.collect()
        assert live.current == 0


def test_the_cpus_out_of_memory_is_caught_too():
    """On a CPU a failed allocation is a RuntimeError "... can't allocate memory ...", not
    torch.OutOfMemoryError: catch_oom explains it all the same."""
    with catch_oom(verbose=False) as r:
        torch.empty(2**62, dtype=torch.uint8)  # 4 EiB: refused at once, nothing is allocated
    assert not r.ok and "Out of memory" in r.explanation


def test_largest_that_fits_is_exact_for_every_small_case():
    """Every answer from 0 to limit, for every limit up to 40, with and without at_limit."""
    for limit in range(1, 41):
        for answer in range(0, limit + 1):
            got = largest_that_fits(lambda n: n <= answer, limit=limit, at_limit="return")
            assert got == answer, (limit, answer, got)
    for start in (1, 3, 5):
        for answer in range(start - 1, 30):
            assert largest_that_fits(lambda n: n <= answer, start=start, limit=64) == answer
    assert largest_that_fits(lambda n: n <= 4999, limit=5000) == 4999
    with pytest.raises(ValueError, match="everything up to limit"):
        largest_that_fits(lambda n: n <= 40, limit=40)
