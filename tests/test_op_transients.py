"""``memory.OpTransients``: every op's memory -- what it keeps beyond its outputs (cuBLAS's
workspace) and what it needs only while it runs (a cuDNN workspace) -- checked on a CPU, where a
``LiveBytes`` meter stands in for the CUDA allocator: exact for outputs, so every transient is 0,
and a workspace planted in the readings is found at its op."""

import pytest
import torch
from torch import nn

from course_utils.memory import (BLOCK, LiveBytes, LiveBytesStats, OpTransients, largest_that_fits,
                                 op_memory_step, predict_step)
from course_utils.unet import UNet3D

BUILD = lambda: UNet3D(levels=3, channels=4)  # noqa: E731
SHAPE = (2, 1, 8, 16, 16)


def test_the_cpu_step_op_by_op_is_the_predicted_step():
    """The steady-state step recorded op by op on CPU tensors reaches exactly the peak the fake-
    tensor prediction gives for a CUDA GPU (fp32: the same ops, the same 512-byte blocks), every op
    keeps only its outputs, and the backward's ops are seen as such."""
    ops, peak = op_memory_step(BUILD, SHAPE, device="cpu", n_classes=5)
    assert peak == ops.peak == predict_step(BUILD, SHAPE, n_classes=5).peak
    assert all(r.transient == 0 and r.kept_extra == 0 for r in ops.rows)
    backward = {r.op for r in ops.rows if r.phase == "backward"}
    assert {"convolution_backward", "native_batch_norm_backward"} <= backward
    assert "ConvolutionBackward0" in {r.node for r in ops.rows if r.op == "convolution_backward"}
    assert {r.op for r in ops.rows if r.phase == "forward"} >= {"convolution", "_foreach_add_"}  # Adam's too
    assert all(r.new_outputs % BLOCK == 0 for r in ops.rows)


class Planted(LiveBytesStats):
    """The meter's readings with a workspace: ``transient`` bytes taken and given back inside every
    ``convolution_backward``, ``kept`` bytes kept after the first ``mm``."""

    def __init__(self, meter, transient=3 << 20, kept=1 << 20):
        super().__init__(meter)
        self.transient, self.kept, self.op = transient, kept, None
        self.extra = 0

    def peak(self):
        return super().peak() + self.extra + (self.transient if self.op == "convolution_backward" else 0)

    def allocated(self):
        return super().allocated() + self.extra


class KeepsWorkspace:
    """An op that, the first time it runs, leaves ``stats.kept`` bytes allocated (cuBLAS's way)."""

    def __init__(self, func, stats):
        self.func, self.stats, self.overloadpacket = func, stats, func.overloadpacket

    def __call__(self, *args, **kwargs):
        self.stats.extra = self.stats.kept
        return self.func(*args, **kwargs)


class Tagging(OpTransients):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.stats.op = func.overloadpacket.__name__
        if self.stats.op == "mm" and not self.stats.extra:
            func = KeepsWorkspace(func, self.stats)
        return super().__torch_dispatch__(func, types, args, kwargs)


def test_a_workspace_shows_as_the_transient_of_its_op_and_a_kept_one_as_kept_beyond_outputs():
    model = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4**3, 3))
    x = torch.randn(2, 1, 4, 4, 4)
    live = LiveBytes(round_to=BLOCK)
    with live:
        live.track(model, x)
        with Tagging(Planted(live)) as ops:
            model(x).sum().backward()
    big = ops.largest("transient")
    assert big and {r.op for r in big} == {"convolution_backward"} and big[0].transient == 3 << 20
    assert big[0].phase == "backward"
    by = ops.by_op("transient")
    assert by == [{"op": "convolution_backward", "phase": "backward", "calls": 1, "max": 3 << 20, "total": 3 << 20}]
    kept = ops.largest("kept_extra")
    assert [(r.op, r.kept_extra) for r in kept] == [("mm", 1 << 20)]
    assert ops.peak >= (3 << 20)  # the step's own peak sees the workspace
    with pytest.raises(ValueError, match="transient"):
        ops.by_op("outputs")


def test_op_memory_step_on_cuda_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("checks the error without a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        op_memory_step(BUILD, SHAPE, device="cuda", n_classes=5)


@pytest.mark.gpu
def test_op_by_op_peak_is_the_plain_step_peak_on_cuda():
    """On a GPU: synchronising and reading the allocator around every op changes no allocation,
    so the op-by-op step's peak is the plain measured step's."""
    from course_utils.memory import measure_step

    build, shape = lambda: UNet3D(levels=4, channels=16), (2, 1, 32, 64, 64)
    plain = measure_step(build, shape, n_classes=5)
    torch.cuda.empty_cache()
    ops, measured = op_memory_step(build, shape, n_classes=5)
    assert measured.peak_allocated == ops.peak
    assert abs(ops.peak - plain.peak_allocated) <= 2 << 20, (ops.peak, plain.peak_allocated)
    assert ops.rows and any(r.phase == "backward" for r in ops.rows)


@pytest.mark.parametrize("true", [0, 1, 5, 17, 63, 64, 80])
def test_a_right_hint_costs_two_tries_and_a_wrong_one_still_finds_the_answer(true):
    for hint in (None, 1, 4, 5, 6, 17, 40, 63):
        tried = []

        def fits(n):
            tried.append(n)
            return n <= true

        assert largest_that_fits(fits, 1, 64, "return", hint=hint) == min(true, 64)
        assert len(tried) == len(set(tried))  # no batch is tried twice
        if hint == true:
            assert len(tried) == 2
    with pytest.raises(TypeError, match="hint"):
        largest_that_fits(lambda n: True, 1, 64, "return", hint=2.5)
