"""The branches of course_utils.parallel that only a GPU machine takes, run on CPU with the
device count, availability or device type injected (or the gloo path taking the same branch);
and CrossReplicaBatchNorm3d's numerics (fp16 input, large counts, large means)."""


import re

import pytest
import torch
from torch import nn

from course_utils import parallel
from course_utils.parallel import launcher
from course_utils.parallel import (
    CrossReplicaBatchNorm3d, OpTimer, backend_for, build_net, launch_many, norm_worker, relative_error,
    source_worker, split_and_reference, torchrun_backend,
)
from course_utils.unet import UNet3D


class _Stop(Exception):
    pass


def _fake_gpus(monkeypatch, n: int, calls: list):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", torch.device(d))))

    def init(backend, **kw):
        calls.append(("init", backend, kw.get("device_id")))
        raise _Stop

    monkeypatch.setattr(parallel.dist, "init_process_group", init)


def test_sync_bn_builds_instead_of_a_key_error():
    net = build_net({"norm": "sync_bn"})  # notebook 08 asks for it on a 2-GPU machine
    assert any(isinstance(m, nn.SyncBatchNorm) for m in net.modules())
    assert not any(type(m) is nn.BatchNorm3d for m in net.modules())
    with pytest.raises(ValueError, match="choose one of .*sync_bn"):
        build_net({"norm": "batchnorm"})


def test_source_worker_puts_the_batch_on_the_models_device():
    # under NCCL the net is on cuda:rank; here "meta" plays that device
    source = "def step(model, x, y, rank, world):\n    model(x)\n    return []\n"
    r = source_worker(0, 1, torch.device("meta"), {"source": source, "name": "step", "norm": "gn"})
    assert r["devices_seen"] == ["meta"] and r["batch_seen"] == [4]


def test_op_timer_synchronizes_cuda_around_each_op(monkeypatch):
    log = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    timer = OpTimer(torch.device("cuda", 0))
    log.clear()
    timer.run("F", 0, lambda: log.append("op"))
    assert log == ["sync", "op", "sync"]  # the clock is read after the kernels finished
    cpu = OpTimer("cpu")
    log.clear()
    cpu.run("F", 0, lambda: log.append("op"))
    assert log == ["op"] and cpu.ops[0][:2] == ("F", 0)


def test_split_check_runs_its_reference_on_the_first_stage_device():
    torch.manual_seed(0)
    x = torch.randn(2, 1, 8, 8, 8)
    meta = split_and_reference(UNet3D(3, 4), x, ("meta", "meta"))
    assert meta["ref"].device.type == "meta"  # never a CPU reference for a GPU run
    r = split_and_reference(UNet3D(3, 4), x, ("cpu", "cpu"))
    assert relative_error([r["out"]], [r["ref"]]) < 1e-6
    assert relative_error(r["grads"], r["ref_grads"]) < 1e-6


def test_launch_sets_the_device_before_init_and_passes_it(monkeypatch):
    calls = []
    _fake_gpus(monkeypatch, 2, calls)
    store = launcher.rendezvous_store()  # launch's own store, which rank 1 joins as a client
    with pytest.raises(_Stop):
        launcher._init(1, 2, store.port)
    assert calls == [("set_device", torch.device("cuda", 1)), ("init", "nccl", torch.device("cuda", 1))]


def _torchrun_env(monkeypatch, rank, world, local_rank, local_world):
    for k, v in {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local_rank,
                 "LOCAL_WORLD_SIZE": local_world}.items():
        monkeypatch.setenv(k, str(v))


def test_torchrun_on_two_nodes_uses_nccl_and_the_local_gpu(monkeypatch):
    # 2 nodes x 4 GPUs: this rank is global rank 5, local rank 1; 4 GPUs here < 8 ranks
    calls = []
    _fake_gpus(monkeypatch, 4, calls)
    _torchrun_env(monkeypatch, 5, 8, 1, 4)
    with pytest.raises(_Stop):
        parallel.main(["--steps", "1"])
    assert calls == [("set_device", torch.device("cuda", 1)), ("init", "nccl", torch.device("cuda", 1))]


def test_torchrun_with_fewer_gpus_than_local_ranks_says_how_to_fix_it(monkeypatch, capsys):
    calls = []
    _fake_gpus(monkeypatch, 2, calls)
    _torchrun_env(monkeypatch, 0, 4, 0, 4)
    with pytest.raises(RuntimeError, match="4 ranks but has 2 GPU.*--nproc-per-node=2.*--backend gloo"):
        torchrun_backend({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"})
    assert parallel.main(["--steps", "1"]) == 2  # the command: one line with the fix, no traceback
    assert re.fullmatch(r"error: .*4 ranks but has 2 GPU.*Fix: .*--nproc-per-node=2.*--backend gloo.*\n",
                        capsys.readouterr().err)
    assert calls == []  # no silent fall-back to gloo
    assert torchrun_backend({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "gloo") == ("gloo", torch.device("cpu"))


def test_torchrun_without_cuda_uses_gloo_on_cpu(monkeypatch):
    calls = []
    _fake_gpus(monkeypatch, 0, calls)
    _torchrun_env(monkeypatch, 0, 2, 0, 2)
    with pytest.raises(_Stop):
        parallel.main(["--steps", "1"])
    assert calls == [("init", "gloo", None)]


# ---- CrossReplicaBatchNorm3d --------------------------------------------------------------
def _reference(x: torch.Tensor, w: torch.Tensor) -> dict:
    """One BatchNorm3d on the whole batch, in float64."""
    c = x.shape[1]
    bn = nn.BatchNorm3d(c).double()
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, c))
        bn.bias.copy_(torch.linspace(-1.0, 1.0, c))
    xd = x.double().requires_grad_()
    y = bn(xd)
    (y * w).sum().backward()
    return {"y": y.detach(), "x_grad": xd.grad, "weight_grad": bn.weight.grad, "bias_grad": bn.bias.grad,
            "running_mean": bn.running_mean, "running_var": bn.running_var}


@pytest.fixture(scope="module")
def bn_runs():
    g = torch.Generator().manual_seed(0)
    shape = (2, 2, 32, 32, 64)  # 131,072 values per channel; 65,536 on each rank > fp16's 65,504
    fp16 = (3 + torch.randn(shape, generator=g)).half()
    offset = 1e4 + torch.randn(shape, generator=g)  # fp32, mean 1e4, std 1: E[x^2]-E[x]^2 cancels
    w = torch.randn(shape, generator=g, dtype=torch.float64)
    cases = {"fp16": fp16, "offset": offset}
    jobs = [(norm_worker, {"x": x, "w": w, "try_sync_bn": True}) for x in cases.values()]
    return {name: (x, w, ranks) for (name, x), ranks in zip(cases.items(), launch_many(jobs, 2), strict=True)}


@pytest.mark.parametrize("case", ["fp16", "offset"])
def test_cross_replica_bn_matches_one_batchnorm_on_the_whole_batch(bn_runs, case):
    x, w, ranks = bn_runs[case]
    ref = _reference(x, w)
    y = torch.cat([r["y"] for r in ranks]).double()
    tol = 2e-3 if case == "fp16" else 1e-4  # fp16 output: 11 significant bits
    assert torch.isfinite(y).all()
    assert relative_error([y], [ref["y"]]) < tol
    assert relative_error([torch.cat([r["x_grad"] for r in ranks])], [ref["x_grad"]]) < 10 * tol
    for key in ("weight_grad", "bias_grad"):  # DDP would all-reduce these: the sum over ranks
        assert relative_error([sum(r[key] for r in ranks)], [ref[key]]) < 10 * tol, key
    for r in ranks:
        torch.testing.assert_close(r["running_mean"].double(), ref["running_mean"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(r["running_var"].double(), ref["running_var"], rtol=1e-3, atol=1e-4)


def test_sync_batchnorm_refuses_cpu_tensors_as_the_docstring_says(bn_runs):
    _, _, ranks = bn_runs["offset"]
    if backend_for(2)[0] == "nccl":  # two GPUs: the ranks' tensors are on them, and it runs
        assert ranks[0]["sync_bn"] == "ran"
    else:
        assert ranks[0]["sync_bn"].startswith("ValueError: SyncBatchNorm expected input tensor to be on GPU")
    assert "all-gather" in CrossReplicaBatchNorm3d.__doc__ and "SyncBatchNorm" in CrossReplicaBatchNorm3d.__doc__


def test_cross_replica_bn_outside_a_process_group_is_batchnorm():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 4, 4)
    bn, ref = CrossReplicaBatchNorm3d(3), nn.BatchNorm3d(3)
    torch.testing.assert_close(bn(x), ref(x))


@pytest.mark.parametrize("gpus, backend_args, where", [(0, [], "no GPU"), (1, ["--backend", "gloo"], "NCCL needs one per"),
                                                      (2, [], "NCCL, one GPU each"), (8, [], "NCCL, one GPU each")])
def test_torchrun_demo_command_fits_the_gpus(monkeypatch, gpus, backend_args, where):
    # notebook 08's torchrun cell: on a 1-GPU machine 2 NCCL ranks would stop at torchrun_backend's
    # error; the command asks for gloo there instead
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    cmd, said = parallel.torchrun_command(2)
    module_at = cmd.index("course_utils.parallel")
    assert "--nproc-per-node=2" in cmd and cmd[module_at - 1] == "-m" and where in said
    # a rendezvous on a free port: two runs at once (two notebooks, a class on one server) would
    # otherwise meet at torchrun's fixed port 29500 and share one rendezvous store
    assert "--standalone" in cmd[:module_at]
    args = cmd[module_at + 1:]
    assert args == backend_args
    if gpus:  # what main() then picks with that command line on this machine
        chosen = torchrun_backend({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
                                  args[1] if args else "auto")
        assert chosen[0] == ("nccl" if gpus >= 2 else "gloo")


def test_fsdp_builds_its_mesh_on_the_ranks_device_when_a_gpu_is_visible(monkeypatch):
    """On a machine with one GPU, ``launch`` runs 2 ranks with gloo on the CPU; ``fsdp_worker``
    called ``fully_shard`` without a mesh, and FSDP2's default mesh (torch 2.13's
    ``_init_default_mesh``) is built on ``torch._C._get_accelerator()``, CUDA whenever a GPU is
    visible: the parameters moved to cuda:0 beside a CPU batch, and notebook 08 failed on the H200
    run of 2026-11-27. Here the accelerator is reported as CUDA on a CPU machine, in a process
    group of one rank; the code before issue 41 failed this test ("Torch not compiled with CUDA
    enabled", checked by running it against that module)."""
    from course_utils.parallel import fsdp_worker

    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    parallel.dist.init_process_group("gloo", store=parallel.dist.HashStore(), rank=0, world_size=1)
    try:
        r = fsdp_worker(0, 1, torch.device("cpu"), {"norm": "gn"})
    finally:
        parallel.dist.destroy_process_group()
    assert r["mesh_device"] == "cpu" and r["param_devices"] == ["cpu"]
    assert relative_error(r["grads"], parallel.single_process_grads({"norm": "gn"})) < 1e-5
