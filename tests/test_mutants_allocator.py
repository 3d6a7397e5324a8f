"""course_utils.allocator's model of the CUDA caching allocator: the checks that kill the
mutants (tools/mutants.py) the other tests let through -- best fit, when a block is split, merging
with either neighbour, the retry after freeing cached segments at a cap, the 1 MiB and 10 MiB
boundaries of c10/cuda/CUDACachingAllocator.cpp, and the foreach Adam of a traced step."""

import pytest
from torch import nn

from course_utils import predict_step
from course_utils.allocator import SimulatedAllocator, simulate, trace_step
from course_utils.memory import MiB


def test_best_fit_takes_the_smallest_free_block_that_fits():
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
    a = SimulatedAllocator()
    a.malloc(11 * MiB + 1, 1)  # a 12 MiB segment; 1 MiB - 512 B would remain: not split
    assert a.allocated == 12 * MiB and len(a.snapshot()[0]) == 1
    a.free(1)
    a.malloc(10 * MiB, 2)  # 2 MiB would remain: split
    assert a.allocated == 10 * MiB and a.snapshot()[0] == [(0, 10 * MiB, True), (10 * MiB, 2 * MiB, False)]


def test_a_small_block_is_split_down_to_512_bytes():
    a = SimulatedAllocator()
    a.malloc(1000, 1)  # a 1024-byte block of a 2 MiB segment
    a.malloc(1 * MiB, 2)
    a.malloc(1 * MiB - 1024, 3)  # exactly what is left: the segment is full, no second one
    assert a.allocated == a.reserved == 2 * MiB and a.n_mallocs == 1


@pytest.mark.parametrize("order", [(1, 2), (2, 1)])
def test_a_freed_block_merges_with_either_free_neighbour(order):
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
    a = SimulatedAllocator(limit=40 * MiB)
    a.malloc(12 * MiB, 1)
    a.free(1)  # a cached, wholly free 12 MiB segment
    a.malloc(30 * MiB, 2)  # 12 + 30 > 40: the cache is emptied, then it fits
    assert (a.allocated, a.reserved) == (30 * MiB, 30 * MiB)


def test_the_pool_and_segment_boundaries():
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
    prediction (CUDA's foreach Adam) does, not where single-tensor Adam would."""
    shape = (2, 1, 2, 2, 2)
    resident, events, starts = trace_step(_param_heavy, shape)
    sim = simulate(events, resident=resident)
    steady = predict_step(_param_heavy, shape, n_classes=5)
    assert max(sim.allocated[starts[1]:]) == steady.peak
