"""Parallelism on CPU with gloo, 2 processes: DDP, accumulation, FSDP2, the split U-Net, the
GPipe pipeline, and failures that surface as errors instead of hangs."""

import pytest
import torch

from course_utils import UNet3D
from course_utils.parallel import (
    TwoStageUNet, accumulated_grads, bubble_fraction, ddp_worker, failing_worker, fsdp_worker,
    launch, pipeline_worker, relative_error as rel_error, single_process_grads, source_worker,
    stuck_worker,
)


@pytest.fixture(scope="module")
def ddp():
    return {norm: launch(ddp_worker, 2, {"norm": norm}) for norm in ("bn", "cross_replica_bn")}


def test_ddp_with_cross_replica_bn_equals_single_process(ddp):
    ranks = ddp["cross_replica_bn"]
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["grads"], ranks[1]["grads"]))
    assert rel_error(ranks[0]["grads"], single_process_grads({"norm": "cross_replica_bn"})) < 1e-4


def test_ddp_with_plain_bn_differs(ddp):
    # each replica normalises with its own half-batch statistics: not the global batch's
    assert rel_error(ddp["bn"][0]["grads"], single_process_grads({"norm": "bn"})) > 1e-2


def test_ddp_memory_is_replicated(ddp):
    r0, r1 = ddp["bn"]
    n_param_bytes = sum(p.numel() * 4 for p in UNet3D(3, 4).parameters())
    assert r0["param_bytes"] == r1["param_bytes"] == n_param_bytes
    assert r0["optimizer_bytes"] == 2 * n_param_bytes  # Adam: two moments
    assert r0["local_batch"] == 2


def test_gradient_accumulation():
    assert rel_error(accumulated_grads({"norm": "gn"}, 4), single_process_grads({"norm": "gn"})) < 1e-4
    assert rel_error(accumulated_grads({"norm": "bn"}, 2), single_process_grads({"norm": "bn"})) > 1e-2


def test_fsdp_shards_params_grads_and_optimizer_state(ddp):
    r0, r1 = launch(fsdp_worker, 2, {"norm": "gn"})
    full = ddp["bn"][0]
    for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        assert r0[key] + r1[key] == pytest.approx(full[key], rel=0.01), key
        assert r0[key] < 0.6 * full[key], key
    assert rel_error(r0["grads"], single_process_grads({"norm": "gn"})) < 1e-4


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
    for a, b in zip(net.parameters(), ref):
        torch.testing.assert_close(a.grad, b)
    assert staged.boundary_bytes == sum(2 * c * (8 // 2**i) ** 3 * 4 for i, c in enumerate((4, 8, 8)))


def test_gpipe_pipeline_gradients_equal_single_process():
    r0, r1 = launch(pipeline_worker, 2, {"norm": "gn", "micro_batches": 4})
    assert rel_error(r0["grads"] + r1["grads"], single_process_grads({"norm": "gn"})) < 1e-4
    kinds = [(k, i) for k, i, _, _ in r0["timeline"]]
    assert kinds == [("F", i) for i in range(4)] + [("B", i) for i in reversed(range(4))]
    assert bubble_fraction(2, 4) == pytest.approx(1 / 5)


def test_worker_failure_is_a_clear_error():
    with pytest.raises(RuntimeError, match="rank 1 failed on purpose"):
        launch(failing_worker, 2, timeout_s=120)
    with pytest.raises(RuntimeError, match="splits the U-Net in 2 stages"):
        launch(pipeline_worker, 3, {})


def test_a_stuck_worker_times_out():
    with pytest.raises(TimeoutError, match="did not finish within 15 s"):
        launch(stuck_worker, 2, {"sleep_s": 120}, timeout_s=15)


def test_a_crash_at_exit_after_every_result_is_a_warning():
    # gloo can abort a process during interpreter teardown, after its work is done: launch keeps
    # the complete results and warns instead of failing
    with pytest.warns(RuntimeWarning, match="every rank returned its result"):
        r0, r1 = launch(source_worker, 2, {
            "name": "step", "norm": "gn", "exit_code_after_result": 3,
            "source": "def step(model, x, y, rank, world):\n"
                      "    return [p.detach() for p in model.parameters()][:1]\n"})
    assert r0["rank"] == 0 and r1["rank"] == 1
