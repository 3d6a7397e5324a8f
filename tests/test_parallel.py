"""Parallelism on CPU with gloo, 2 processes: DDP, accumulation, BatchNorm across replicas,
FSDP2 at rest and at work, the split U-Net, pipelines (GPipe and 1F1B, hand-written and
torch.distributed.pipelining), FSDP2's working figure against FSDPMemTracker, DDP's gradient
buckets, torchrun's whole lines, the bubble of unequal stages, pipeline_layouts. Launch failures: tests/test_parallel_launch.py; the GPU-only
branches: tests/test_parallel_gpu_paths.py."""

import os
import io
import itertools
import random
import subprocess
import sys

import launch_workers
import pytest
import torch

from course_utils import UNet3D, tf32
from course_utils.parallel import (
    TwoStageUNet, accumulated_grads, build_net, bubble_fraction, ddp_worker,
    fsdp_rank_memory, fsdp_units, fsdp_worker, in_flight, launch, launch_many, per_replica_bn_errors,
    pipeline_worker, pipelining_worker, relative_error as rel_error, replay_schedule,
    replay_timelines, schedule_order, single_process_grads, source_worker,
)
from course_utils import seed000_unet
from course_utils.parallel import fsdp_backward_moments, rendezvous_store, gpipe_idle, pipeline_layouts, stage_parameters


#: notebook 09's pipeline net at its CPU size (tests/test_tf32.py's NB09_NET)
NB09_NET = {"norm": "gn", "global_batch": 8, "volume": (16, 32, 32), "channels": 8, "levels": 3}


@pytest.fixture(scope="module")
def runs():
    """Every 2-rank job of this file in one start of the processes, the ranks computing as TF32
    GPUs would (``COURSE_EMULATE_TF32=1``: convolution operands rounded to TF32 whenever the
    flags say a GPU would round them). The comparisons below therefore hold on a recent GPU, not
    only on a CPU: without ``exact_fp32()`` in the workers they fail here, as ``tf32_raw`` shows."""
    jobs = {"bn": (ddp_worker, {"norm": "bn"}), "xbn": (ddp_worker, {"norm": "cross_replica_bn"}),
            "gn": (ddp_worker, {"norm": "gn"}), "fsdp": (fsdp_worker, {"norm": "gn"}),
            "gn_bucket_view": (ddp_worker, {"norm": "gn", "gradient_as_bucket_view": True}),
            "pipe": (pipeline_worker, {"norm": "gn", "runs": [{"micro_batches": 4, "schedule": "gpipe"},
                                                              {"micro_batches": 4, "schedule": "1f1b"}]}),
            "pipelining": (pipelining_worker, {"norm": "gn", "micro_batches": 4}),
            # notebook 09's net at seed 2, whose fp32 orders take different branches (~2 CPU-s)
            "pipe_nb09_seed2": (pipeline_worker, dict(NB09_NET, seed=2, runs=[{"micro_batches": 1, "schedule": "gpipe"},
                                                                            {"micro_batches": 4, "schedule": "1f1b"}])),
            "tf32_raw": (launch_workers.uncompared_ddp_worker, {"norm": "bn"})}
    saved = os.environ.get(tf32.ENV_VAR)
    os.environ[tf32.ENV_VAR] = "1"
    try:
        return dict(zip(jobs, launch_many(list(jobs.values()), 2), strict=True))
    finally:
        if saved is None:
            del os.environ[tf32.ENV_VAR]
        else:
            os.environ[tf32.ENV_VAR] = saved


def test_the_ranks_computed_as_tf32_gpus(runs):
    # the same DDP step without exact_fp32(): TF32's rounding, 1e-2 of the gradient, not 1e-7
    raw = runs["tf32_raw"][0]
    assert rel_error(raw["grads"], accumulated_grads({"norm": "bn"}, 2)) > 1e-3
    assert raw["tf32_counts"]["conv"] > 0
    assert rel_error(runs["bn"][0]["grads"], accumulated_grads({"norm": "bn"}, 2)) < 1e-5


def test_ddp_with_cross_replica_bn_equals_single_process(runs):
    ranks = runs["xbn"]
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["grads"], ranks[1]["grads"], strict=True))
    assert rel_error(ranks[0]["grads"], single_process_grads({"norm": "cross_replica_bn"})) < 1e-4


def test_ddp_with_plain_bn_is_accumulation_and_differs_from_the_global_batch(runs):
    # each replica normalises with its own half-batch statistics: not the global batch's, but
    # exactly what accumulating two micro-batches computes on one device
    got = runs["bn"][0]["grads"]
    assert rel_error(got, single_process_grads({"norm": "bn"})) > 1e-2
    assert rel_error(got, accumulated_grads({"norm": "bn"}, 2)) < 1e-5


def test_per_replica_bn_error_depends_on_the_seed():
    errors = per_replica_bn_errors(range(4))
    assert min(errors) > 1e-2
    assert max(errors) > 1.2 * min(errors)  # one draw is not "the" error: a spread


def test_ddp_memory_is_replicated(runs):
    r0, r1 = runs["bn"]
    n_param_bytes = sum(p.numel() * 4 for p in UNet3D(3, 4).parameters())
    assert r0["param_bytes"] == r1["param_bytes"] == n_param_bytes
    assert r0["optimizer_bytes"] == 2 * n_param_bytes  # Adam: two moments
    assert r0["local_batch"] == 2


def test_gradient_accumulation():
    assert rel_error(accumulated_grads({"norm": "gn"}, 4), single_process_grads({"norm": "gn"})) < 1e-4
    assert rel_error(accumulated_grads({"norm": "bn"}, 2), single_process_grads({"norm": "bn"})) > 1e-2


def test_fsdp_shards_params_grads_and_optimizer_state_at_rest(runs):
    r0, r1 = runs["fsdp"]
    full = runs["gn"][0]
    for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        assert r0[key] + r1[key] == pytest.approx(full[key], rel=0.01), key
        assert r0[key] < 0.6 * full[key], key
    assert rel_error(r0["grads"], single_process_grads({"norm": "gn"})) < 1e-4


def test_fsdp_working_memory_is_the_shard_plus_the_gathered_unit(runs):
    # while a unit runs, its full parameters are gathered on every rank: measured by
    # FSDPMemTracker, predicted from the units' sizes
    net = build_net({"norm": "gn"})
    full = sum(p.numel() * 4 for p in net.parameters())
    predicted = fsdp_rank_memory(net, fsdp_units(net), world=2)
    for r in runs["fsdp"]:
        assert r["working_param_bytes"] == pytest.approx(predicted["working params"], rel=0.01)
        assert r["working_param_bytes"] > 0.75 * full > 1.4 * r["param_bytes"]


def test_fsdp_rank_memory_of_seed000_on_8_ranks():
    from course_utils import seed000_unet

    with torch.device("meta"):
        net = seed000_unet("large")
    m = fsdp_rank_memory(net, fsdp_units(net), world=8)
    n = 40_158_853
    assert m["resting"] == pytest.approx(16 * n / 8)
    assert 75 < m["resting"] / 2**20 < 78
    # the working figure (a unit gathered, the next prefetched, the held reduce-scatter input):
    # test_fsdp_backward_moments_match_fsdpmemtracker, against FSDPMemTracker
    assert m["working"] > m["working, no prefetch"] > m["resting"]
    assert 255 < m["working, shards kept"] / 2**20 < 262 and 240 < m["working"] / 2**20 < 250
    largest = sum(p.numel() for p in net.downs[3].parameters())  # Down(512, 512), gathered + its gradient
    assert m["gathered params"] >= 4 * largest and m["unsharded grads"] >= 4 * largest


def test_two_stage_unet_equals_the_unsplit_model():
    torch.manual_seed(0)
    net = UNet3D(3, 4)
    x = torch.randn(2, 1, 8, 8, 8)
    ref_out = net(x)
    ref_out.sum().backward()
    ref = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    staged = TwoStageUNet(net)
    out = staged(x)
    torch.testing.assert_close(out, ref_out)
    out.sum().backward()
    for a, b in zip(net.parameters(), ref, strict=True):
        torch.testing.assert_close(a.grad, b)
    assert staged.boundary_bytes == sum(2 * c * (8 // 2**i) ** 3 * 4 for i, c in enumerate((4, 8, 8)))


def test_schedules_order_and_micro_batches_in_flight():
    assert schedule_order("gpipe", 0, 2, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    assert schedule_order("1f1b", 0, 2, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1),
                                               ("F", 3), ("B", 2), ("B", 3)]
    assert schedule_order("1f1b", 1, 2, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2),
                                               ("B", 2), ("F", 3), ("B", 3)]
    assert [in_flight(schedule_order("gpipe", s, 4, 8)) for s in range(4)] == [8, 8, 8, 8]
    assert [in_flight(schedule_order("1f1b", s, 4, 8)) for s in range(4)] == [4, 3, 2, 1]
    with pytest.raises(ValueError, match="choose one of"):
        schedule_order("zero-bubble", 0, 2, 4)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, m", [(2, 1), (2, 4), (3, 4), (4, 8)])
def test_replayed_balanced_schedule_has_the_textbook_bubble(kind, stages, m):
    unit = [{**{("F", i): 1.0 for i in range(m)}, **{("B", i): 2.0 for i in range(m)}} for _ in range(stages)]
    sim = replay_schedule(unit, kind)
    assert sim["step_s"] == pytest.approx(3 * (m + stages - 1))
    assert sim["idle"] == pytest.approx([bubble_fraction(stages, m)] * stages)


def test_pipelines_give_the_single_process_gradients_and_1f1b_holds_less(runs):
    r0, r1 = runs["pipe"]
    ref = single_process_grads({"norm": "gn"})
    for a, b in zip(r0["runs"], r1["runs"], strict=True):
        assert rel_error(a["grads"] + b["grads"], ref) < 1e-4, a["schedule"]
        assert [(k, i) for k, i, _, _ in a["timeline"]] == schedule_order(a["schedule"], 0, 2, 4)
        assert [(k, i) for k, i, _, _ in b["timeline"]] == schedule_order(b["schedule"], 1, 2, 4)
    gpipe, one_f_one_b = r0["runs"]
    # stage 1 holds 2 micro-batches of 4 under 1F1B, all 4 under GPipe
    assert one_f_one_b["saved_peak"] == pytest.approx(gpipe["saved_peak"] / 2, rel=0.1)
    assert r1["runs"][1]["saved_peak"] < 0.4 * r1["runs"][0]["saved_peak"]
    sim = replay_timelines([gpipe["timeline"], r1["runs"][0]["timeline"]])
    assert 0 < sim["step_s"] and all(0 <= v < 1 for v in sim["idle"])


def test_notebook_09s_check_holds_the_pipeline_to_the_ranks_arithmetic(runs):
    """Notebook 09's gradient check failed on the recorded H200 run: it allowed 4 x the fp32
    error of its own process (all threads) against float64, and its ranks (one CPU thread each)
    took other branches on a net whose values lie within rounding of a ReLU's kink. On seed 2 of
    that net the ranks' order exceeds such a tolerance (tests/test_tf32.py); the notebook now
    compares with ``ranks_order_grads`` (the ranks' device, one thread on a CPU, the same
    micro-batches) at 1e-5, and on a CPU the launched pipeline gives exactly its gradient, TF32
    emulation on."""
    from course_utils.parallel import ranks_order_grads

    config = dict(NB09_NET, seed=2)
    r0, r1 = runs["pipe_nb09_seed2"]
    for a, b in zip(r0["runs"], r1["runs"], strict=True):
        assert rel_error(a["grads"] + b["grads"], ranks_order_grads(config, a["micro_batches"])) == 0, a["schedule"]


def test_torch_pipelining_schedules_agree_and_1f1b_holds_less(runs):
    r0, r1 = runs["pipelining"]
    ref = single_process_grads({"norm": "gn"})
    for kind in ("gpipe", "1f1b"):
        assert rel_error(r0["schedules"][kind]["grads"] + r1["schedules"][kind]["grads"], ref) < 1e-4
    for r in (r0, r1):
        assert r["schedules"]["1f1b"]["saved_peak"] < 0.8 * r["schedules"]["gpipe"]["saved_peak"]


def test_pipeline_worker_needs_two_ranks():
    with pytest.raises(ValueError, match="splits the U-Net in 2 stages"):
        pipeline_worker(0, 3, torch.device("cpu"), {})


def test_a_crash_at_exit_after_every_result_is_a_warning():
    # gloo can abort a process during interpreter teardown, after its work is done: launch keeps
    # the complete results and warns instead of failing
    with pytest.warns(RuntimeWarning, match="every rank returned its result") as caught:
        r0, r1 = launch(source_worker, 2, {
            "name": "step", "norm": "gn", "exit_code_after_result": 3,
            "source": "def step(model, x, y, rank, world):\n"
                      "    return [p.detach() for p in model.parameters()][:1]\n"})
    assert r0["rank"] == 0 and r1["rank"] == 1
    assert caught[0].filename == __file__  # the warning points at the line that called launch


# -- the U-Net's two stages, pipeline_layouts' 1F1B arithmetic ----------------------------------
def test_the_stages_split_encoder_from_decoder():
    """Without this test the mutant ``stage-of-downs-in-decoder`` of tools/mutants.py (the Down blocks in the decoder's
    stage) survived the other tests."""
    net = UNet3D(levels=3, channels=4)

    def n(*mods):
        return sum(p.numel() for m in mods for p in m.parameters())

    assert stage_parameters(net) == {0: n(net.inc, net.downs), 1: n(net.ups, net.outc)}


def test_pipeline_layouts_1f1b_keeps_s_minus_stage_micro_batches():
    """Batch 4 in micro-batches of one sample over 2 stages: under 1F1B stage 1 holds 2 of the 4
    micro-batches GPipe holds, stage 2 one; unsplit (pp=1) nothing changes.
    Without this test 1F1B's last stage keeping two micro-batches in the 1F1B column survived the other tests (the
    mutant ``pipeline-layouts-1f1b-keeps-two`` of tools/mutants.py, whose text now lands in the micro-batch column:
    test_pipeline_layouts_compare_like_with_like_and_count_buckets kills that one)."""
    whole, first, second = pipeline_layouts(lambda: UNet3D(3, 4), (8, 8, 8), 4, [(1, 1), (1, 2)],
                                            dtype=torch.float32)
    assert whole["activations (1F1B)"] == whole["activations (GPipe)"]
    assert first["activations (1F1B)"] == pytest.approx(first["activations (GPipe)"] * 2 / 4)
    assert second["activations (1F1B)"] == pytest.approx(second["activations (GPipe)"] / 4)
    assert first["params + grads + Adam"] + second["params + grads + Adam"] == whole["params + grads + Adam"]
    assert first["activations (GPipe)"] + second["activations (GPipe)"] == whole["activations (GPipe)"]


# -- FSDP2's working figure against FSDPMemTracker, DDP's buckets, torchrun's whole lines (notebook
# 08); unequal stages and pipeline_layouts' like-with-like column (notebook 09) --------------------
def _n(module):
    return sum(p.numel() for p in module.parameters())


def test_fsdp_working_figure_includes_the_prefetched_unit_seed000():
    """Notebook 08's text rests on this: FSDP2's working figure holds the prefetched unit and the reduce-scatter input."""
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
    """Notebook 08's text rests on this: the computed backward moments are what FSDPMemTracker measures."""
    net = build_net({"norm": "gn"})
    computed = fsdp_backward_moments(net, fsdp_units(net), 2)
    for rank in runs["fsdp"]:
        measured = rank["backward_moments"]
        for c, m in zip(computed, measured, strict=True):
            total = sum(v for k, v in m.items() if k != "unit")
            assert total == pytest.approx(c["total"], rel=0.01), (c, m)
            assert m["All Gather"] == c["prefetched params"]              # the prefetched unit
            assert m["Reduce Scatter"] == pytest.approx(c["reduce-scatter input"], abs=32)  # padding
        assert any(m["All Gather"] for m in measured)


def test_fsdp_moments_table_sets_each_computed_moment_beside_its_measurement(runs):
    """Notebook 08's table of FSDP2's end-of-backward moments (``moments_table``): one row per unit,
    named, its computed parts adding up to ``fsdp_backward_moments``' total, the measurement
    beside it."""
    from course_utils.parallel import fsdp_unit_names, moments_table

    net = build_net({"norm": "gn"})
    measured = runs["fsdp"][0]["backward_moments"]
    table = moments_table(net, measured, 2)
    computed = fsdp_backward_moments(net, fsdp_units(net), 2)
    assert list(table["unit"]) == fsdp_unit_names(net) == ["inc", "downs.0", "downs.1", "ups.0", "ups.1"]
    assert list(table["computed KiB"] * 1024) == [c["total"] for c in computed]
    assert list(table["measured KiB"] * 1024) == [sum(v for k, v in m.items() if k != "unit") for m in measured]


def test_fsdp_timeline_reaches_fsdp_rank_memorys_figures_seed000():
    """Notebook 08's time line of one FSDP2 rank: at rest, each unit's forward, each unit's end of
    backward in backward order; its largest forward and overall moments are ``fsdp_rank_memory``'s
    ``forward`` and ``working``, and the worst is a backward's end."""
    from course_utils.parallel import fsdp_timeline, fsdp_unit_names

    with torch.device("meta"):
        net = seed000_unet("large")
    m = fsdp_rank_memory(net, fsdp_units(net), world=8)
    timeline = fsdp_timeline(net, 8)
    names = fsdp_unit_names(net)
    assert [label for label, _ in timeline] == ["at rest", *[f"F {n}" for n in names], *[f"B {n}" for n in reversed(names)]]
    totals = {label: sum(parts.values()) for label, parts in timeline}
    assert totals["at rest"] == m["resting"]
    assert max(v for k, v in totals.items() if k.startswith("F ")) == pytest.approx(m["forward"])
    assert max(totals.values()) == pytest.approx(m["working"]) and max(totals, key=totals.get).startswith("B ")


def test_a_ranks_saved_bytes_are_its_share_of_the_whole_batchs(runs):
    """Notebook 08's "each rank saves about half of what one process saves for all 4": the same
    meter on one process (``whole_batch_saved_bytes``) grows with the batch, and a rank of 2
    measures half of it plus its slice's view of the whole batch (input and target)."""
    from course_utils.parallel import global_batch, whole_batch_saved_bytes

    whole, half = whole_batch_saved_bytes({"norm": "gn"}), whole_batch_saved_bytes({"norm": "gn", "global_batch": 2})
    assert 1.95 < whole / half < 2.0
    x, y = global_batch({})
    views = (x.nbytes + y.nbytes) // 2  # the half of the whole batch's storage a rank's slice does not own
    assert runs["gn"][0]["saved_bytes"] == half + views


def test_ddp_buckets_are_a_copy_of_the_gradients_unless_views(runs):
    """Notebook 08's text rests on this: DDP's gradient buckets, measured."""
    default, views = runs["gn"][0], runs["gn_bucket_view"][0]
    assert not default["gradient_as_bucket_view"]
    assert default["bucket_bytes"] == default["bucket_extra_bytes"] == default["grad_bytes"] > 0
    assert views["bucket_bytes"] == views["grad_bytes"] and views["bucket_extra_bytes"] == 0


def _torchrun_rank_env(port: int) -> dict[str, str]:
    """The environment torchrun gives the only rank of a 1-rank run whose agent hosts the
    rendezvous store on ``port`` (the rank connects to it, as under torchrun, and binds nothing)."""
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"}


def test_torchrun_rank_prints_its_line_in_one_write(monkeypatch):
    """Notebook 08's text rests on this: under torchrun each rank prints whole lines."""
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
    store = rendezvous_store()  # torchrun's agent hosts the store; this test plays the agent
    for key, value in _torchrun_rank_env(store.port).items():
        monkeypatch.setenv(key, value)
    assert cli.main(["--steps", "1", "--backend", "gloo"]) == 0
    lines = [c for c in chunks if "rank" in c]
    assert lines and all(c.endswith("\n") and c.count("\n") == 1 for c in lines), chunks


def test_gpipe_idle_is_the_replay_for_unequal_stages():
    """Notebook 09's text rests on this: the bubble of unequal stages."""
    rng = random.Random(0)
    for stages, m in itertools.product((2, 3, 4), (1, 2, 5)):
        f = [rng.uniform(0.5, 3) for _ in range(stages)]
        b = [rng.uniform(0.5, 6) for _ in range(stages)]
        durations = [{**{("F", i): f[s] for i in range(m)}, **{("B", i): b[s] for i in range(m)}} for s in range(stages)]
        assert replay_schedule(durations, "gpipe")["idle"] == pytest.approx(gpipe_idle(f, b, m))
        assert gpipe_idle([1.0] * stages, [2.0] * stages, m) == pytest.approx([bubble_fraction(stages, m)] * stages)
    light, heavy = gpipe_idle([1.0, 3.0], [2.0, 6.0], 1)
    assert heavy == pytest.approx(3 / 12) and heavy < bubble_fraction(2, 1) < light


def test_a_torchrun_rank_that_is_done_leaves_before_the_interpreters_teardown():
    """Notebook 08's torchrun cell failed once in CI (2026-11-28): both ranks had printed their
    line, then rank 0 aborted in the interpreter's teardown (gloo's threads still running when
    C++'s static destructors ran: "terminate called without an active exception", SIGABRT) and
    torchrun reported the run as failed. Emulated with a teardown that aborts (an atexit
    handler): a rank that is done leaves before it, with its own exit status."""
    code = ("import atexit, os, runpy, sys; atexit.register(os.abort); "
            "sys.argv = ['course_utils.parallel', '--steps', '1', '--backend', 'gloo']; "
            "runpy.run_module('course_utils.parallel', run_name='__main__', alter_sys=True)")
    store = rendezvous_store()
    env = {**os.environ, **_torchrun_rank_env(store.port)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)  # subprocess.run kills the child when the time is up
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("rank 0/1 (gloo)") == 1, run.stdout


def test_pipeline_layouts_compare_like_with_like_and_count_buckets():
    """Notebook 09's text rests on this: pipeline_layouts' like-with-like column and its DDP buckets."""
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


def test_the_commands_options_are_refused_before_any_process_starts(monkeypatch, capsys):
    """Issue 43: ``python -m course_utils.parallel --steps 0`` spawned two ranks that trained no
    step and exited 0; ``--global-batch 3`` trained 2 samples a step on 2 ranks without a word;
    ``--steps 10**9`` and a global batch of a billion started ranks that would never finish."""
    from course_utils.parallel import cli

    def no_ranks(*args, **kwargs):  # noqa: ARG001 - launch's signature
        raise AssertionError("ranks were started before the options were checked")
    monkeypatch.setattr(cli, "launch", no_ranks)
    monkeypatch.delenv("RANK", raising=False)
    for argv in (["--steps", "0"], ["--steps", "-2"], ["--steps", str(10**9)], ["--global-batch", "3"],
                 ["--global-batch", "0"], ["--global-batch", str(10**9)]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: --") and "Fix: pass" in err, err
