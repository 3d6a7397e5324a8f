"""LiveBytes (memory_allocated's CPU stand-in) and the caching-allocator model (course_utils.allocator):
its rules one at a time (best fit, splitting, merging, the retry at a cap, the 1 MiB and 10 MiB
boundaries of c10/cuda/CUDACachingAllocator.cpp) and the foreach Adam of a traced step."""

import gc

import pytest
import torch
from torch import nn

from course_utils import UNet3D, predict_step
from course_utils.allocator import SimulatedAllocator, simulate, trace_step
from course_utils.memory import MiB, LiveBytes


def test_live_bytes_counts_what_memory_allocated_would():
    net = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU())
    x = torch.randn(1, 1, 8, 8, 8)
    with LiveBytes() as live:
        live.track(net, x)
        resident = live.current
        assert resident == sum(p.nbytes for p in net.parameters()) + x.nbytes
        y = net(x)
        # the conv output dies once ReLU has read it; ReLU's output is kept (and returned)
        assert live.current == resident + y.nbytes
        assert live.peak == resident + 2 * y.nbytes
        y.sum().backward()
        del y
        gc.collect()
        assert live.current == resident + sum(p.grad.nbytes for p in net.parameters())
    with LiveBytes(round_to=512) as live:
        t = torch.ones(3)  # 12 bytes occupy a 512-byte block
        assert live.current == 512 and t.nbytes == 12


def test_segment_sizes_and_rounding():
    a = SimulatedAllocator()
    a.malloc(100, 1)  # small pool: 2 MiB segment, 512-B block
    assert (a.allocated, a.reserved) == (512, 2 * MiB)
    a.malloc(11 * MiB + 1, 2)  # >= 10 MiB: its own segment, rounded up to 2 MiB
    assert a.reserved == 14 * MiB
    a.malloc(3 * MiB, 3)  # large, < 10 MiB, and no free block fits: a 20 MiB segment
    assert a.reserved == 34 * MiB and a.n_mallocs == 3
    a.malloc(11 * MiB, 4)  # best fit: the 17 MiB left in the 20 MiB segment, no new segment
    assert a.n_mallocs == 3


def test_the_caching_demo_sequence():
    """The sequence of allocator.caching_demo: a freed block stays reserved, is reused for a
    smaller tensor, and only empty_cache gives it back."""
    a = SimulatedAllocator()
    a.malloc(256 * MiB, 1)
    a.malloc(256 * MiB, 2)
    a.free(1)
    assert (a.allocated, a.reserved) == (256 * MiB, 512 * MiB)
    a.malloc(128 * MiB, 3)  # best fit: a's cached 256 MiB segment, split
    assert a.reserved == 512 * MiB and a.n_mallocs == 2
    a.free(2)
    a.free(3)
    assert (a.allocated, a.reserved) == (0, 512 * MiB)
    a.empty_cache()
    assert a.reserved == 0


def test_fragmentation_runs_out_below_the_limit():
    """Holes between live blocks cannot serve a larger request: an OOM with less allocated
    than the limit (what expandable segments address)."""
    a = SimulatedAllocator(limit=40 * MiB)
    for k in range(8):
        a.malloc(5 * MiB, k)  # two 20 MiB segments, four 5 MiB blocks each
    for k in range(0, 8, 2):
        a.free(k)  # 20 MiB free, in 5 MiB holes between live blocks
    assert a.reserved == 40 * MiB and a.allocated == 20 * MiB
    with pytest.raises(MemoryError, match="simulated CUDA out of memory"):
        a.malloc(8 * MiB, 99)  # no hole is large enough, and no segment is wholly free


def test_a_traced_step_replays_to_the_predicted_peak():
    build = lambda: UNet3D(levels=3, channels=8)
    resident, events, starts = trace_step(build, (2, 1, 16, 32, 32))
    sim = simulate(events, resident=resident)
    steady = predict_step(build, (2, 1, 16, 32, 32), n_classes=5)  # 512-B blocks, CUDA target
    second = max(sim.allocated[starts[1]:])
    assert second == pytest.approx(steady.peak, rel=0.005)
    assert sim.peak_reserved >= sim.peak_allocated
    assert sim.reserved[-1] > sim.allocated[-1]  # the cache stays after the step


@pytest.mark.gpu
def test_the_model_is_close_to_the_real_allocator():
    """Two real training steps against the same steps replayed through the model: peak
    reserved within 15 % (cuDNN workspaces and streams are not modelled)."""
    from course_utils.memory import measure_step

    build = lambda: UNet3D(levels=4, channels=16)
    shape = (2, 1, 32, 64, 64)
    resident, events, starts = trace_step(build, shape)
    sim = simulate(events, resident=resident)
    real = measure_step(build, shape, n_classes=5)
    assert sim.peak_reserved == pytest.approx(real.peak_reserved, rel=0.15)


def test_live_at_peak_replays_a_snapshot_trace():
    """The events of torch.cuda.memory._snapshot()["device_traces"][0]: the peak is the largest
    running total of alloc minus free_requested, and the blocks are those live at that moment."""
    from course_utils.allocator import live_at_peak

    def ev(action, addr, size, frame="f"):
        return {"action": action, "addr": addr, "size": size,
                "frames": [{"name": frame, "filename": "/x/train.py", "line": 66}]}

    trace = [ev("segment_alloc", 0, 1 << 30), ev("alloc", 1, 100, "activation"), ev("alloc", 2, 50, "workspace"),
             ev("free_requested", 2, 50), ev("free_completed", 2, 50), ev("alloc", 3, 70, "grad"),
             ev("alloc", 4, 10, "late"), ev("free_requested", 1, 100), ev("alloc", 5, 60, "after")]
    peak, blocks = live_at_peak(trace)
    assert peak == 180  # 100 + 70 + 10 (the workspace had gone; 100 + 50 = 150 was lower)
    assert [b.size for b in blocks] == [100, 70, 10]
    assert blocks[0].frames == ["activation (train.py:66)"] and "activation" in blocks[0].where()
    assert live_at_peak([]) == (0, [])
    freed_twice = [ev("alloc", 1, 5), ev("free_requested", 1, 5), ev("free_requested", 1, 5)]
    assert live_at_peak(freed_twice)[0] == 5


def test_a_cudnn_workspace_is_named_by_its_native_frame():
    from course_utils.allocator import PeakBlock

    b = PeakBlock(1 << 20, ["c10::cuda::CUDACachingAllocator::malloc (??:0)",
                            "at::native::cudnn_convolution_backward_weight (Conv_v8.cpp:0)",
                            "backward (__init__.py:353)", "training_step (train.py:66)"])
    assert b.where().startswith("at::native::cudnn_convolution_backward_weight")
    assert "train.py:66" in b.where()


# -- the model's rules one at a time: best fit, splitting, merging, the retry at a cap, the pool
# boundaries; the traced step's foreach Adam ------------------------------------------------------
def test_best_fit_takes_the_smallest_free_block_that_fits():
    """Without this test the mutant ``allocator-first-fit`` of tools/mutants.py (the first free block that fits, not
    the best fit) survived the other tests."""
    a = SimulatedAllocator()
    a.malloc(16 * MiB, 1)  # segment 0: 16 MiB
    a.malloc(12 * MiB, 2)  # segment 1: 12 MiB
    a.free(1)
    a.free(2)
    a.malloc(11 * MiB, 3)
    assert a.where[3].segment == 1  # the 12 MiB block, not the first one found
    a.malloc(15 * MiB, 4)  # so the 16 MiB block is still whole
    assert a.where[4].segment == 0 and a.n_mallocs == 2 and a.reserved == 28 * MiB


def test_a_large_block_is_split_only_if_more_than_1_mib_remains():
    """Without this test the mutant ``allocator-large-split-threshold`` of tools/mutants.py (large blocks split
    whenever 512 B remain) survived the other tests."""
    a = SimulatedAllocator()
    a.malloc(11 * MiB + 1, 1)  # a 12 MiB segment; 1 MiB - 512 B would remain: not split
    assert a.allocated == 12 * MiB and len(a.snapshot()[0]) == 1
    a.free(1)
    a.malloc(10 * MiB, 2)  # 2 MiB would remain: split
    assert a.allocated == 10 * MiB and a.snapshot()[0] == [(0, 10 * MiB, True), (10 * MiB, 2 * MiB, False)]


def test_a_small_block_is_split_down_to_512_bytes():
    """Without this test the mutant ``allocator-small-never-split`` of tools/mutants.py (small blocks never split)
    survived the other tests."""
    a = SimulatedAllocator()
    a.malloc(1000, 1)  # a 1024-byte block of a 2 MiB segment
    a.malloc(1 * MiB, 2)
    a.malloc(1 * MiB - 1024, 3)  # exactly what is left: the segment is full, no second one
    assert a.allocated == a.reserved == 2 * MiB and a.n_mallocs == 1


@pytest.mark.parametrize("order", [(1, 2), (2, 1)])
def test_a_freed_block_merges_with_either_free_neighbour(order):
    """Without this test the mutants ``allocator-no-merge-next`` and ``allocator-no-merge-previous`` of
    tools/mutants.py (no merge with the block after, or before) survived the other tests."""
    a = SimulatedAllocator()
    for k in (1, 2, 3):
        a.malloc(5 * MiB, k)  # one 20 MiB segment: 5 + 5 + 5 MiB, 5 MiB free at the end
    for k in order:
        a.free(k)
    assert a.snapshot()[0][0] == (0, 10 * MiB, False)  # blocks 1 and 2 are one free block
    a.malloc(9 * MiB, 4)  # fits in it: no new segment
    assert a.n_mallocs == 1
    a.free(3)
    a.free(4)
    assert a.snapshot() == [[(0, 20 * MiB, False)]]


def test_at_the_cap_cached_segments_are_freed_before_an_oom():
    """Without this test the mutant ``allocator-no-retry-after-empty-cache`` of tools/mutants.py (an OOM at the cap
    without returning the cached segments first) survived the other tests."""
    a = SimulatedAllocator(limit=40 * MiB)
    a.malloc(12 * MiB, 1)
    a.free(1)  # a cached, wholly free 12 MiB segment
    a.malloc(30 * MiB, 2)  # 12 + 30 > 40: the cache is emptied, then it fits
    assert (a.allocated, a.reserved) == (30 * MiB, 30 * MiB)


def test_the_pool_and_segment_boundaries():
    """Without this test the mutants ``allocator-1mib-boundary`` and ``allocator-10mib-boundary`` of tools/mutants.py
    (exactly 1 MiB in the large pool, exactly 10 MiB in a shared segment) survived the other tests."""
    a = SimulatedAllocator()
    a.malloc(1 * MiB, 1)  # <= 1 MiB: the small pool, a 2 MiB segment, split
    a.malloc(1 * MiB, 2)
    assert (a.allocated, a.reserved, a.n_mallocs) == (2 * MiB, 2 * MiB, 1)
    b = SimulatedAllocator()
    b.malloc(10 * MiB, 1)  # >= 10 MiB: a segment of its own (CUDA: size < kMinLargeAlloc shares)
    assert b.reserved == 10 * MiB
    b.malloc(10 * MiB - 512, 2)  # < 10 MiB: a shared 20 MiB segment
    assert b.reserved == 30 * MiB


def _param_heavy():
    return nn.Sequential(nn.Conv3d(1, 64, 1), nn.Conv3d(64, 256, 1), nn.Conv3d(256, 5, 1))


def test_a_traced_step_replays_foreach_adam_like_the_prediction():
    """A net whose peak is in the optimizer step: the replayed second step peaks where the
    prediction (CUDA's foreach Adam) does, not where single-tensor Adam would.
    Without this test the mutant ``trace-step-single-tensor-adam`` of tools/mutants.py (trace_step replays
    single-tensor Adam) survived the other tests."""
    shape = (2, 1, 2, 2, 2)
    resident, events, starts = trace_step(_param_heavy, shape)
    sim = simulate(events, resident=resident)
    steady = predict_step(_param_heavy, shape, n_classes=5)
    assert max(sim.allocated[starts[1]:]) == steady.peak
