"""course_utils.memory and limit_test: exact bytes on hand-computable nets, predictor vs
measurement, the optimizer step and the peak's phase in a prediction, MemTracker pinned, errors
and OOM handling, largest_that_fits' edges; seed 003's forward column (notebook 03)."""

import gc

import pytest
import torch
from torch import nn

from course_utils import (
    SavedTensorMeter, UNet3D, catch_oom, explain_oom, largest_that_fits, log_step,
    predict_step, saved_tensors, seed000_unet,
)
from course_utils.limit_test import (
    LimitTestNet, expected_saved_bytes, input_bytes, make_inputs, naive_bytes,
)
from course_utils.checks import MeasureError
from course_utils.memory import GiB, MiB, CATEGORIES, MemoryLog, SavedTensorModifiedError
from course_utils.limit_test import run_limit_test, seed003_forward_table
from course_utils.memory import LiveBytes


# -- saved-for-backward bytes --------------------------------------------------------------
def test_conv_relu_saves_input_and_relu_output():
    conv = nn.Conv3d(1, 4, 3, padding=1)
    x = torch.randn(1, 1, 8, 8, 8)
    with SavedTensorMeter(conv.parameters()) as m:
        y = torch.relu(conv(x))
    assert m.current == (1 + 4) * 8**3 * 4  # conv keeps x, relu keeps its output
    assert m.param_bytes == conv.weight.numel() * 4  # the weight is referenced, not copied
    y.sum().backward()
    del y
    gc.collect()
    assert m.current == 0  # freed with the graph


@pytest.mark.parametrize("n", [8, 12, 16])
def test_limit_net_saves_15x_the_input(n):
    net = LimitTestNet()
    x, target = make_inputs(n)
    with SavedTensorMeter(net.parameters()) as m:
        loss = nn.functional.mse_loss(net(x), target)
    assert m.current == expected_saved_bytes(n) == 15 * input_bytes(n)
    assert naive_bytes(n) == 26 * input_bytes(n)
    loss.backward()


def test_inplace_relu_shares_the_conv_output():
    net = LimitTestNet(inplace=True)
    x, target = make_inputs(8)
    with SavedTensorMeter(net.parameters()) as m:
        loss = nn.functional.mse_loss(net(x), target)
    # each conv output is overwritten by its in-place ReLU: one storage, as before
    assert m.current == 15 * input_bytes(8)
    loss.backward()


def test_saved_tensors_lists_nodes():
    conv = nn.Conv3d(1, 2, 3, padding=1)
    bn = nn.BatchNorm3d(2)
    out = torch.relu(bn(conv(torch.randn(2, 1, 4, 4, 4))))
    rows = saved_tensors(out, params=list(conv.parameters()) + list(bn.parameters()))
    nodes = {r.node for r in rows}
    assert {"ConvolutionBackward0", "NativeBatchNormBackward0", "ReluBackward0"} <= nodes
    relu = [r for r in rows if r.node == "ReluBackward0"]
    assert relu[0].attr == "_saved_result" and relu[0].shape == (2, 2, 4, 4, 4)
    assert any(r.is_param for r in rows if r.node == "ConvolutionBackward0")
    with pytest.raises(ValueError, match="requires grad"):
        saved_tensors(torch.zeros(3))


# -- the hook log and the predictor --------------------------------------------------------
def test_memory_log_rows_and_breakdown():
    net = UNet3D(levels=3, channels=4)
    x, y = torch.randn(2, 1, 8, 8, 8), torch.randint(0, 5, (2, 8, 8, 8))
    opt = torch.optim.Adam(net.parameters())
    log = log_step(net, x, y, optimizer=opt)
    hooks = {r.hook for r in log.rows}
    assert hooks == {"pre", "fwd", "bwd_pre", "bwd"}
    assert log.rows[0].module == "UNet3D" and log.rows[0].hook == "pre"
    bd = log.breakdown("peak")
    n_param_bytes = sum(p.numel() * 4 for p in net.parameters())
    assert bd["Parameter"] == n_param_bytes
    assert bd["Total"] == sum(bd[c] for c in CATEGORIES) == log.peak
    df = log.frame()
    assert list(df.columns[:5]) == ["event", "call", "module", "layer_type", "hook"]
    per = log.per_module_saved()
    assert "inc.double_conv.0" in per and all(v >= 0 for v in per.values())


def test_saved_by_layer_type_and_the_tie_notebook_02_explains():
    """Notebook 02 asks which two layer types tie in what they save: BatchNorm3d keeps its input and
    ReLU its output, one full map each per conv; BN's extra is per-channel (running mean and
    variance, the batch's mean and inverse std: 4 fp32 numbers a channel). Conv3d saves less: most
    of its inputs are ReLU outputs, counted there."""
    torch.manual_seed(0)
    net = UNet3D(levels=3, channels=4)
    log = log_step(net, torch.randn(2, 1, 8, 8, 8), torch.randint(0, 5, (2, 8, 8, 8)),
                   optimizer=torch.optim.Adam(net.parameters()))
    by_type = log.saved_by()
    assert by_type.sum() == sum(log.per_module_saved().values())
    bn_channels = sum(m.num_features for m in net.modules() if isinstance(m, torch.nn.BatchNorm3d))
    assert by_type["BatchNorm3d"] - by_type["ReLU"] == 4 * 4 * bn_channels
    assert by_type["Conv3d"] < by_type["ReLU"] and by_type["Upsample"] == 0
    by_block = log.saved_by(lambda name: name.split(".")[0])
    assert set(by_block.index) == {"inc", "downs", "ups", "outc"} and by_block.sum() == by_type.sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prediction_equals_cpu_measurement_exactly(dtype):
    def build():
        torch.manual_seed(0)
        return UNet3D(levels=3, channels=4)

    for steady in (True, False):
        kw = dict(n_classes=5, dtype=dtype, steady_state=steady)
        fake = predict_step(build, (2, 1, 8, 16, 12), target="cpu", **kw)
        real = predict_step(build, (2, 1, 8, 16, 12), fake=False, **kw)
        assert fake.peak == real.peak
        assert fake.breakdown == real.breakdown
        assert fake.after_forward == real.after_forward
        assert fake.saved_peak == real.saved_peak
        assert "predicted" in fake.method and "measured" in real.method


def test_cuda_target_rounds_every_block_to_512_bytes():
    build = lambda: UNet3D(levels=3, channels=4)
    cpu = predict_step(build, (2, 1, 8, 8, 8), n_classes=5, target="cpu")
    cuda = predict_step(build, (2, 1, 8, 8, 8), n_classes=5)
    n_tensors = len(list(build().parameters()))
    # every parameter is its own block: rounded up to a multiple of 512 bytes
    assert cuda.breakdown["Parameter"] % 512 == 0
    assert cpu.breakdown["Parameter"] < cuda.breakdown["Parameter"] <= cpu.breakdown["Parameter"] + 512 * n_tensors


# -- steady state: what a real loop's step 2+ holds ------------------------------------------
@pytest.mark.parametrize("optimizer, states", [("adam", 2), ("sgd", 1)])
def test_steady_state_carries_the_optimizer_state(optimizer, states):
    build = lambda: UNet3D(levels=3, channels=4)
    kw = dict(n_classes=5, target="cpu", optimizer=optimizer)
    first = predict_step(build, (2, 1, 8, 16, 16), steady_state=False, **kw)
    steady = predict_step(build, (2, 1, 8, 16, 16), **kw)
    param_bytes = steady.breakdown["Parameter"]
    # Adam keeps two moments per parameter (plus a scalar step count each), SGD one momentum
    assert states * param_bytes <= steady.breakdown["Optstate"] <= states * param_bytes + 8 * 64
    assert first.breakdown["Optstate"] == 0  # created in opt.step(), after the backward peak
    assert steady.peak >= first.peak + states * param_bytes


def test_steady_state_equals_a_real_second_step():
    """prime_optimizer's shortcut (one step on zero gradients) leaves the same state as a real
    first step: the tracked second step of a real two-step loop has the same figures."""
    from course_utils.memory import MemoryLog
    from course_utils.train import training_step

    torch.manual_seed(0)
    net = UNet3D(levels=3, channels=4)
    x, y = torch.randn(2, 1, 8, 8, 8), torch.randint(0, 5, (2, 8, 8, 8))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, foreach=False)
    training_step(net, x, y, opt)  # a real first step
    log = MemoryLog(net, cuda=False)
    log.track_external(net, x, y, opt)
    with log:
        training_step(net, x, y, opt)
    pred = predict_step(lambda: UNet3D(levels=3, channels=4), (2, 1, 8, 8, 8), n_classes=5,
                        target="cpu")
    assert pred.breakdown == log.breakdown("peak")


def test_a_log_does_not_keep_the_model_alive():
    """MemTracker's module tracker leaves multi-grad hooks whose closures form a reference
    cycle through C++ graph nodes; MemoryLog removes them (old code: 40 of 42 params survived)."""
    import weakref

    net = UNet3D(levels=3, channels=4)
    x, y = torch.randn(2, 1, 8, 8, 8), torch.randint(0, 5, (2, 8, 8, 8))
    log = log_step(net, x, y, optimizer=torch.optim.Adam(net.parameters()))
    params = [weakref.ref(p) for p in net.parameters()]
    grads = [weakref.ref(p.grad) for p in net.parameters()]
    del net
    gc.collect()
    assert sum(r() is not None for r in params) == 0
    assert sum(r() is not None for r in grads) == 0
    assert log.peak > 0 and log.rows  # the figures stay


def test_peak_location_is_reported():
    """A real module of the net and the phase: the small seed net (fp16, full size) peaks at the
    end of its forward pass, the large one in backward (notebook 05 relies on both)."""
    names = {n for n, _ in seed000_unet("small").named_modules() if n}
    kw = dict(n_classes=5, dtype=torch.float16, module_peaks=False)
    small = predict_step(lambda: seed000_unet("small"), (2, 1, 26, 150, 320), **kw).log.peak_location
    large = predict_step(lambda: seed000_unet("large"), (2, 1, 26, 150, 320), **kw).log.peak_location
    assert small == ("ups.2.conv.double_conv.5", "forward") and small[0] in names
    assert large[1] == "backward" and large[0].startswith("ups.3")


def test_global_peak_without_module_peaks_is_the_same():
    kw = dict(n_classes=5, dtype=torch.float16)
    a = predict_step(lambda: seed000_unet("small"), (1, 1, 26, 150, 320), **kw)
    b = predict_step(lambda: seed000_unet("small"), (1, 1, 26, 150, 320), module_peaks=False, **kw)
    assert a.peak == b.peak and a.breakdown == b.breakdown


def _device_ops_tracked(monkeypatch) -> list:
    """The prim.device ops that reach MemTracker's own bookkeeping, recorded from now on."""
    from torch.distributed._tools.mem_tracker import MemTracker

    seen = []
    original = MemTracker.__torch_dispatch__

    def counting(self, func, types, args=(), kwargs=None):
        if func is torch.ops.prim.device.default:
            seen.append(func)
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(MemTracker, "__torch_dispatch__", counting)
    return seen


def test_ops_that_allocate_nothing_skip_the_bookkeeping_and_change_no_figure(monkeypatch):
    """MemoryLog passes prim.device (no tensor out, nothing allocated; most of a step's ops under
    fake tensors) straight on when module_peaks=False: every figure is the same as with
    MemTracker's bookkeeping after each of them -- the peak, its place, the breakdown, what the
    forward keeps, every row of the hook table -- on a step with autocast, checkpointing and the
    loss, where the stage (forward, backward, after) must still move on at the right op."""
    from course_utils import explorer as ex
    from course_utils.memory import hook_table

    cfg = ex.Config(volume=(8, 16, 16), levels=3, base_channels=4, precision="autocast_fp16", lean_up=True,
                    inplace_relu=True, checkpointing="selective")
    dtype, ac = ex.PRECISIONS[cfg.precision]

    def step():
        p = predict_step(lambda: ex.build(cfg), (2, 1, *cfg.volume), n_classes=5, dtype=dtype,
                         autocast_dtype=ac, module_peaks=False)
        return (p.peak, p.breakdown, p.after_forward, p.saved_peak, p.log.peak_location, p.log.peak_event,
                [(r.module, r.hook, r.tracked, r.saved) for r in p.log.rows])

    seen = _device_ops_tracked(monkeypatch)
    fast = step()
    assert not seen  # none reached MemTracker's bookkeeping (the old MemoryLog: hundreds)
    monkeypatch.setattr(hook_table, "_NO_MEMORY_OPS", frozenset())
    assert step() == fast
    assert seen  # the step does ask devices: the comparison covered them


def test_module_peaks_keep_memtrackers_bookkeeping_for_every_op(monkeypatch):
    seen = _device_ops_tracked(monkeypatch)
    predict_step(lambda: seed000_unet("small"), (1, 1, 8, 16, 16), n_classes=5, optimizer=None)
    assert seen


def test_full_size_seed000_predicted_in_seconds():
    preds = {v: predict_step(lambda v=v: seed000_unet(v), (2, 1, 26, 150, 320), n_classes=5,
                             dtype=torch.float16) for v in ("large", "small")}
    for p in preds.values():
        assert p.breakdown["Activation"] > 10 * p.breakdown["Parameter"]
        assert 3000 * MiB < p.peak < 8000 * MiB  # the seed saw ~7000 MiB on nvidia-smi
    assert preds["large"].parameters == 40_158_853
    # 2.8x fewer parameters, yet the small net does not peak lower
    assert preds["small"].peak > 0.9 * preds["large"].peak


def test_limit_net_prediction_scales_with_n_cubed():
    a = predict_step(LimitTestNet, (1, 1, 100, 100, 100), (1, 1, 100, 100, 100), optimizer=None)
    b = predict_step(LimitTestNet, (1, 1, 200, 200, 200), (1, 1, 200, 200, 200), optimizer=None)
    assert a.saved_peak == expected_saved_bytes(100)
    assert b.saved_peak == expected_saved_bytes(200)
    assert 7.5 < b.peak / a.peak < 8.1


def test_bad_inputs():
    for call, fix in [
        (lambda: predict_step(UNet3D(3, 4), (1, 1, 8, 8, 8), n_classes=5), "function that builds the model, not a model"),
        (lambda: predict_step(lambda: UNet3D(3, 4), (-2, 1, 8, 8, 8), n_classes=5), "whole number >= 1"),
        (lambda: predict_step(lambda: UNet3D(3, 4), (2, 1, 8, 8, 8), n_classes=5, target="tpu"), "one of 'cuda', 'cpu'"),
        (lambda: predict_step(lambda: UNet3D(3, 4), (2, 1, 8, 8, 8), n_classes=5, fake=False, target="cuda"),
         "real CPU tensors follow the CPU's rules"),
        (lambda: log_step("not a model", torch.zeros(1), torch.zeros(1)), "nn.Module"),
        (lambda: log_step(nn.Linear(2, 2), [1, 2], torch.zeros(1)), "torch.Tensor"),
        (lambda: predict_step(lambda: UNet3D(3, 4), (1, 1, 8, 8, 8), n_classes=5, optimizer="lion"), "optimizer must be"),
        (lambda: predict_step(lambda: UNet3D(3, 4), (2**62, 1, 8, 8, 8)), "more than any GPU holds"),  # torch overflowed
        (lambda: predict_step(lambda: UNet3D(3, 4), (2, 1, 8, 8, 8), (3, 8, 8, 8)), "have different batches"),
        (lambda: predict_step(lambda: UNet3D(3, 4), (2, 3, 8, 8, 8)), r"the step failed on fake tensors of input shape"),
    ]:
        with pytest.raises(MeasureError, match=fix) as e:
            call()
        assert "Fix:" in str(e.value)
    with pytest.raises(ValueError, match="5D tensor"):  # torch's own words: the model refuses the shape
        predict_step(lambda: UNet3D(3, 4), (1, 8, 8, 8), n_classes=5)


# -- MemTracker is private API: pin what we rely on -----------------------------------------
def test_memtracker_private_api_is_as_expected():
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    assert {m.value for m in _MemRefType} == set(CATEGORIES)
    for name in ("_pre_fw_hook", "_post_fw_hook", "_pre_bw_hook", "_post_bw_hook",
                 "get_tracker_snapshot", "track_external", "_mod_tracker", "_update_peak_stats",
                 "_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_in_opt", "_param_to_grad_hook_handles",
                 "memory_tracking", "reset_mod_stats"):
        assert hasattr(MemTracker(), name), f"MemTracker.{name} is gone: update MemoryLog"
    assert issubclass(MemoryLog, MemTracker)


# -- budgets and OOM -------------------------------------------------------------------------
@pytest.mark.parametrize("limit", [1, 7, 100, 1023, 4096])
def test_largest_that_fits(limit):
    calls = []
    assert largest_that_fits(lambda n: calls.append(n) or n <= limit) == limit
    assert len(calls) < 30
    assert largest_that_fits(lambda n: False) == 0
    assert largest_that_fits(lambda n: n <= limit, start=1, limit=5000) == limit


def test_largest_that_fits_refuses_what_it_cannot_answer():
    with pytest.raises(MeasureError, match="start=0 .* whole number >= 1"):
        largest_that_fits(lambda n: n <= 10, start=0)  # doubling from 0: used to loop forever
    with pytest.raises(MeasureError, match="whole number >= 1"):
        largest_that_fits(lambda n: n <= 10, start=-4)
    with pytest.raises(MeasureError, match="below start"):
        largest_that_fits(lambda n: True, start=20, limit=10)
    with pytest.raises(MeasureError, match="everything up to limit=64 fits"):
        largest_that_fits(lambda n: True, limit=64)
    assert largest_that_fits(lambda n: True, limit=64, at_limit="return") == 64


OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.19 GiB of "
    "which 1.06 GiB is free. Process 1 has 78.12 GiB memory in use. Of the allocated memory "
    "74.50 GiB is allocated by PyTorch, and 3.10 GiB is reserved by PyTorch but unallocated."
)


def test_explain_oom_pulls_out_the_figures():
    text = explain_oom(torch.OutOfMemoryError(OOM_MESSAGE))
    for part in ("2.50 GiB", "1.06 GiB of 79.19 GiB", "74.50 GiB", "3.10 GiB", "expandable"):
        assert part in text


def test_explain_oom_with_an_empty_message():
    text = explain_oom(torch.OutOfMemoryError())  # used to raise IndexError
    assert "OutOfMemoryError" in text and "What to do" in text
    assert "before CUDA starts" in explain_oom(torch.OutOfMemoryError(OOM_MESSAGE))


def test_catch_oom_leaves_nothing_alive():
    """The stored error must not keep the failed attempt's tensors alive through its traceback
    (old code: they survived until a later gc.collect(), beside the next attempt)."""
    import weakref

    alive = []

    def attempt():
        big = torch.empty(1000, 1000)
        alive.append(weakref.ref(big))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    with catch_oom(verbose=False) as r:
        attempt()
    assert not r.ok and alive[0]() is None
    assert r.error.__traceback__ is None


def test_an_oom_in_a_metered_forward_frees_the_graph():
    """An OOM in the middle of a forward under SavedTensorMeter (what measure_step runs, so what
    every largest-batch search on a GPU hits) must free what autograd had saved. Old code: the
    meter's pack hook kept the tensor itself, a cycle through the C++ graph that gc cannot break,
    so each failed attempt stayed allocated -- on the H100, 4,540 MiB after the first search
    and about 7,100 MiB after the second, inflating every later benchmark row by as much."""
    import weakref

    saved = []

    def attempt():
        model = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv3d(4, 4, 3, padding=1), nn.ReLU())
        model[1].register_forward_hook(lambda m, i, out: saved.append(weakref.ref(out)))  # saved by ReLU

        def out_of_memory(*_):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

        model[3].register_forward_hook(out_of_memory)
        with SavedTensorMeter(model.parameters()):
            model(torch.randn(1, 1, 8, 8, 8)).sum().backward()

    with catch_oom(verbose=False) as r:
        attempt()
    gc.collect()
    assert not r.ok and saved and saved[0]() is None


def test_the_meter_keeps_gradients_exact():
    """The meter hands autograd detached aliases: backward must still give the same gradients."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv3d(4, 2, 3, padding=1), nn.Sigmoid())
    x = torch.randn(2, 1, 6, 6, 6)
    model(x).square().sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with SavedTensorMeter(model.parameters()) as m:
        model(x).square().sum().backward()
    assert m.peak > 0
    assert all(torch.equal(a, p.grad) for a, p in zip(plain, model.parameters(), strict=True))


def test_catch_oom_catches_and_explains(capsys):
    with catch_oom() as r:
        raise torch.OutOfMemoryError(OOM_MESSAGE)
    assert not r.ok and "asked for" in capsys.readouterr().out
    with catch_oom(verbose=False) as r:
        pass
    assert r.ok
    with pytest.raises(ValueError):
        with catch_oom():
            raise ValueError("not an OOM: must propagate")


# -- on a GPU: the prediction against the CUDA allocator -------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("case", ["large fp16 model", "small fp16 model", "large autocast fp16",
                                  "large fp32", "limit net N=256"])
def test_prediction_within_5_percent_of_cuda(case):
    """The same training_step, predicted (fake tensors, CUDA rules, steady state) and measured
    (max_memory_allocated of the second step)."""
    from course_utils.memory import measure_step

    if case.startswith("limit"):
        kw = dict(target_shape=(1, 1, 256, 256, 256), optimizer=None, steady_state=False)
        build, shape = LimitTestNet, (1, 1, 256, 256, 256)
    else:
        variant, rest = case.split(" ", 1)
        kw = dict(n_classes=5, dtype=torch.float16 if rest == "fp16 model" else torch.float32,
                  autocast_dtype=torch.float16 if rest.startswith("autocast") else None)
        build, shape = (lambda: seed000_unet(variant)), (2, 1, 26, 150, 320)
    pred = predict_step(build, shape, **kw)
    meas = measure_step(build, shape, **kw)
    miss = (pred.peak - meas.peak_allocated) / meas.peak_allocated
    assert abs(miss) < 0.05, (case, pred.peak / MiB, meas.peak_allocated / MiB, meas.peak_reserved / MiB)


@pytest.mark.gpu
def test_catch_oom_frees_the_failed_attempt_on_cuda():
    from course_utils.memory import memory_cap

    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()

    def attempt():  # its own frame: a name bound in the test's frame would outlive any with-block
        keep = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")  # fits
        more = torch.empty(2 * 1024 * MiB, dtype=torch.uint8, device="cuda")  # does not
        return keep, more

    with memory_cap(1.0):
        with catch_oom(verbose=False) as r:
            attempt()
        assert not r.ok
    assert torch.cuda.memory_allocated() == before  # nothing of the attempt survives
    total = torch.cuda.get_device_properties(0).total_memory
    big = torch.empty(int(total * 0.5), dtype=torch.uint8, device="cuda")  # the cap is gone
    del big


@pytest.mark.gpu
def test_a_failed_measure_step_leaves_nothing_allocated():
    """The benchmark's largest-batch search on a GPU: an attempt that runs out of memory in its
    forward must leave memory_allocated where it was (the first H100 run: 4,540 MiB stayed)."""
    from course_utils.memory import measure_step, memory_cap

    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    with memory_cap(1.0):
        with catch_oom(verbose=False) as r:  # 16 channels x 64x128x128 x 4 samples: 256 MiB a layer
            measure_step(lambda: UNet3D(levels=4, channels=16), (4, 1, 64, 128, 128), n_classes=5)
    assert not r.ok
    assert torch.cuda.memory_allocated() == before


@pytest.mark.gpu
def test_allocator_demos_run():
    from course_utils import allocator

    states = allocator.caching_demo(64)
    assert states[-1].reserved <= states[-2].reserved  # empty_cache gives blocks back
    cached = [s for s in states if "del a" in s.label][0]
    assert cached.reserved > cached.allocated  # a freed block stays reserved


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU errors")
def test_cuda_only_helpers_say_so_on_cpu():
    from course_utils import allocator
    from course_utils.memory import cuda_peak, measure_step, memory_cap

    for call in (lambda: cuda_peak(lambda: None), lambda: allocator.caching_demo(),
                 lambda: measure_step(lambda: UNet3D(3, 4), (2, 1, 8, 8, 8), n_classes=5),
                 lambda: memory_cap(8).__enter__()):
        with pytest.raises(RuntimeError, match="needs a CUDA GPU.*recorded.show"):
            call()


# -- the predicted step's optimizer and peak, a weight saved twice, views, the CPU's OOM, the edges
# of largest_that_fits --------------------------------------------------------------------------
def _param_heavy():
    """Many parameters, almost no activations: the step's peak is in the optimizer step."""
    return nn.Sequential(nn.Conv3d(1, 64, 1), nn.Conv3d(64, 256, 1), nn.Conv3d(256, 5, 1))


SHAPE = (2, 1, 2, 2, 2)


def test_the_first_step_creates_adams_state_in_the_optimizer_step():
    """steady_state=False: Adam's two moments appear in opt.step(), after the backward. For a
    net whose parameters outweigh its activations that is where the peak is, and the peak holds
    parameters, gradients and both moments (a prediction without the step would show no state).
    Without this test the mutant ``predict-no-optimizer-step`` of tools/mutants.py (the predicted step without its
    optimizer step) survived the other tests."""
    pred = predict_step(_param_heavy, SHAPE, n_classes=5, steady_state=False)
    bd = pred.breakdown
    assert pred.log.peak_location[1] == "optimizer/other"
    assert bd["Gradient"] == bd["Parameter"] > 0
    assert bd["Optstate"] >= 2 * bd["Parameter"]
    assert pred.peak >= 4 * bd["Parameter"]


def test_a_cuda_prediction_uses_foreach_adam_and_a_cpu_one_does_not():
    """CUDA's default Adam is the multi-tensor (foreach) one; its temporaries differ from the
    single-tensor Adam the CPU uses, and here (peak in the step) the peak shows it.
    Without this test the mutant ``predict-no-foreach`` of tools/mutants.py (CUDA's prediction with single-tensor
    Adam) survived the other tests."""
    def adam(foreach):
        return lambda params: torch.optim.Adam(params, lr=1e-3, foreach=foreach)

    kw = dict(n_classes=5)
    cuda = predict_step(_param_heavy, SHAPE, **kw)
    assert cuda.peak == predict_step(_param_heavy, SHAPE, optimizer=adam(True), **kw).peak
    single = predict_step(_param_heavy, SHAPE, optimizer=adam(False), **kw).peak
    assert single != cuda.peak
    cpu = predict_step(_param_heavy, SHAPE, target="cpu", **kw)
    assert cpu.peak == predict_step(_param_heavy, SHAPE, target="cpu", optimizer=adam(False), **kw).peak


def test_the_peak_is_named_with_its_phase():
    """The tiny U-Net peaks in backward (activations dominate); the parameter-heavy net in the
    optimizer step.
    Without this test the mutant ``log-peak-phase-swapped`` of tools/mutants.py (a backward peak called forward)
    survived the other tests."""
    unet = predict_step(lambda: UNet3D(levels=3, channels=4), (2, 1, 8, 8, 8), n_classes=5)
    assert unet.log.peak_location[1] == "backward"
    assert predict_step(_param_heavy, SHAPE, n_classes=5).log.peak_location[1] == "optimizer/other"


def test_a_weight_saved_twice_is_one_parameter_storage():
    """Without this test the mutant ``meter-param-bytes-every-save`` of tools/mutants.py (a weight counted at each
    save) survived the other tests."""
    conv = nn.Conv3d(2, 2, 3, padding=1)
    x = torch.randn(1, 2, 6, 6, 6)
    with SavedTensorMeter(conv.parameters()) as m:
        y = conv(torch.relu(conv(x)))  # the same weight saved by two convolutions
    assert m.n_saved == 5  # x and the weight; ReLU's output; that output again and the weight
    assert m.param_bytes == conv.weight.nbytes
    assert m.current == 2 * x.nbytes  # x and ReLU's output, once each
    del y


def test_views_and_in_place_results_share_one_live_storage():
    """Without this test the mutant ``livebytes-views-counted-again`` of tools/mutants.py (a view or in-place result
    counted again) survived the other tests."""
    with LiveBytes() as live:
        a = torch.ones(1000)
        b, c = a.view(10, 100), a[:5]
        a.add_(1)
        assert live.current == live.peak == a.nbytes
        del a, b, c
        gc.collect()
        assert live.current == 0


def test_the_cpus_out_of_memory_is_caught_too():
    """On a CPU a failed allocation is a RuntimeError "... can't allocate memory ...", not
    torch.OutOfMemoryError: catch_oom explains it all the same.
    Without this test the mutant ``is-oom-misses-cpu-oom`` of tools/mutants.py (the CPU's failed allocation not
    recognised) survived the other tests."""
    with catch_oom(verbose=False) as r:
        torch.empty(2**62, dtype=torch.uint8)  # 4 EiB: refused at once, nothing is allocated
    assert not r.ok and "Out of memory" in r.explanation


def test_largest_that_fits_is_exact_for_every_small_case():
    """Every answer from 0 to limit, for every limit up to 40, with and without at_limit.
    Without this test the mutants ``largest-bisection-off-by-one`` and ``largest-limit-bound-off-by-one`` of
    tools/mutants.py (the bisection one step short, or below limit - 1) survived the other tests."""
    for limit in range(1, 41):
        for answer in range(0, limit + 1):
            got = largest_that_fits(lambda n: n <= answer, limit=limit, at_limit="return")
            assert got == answer, (limit, answer, got)
    for start in (1, 3, 5):
        for answer in range(start - 1, 30):
            assert largest_that_fits(lambda n: n <= answer, start=start, limit=64) == answer
    assert largest_that_fits(lambda n: n <= 4999, limit=5000) == 4999
    with pytest.raises(ValueError, match="everything up to limit"):
        largest_that_fits(lambda n: n <= 40, limit=40)


# -- limit_test: seed 003's forward column (notebook 03) -----------------------------------------
@pytest.mark.parametrize("n", [16, 50])
def test_forward_added_is_the_13_intermediates(n):
    """Notebook 03's text rests on this: what the forward pass adds, like for like with seed 003's "Forward" column."""
    run = run_limit_test(n)
    # three ReLU outputs (4 + 8 + 1 channels), each rounded up to the allocator's 512-byte blocks
    assert 0 <= run.forward_added - 13 * input_bytes(n) < 3 * 512
    # the total after forward also holds the weights, the input and the target
    assert run.after_forward - run.forward_added >= 2 * input_bytes(n)
    assert "forward added MiB" in run.row()


def test_seed003_excess_is_about_130_mb_at_small_n():
    """Notebook 03's text rests on this: seed 003's excess over the 13 intermediates at small N."""
    table = seed003_forward_table([50, 64, 350]).set_index("N")
    assert table.loc[50, "excess MB"] == pytest.approx(134 - 13 * 0.5, abs=0.1)
    assert table.loc[[50, 64], "excess MB"].between(100, 150).all()
    assert 18 < table.loc[350, "excess / input"] < 20


def test_limit_run_row_has_five_columns_and_the_rest_on_request():
    """Notebook 03's tables of the memory-limit step: five columns, the input, the saved bytes and
    the method with ``show_all=True``."""
    run = run_limit_test(50)
    assert list(run.row()) == ["N", "after forward MiB", "forward added MiB", "peak MiB", "forward / naive 26x"]
    full = run.row(show_all=True)
    assert list(full)[:5] == list(run.row()) and {"input MiB", "saved MiB", "method"} <= set(full)
    assert full["method"] == run.method and full["saved MiB"] == round(run.saved / MiB, 1)


def test_recorded_backward_excess_reads_both_kinds_of_gpu_record(tmp_path):
    """Notebook 03's account of the GPU's largest N rests on this: cuDNN's backward workspace in
    input volumes, read from a run's ``limit.json`` and from the kit's ``examples/seed003`` task,
    as the difference of the backward's rises (what was allocated before the step cancels)."""
    import json

    from course_utils.limit_test import recorded_backward_excess

    machine = {"gpu": "G", "date": "2026-01-01", "torch": "2.13", "cuda": "13"}
    row = {"N": 128, "predicted peak MiB": 248.0, "predicted after forward MiB": 120.0,
           "measured peak MiB": 361.0, "measured after forward MiB": 185.0}  # 65 MiB held before the step
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "limit.json").write_text(json.dumps({"machine": machine, "limit": [row]}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "kit.json").write_text(json.dumps({"machine": {**machine, "gpu": "H"}, "tasks": [
        {"name": "examples/densenet", "status": "done", "result": {"rows": []}},
        {"name": "examples/seed003", "status": "done", "result": {"rows": [{**row, "N": 256, "measured peak MiB": 1984.0 + 384 + 65,
                                                           "predicted peak MiB": 1984.0,
                                                           "predicted after forward MiB": 960.0,
                                                           "measured after forward MiB": 1025.0}]}}]}))
    table = recorded_backward_excess(tmp_path)
    assert list(table["GPU run"]) == ["G, 2026-01-01, torch 2.13", "H, 2026-01-01, torch 2.13"]
    assert list(table["extra / input volume"]) == [6.0, 6.0]  # 48 MiB at N = 128, 384 MiB at 256
    assert recorded_backward_excess(tmp_path / "none").empty


def test_recorded_diagnosis_reads_the_kits_op_by_op_run(tmp_path):
    """Notebook 03 says where cuDNN's backward workspace lives (a transient inside
    ``convolution_backward``) and that TF32 off removes it, from this reading of the kit's diagnosis:
    the peak above the step's start and the convolutions' transients, per setting, the newest run."""
    import json

    from course_utils.limit_test import recorded_diagnosis

    def ops(start, conv_transient):
        return [{"op": "detach", "before": start, "peak": start, "transient": 0},
                {"op": "aten.convolution_backward.default", "before": start, "peak": start + 3 * MiB,
                 "transient": conv_transient},
                {"op": "add_", "before": start, "peak": start + MiB, "transient": 0}]

    for run, workspace in (("2026-01-01-g", 7), ("2026-02-01-g", 2)):
        (tmp_path / run / "details").mkdir(parents=True)
        (tmp_path / run / "details" / "diagnose-seed003.json").write_text(json.dumps(
            {"blocks at the peak": [{"MiB": 1.0, "frames": []}], "cuDNN default": ops(10 * MiB, workspace * MiB),
             "TF32 off": ops(10 * MiB, 0)}))
    (tmp_path / "2026-02-01-g" / "kit.json").write_text(json.dumps(
        {"machine": {"gpu": "G", "date": "2026-02-01", "torch": "2.13"}}))
    table = recorded_diagnosis(tmp_path)
    assert list(table.index) == ["cuDNN default", "TF32 off"] and table.attrs["run"] == "G, 2026-02-01, torch 2.13"
    assert table.loc["cuDNN default", "convolution backward transients MiB"] == 2.0  # the newest run's
    assert table.loc["TF32 off", "convolution backward transients MiB"] == 0.0
    assert table["peak above the step's start MiB"].tolist() == [3.0, 3.0]
    assert recorded_diagnosis(tmp_path / "none").empty


def test_largest_n_on_a_card_applies_each_correction_in_turn():
    """Notebook 03's chain from the predicted largest N (8 GiB of tensors) to a real card's: each
    step a search over the predicted peak, each correction taking N down."""
    from course_utils.limit_test import largest_n_on_a_card

    budget = 2 * GiB
    steps = largest_n_on_a_card(budget, 256 * MiB, 6, 1.1)
    assert steps.iloc[0] == largest_that_fits(lambda k: run_limit_test(k).peak <= budget, start=16)
    assert steps.is_monotonic_decreasing and steps.iloc[-1] < steps.iloc[0]
    n = int(steps.iloc[2])
    assert run_limit_test(n).peak + 6 * input_bytes(n) <= budget - 256 * MiB
    assert run_limit_test(n + 1).peak + 6 * input_bytes(n + 1) > budget - 256 * MiB
    assert largest_n_on_a_card(budget, 0, 0, 1.0).nunique() == 1  # no correction, no change


def test_the_graph_walk_drawing_shades_what_autograd_saved():
    """Notebook 03's drawing of the graph walk: the input, the three ReLU outputs and the target
    are shaded (saved, 15 x the input), the three convolution outputs are not (freed, 13 x), each
    shaded box labelled with the backward nodes that saved it -- read from the walk, not assumed:
    with in-place ReLUs the convolution outputs are the saved storages."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_utils.limit_test import LimitTestNet, draw_saved, forward_tensors, make_inputs, saved_by
    from course_utils.memory import saved_tensors

    torch.manual_seed(0)
    net = LimitTestNet()
    x, target = make_inputs(8)
    loss, named = forward_tensors(net, x, target)
    assert torch.equal(loss, nn.functional.mse_loss(net(x), target))  # the graph net(x) builds
    rows = saved_tensors(loss, params=net.parameters())
    by = saved_by(named, rows)
    assert [n for n, _ in named] == ["input", "conv 1", "relu 1", "conv 2", "relu 2", "conv 3", "relu 3", "target"]
    assert {n for n, nodes in by.items() if nodes} == {"input", "relu 1", "relu 2", "relu 3", "target"}
    assert by["relu 1"] == ["relu: result", "conv: input"] and by["relu 3"] == ["relu: result", "MSE: self"]
    ax = draw_saved(named, rows)
    boxes = {p.get_label(): p for p in ax.patches if p.get_label() in by}
    assert {n for n, p in boxes.items() if p.get_gid() == "saved"} == {n for n, nodes in by.items() if nodes}
    assert len({p.get_facecolor() for p in boxes.values()}) == 2
    assert "15 x the input" in ax.get_title() and "13 x" in ax.get_title()
    plt.close(ax.figure)
    inplace = LimitTestNet(inplace=True)
    loss, named = forward_tensors(inplace, x, target)
    by = saved_by(named, saved_tensors(loss, params=inplace.parameters()))
    assert by["conv 1"] and by["conv 1"] == by["relu 1"]  # one storage: the ReLU wrote into the conv's output


def test_dropout_follows_cudas_fused_kernel():
    """ATen's dropout takes the fused kernel on a CUDA tensor (``native_dropout``: a bool mask
    kept for backward) and multiplies by a float noise tensor it keeps on a CPU tensor: the real
    dispatch on fake CUDA and CPU tensors says which, and the prediction for CUDA keeps 1 byte
    per element where the CPU keeps 4 (before cuda_dropout the prediction for CUDA kept 4)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    for device, fused in (("cuda", True), ("cpu", False)):
        with FakeTensorMode(), Ops() as ops:
            torch.nn.functional.dropout(torch.empty(8, 8, device=device), 0.1)
        assert ("native_dropout" in ops.names) is fused and ("bernoulli_" in ops.names) is not fused

    def net():
        return nn.Sequential(nn.Linear(64, 256), nn.Dropout(0.1), nn.Linear(256, 8))

    kw = dict(n_classes=8, optimizer=None, module_peaks=False)
    cuda = predict_step(net, (32, 64), (32,), **kw)
    cpu = predict_step(net, (32, 64), (32,), target="cpu", **kw)
    assert cpu.saved_peak - cuda.saved_peak == 32 * 256 * (4 - 1)
    x = torch.randn(4, 8, requires_grad=True)  # and CPU dropout is itself again afterwards
    assert type(torch.nn.functional.dropout(x, 0.1).grad_fn).__name__ == "MulBackward0"


# -- issue 43: the meter makes autograd's in-place check; a model on the meta device ---------------
def _relu_then_elu(elu_inplace: bool) -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.ELU(inplace=elu_inplace), nn.Conv2d(4, 2, 1))


@pytest.mark.parametrize("fake", [True, False])
def test_a_backward_that_pytorch_refuses_is_refused_by_the_prediction(fake):
    """Issue 43: with saved-tensor hooks set, autograd leaves its version check to them, and the
    meter's hooks made none: a step whose backward PyTorch refuses (an in-place ELU overwrites the
    output ReLU's backward needs) was predicted as if it ran. SavedTensorMeter now compares each
    saved tensor's version at unpack time, as autograd does."""
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):  # eager PyTorch
        _relu_then_elu(True)(torch.randn(2, 1, 8, 8)).sum().backward()
    kw = dict(fake=fake, target="cpu", module_peaks=False)
    with pytest.raises(SavedTensorModifiedError, match=r"\[2, 4, 8, 8\] float32, the output of ReluBackward0") as e:
        predict_step(lambda: _relu_then_elu(True), (2, 1, 8, 8), **kw)
    assert isinstance(e.value, MeasureError) and "Fix: make the operation that overwrites it out of place" in str(e.value)
    assert predict_step(lambda: _relu_then_elu(False), (2, 1, 8, 8), **kw).peak > 0


def _small_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))


def _on_meta() -> nn.Module:
    with torch.device("meta"):
        return _small_net()


def test_a_model_on_the_meta_device_is_predicted_or_refused_with_the_fix():
    """Issue 43: a model built on the meta device reached torch's internals in predict_step (a
    device mismatch) and log_step. A prediction needs shapes only: it now takes the meta model's;
    a real step (log_step, fake=False) refuses it, naming the meta device and the fix."""
    shape = (2, 1, 8, 8)
    assert predict_step(_on_meta, shape).peak == predict_step(_small_net, shape).peak
    with pytest.raises(MeasureError, match=r"predict_step\(fake=False\) needs tensors with data.*meta device.*Fix:"):
        predict_step(_on_meta, shape, fake=False, target="cpu")
    with pytest.raises(MeasureError, match="log_step needs tensors with data, and the Sequential's parameters are on "
                                           "the meta device.*Fix: build the model on the CPU"):
        log_step(_on_meta(), torch.randn(shape), torch.randint(0, 2, (2, 8, 8)))
    with pytest.raises(MeasureError, match=r"converts or moves the model .* Fix: build the model where and as it runs"):
        predict_step(lambda: _small_net().to("meta"), shape)
    built = _small_net()
    with pytest.raises(MeasureError, match=r"Sequential's 0.weight is a real tensor.*Fix: pass a function that builds"):
        predict_step(lambda: built, shape)


def test_a_shape_computed_with_numpy_is_a_shape():
    """Notebook 10 sizes its batch with NumPy: (np.int64(8), 1, ...) is a shape like (8, 1, ...)
    (a check that took only Python ints refused it, after this issue's first try)."""
    import numpy as np

    build = lambda: UNet3D(3, 4)  # noqa: E731
    got = predict_step(build, (np.int64(2), 1, 8, 8, 8), n_classes=5)
    assert got.peak == predict_step(build, (2, 1, 8, 8, 8), n_classes=5).peak
