"""Truth pass 3, notebooks 08 and 09: FSDP2's backward prefetch and reduce-scatter input in the
working figure (computed and measured), DDP's gradient buckets (measured, counted in the explorer
and in pipeline_layouts), torchrun's ranks printing whole lines, the bubble of unequal stages,
and the like-with-like column of pipeline_layouts."""

import io
import itertools
import random
import sys

import pytest
import torch

from course_utils import UNet3D, seed000_unet
from course_utils.parallel import (
    build_net, ddp_worker, fsdp_backward_moments, fsdp_rank_memory, fsdp_units, fsdp_worker, free_port,
    gpipe_idle, bubble_fraction, launch_many, pipeline_layouts, replay_schedule,
)


@pytest.fixture(scope="module")
def runs():
    jobs = [(fsdp_worker, {"norm": "gn"}), (ddp_worker, {"norm": "gn"}),
            (ddp_worker, {"norm": "gn", "gradient_as_bucket_view": True})]
    return launch_many(jobs, 2)


def _n(module):
    return sum(p.numel() for p in module.parameters())


def test_fsdp_working_figure_includes_the_prefetched_unit_seed000():
    with torch.device("meta"):
        net = seed000_unet("large")
    units = fsdp_units(net)
    m = fsdp_rank_memory(net, units, world=8)
    k = m["working unit"]
    assert units[k] is net.downs[3]                                       # Down(512, 512)
    assert m["prefetched params"] == 4 * _n(net.downs[2])                 # the unit before it, gathered
    assert m["reduce-scatter input"] == 4 * _n(net.ups[0])                # the unit after it, still held
    assert m["working, shards kept"] == pytest.approx(
        m["resting"] + 8 * (_n(net.downs[3]) + _n(net) - sum(_n(u) for u in units)) + 4 * _n(net.downs[2])
        + 4 * _n(net.ups[0]))
    assert m["working"] > m["working, no prefetch"] + 0.9 * m["prefetched params"]
    assert 255 < m["working, shards kept"] / 2**20 < 262 and 240 < m["working"] / 2**20 < 250


def test_fsdp_backward_moments_match_fsdpmemtracker(runs):
    net = build_net({"norm": "gn"})
    computed = fsdp_backward_moments(net, fsdp_units(net), 2)
    for rank in runs[0]:
        measured = rank["backward_moments"]
        for c, m in zip(computed, measured, strict=True):
            total = sum(v for k, v in m.items() if k != "unit")
            assert total == pytest.approx(c["total"], rel=0.01), (c, m)
            assert m["All Gather"] == c["prefetched params"]              # the prefetched unit
            assert m["Reduce Scatter"] == pytest.approx(c["reduce-scatter input"], abs=32)  # padding
        assert any(m["All Gather"] for m in measured)


def test_ddp_buckets_are_a_copy_of_the_gradients_unless_views(runs):
    default, views = runs[1][0], runs[2][0]
    assert not default["gradient_as_bucket_view"]
    assert default["bucket_bytes"] == default["bucket_extra_bytes"] == default["grad_bytes"] > 0
    assert views["bucket_bytes"] == views["grad_bytes"] and views["bucket_extra_bytes"] == 0


def test_explorer_counts_ddp_buckets():
    from dataclasses import replace

    from course_utils import explorer as ex

    cfg = ex.Config(levels=3, base_channels=8, volume=(16, 32, 32), seed000=False, batch=4,
                    precision="fp16_model", budget_gib=80)
    one, two = ex.estimate(cfg), ex.estimate(replace(cfg, dp_ranks=2))
    with torch.device("meta"):
        grads = sum(p.numel() * 2 for p in ex.build(cfg).parameters())
    assert "DDP buckets" not in one.parts
    assert two.parts["DDP buckets"] == grads
    assert two.total == sum(v for k, v in two.parts.items())


def test_torchrun_rank_prints_its_line_in_one_write(monkeypatch):
    from course_utils.parallel import cli

    chunks = []

    class Raw(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            chunks.append(bytes(b).decode())
            return len(b)

    # what PYTHONUNBUFFERED=1 gives a process: every write goes straight through
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(Raw(), write_through=True))
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["--steps", "1", "--backend", "gloo"]) == 0
    lines = [c for c in chunks if "rank" in c]
    assert lines and all(c.endswith("\n") and c.count("\n") == 1 for c in lines), chunks


def test_gpipe_idle_is_the_replay_for_unequal_stages():
    rng = random.Random(0)
    for stages, m in itertools.product((2, 3, 4), (1, 2, 5)):
        f = [rng.uniform(0.5, 3) for _ in range(stages)]
        b = [rng.uniform(0.5, 6) for _ in range(stages)]
        durations = [{**{("F", i): f[s] for i in range(m)}, **{("B", i): b[s] for i in range(m)}} for s in range(stages)]
        assert replay_schedule(durations, "gpipe")["idle"] == pytest.approx(gpipe_idle(f, b, m))
        assert gpipe_idle([1.0] * stages, [2.0] * stages, m) == pytest.approx([bubble_fraction(stages, m)] * stages)
    light, heavy = gpipe_idle([1.0, 3.0], [2.0, 6.0], 1)
    assert heavy == pytest.approx(3 / 12) and heavy < bubble_fraction(2, 1) < light


def test_pipeline_layouts_compare_like_with_like_and_count_buckets():
    from course_utils.memory import predict_step
    from course_utils.parallel import stage_saved_bytes

    def build():
        return UNet3D(3, 4)

    rows = pipeline_layouts(build, (8, 8, 8), 4, [(1, 1), (2, 1), (1, 2)], dtype=torch.float32)
    whole, dp2, stage1, stage2 = rows
    one = stage_saved_bytes(predict_step(build, (1, 1, 8, 8, 8), n_classes=5, dtype=torch.float32))
    params = _n(build())
    for r in (whole, dp2):
        assert r["activations (micro-batches of 1)"] == one[0] + one[1]   # accumulation: one sample's
    assert whole["DDP buckets"] == 0 and dp2["DDP buckets"] == 4 * params
    assert dp2["total (micro-batches of 1)"] == dp2["params + grads + Adam"] + 4 * params + one[0] + one[1]
    for r in (stage1, stage2):
        assert r["activations (micro-batches of 1)"] == r["activations (1F1B)"] and r["DDP buckets"] == 0
