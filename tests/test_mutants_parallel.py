"""course_utils.parallel: the checks that kill the mutants (tools/mutants.py) the other tests let
through, all in one process -- a peer that lost its connection is a consequence, not the cause;
the split of the U-Net into stages; pipeline_layouts' 1F1B arithmetic; relative_error."""

import pytest
import torch

from course_utils import UNet3D
from course_utils.parallel.launcher import _diagnose, _RunEnd
from course_utils.parallel import (
    LaunchError, pipeline_layouts, relative_error, stage_parameters,
)


def test_a_rank_that_lost_its_peer_is_not_blamed_even_if_it_ended_first(tmp_path):
    """Rank 0's collective fails with gloo's 'Connection closed by peer' (and rank 0 ends
    first) because rank 1 raised: rank 1 is the cause."""
    records = {
        0: {"ok": False, "error": "Traceback (most recent call last):\nRuntimeError: "
                                  "[gloo/transport/tcp/pair.cc:534] Connection closed by peer"},
        1: {"ok": False, "error": "Traceback (most recent call last):\nValueError: a bad shape"},
    }
    err = _diagnose(_RunEnd("w", str(tmp_path), records, codes={0: 1, 1: 1}, ended={0: 1.0, 1: 2.0},
                            stopped=set(), stacks={}, timed_out=False, timeout_s=180, collective_timeout_s=60))
    assert isinstance(err, LaunchError) and err.rank == 1
    assert err.cause == "ValueError: a bad shape"
    assert err.ranks[0] == "failed as a consequence (a peer closed its connection)"


def test_the_stages_split_encoder_from_decoder():
    net = UNet3D(levels=3, channels=4)

    def n(*mods):
        return sum(p.numel() for m in mods for p in m.parameters())

    assert stage_parameters(net) == {0: n(net.inc, net.downs), 1: n(net.ups, net.outc)}


def test_pipeline_layouts_1f1b_keeps_s_minus_stage_micro_batches():
    """Batch 4 in micro-batches of one sample over 2 stages: under 1F1B stage 1 holds 2 of the 4
    micro-batches GPipe holds, stage 2 one; unsplit (pp=1) nothing changes."""
    whole, first, second = pipeline_layouts(lambda: UNet3D(3, 4), (8, 8, 8), 4, [(1, 1), (1, 2)],
                                            dtype=torch.float32)
    assert whole["activations (1F1B)"] == whole["activations (GPipe)"]
    assert first["activations (1F1B)"] == pytest.approx(first["activations (GPipe)"] * 2 / 4)
    assert second["activations (1F1B)"] == pytest.approx(second["activations (GPipe)"] / 4)
    assert first["params + grads + Adam"] + second["params + grads + Adam"] == whole["params + grads + Adam"]
    assert first["activations (GPipe)"] + second["activations (GPipe)"] == whole["activations (GPipe)"]


def test_relative_error_is_relative_to_the_largest_reference_value():
    ref = [torch.tensor([1.0, -4.0]), torch.tensor([0.5])]
    got = [torch.tensor([1.0, -2.0]), torch.tensor([0.5])]
    assert relative_error(got, ref) == 0.5  # largest difference 2, largest reference value 4
    assert relative_error([1000 * t for t in got], [1000 * t for t in ref]) == 0.5
