"""amp_rules: CUDA's autocast rules applied on a CPU, op by op, checked against the dispatcher
and (on a GPU) against real CUDA autocast; the weight-cast cache, bfloat16, an op of unknown policy;
cross-entropy under CUDA autocast (notebook 04: log-softmax in fp16, only its NLL in fp32)."""

import contextlib

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from course_utils import UNet3D, predict_step
from course_utils.amp_rules import (
    cpu_only_ops, cuda_autocast_rules, cuda_policy, registered, unknown_cuda_ops,
)
from course_utils import amp_rules

H = torch.float16


def _ops():
    """Every op the course's nets use, with its inputs: name -> callable returning the output."""
    torch.manual_seed(0)
    x16 = torch.randn(2, 4, 4, 4, 4, dtype=H)
    x32 = torch.randn(2, 4, 4, 4, 4)
    conv = nn.Conv3d(4, 4, 3, padding=1)
    bn = nn.BatchNorm3d(4)
    lin = nn.Linear(4, 3)
    t = torch.randint(0, 4, (2, 4, 4, 4))
    return {
        "conv3d (fp32 in)": lambda: conv(x32),
        "batch_norm (fp16 in)": lambda: bn(x16),
        "relu": lambda: torch.relu(x16),
        "leaky_relu": lambda: F.leaky_relu(x16, 0.01),
        "max_pool3d (fp16 in)": lambda: F.max_pool3d(x16, 2),
        "upsample trilinear (fp16 in)": lambda: F.interpolate(x16, scale_factor=2, mode="trilinear",
                                                              align_corners=True),
        "pad": lambda: F.pad(x16, [0, 1, 0, 1, 0, 1]),
        "cat fp16 + fp16": lambda: torch.cat([x16, x16], 1),
        "cat fp16 + fp32": lambda: torch.cat([x16, x32], 1),
        "cross_entropy (fp16 logits)": lambda: F.cross_entropy(x16, t),
        "log_softmax (fp16 in)": lambda: torch.log_softmax(x16, 1),
        "sum (fp16 in)": lambda: x16.sum(),
        "mse_loss (fp16 in)": lambda: F.mse_loss(x16, x16),
        "linear": lambda: lin(x32[..., 0, 0]),
        "add fp16 + fp32": lambda: x16 + x32,
    }


#: CUDA autocast (float16) in torch 2.13, from aten/src/ATen/autocast_mode.h and the dispatcher
CUDA_EXPECTED = {
    "conv3d (fp32 in)": H, "batch_norm (fp16 in)": H, "relu": H, "leaky_relu": H,
    "max_pool3d (fp16 in)": H, "upsample trilinear (fp16 in)": torch.float32, "pad": H,
    "cat fp16 + fp16": H, "cat fp16 + fp32": torch.float32,
    "cross_entropy (fp16 logits)": torch.float32, "log_softmax (fp16 in)": torch.float32,
    "sum (fp16 in)": torch.float32, "mse_loss (fp16 in)": torch.float32, "linear": H,
    "add fp16 + fp32": torch.float32,
}
#: where CPU autocast differs (what a prediction made with the CPU's rules gets wrong)
CPU_DIFFERS = {"max_pool3d (fp16 in)": torch.float32,
               "upsample trilinear (fp16 in)": H, "sum (fp16 in)": H}


def _dtypes(rules):
    with rules:
        with torch.autocast("cpu", dtype=H):
            return {name: fn().dtype for name, fn in _ops().items()}


def test_the_dispatcher_says_which_ops_cuda_autocast_touches():
    assert unknown_cuda_ops() == frozenset()  # every registered op has a known policy
    assert cuda_policy("conv3d") == "lower_precision_fp"
    assert cuda_policy("upsample_trilinear3d") == "fp32"
    assert cuda_policy("log_softmax.int") == "fp32_set_opt_dtype"
    for op in ("max_pool3d", "cat", "batch_norm", "relu", "cross_entropy_loss"):
        assert cuda_policy(op) is None, op  # not on any CUDA list: runs in its inputs' dtype
    assert {"max_pool3d", "cat", "cross_entropy_loss"} <= cpu_only_ops()
    assert "upsample_trilinear3d" in registered("AutocastCUDA") - registered("AutocastCPU")


@pytest.mark.parametrize("name", list(CUDA_EXPECTED))
def test_each_op_follows_cuda_rules(name):
    assert _dtypes(cuda_autocast_rules())[name] == CUDA_EXPECTED[name]


def test_cpu_rules_differ_and_are_restored_after():
    cpu = _dtypes(contextlib.nullcontext())
    for name, dt in CPU_DIFFERS.items():
        assert cpu[name] == dt != CUDA_EXPECTED[name], name
    _dtypes(cuda_autocast_rules())
    assert _dtypes(contextlib.nullcontext()) == cpu  # the overrides are gone


def test_weights_are_cast_once_per_region_and_gradients_stay_fp32():
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def weight_casts(t):
        seen, stack, casts = set(), [t.grad_fn], []
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if node.name() == "ToCopyBackward0" and any(
                    getattr(f, "variable", None) is lin.weight for f, _ in node.next_functions):
                casts.append(node)
            stack.extend(f for f, _ in node.next_functions)
        return casts

    with cuda_autocast_rules(), torch.autocast("cpu", dtype=H):
        a, b = lin(x), lin(x)
    assert a.dtype == H
    (ca,), (cb,) = weight_casts(a), weight_casts(b)
    assert ca is cb  # one fp16 copy of the weight, used by both calls (autocast's cast cache)
    with cuda_autocast_rules(), torch.autocast("cpu", dtype=H):
        c = lin(x)
    assert weight_casts(c)[0] is not ca  # a new autocast region casts again
    (a.float().sum() + b.float().sum()).backward()
    assert lin.weight.grad.dtype == torch.float32


def test_checkpoint_recomputation_follows_the_same_rules():
    # checkpoint re-enters autocast for the recomputation: under different rules the recomputed
    # tensors would have other dtypes and checkpoint would raise
    torch.manual_seed(0)
    plain = UNet3D(levels=3, channels=4)
    net = UNet3D(levels=3, channels=4, checkpoint="level")
    net.load_state_dict(plain.state_dict())
    x, y = torch.randn(2, 1, 8, 8, 8), torch.randint(0, 5, (2, 8, 8, 8))
    losses = []
    for m in (plain, net):
        with cuda_autocast_rules():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                losses.append(F.cross_entropy(m(x), y))
            losses[-1].backward()
    # the recomputation ran the same ops in the same dtypes: the same loss and gradients, bit for
    # bit up to summation order, and every parameter reached
    assert losses[0].item() == losses[1].item()
    for (name, a), b in zip(plain.named_parameters(), net.parameters(), strict=True):
        assert b.grad is not None, name
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_predictions_name_their_rules():
    kw = dict(n_classes=5, autocast_dtype=H, optimizer=None)
    cuda = predict_step(lambda: UNet3D(levels=3, channels=4), (2, 1, 8, 8, 8), **kw)
    cpu = predict_step(lambda: UNet3D(levels=3, channels=4), (2, 1, 8, 8, 8), target="cpu", **kw)
    assert "CUDA autocast rules" in cuda.method and "CPU autocast rules" in cpu.method
    # CUDA's max-pool stays in fp16: less kept after forward than under the CPU's rules
    assert cuda.kept_after_forward < cpu.kept_after_forward


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CUDA_EXPECTED))
def test_emulation_matches_real_cuda_autocast(name):
    """On a GPU: the same op under real CUDA autocast gives the dtype the emulation gives."""
    emulated = _dtypes(cuda_autocast_rules())[name]
    with torch.device("cuda"):
        ops = _ops()
    with torch.autocast("cuda", dtype=H):
        real = ops[name]().dtype
    assert real == emulated


def test_lean_up_computes_the_same_and_saves_memory_only_under_autocast():
    """Under CUDA autocast trilinear upsampling runs in fp32; the seed's Up keeps that map and
    the fp32 concatenation alive through its DoubleConv. Up(lean=True) casts at once."""
    torch.manual_seed(0)
    plain, lean = UNet3D(levels=3, channels=4), UNet3D(levels=3, channels=4, lean_up=True)
    lean.load_state_dict(plain.state_dict())
    x = torch.randn(2, 1, 8, 12, 10)
    assert torch.equal(plain(x), lean(x))
    with cuda_autocast_rules(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(plain(x), lean(x))  # the conv casts to bf16 anyway
    kw = dict(n_classes=5, optimizer=None)
    shape = (2, 1, 16, 32, 32)
    for ac, lower in ((H, True), (None, False)):
        a = predict_step(lambda: UNet3D(levels=3, channels=8), shape, autocast_dtype=ac, **kw).peak
        b = predict_step(lambda: UNet3D(levels=3, channels=8, lean_up=True), shape, autocast_dtype=ac, **kw).peak
        assert (b < a) if lower else (b <= a)


@pytest.fixture(scope="module")
def real_kernels():
    """``python -m course_utils.amp_check --json`` in a process of its own: fake CUDA tensors run
    the installed torch's real AutocastCUDA kernels (a CUDA device guard, if one were reached on
    this CPU build, would abort the process, not raise)."""
    import json
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "course_utils.amp_check", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)["nets"]


@pytest.mark.emulated
def test_emulation_matches_the_real_autocast_cuda_kernels_op_by_op(real_kernels):
    assert {k.rsplit(",", 1)[0] for k in real_kernels} == {
        "seed 000 large", "seed 000 small", "seed 000 large, lean Up", "seed 004 DenseNet-169"}
    for key, traces in real_kernels.items():
        cuda, cpu = traces["cuda"], traces["cpu"]
        assert len(cuda) > 50, key  # the whole forward pass and the loss were traced
        for i, (real, emulated) in enumerate(zip(cuda, cpu, strict=True)):
            assert real == emulated, f"{key}, op {i}: real AutocastCUDA {real}, emulation {emulated}"
        assert len(cuda) == len(cpu), key


@pytest.mark.emulated
def test_the_traces_hold_what_the_course_teaches(real_kernels):
    # seed 000 under CUDA autocast fp16: convolutions in fp16, trilinear upsampling in fp32, the
    # concatenation promoted to fp32, the loss in fp32 (notebook 04); the lean Up casts back
    large = dict(real_kernels["seed 000 large, float16"]["cuda"])
    assert large["_VariableFunctionsClass.conv3d"] == ["float16"]
    assert large["interpolate"] == ["float32"] and large["_VariableFunctionsClass.cat"] == ["float32"]
    assert large["cross_entropy"] == ["float32"]
    lean = [d for op, d in real_kernels["seed 000 large, lean Up, float16"]["cuda"] if op == "_VariableFunctionsClass.cat"]
    assert lean and all(d == ["float16"] for d in lean)
    assert dict(real_kernels["seed 000 large, bfloat16"]["cuda"])["_VariableFunctionsClass.conv3d"] == ["bfloat16"]
    dense = dict(real_kernels["seed 004 DenseNet-169, float16"]["cuda"])
    assert dense["linear"] == ["float16"] and dense["binary_cross_entropy_with_logits"] == ["float32"]


@pytest.mark.emulated
def test_eval_mode_batchnorm_is_a_faithful_stand_in(real_kernels):
    # the fake-CUDA traces run BatchNorm in eval mode (its training kernel needs a GPU): under
    # the emulation, training mode gives the same dtypes (its only extra op counts batches)
    for key, traces in real_kernels.items():
        train = [e for e in traces["cpu train"] if any(d.startswith(("float", "bfloat")) for d in e[1])]
        assert train == traces["cpu"], key


def test_cudnn_rnn_is_cast_to_fp16_whatever_the_autocast_dtype():
    # CUDA builds register _cudnn_rnn for autocast apart from autocast_mode.h (AutocastRNN.cpp):
    # always float16. The CPU build does not register it; torch 2.11's CUDA build made the
    # emulation refuse to start until it knew this policy.
    from course_utils.amp_rules import _kernel, _policy_of

    assert _policy_of("_cudnn_rnn") == "fp16"
    a, b = torch.randn(2, 3, dtype=torch.bfloat16), torch.randn(3, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _kernel(torch.ops.aten.mm.default, "fp16")(a, b)
    assert out.dtype == torch.float16


# -- the weight-cast cache, bfloat16, an op of unknown policy ------------------------------------
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
    cast node, one copy in memory).
    Without this test the mutant ``amp-weight-cast-not-cached`` of tools/mutants.py (a weight cast again at every
    use) survived the other tests."""
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
    old weight).
    Without this test the mutant ``amp-cache-not-cleared`` of tools/mutants.py (the cast cache kept after the
    region) survived the other tests."""
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
    """Without this test the mutant ``amp-lower-precision-always-fp16`` of tools/mutants.py (bfloat16 autocast
    convolving in float16) survived the other tests."""
    conv = nn.Conv3d(2, 2, 3)
    with cuda_autocast_rules(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert conv(torch.randn(1, 2, 4, 4, 4)).dtype == torch.bfloat16


def test_an_op_of_unknown_policy_is_refused(monkeypatch):
    """A torch upgrade that registers a CUDA autocast op the lists do not know must fail loudly,
    not predict with wrong dtypes.
    Without this test the mutant ``amp-unknown-ops-accepted`` of tools/mutants.py (an op of unknown policy accepted
    silently) survived the other tests."""
    monkeypatch.setattr(amp_rules, "unknown_cuda_ops", lambda: frozenset({"new_op"}))
    with pytest.raises(RuntimeError, match=r"\['new_op'\].*does not know"):
        with cuda_autocast_rules():
            pass


# -- cross-entropy under CUDA autocast (notebook 04), aten_dtypes ---------------------------------
LOGITS, LABELS = (2, 5, 4, 6, 8), (2, 4, 6, 8)


def _by_op(rows):
    return {r["aten op"]: r for r in rows}


def test_cross_entropy_has_no_cuda_autocast_kernel_but_its_parts_do():
    """Notebook 04's text rests on this: under CUDA autocast cross-entropy runs as its parts, each on its own list."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert not has("aten::cross_entropy_loss", "AutocastCUDA")
    assert has("aten::cross_entropy_loss", "AutocastCPU")
    assert has("aten::log_softmax.int", "AutocastCUDA") and has("aten::nll_loss2d", "AutocastCUDA")


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
def test_cross_entropy_log_softmax_runs_in_low_precision_through_real_cuda_kernels(low):
    """Notebook 04's text rests on this: cross-entropy's log-softmax runs in fp16 and only its NLL in fp32 (the real
    AutocastCUDA kernels on fake CUDA tensors), and the emulation agrees."""
    rows = amp_rules.aten_dtypes(F.cross_entropy, LOGITS, LABELS, dtypes=(low, torch.long), autocast_dtype=low)
    ops = _by_op(rows)
    name = str(low).removeprefix("torch.")
    assert ops["aten._log_softmax"]["input dtypes"] == (name,)
    assert ops["aten._log_softmax"]["output dtypes"] == (name,)        # not fp32
    assert ops["aten.nll_loss2d_forward"]["input dtypes"][0] == "float32"  # NLL is on the fp32 list
    # the emulation the predictor uses traces the same ops with the same dtypes
    assert amp_rules.aten_dtypes(F.cross_entropy, LOGITS, LABELS, dtypes=(low, torch.long),
                                 autocast_dtype=low, device="cpu") == rows


def test_log_softmax_called_directly_returns_fp32_on_cuda():
    """Notebook 04's text rests on this: log-softmax called on its own is on CUDA's fp32 list."""
    rows = amp_rules.aten_dtypes(lambda x: F.log_softmax(x, 1), LOGITS, dtypes=(torch.float16,))
    assert _by_op(rows)["aten._log_softmax"]["output dtypes"] == ("float32",)


def test_amp_rules_docstring_does_not_put_cross_entropy_log_softmax_in_fp32():
    """Notebook 04's text rests on this: amp_rules' docstring, which it quotes, says where the log-softmax runs."""
    doc = " ".join(amp_rules.__doc__.split())
    assert "``_log_softmax`` runs in fp16" in doc


def test_aten_dtypes_refuses_bad_arguments():
    """aten_dtypes draws notebook 04's op-by-op dtype tables."""
    with pytest.raises(ValueError, match="device"):
        amp_rules.aten_dtypes(F.relu, (2,), device="mps")
    with pytest.raises(ValueError, match="dtypes"):
        amp_rules.aten_dtypes(F.relu, (2,), (3,), dtypes=(torch.float32,))


def test_loss_bytes_per_logit_inside_and_outside_autocast():
    """Notebook 04 (section 6) and exercise 04's recipe rest on these: the loss inside autocast keeps
    an fp16 log-softmax output and its fp32 copy (6 bytes a logit), on ``out.float()`` outside it
    one fp32 tensor (4), as in fp32; CPU autocast's own rules are restored after."""
    assert [amp_rules.loss_bytes_per_logit(w) for w in amp_rules.LOSS_PLACES] == [4.0, 6.0, 4.0]
    assert amp_rules.loss_bytes_per_logit("inside", (1, 3, 4, 4)) == 6.0  # 2D logits too
    assert "cross_entropy_loss" in amp_rules.registered("AutocastCPU")
    with pytest.raises(ValueError, match="use one of"):
        amp_rules.loss_bytes_per_logit("under")


def test_amp_checks_command_refuses_a_wrong_argument_before_the_traces(monkeypatch, capsys):
    """Issue 43: ``python -m course_utils.amp_check`` read ``--json`` out of sys.argv and ignored
    anything else, so ``--jsn`` ran every trace and printed lines instead of the JSON asked for."""
    from course_utils import amp_check

    def traces():
        raise AssertionError("the traces started before the arguments were read")
    monkeypatch.setattr(amp_check, "compare_with_real_kernels", traces)
    for argv in (["--jsn"], ["--json", "extra"], ["-x"]):
        with pytest.raises(SystemExit) as e:
            amp_check.main(argv)
        assert e.value.code == 2 and "usage: python -m course_utils.amp_check" in capsys.readouterr().err
    same = {"cuda": [["aten.conv3d", ["torch.float16"]]], "cpu": [["aten.conv3d", ["torch.float16"]]]}
    monkeypatch.setattr(amp_check, "compare_with_real_kernels", lambda: {"net, float16": same})
    assert amp_check.main([]) == 0 and capsys.readouterr().out == "net, float16: 1 ops, emulation agrees\n"
    differs = {"net, float16": {**same, "cpu": [["aten.conv3d", ["torch.float32"]]]}}
    monkeypatch.setattr(amp_check, "compare_with_real_kernels", lambda: differs)
    assert amp_check.main([]) == 1 and "DIFFERS" in capsys.readouterr().out
    assert amp_check.main(["--json"]) == 0 and '"nets": {"net, float16"' in capsys.readouterr().out
