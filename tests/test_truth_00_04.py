"""Truth pass 3, notebooks 00-04: the figures their prose now rests on.

* seed 003 (notebook 03): what the forward pass adds, like for like with the seed's "Forward"
  column (``LimitRun.forward_added``), and the seed's small-N excess over it;
* notebook 04: under CUDA autocast, cross-entropy's log-softmax runs in fp16 and only its NLL in
  fp32 (the real AutocastCUDA kernels on fake CUDA tensors), and the emulation agrees.
"""

import pytest
import torch
import torch.nn.functional as F

from course_utils import amp_rules
from course_utils.limit_test import input_bytes, run_limit_test, seed003_forward_table


@pytest.mark.parametrize("n", [16, 50])
def test_forward_added_is_the_13_intermediates(n):
    run = run_limit_test(n)
    # three ReLU outputs (4 + 8 + 1 channels), each rounded up to the allocator's 512-byte blocks
    assert 0 <= run.forward_added - 13 * input_bytes(n) < 3 * 512
    # the total after forward also holds the weights, the input and the target
    assert run.after_forward - run.forward_added >= 2 * input_bytes(n)
    assert "forward added MiB" in run.row()


def test_seed003_excess_is_about_130_mb_at_small_n():
    table = seed003_forward_table([50, 64, 350]).set_index("N")
    assert table.loc[50, "excess MB"] == pytest.approx(134 - 13 * 0.5, abs=0.1)
    assert table.loc[[50, 64], "excess MB"].between(100, 150).all()
    assert 18 < table.loc[350, "excess / input"] < 20


LOGITS, LABELS = (2, 5, 4, 6, 8), (2, 4, 6, 8)


def _by_op(rows):
    return {r["aten op"]: r for r in rows}


def test_cross_entropy_has_no_cuda_autocast_kernel_but_its_parts_do():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert not has("aten::cross_entropy_loss", "AutocastCUDA")
    assert has("aten::cross_entropy_loss", "AutocastCPU")
    assert has("aten::log_softmax.int", "AutocastCUDA") and has("aten::nll_loss2d", "AutocastCUDA")


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
def test_cross_entropy_log_softmax_runs_in_low_precision_through_real_cuda_kernels(low):
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
    rows = amp_rules.aten_dtypes(lambda x: F.log_softmax(x, 1), LOGITS, dtypes=(torch.float16,))
    assert _by_op(rows)["aten._log_softmax"]["output dtypes"] == ("float32",)


def test_amp_rules_docstring_does_not_put_cross_entropy_log_softmax_in_fp32():
    doc = " ".join(amp_rules.__doc__.split())
    assert "``_log_softmax`` runs in fp16" in doc


def test_aten_dtypes_refuses_bad_arguments():
    with pytest.raises(ValueError, match="device"):
        amp_rules.aten_dtypes(F.relu, (2,), device="mps")
    with pytest.raises(ValueError, match="dtypes"):
        amp_rules.aten_dtypes(F.relu, (2,), (3,), dtypes=(torch.float32,))
