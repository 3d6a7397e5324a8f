"""course_utils.amp_rules: the checks that kill the mutants (tools/mutants.py) the other tests
let through -- the weight-cast cache (one cast per region, none kept after it), bfloat16 under
CUDA's rules, and a torch whose CUDA autocast registers an op the lists do not know."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from course_utils import amp_rules
from course_utils.amp_rules import cuda_autocast_rules

H = torch.float16


def _weight_cast(out: torch.Tensor, weight: torch.Tensor):
    """The graph node that casts ``weight`` (the node whose input is the weight's AccumulateGrad)."""
    stack, seen = [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for nxt, _ in node.next_functions:
            if type(nxt).__name__ == "AccumulateGrad" and nxt.variable is weight:
                return node
            stack.append(nxt)
    return None


def test_a_weight_is_cast_once_per_region():
    """As CUDA autocast does: both uses of the weight in one region share one fp16 copy (one
    cast node, one copy in memory)."""
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with cuda_autocast_rules(), torch.autocast("cpu", dtype=H):
        a, b = lin(x), lin(x)
    node = _weight_cast(a, lin.weight)
    assert type(node).__name__ == "ToCopyBackward0"
    assert _weight_cast(b, lin.weight) is node


def test_no_cast_outlives_its_region():
    """The cache is emptied when the autocast region ends: after opt.step() changes a weight
    in place, the next region casts the new values (a stale fp16 copy would compute with the
    old weight)."""
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with cuda_autocast_rules():
        with torch.autocast("cpu", dtype=H):
            first = lin(x)
        with torch.no_grad():
            lin.weight.add_(1.0)
        with torch.autocast("cpu", dtype=H):
            second = lin(x)
    expected = F.linear(x.half(), lin.weight.half(), lin.bias.half())
    torch.testing.assert_close(second, expected)
    assert not torch.allclose(first, expected)


def test_bfloat16_autocast_runs_convolutions_in_bfloat16():
    conv = nn.Conv3d(2, 2, 3)
    with cuda_autocast_rules(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert conv(torch.randn(1, 2, 4, 4, 4)).dtype == torch.bfloat16


def test_an_op_of_unknown_policy_is_refused(monkeypatch):
    """A torch upgrade that registers a CUDA autocast op the lists do not know must fail loudly,
    not predict with wrong dtypes."""
    monkeypatch.setattr(amp_rules, "unknown_cuda_ops", lambda: frozenset({"new_op"}))
    with pytest.raises(RuntimeError, match=r"\['new_op'\].*does not know"):
        with cuda_autocast_rules():
            pass
