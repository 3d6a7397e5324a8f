"""course_utils.numerics: the one relative_error (float64) and the BatchNorm arithmetic that the
tiled step, spatial parallelism and CrossReplicaBatchNorm3d share, against nn.BatchNorm itself."""

import pytest
import torch
from torch import nn

from course_utils import parallel, spatial, tiling
from course_utils.checks import ParallelError
from course_utils.numerics import normalise, relative_error, update_running_stats, uses_batch_stats


def test_one_relative_error_everywhere():
    assert tiling.relative_error is relative_error and parallel.relative_error is relative_error
    assert spatial.update_running_stats is update_running_stats and tiling.normalise is normalise


def test_relative_error_is_relative_to_the_largest_reference_value():
    got, ref = [torch.tensor([1.0, 2.0]), torch.tensor([0.0])], [torch.tensor([3.0, 4.0]), torch.tensor([1.0])]
    assert relative_error(got, ref) == 0.5  # largest difference 2, largest reference value 4
    assert relative_error([1000 * t for t in got], [1000 * t for t in ref]) == 0.5


def test_relative_error_is_computed_in_float64():
    # in fp16, 60000 - (-60000) overflows to inf; in float64 it is 120000, twice the reference
    got, ref = [torch.tensor([60000.0], dtype=torch.float16)], [torch.tensor([-60000.0], dtype=torch.float16)]
    assert relative_error(got, ref) == 2.0
    with pytest.raises(ValueError, match="2 tensors vs 1 reference"):
        relative_error(got * 2, ref)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_running_stats_and_output_are_batchnorms(momentum):
    torch.manual_seed(0)
    x = 3 + 2 * torch.randn(4, 3, 5, 6, 7, dtype=torch.float64)
    ref = nn.BatchNorm3d(3, momentum=momentum).double()
    mine = nn.BatchNorm3d(3, momentum=momentum).double()
    with torch.no_grad():
        for bn in (ref, mine):
            bn.weight.copy_(torch.tensor([0.5, 1.0, 2.0]))
            bn.bias.copy_(torch.tensor([-1.0, 0.0, 1.0]))
    dims, count = [0, 2, 3, 4], x.numel() // 3
    for step in range(3):  # momentum=None: a cumulative average, which needs several steps to show
        xs = x + step
        y_ref = ref(xs)
        mean, var = xs.mean(dims), xs.var(dims, unbiased=False)
        assert uses_batch_stats(mine)
        torch.testing.assert_close(normalise(mine, xs, mean, var), y_ref)
        update_running_stats(mine, mean, var, count)
    torch.testing.assert_close(mine.running_mean, ref.running_mean)
    torch.testing.assert_close(mine.running_var, ref.running_var)
    assert mine.num_batches_tracked.item() == ref.num_batches_tracked.item() == 3


def test_eval_mode_uses_and_keeps_the_running_stats():
    bn = nn.BatchNorm3d(2).eval()
    before = bn.running_var.clone()
    assert not uses_batch_stats(bn)
    update_running_stats(bn, torch.zeros(2), torch.full((2,), 5.0), 100)
    assert torch.equal(bn.running_var, before) and bn.num_batches_tracked.item() == 0
    assert uses_batch_stats(nn.BatchNorm3d(2, track_running_stats=False).eval())


# -- relative_error's scale with a negative reference value --------------------------------------
def test_relative_error_scales_by_the_largest_absolute_reference_value():
    """A negative reference value: the scale is the largest absolute value. Written when relative_error lived in
    course_utils.parallel, against the mutant ``relative-error-absolute`` of tools/mutants.py (the absolute
    difference returned); test_relative_error_is_relative_to_the_largest_reference_value kills it too."""
    ref = [torch.tensor([1.0, -4.0]), torch.tensor([0.5])]
    got = [torch.tensor([1.0, -2.0]), torch.tensor([0.5])]
    assert relative_error(got, ref) == 0.5  # largest difference 2, largest reference value 4
    assert relative_error([1000 * t for t in got], [1000 * t for t in ref]) == 0.5


def test_relative_error_of_nothing_or_to_a_zero_reference():
    """No tensors (``max()`` of an empty sequence before) are refused with the fix; an all-zero
    reference (ZeroDivisionError before: a conv bias in front of BatchNorm has a zero gradient) gives
    0 where the tensors agree and inf where they do not."""
    with pytest.raises(ParallelError, match="0 tensors vs 0 reference tensors.*Fix: "):
        relative_error([], [])
    zero = [torch.zeros(3)]
    assert relative_error(zero, zero) == 0.0
    assert relative_error([torch.ones(3)], zero) == float("inf")


def test_running_statistics_of_no_values_are_refused():
    """``count=0`` made the unbiased variance 0 and moved the running variance toward it."""
    bn = nn.BatchNorm1d(2)
    with pytest.raises(ParallelError, match="count=0.*Fix: "):
        update_running_stats(bn, torch.zeros(2), torch.ones(2), 0)
    assert torch.equal(bn.running_var, torch.ones(2)) and bn.num_batches_tracked == 0


def test_combine_moments_gives_the_whole_from_parts_whose_means_differ():
    """Without this test the mutant ``cross-replica-bn-var-within-only`` of tools/mutants.py (the
    between-part term of Chan's formula dropped) survived test_numerics.py: parts with equal
    means hide it, so these parts' means differ by far more than their spread."""
    from course_utils.numerics import combine_moments

    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(n, 3, generator=gen, dtype=torch.float64) + offset
             for n, offset in ((5, 0.0), (7, 10.0), (4, -3.0))]
    counts = torch.tensor([[float(len(p))] for p in parts], dtype=torch.float64)
    means = torch.stack([p.mean(0) for p in parts])
    m2s = torch.stack([((p - p.mean(0)) ** 2).sum(0) for p in parts])
    n, mean, var = combine_moments(counts, means, m2s)
    whole = torch.cat(parts)
    assert n.item() == 16
    torch.testing.assert_close(mean, whole.mean(0))
    torch.testing.assert_close(var, whole.var(0, unbiased=False))
