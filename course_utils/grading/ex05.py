"""Exercise 05 -- in-place ReLU: where it is safe, a broken function fixed, where a net's peak
is, and whether in-place ReLU lowers it."""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import nn

from ..memory import predict_step
from ..unet import UNet3D, bn_relu, bn_relu_inplace
from .core import CheckFailed, Exercise, answer, expect_close, expect_keys, reference, short

EX = Exercise("05", "In-place ReLU", names=("answers", "fixed", "where_is_the_peak", "inplace_lowers_peak"))

PRECEDING_OPS: dict[str, Callable[[], nn.Module]] = {
    "Conv3d": lambda: nn.Conv3d(2, 2, 3, padding=1),
    "BatchNorm3d": lambda: nn.BatchNorm3d(2),
    "Sigmoid": nn.Sigmoid,
    "Tanh": nn.Tanh,
    "MaxPool3d": lambda: nn.MaxPool3d(2),
    "ReLU": nn.ReLU,
    "Softplus": nn.Softplus,
    "ELU": nn.ELU,
}


@answer
@functools.lru_cache(maxsize=None)
def inplace_relu_is_safe_after(op: str) -> bool:
    """By experiment: does ``ReLU(inplace=True)`` after ``op`` leave backward working?"""
    x = torch.randn(2, 2, 4, 4, 4, requires_grad=True)
    out = nn.ReLU(inplace=True)(PRECEDING_OPS[op]()(x * 1))
    try:
        out.sum().backward()
        return True
    except RuntimeError:
        return False


ANSWERS = EX.part("answers", "which ops may be followed by ReLU(inplace=True)", 2, ["answers"], secret=True)
FIXED = EX.part("fixed", "fixed(x): same values as broken(x), working backward, right gradient", 2, ["fixed"])
PEAK = EX.part("peak", "where_is_the_peak: the module and phase at a net's predicted peak", 2,
               ["where_is_the_peak"])
LOWERS = EX.part("lowers", "inplace_lowers_peak: does in-place ReLU lower a net's predicted peak?", 1,
                 ["inplace_lowers_peak"])


@ANSWERS.observe
def _(answers, seed):
    got = answers()
    if not isinstance(got, dict):
        raise TypeError(f"answers() must return a dict op -> bool, got {type(got).__name__}")
    return {str(k): v for k, v in got.items()}


@ANSWERS.judge
def _(got, seed):
    expect_keys("answers(): answer every op and only those", got, PRECEDING_OPS, "ops")
    not_bool = sorted(k for k in PRECEDING_OPS if not isinstance(got[k], bool))
    if not_bool:
        raise CheckFailed(f"answer True or False; not a bool for: {not_bool}")
    wrong = sum(got[op] != inplace_relu_is_safe_after(op) for op in PRECEDING_OPS)
    if wrong:
        raise CheckFailed(f"{wrong} of {len(PRECEDING_OPS)} answers are wrong: for each op, ask what "
                          "it saves for backward, then try it")


def broken(x):
    """The function of the exercise: its backward fails."""
    y = torch.sigmoid(x)
    y.mul_(2)
    return y


@FIXED.observe
def _(fixed, seed):
    x = torch.randn(7, generator=torch.Generator().manual_seed(seed % 2**31)).requires_grad_()
    y = fixed(x)
    y.sum().backward()
    return {"y": y, "grad": x.grad}


@FIXED.judge
def _(got, seed):
    expect_keys("fixed", got, ("y", "grad"))
    x = torch.randn(7, generator=torch.Generator().manual_seed(seed % 2**31))
    s = torch.sigmoid(x)
    expect_close("fixed(x)", got["y"], 2 * s)
    expect_close("the gradient of fixed(x).sum()", got["grad"], 2 * s * (1 - s))


# -- where is the peak, and does in-place ReLU lower it -----------------------------------------
def _net(inplace: bool, checkpoint: bool, levels: int, channels=4, **kw) -> Callable[[], nn.Module]:
    norm_act = bn_relu_inplace if inplace else bn_relu
    return functools.partial(UNet3D, levels=levels, channels=channels, norm_act=norm_act,
                             checkpoint="level" if checkpoint else None, **kw)


#: the nets of the last two parts: (description, build plain, build in-place, input shape). Where
#: their plain builds peak (``MemoryLog.peak_location``, the course's one definition): the first
#: in the loss's gradient at the start of backward, outside every module (so the hook table's
#: largest row names another module); the second in backward, inside a module that the checkpoint
#: is recomputing; the third at the end of the forward pass, in its top decoder's last ReLU (its
#: top decoder is narrower than the level below it, whose upsampled map is still alive there).
#: So a function that always answers one phase fails, and so does the largest hook-table row.
#: In-place ReLU lowers the predicted peaks of the second and third, not the first.
NETS = {
    "U-Net, 3 levels": (_net(False, False, 3), _net(True, False, 3), (2, 1, 16, 16, 16)),
    "U-Net, 3 levels, every level checkpointed": (_net(False, True, 3), _net(True, True, 3), (2, 1, 16, 16, 16)),
    "U-Net, 2 levels, 8 and 16 channels": (_net(False, False, 2, (8, 16), decoder_channels=(8,)),
                                           _net(True, False, 2, (8, 16), decoder_channels=(8,)),
                                           (1, 1, 16, 24, 24)),
}

#: the phases ``peak_location`` names
PHASES = ("forward", "backward", "optimizer/other")


@reference
@functools.lru_cache(maxsize=None)
def peak_of(name: str, inplace: bool) -> tuple[str, str, int]:
    """(module, phase, peak bytes) of the net's predicted step (no optimizer): where the step's
    peak is, as ``MemoryLog.peak_location`` defines it (in its order)."""
    plain, inp, shape = NETS[name]
    pred = predict_step(inp if inplace else plain, shape, n_classes=5, optimizer=None)
    module, phase = pred.log.peak_location
    return module, phase, pred.peak


@PEAK.observe
def _(where_is_the_peak, seed):
    out = {}
    for name, (plain, _, shape) in NETS.items():
        got = where_is_the_peak(plain, shape)
        out[name] = list(got) if isinstance(got, (tuple, list)) else got
    return out


@PEAK.judge
def _(got, seed):
    expect_keys("where_is_the_peak", got, NETS, "nets")
    for name in NETS:
        answer = got.get(name)
        if not (isinstance(answer, list) and len(answer) == 2 and all(isinstance(a, str) for a in answer)):
            raise CheckFailed(f"{name}: return a pair of strings (module name, phase), got {short(answer, 80)}")
        module, phase = answer
        ref_module, ref_phase, _ = peak_of(name, False)
        if phase not in PHASES and module in PHASES:
            raise CheckFailed(f"{name}: return (module, phase) -- module first, as peak_location "
                              "gives it")
        if phase not in PHASES:
            raise CheckFailed(f"{name}: the phase is one of {', '.join(PHASES)}, got {short(phase, 40)}")
        checkpointed = "checkpointed" in name
        if phase != ref_phase:
            why = ("; in a checkpointed net a module's forward runs a second time during backward "
                   "(the recomputation, notebook 07), and that moment belongs to the backward phase"
                   if checkpointed and phase == "forward" else "")
            raise CheckFailed(f"{name}: that is not the phase the predicted peak falls in (the peak "
                              f"is the step's largest live-bytes moment, .peak){why}")
        if module != ref_module:
            outside = ref_module.startswith("(")
            why = ("; the hook table samples memory only when a module's hook fires, and the peak can "
                   "fall between two rows -- inside an op, or outside every module (the loss, the "
                   "optimizer), so the largest row is not always the peak: use the log's "
                   "peak_location" if outside or not checkpointed else
                   "; during backward a checkpointed module runs its forward again, and the peak "
                   "can be inside that recomputation")
            raise CheckFailed(f"{name}: {short(module, 60)} is not where the predicted peak is (the "
                              f"module running at the moment of .peak){why}")


@LOWERS.observe
def _(inplace_lowers_peak, seed):
    return {name: inplace_lowers_peak(plain, inp, shape) for name, (plain, inp, shape) in NETS.items()}


@LOWERS.judge
def _(got, seed):
    expect_keys("inplace_lowers_peak", got, NETS, "nets")
    wrong = []
    for name in NETS:
        expected = peak_of(name, True)[2] < peak_of(name, False)[2]
        if not isinstance(got.get(name), bool):
            raise CheckFailed(f"{name}: return True or False, got {short(got.get(name), 80)}")
        if got[name] != expected:
            wrong.append(name)
    if wrong:
        raise CheckFailed(f"wrong for {len(wrong)} of {len(NETS)} nets: compare the predicted peaks "
                          "of the two builds")


def check_inplace(answers, fixed, verbose: bool = True):
    """Instant feedback on ``answers`` and ``fixed``."""
    return EX.run(["answers", "fixed"], {"answers": answers, "fixed": fixed}, verbose=verbose)


def check_peak(where_is_the_peak, inplace_lowers_peak, verbose: bool = True):
    """Instant feedback on ``where_is_the_peak`` and ``inplace_lowers_peak``."""
    return EX.run(["peak", "lowers"], {"where_is_the_peak": where_is_the_peak,
                                       "inplace_lowers_peak": inplace_lowers_peak}, verbose=verbose)
