"""Exercise 01 -- the U-Net's DoubleConv and Up blocks, checked by their values.

Parameter counts and shapes cannot tell a right block from a wrong one (a swapped layer order,
nearest upsampling, ``[x, skip]`` concatenation or one-sided padding all keep them). So the check
gives the learner's block and ``course_utils.unet``'s the *same* weights -- every Conv3d and
BatchNorm3d, in the order they were registered, filled from the seed -- and compares the outputs
on the same input.
"""

from __future__ import annotations

import functools
import itertools

import torch
from torch import nn

from .. import unet
from ..unet import count_parameters
from .core import (CheckFailed, Exercise, expect_close, expect_equal, expect_int, expect_keys, expect_list,
                   expect_str, reference, seeded)

EX = Exercise("01", "DoubleConv and Up", names=("DoubleConv", "Up"),
              refused={"course_utils.unet": ("DoubleConv", "Up")})


def set_weights(module: nn.Module, seed: int) -> list[list]:
    """Fill every Conv3d and BatchNorm3d of ``module`` (registration order) from the seed; put it
    in training mode. Returns [kind, index, shapes] per layer, for the messages."""
    module.train()
    layers = []
    counts = {"Conv3d": 0, "BatchNorm3d": 0}
    with torch.no_grad():
        for m in module.modules():
            kind = type(m).__name__ if isinstance(m, (nn.Conv3d, nn.BatchNorm3d)) else None
            if kind is None:
                continue
            k = counts[kind]
            counts[kind] += 1
            g = seeded(seed, 1 if kind == "Conv3d" else 2, k)
            if kind == "Conv3d":
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / fan_in**0.5)
                if m.bias is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
            else:
                if m.weight is not None:
                    m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                    m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
            layers.append([kind, k, [list(p.shape) for p in m.parameters(recurse=False)]])
    return layers


def _dc_input(seed: int) -> torch.Tensor:
    return torch.randn(2, 3, 5, 6, 7, generator=seeded(seed, 10))


def _up_inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    # sizes chosen so that the upsampled map is 3, 2 and 0 voxels short of the skip: the padding
    # must be split between both sides
    g = seeded(seed, 11)
    return torch.randn(1, 8, 2, 3, 5, generator=g), torch.randn(1, 4, 7, 8, 10, generator=g)


DC_PARAMS = EX.part("dc_params", "DoubleConv: parameter counts (1->64, 64->128, 512->512)", 1, ["DoubleConv"])
DC_VALUES = EX.part("dc_values", "DoubleConv: output equals the reference block's (same weights)", 2, ["DoubleConv"])
UP_VALUES = EX.part("up_values", "Up: output on odd sizes equals the reference block's (same weights)", 2, ["Up"])
UP_PARAMS = EX.part("up_params", "Up: parameter count and output shape of Up(96, 32)", 1, ["Up"])
SEED000 = EX.part("seed000", "seed 000's two nets built from your blocks: exact parameter counts", 1,
                  ["DoubleConv", "Up"])

DC_SIZES = ((1, 64), (64, 128), (512, 512))
SEED000_NETS = ("large", "small")


@reference
@functools.lru_cache(maxsize=None)
def _reference_count(block: str, *args: int) -> int:
    return count_parameters(getattr(unet, block)(*args))


@DC_PARAMS.observe
def _(DoubleConv, seed):
    return [count_parameters(DoubleConv(a, b)) for a, b in DC_SIZES]


@DC_PARAMS.judge
def _(got, seed):
    expect_list("DoubleConv parameter counts", got, len(DC_SIZES), "counts (one per block size)")
    for (a, b), n in zip(DC_SIZES, got, strict=True):
        expect_int(f"parameters of DoubleConv({a}, {b})", n)
        expect_equal(f"parameters of DoubleConv({a}, {b})", n, _reference_count("DoubleConv", a, b))


@DC_VALUES.observe
def _(DoubleConv, seed):
    block = DoubleConv(3, 4)
    layers = set_weights(block, seed)
    return {"layers": layers, "out": block(_dc_input(seed))}


def _layers(got: dict, what: str) -> list:
    """The observed [kind, index, parameter shapes] rows, checked for form."""
    layers = expect_list(f"{what}: layers", got["layers"])
    for k, lay in enumerate(layers):
        expect_list(f"{what}: layer row {k + 1}", lay, 3, "items (kind, index, shapes)")
        expect_str(f"{what}: layer row {k + 1} kind", lay[0])
        expect_int(f"{what}: layer row {k + 1} index", lay[1])
        for shape in expect_list(f"{what}: layer row {k + 1} shapes", lay[2]):
            for v in expect_list(f"{what}: layer row {k + 1} shape", shape):
                expect_int(f"{what}: layer row {k + 1} shape", v)
    rows = [(lay[0], lay[1]) for lay in layers]
    if len(set(rows)) != len(rows):
        raise CheckFailed(f"{what}: a layer is listed twice")
    return layers


def _judge_values(got: dict, ref: nn.Module, expected: torch.Tensor, what: str, seed: int) -> None:
    ref_layers = set_weights(ref, seed)
    expect_keys(what, got, ("layers", "out"))
    layers = _layers(got, what)
    kinds = [lay[0] for lay in layers]
    ref_kinds = [lay[0] for lay in ref_layers]
    for kind in ("Conv3d", "BatchNorm3d"):
        if kinds.count(kind) != ref_kinds.count(kind):
            raise CheckFailed(f"{what} has {kinds.count(kind)} {kind} layers; the block needs "
                              f"{ref_kinds.count(kind)}")
    shapes = {(lay[0], lay[1]): lay[2] for lay in layers}
    if set(shapes) != {(kind, k) for kind, k, _ in ref_layers}:
        raise CheckFailed(f"{what}: the layers are not numbered 0, 1, ... in the order they were registered")
    for kind, k, ref_shapes in ref_layers:
        if shapes[(kind, k)] != ref_shapes:
            raise CheckFailed(f"{what}: {kind} number {k + 1} has parameters of shapes "
                              f"{shapes[(kind, k)]}, expected {ref_shapes}")
    out = got["out"]
    if isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(expected.shape):
        try:
            expect_close(f"{what}: output", out, expected, atol=1e-4, rtol=1e-4)
        except CheckFailed as err:
            raise CheckFailed(f"{err}. The layers and shapes are right, so look at the order of "
                              "the operations (and, for Up, the upsampling mode, the padding of "
                              "both sides and the order of the concatenation)") from None
    else:
        expect_close(f"{what}: output", out, expected)


@DC_VALUES.judge
def _(got, seed):
    ref = unet.DoubleConv(3, 4)
    set_weights(ref, seed)
    _judge_values(got, ref, ref(_dc_input(seed)).detach(), "DoubleConv(3, 4)", seed)


@UP_VALUES.observe
def _(Up, seed):
    block = Up(12, 4)
    layers = set_weights(block, seed)
    return {"layers": layers, "out": block(*_up_inputs(seed))}


@UP_VALUES.judge
def _(got, seed):
    ref = unet.Up(12, 4)
    set_weights(ref, seed)
    _judge_values(got, ref, ref(*_up_inputs(seed)).detach(), "Up(12, 4)", seed)


@UP_PARAMS.observe
def _(Up, seed):
    up = Up(96, 32)
    out = up(torch.randn(1, 64, 3, 4, 5), torch.randn(1, 32, 7, 9, 10))
    return {"params": count_parameters(up), "shape": list(out.shape)}


@reference
@functools.lru_cache(maxsize=None)
def _up_reference() -> tuple[int, list[int]]:
    ref = unet.Up(96, 32)
    return count_parameters(ref), list(ref(torch.randn(1, 64, 3, 4, 5), torch.randn(1, 32, 7, 9, 10)).shape)


@UP_PARAMS.judge
def _(got, seed):
    expect_keys("Up(96, 32)", got, ("params", "shape"))
    params, shape = _up_reference()
    expect_int("parameters of Up(96, 32)", got["params"])
    expect_equal("parameters of Up(96, 32)", got["params"], params)
    expect_equal("output shape of Up(96, 32) for a (1, 64, 3, 4, 5) input and a (1, 32, 7, 9, 10) skip",
                 got["shape"], shape)


def _seed000_count(DoubleConv, Up, variant: str) -> int:
    cfg = unet.SEED000_VARIANTS[variant]
    enc, dec = cfg["channels"], cfg["decoder_channels"]
    total = count_parameters(DoubleConv(1, enc[0]))
    total += sum(count_parameters(DoubleConv(a, b)) for a, b in itertools.pairwise(enc))
    below = enc[-1]
    for i, out in enumerate(dec):
        total += count_parameters(Up(below + enc[len(enc) - 2 - i], out))
        below = out
    return total + count_parameters(unet.OutConv(below, 5))


@reference
@functools.lru_cache(maxsize=None)
def _seed000_reference(variant: str) -> int:
    return count_parameters(unet.seed000_unet(variant))


@SEED000.observe
def _(DoubleConv, Up, seed):
    return {v: _seed000_count(DoubleConv, Up, v) for v in SEED000_NETS}


@SEED000.judge
def _(got, seed):
    expect_keys("seed 000's nets", got, SEED000_NETS, "nets")
    for variant in SEED000_NETS:
        expect_int(f"trainable parameters of the {variant} net", got[variant])
        expect_equal(f"trainable parameters of the {variant} net", got[variant], _seed000_reference(variant))


def check_double_conv(DoubleConv, verbose: bool = True):
    """Instant feedback on your ``DoubleConv``."""
    return EX.run(["dc_params", "dc_values"], {"DoubleConv": DoubleConv}, verbose=verbose)


def check_up(Up, DoubleConv, verbose: bool = True):
    """Instant feedback on your ``Up`` (and both seed 000 nets built from your blocks)."""
    return EX.run(["up_values", "up_params", "seed000"], {"Up": Up, "DoubleConv": DoubleConv},
                  verbose=verbose)
