"""Exercise 09 -- split the U-Net in two stages; how many bytes cross the cut."""

from __future__ import annotations

import functools

import torch

from ..unet import UNet3D, level_shapes, seed000_unet
from .core import (CheckFailed, Exercise, expect_close, expect_equal, expect_grads_close, expect_int, expect_items,
                   expect_keys, expect_tensor, reference, seeded, seeded_build)

EX = Exercise("09", "Model parallel", names=("split_unet", "boundary_bytes"),
              refused={"course_utils.parallel.pipeline": ("EncoderStage", "DecoderStage", "TwoStageUNet")})


def _net(seed: int) -> UNet3D:
    return seeded_build(lambda: UNet3D(levels=3, channels=4), seeded(seed, 90))


def _input(seed: int) -> torch.Tensor:
    return torch.randn(2, 1, 8, 8, 8, generator=seeded(seed, 91))


def run_split(split_unet, seed: int) -> dict:
    """Split the seed's U-Net with ``split_unet``, run ``stage2(stage1(x))`` and backward; returns
    the parameters the stages share and cover, the output and every parameter's gradient by name."""
    net = _net(seed)
    stages = split_unet(net)
    if not (isinstance(stages, (tuple, list)) and len(stages) == 2):
        raise CheckFailed(f"split_unet must return (stage1, stage2), got {type(stages).__name__}")
    ids = [{id(p) for p in s.parameters()} for s in stages]
    out = stages[1](stages[0](_input(seed)))
    out.sum().backward()
    return {"shared": len(ids[0] & ids[1]), "covered": len(ids[0] | ids[1]),
            "total": len(list(net.parameters())), "out": out.detach(),
            "grads": {n: p.grad for n, p in net.named_parameters()}}


@reference
@functools.lru_cache(maxsize=4)
def unsplit(seed: int) -> dict:
    """The reference: the whole net's output and gradients on the same input (cached per seed)."""
    net = _net(seed)
    out = net(_input(seed))
    out.sum().backward()
    return {"out": out.detach(), "grads": {n: p.grad for n, p in net.named_parameters()}}


DISJOINT = EX.part("disjoint", "the stages share no parameter and together hold them all", 1, ["split_unet"])
OUTPUT = EX.part("output", "stage2(stage1(x)) equals net(x)", 2, ["split_unet"])
GRADS = EX.part("grads", "the gradients equal the unsplit net's", 1, ["split_unet"])
BOUNDARY = EX.part("boundary", "boundary_bytes: the bytes that cross the cut in the forward pass", 2,
                   ["boundary_bytes"])


def split_observed(got, seed: int) -> dict:
    """``run_split``'s observation, checked for form: three counts, the output, and one gradient
    (or None) per parameter of the judge's own net, by name, with its shape and dtype."""
    expect_keys("the observed split", got, ("shared", "covered", "total", "out", "grads"))
    for key in ("shared", "covered", "total"):
        if expect_int(f"the number of parameters ({key})", got[key]) < 0:
            raise CheckFailed(f"the number of parameters ({key}) is negative")
    expect_tensor("stage2(stage1(x))", got["out"])
    params = dict(_net(seed).named_parameters())
    expect_keys("the gradients", got["grads"], params, "parameters")
    for name, p in params.items():
        expect_tensor(f"the gradient of {name}", got["grads"][name], p.shape, p.dtype, none_ok=True)
    return got


@DISJOINT.observe
def _(split_unet, seed):
    return run_split(split_unet, seed)


@DISJOINT.judge
def _(got, seed):
    split_observed(got, seed)
    # the counts are the learner's stages' parameters; the net's own count is the judge's
    total = len(list(_net(seed).parameters()))
    expect_equal("parameters of the net", got["total"], total)
    if got["shared"]:
        raise CheckFailed(f"{got['shared']} parameters are in both stages")
    expect_equal("parameters in the two stages together", got["covered"], total)


@OUTPUT.observe
def _(split_unet, seed):
    return run_split(split_unet, seed)


@OUTPUT.judge
def _(got, seed):
    split_observed(got, seed)
    expect_close("output", got["out"], unsplit(seed)["out"])


@GRADS.observe
def _(split_unet, seed):
    return run_split(split_unet, seed)


@GRADS.judge
def _(got, seed):
    split_observed(got, seed)
    ref = unsplit(seed)["grads"]
    for n in ref:
        if got["grads"].get(n) is None:
            raise CheckFailed(f"{n} got no gradient: the stages must use the net's own blocks")
    names = list(ref)
    expect_grads_close("gradient of parameter", [got["grads"][n] for n in names], [ref[n] for n in names])


# -- boundary_bytes(net, input_shape, dtype) ----------------------------------------------------
def boundary_cases(seed: int) -> list[dict]:
    """The nets and inputs ``boundary_bytes`` is asked about: seed 000's large net at its fp16 batch,
    and a U-Net whose depth, batch and volume are drawn from the seed."""
    g = seeded(seed, 92)
    levels = int(torch.randint(3, 6, (1,), generator=g))
    side = 2 ** (levels - 1)
    vol = [int(v) * side + int(w) for v, w in zip(torch.randint(2, 4, (3,), generator=g),
                                                  torch.randint(0, side, (3,), generator=g), strict=True)]
    return [
        {"net": "seed000 large", "shape": [2, 1, 26, 150, 320], "dtype": "float16"},
        {"net": f"UNet3D(levels={levels}, channels=8)", "levels": levels,
         "shape": [int(torch.randint(1, 4, (1,), generator=g)), 1, *vol], "dtype": "float32"},
    ]


def _build(case: dict):
    with torch.device("meta"):
        if case["net"] == "seed000 large":
            return seed000_unet("large")
        return UNet3D(levels=case["levels"], channels=8)


def _case_input(case: dict) -> tuple:
    """What a row of the observation names: the net, the input shape, the dtype."""
    return case["net"], case["shape"], case["dtype"]


@BOUNDARY.observe
def _(boundary_bytes, seed):
    return [[*_case_input(c), boundary_bytes(_build(c), tuple(c["shape"]), getattr(torch, c["dtype"]))]
            for c in boundary_cases(seed)]


@reference
def reference_boundary(case: dict) -> int:
    """The bytes that cross the cut for ``case``: every skip and the encoder's output (``inc`` and
    the ``downs``' outputs), at the case's batch and dtype."""
    net = _build(case)
    rows = level_shapes(net, case["shape"][2:], batch=case["shape"][0])
    size = torch.empty((), dtype=getattr(torch, case["dtype"])).element_size()
    return sum(int(torch.Size(shape).numel()) * size for name, shape in rows
               if name == "inc" or name.startswith("downs."))


@BOUNDARY.judge
def _(got, seed):
    cases = boundary_cases(seed)
    values = expect_items("boundary_bytes", got, [_case_input(c) for c in cases], what="nets and inputs")
    for case, value in zip(cases, values, strict=True):
        name, shape, dtype = _case_input(case)
        expect_int(f"boundary_bytes({name}, {tuple(shape)}, {dtype})", value)
        expect_equal(f"boundary_bytes({name}, {tuple(shape)}, {dtype})", value, reference_boundary(case))


def check_split(split_unet, verbose: bool = True):
    """Instant feedback on your ``split_unet``."""
    return EX.run(["disjoint", "output", "grads"], {"split_unet": split_unet}, verbose=verbose)


def check_boundary(boundary_bytes, verbose: bool = True):
    """Instant feedback on your ``boundary_bytes``."""
    return EX.run(["boundary"], {"boundary_bytes": boundary_bytes}, verbose=verbose)
