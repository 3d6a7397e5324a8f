"""Exercise 06 -- the backward of In-Place Activated BatchNorm, from its output alone.

``abn_backward(z, dz, scale, bias, invstd, slope, training) -> (dx, dscale, dbias)``, where
``scale`` is the per-channel scale s the forward stored (``InPlaceABNFunction`` stores
|weight| + eps: notebook 06, section 2). The check computes ``z`` from a random ``x`` and compares
the learner's gradients with autograd's through ``batch_norm`` (with ``scale`` as its weight) +
``leaky_relu`` (float64), in training and eval mode, for 5D and 3D inputs, some scales negative
(the inversion holds for any s != 0), and inside ``InPlaceABN``'s autograd function against
``BatchNorm3d`` + ``LeakyReLU``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..inplace_abn import InPlaceABNFunction
from .core import CheckFailed, Exercise, expect_close, expect_list, reference, seeded

EX = Exercise("06", "The In-Place ABN backward", names=("abn_backward",),
              refused={"course_utils.inplace_abn": ("InPlaceABNFunction.backward",)})

EPS = 1e-5


def abn_case(seed: int, salt: int, shape: tuple[int, ...], training: bool) -> dict:
    """x, the per-channel scale, bias and statistics, z and an upstream gradient dz (float64)."""
    g = seeded(seed, 60, salt)
    c = shape[1]
    x = 2 * torch.randn(shape, generator=g, dtype=torch.float64) + 0.5
    scale = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5) * torch.where(
        torch.rand(c, generator=g) < 0.3, -1.0, 1.0).double()  # some negative scales
    bias = torch.randn(c, generator=g, dtype=torch.float64)
    mean_run = torch.randn(c, generator=g, dtype=torch.float64)
    var_run = torch.rand(c, generator=g, dtype=torch.float64) + 0.5
    slope = float(torch.rand(1, generator=g)) * 0.2 + 0.01
    dz = torch.randn(shape, generator=g, dtype=torch.float64)
    dims = [0, *range(2, x.dim())]
    view = (1, -1) + (1,) * (x.dim() - 2)
    if training:
        var, mean = torch.var_mean(x, dim=dims, unbiased=False)
    else:
        var, mean = var_run, mean_run
    invstd = torch.rsqrt(var + EPS)
    z = nn.functional.leaky_relu((x - mean.view(view)) * (invstd * scale).view(view) + bias.view(view), slope)
    return {"x": x, "z": z, "dz": dz, "scale": scale, "bias": bias, "invstd": invstd, "slope": slope,
            "mean_run": mean_run, "var_run": var_run, "training": training}


def run_learner(abn_backward, case: dict) -> list:
    """The learner's ``abn_backward`` on a case (copies of its tensors, so the case stays intact);
    returns ``[dx, dscale, dbias]``, or raises TypeError when it does not return three."""
    out = abn_backward(case["z"].clone(), case["dz"].clone(), case["scale"].clone(), case["bias"].clone(),
                       case["invstd"].clone(), case["slope"], case["training"])
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise TypeError(f"abn_backward must return (dx, dscale, dbias), got {type(out).__name__}")
    return list(out)


@reference
def autograd_gradients(case: dict) -> list[torch.Tensor]:
    """The reference ``[dx, dscale, dbias]``: autograd through BatchNorm (weight = the scale) and
    LeakyReLU on the same case (float64)."""
    x = case["x"].clone().requires_grad_()
    w = case["scale"].clone().requires_grad_()
    b = case["bias"].clone().requires_grad_()
    y = nn.functional.batch_norm(x, case["mean_run"].clone(), case["var_run"].clone(), w, b,
                                 training=case["training"], momentum=0.0, eps=EPS)
    z = nn.functional.leaky_relu(y, case["slope"])
    z.backward(case["dz"])
    return [x.grad, w.grad, b.grad]


def _judge_case(got: list, case: dict, what: str) -> None:
    expect_list(f"{what}: abn_backward", got, 3, "gradients (dx, dscale, dbias)")
    for name, g, e in zip(("dx", "dscale", "dbias"), got, autograd_gradients(case), strict=True):
        expect_close(f"{what}: {name}", g, e, atol=1e-8, rtol=1e-6)


TRAIN = EX.part("train", "training mode: dx, dscale, dbias equal autograd's (float64)", 2, ["abn_backward"])
EVAL = EX.part("eval", "eval mode (running statistics): equal autograd's", 2, ["abn_backward"])
ANY_DIMS = EX.part("dims", "any number of spatial dims (a 3D input: batch, channels, length)", 1,
                   ["abn_backward"])
MODULE = EX.part("module", "inside InPlaceABN's autograd function: equals BatchNorm3d + LeakyReLU", 1,
                 ["abn_backward"])

SHAPE_5D = (3, 4, 3, 2, 5)
SHAPE_3D = (4, 3, 11)


@TRAIN.observe
def _(abn_backward, seed):
    return run_learner(abn_backward, abn_case(seed, 1, SHAPE_5D, True))


@TRAIN.judge
def _(got, seed):
    _judge_case(got, abn_case(seed, 1, SHAPE_5D, True), "training")


@EVAL.observe
def _(abn_backward, seed):
    return run_learner(abn_backward, abn_case(seed, 2, SHAPE_5D, False))


@EVAL.judge
def _(got, seed):
    _judge_case(got, abn_case(seed, 2, SHAPE_5D, False), "eval")


@ANY_DIMS.observe
def _(abn_backward, seed):
    return run_learner(abn_backward, abn_case(seed, 3, SHAPE_3D, True))


@ANY_DIMS.judge
def _(got, seed):
    _judge_case(got, abn_case(seed, 3, SHAPE_3D, True), "a (4, 3, 11) input")


def _module_inputs(seed: int):
    g = seeded(seed, 61)
    x = torch.randn(2, 4, 3, 4, 5, generator=g)
    w = torch.rand(4, generator=g) + 0.5
    b = torch.randn(4, generator=g)
    return x, w, b


@MODULE.observe
def _(abn_backward, seed):
    class LearnerABN(InPlaceABNFunction):
        @staticmethod
        def backward(ctx, dz):
            z, scale, bias, invstd = ctx.saved_tensors  # scale = |weight| + eps
            dx, dscale, db = abn_backward(z, dz, scale, bias, invstd, ctx.slope, ctx.training)
            return dx, dscale * ctx.weight_sign, db, None, None, None, None, None, None  # d|w|/dw

    x, w, b = _module_inputs(seed)
    x2 = x.clone().requires_grad_()
    w2, b2 = w.clone().requires_grad_(), b.clone().requires_grad_()
    LearnerABN.apply(x2 * 1, w2, b2, torch.zeros(4), torch.ones(4), True, 0.1, EPS, 0.01).sum().backward()
    return [x2.grad, w2.grad, b2.grad]


@MODULE.judge
def _(got, seed):
    x, w, b = _module_inputs(seed)
    bn, act = nn.BatchNorm3d(4, eps=EPS), nn.LeakyReLU(0.01)
    with torch.no_grad():
        bn.weight.copy_(w)
        bn.bias.copy_(b)
    x1 = x.clone().requires_grad_()
    act(bn(x1)).sum().backward()
    expect_list("the gradients through InPlaceABN", got, 3, "gradients (input, weight, bias)")
    if any(g is None for g in got):
        raise CheckFailed("a gradient is None: return (dx, dscale, dbias)")
    for name, g, e in zip(("d input", "d weight", "d bias"), got, (x1.grad, bn.weight.grad, bn.bias.grad), strict=True):
        expect_close(name, g, e, atol=1e-4, rtol=1e-3)


def check_abn_backward(abn_backward, verbose: bool = True):
    """Instant feedback on your ``abn_backward``."""
    return EX.run([p.key for p in EX.parts], {"abn_backward": abn_backward}, verbose=verbose)
