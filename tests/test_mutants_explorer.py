"""course_utils.explorer: the checks that kill the mutants (tools/mutants.py) the other tests let
through -- an uneven global batch over ranks, and the in-place ReLU and lean Up switches."""

from dataclasses import replace

from torch import nn

from course_utils.explorer import Config, build, estimate

SMALL = Config(levels=3, base_channels=8, volume=(16, 32, 32), batch=2, precision="fp32", seed000=False)


def test_an_uneven_batch_is_sized_for_the_fullest_rank():
    """7 samples on 2 ranks: one rank gets 4, and the card must hold that rank's step."""
    est = estimate(replace(SMALL, batch=7, dp_ranks=2))
    assert est.local_batch == 4
    # the same step; data parallelism adds only DDP's gradient buckets
    parts = {k: v for k, v in est.parts.items() if k != "DDP buckets"}
    assert set(est.parts) - set(parts) == {"DDP buckets"}
    assert parts == estimate(replace(SMALL, batch=4)).parts


def test_the_activation_switches_build_what_they_say():
    def relus(cfg):
        return [m.inplace for m in build(cfg).modules() if isinstance(m, nn.ReLU)]

    assert relus(SMALL) and not any(relus(SMALL))
    assert all(relus(replace(SMALL, inplace_relu=True)))
    assert not any(up.lean for up in build(SMALL).ups)
    assert all(up.lean for up in build(replace(SMALL, lean_up=True, precision="autocast_fp16")).ups)
