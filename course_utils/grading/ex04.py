"""Exercise 04 -- a training step with autocast and GradScaler.

``amp_step(model, x, y, optimizer, scaler) -> float`` runs the forward under
``torch.autocast(x.device.type, dtype=torch.float16)``, the loss in fp32, ``scaler.scale(loss)
.backward()``, ``scaler.step(optimizer)``, ``scaler.update()``. The check watches the step from
the outside (the dtype a layer produces, the raw gradient, the parameters and the scale after)
and compares with an independent computation: the autocast forward's fp32 loss and gradient and
one plain SGD step on them, and GradScaler's own backoff factor for the overflowing step.
"""

from __future__ import annotations

import torch
from torch import nn

from .core import (CheckFailed, Exercise, expect_bool, expect_close, expect_float, expect_keys, expect_list,
                   expect_str, expect_tensor, expect_tensors, reference, seeded, seeded_build)

EX = Exercise("04", "autocast and GradScaler", names=("amp_step",))

LR = 0.1
SCALE = 2.0**10
OVERFLOW_SCALE = 2.0**24  # fp16 gradients of the activations overflow at this scale


def _model(seed: int) -> nn.Module:
    return seeded_build(lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), seeded(seed, 40))


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = seeded(seed, 41)
    return 3 * torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


def watch_step(amp_step, seed: int, init_scale: float) -> dict:
    """Run one ``amp_step`` on a fresh model and record what it did."""
    model = _model(seed)
    x, y = _batch(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    dtypes, raw = [], []
    h1 = model[0].register_forward_hook(lambda m, i, o: dtypes.append(str(o.dtype)))  # noqa: ARG005 - forward hook
    h2 = model[0].weight.register_hook(lambda g: raw.append(g.detach().clone()))
    try:
        loss = amp_step(model, x, y, opt, scaler)
    finally:
        h1.remove()
        h2.remove()
    return {"loss_type": type(loss).__name__, "loss": float(loss) if isinstance(loss, (int, float, torch.Tensor)) else None,
            "dtypes": dtypes, "raw_grad": raw[0] if raw else None,
            "params": [p.detach().clone() for p in model.parameters()],
            "scale": float(scaler.get_scale()), "updated": not scaler._per_optimizer_states}


@reference
def fp32_step(seed: int) -> dict:
    """What a correct step must produce, computed without GradScaler: the loss and the first
    layer's weight gradient of the autocast forward (unscaled), and the parameters after one SGD
    step on the unscaled gradients."""
    model = _model(seed)
    x, y = _batch(seed)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = nn.functional.cross_entropy(out.float(), y)
    loss.backward()
    with torch.no_grad():
        params = [p - LR * p.grad for p in model.parameters()]
    return {"loss": loss.item(), "grad": model[0].weight.grad, "params": params}


def fp32_gradient(seed: int) -> torch.Tensor:
    """The first layer's weight gradient of a correct step, unscaled (``fp32_step``)."""
    return fp32_step(seed)["grad"]


WATCHED = ("loss_type", "loss", "dtypes", "raw_grad", "params", "scale", "updated")


def watched(got, seed: int) -> dict:
    """The observation of ``watch_step``, checked for form against the judge's own model: its
    keys, the types, the weight gradient's and the parameters' shapes and dtypes."""
    expect_keys("the observed step", got, WATCHED)
    expect_str("the type of the returned loss", got["loss_type"])
    if got["loss"] is not None:
        expect_float("the returned loss", got["loss"])
    for k, d in enumerate(expect_list("the dtypes the first Linear produced", got["dtypes"])):
        expect_str(f"the dtype of the first Linear's output {k}", d)
    if not got["dtypes"]:
        raise CheckFailed("the model's forward did not run")
    params = [p.detach() for p in _model(seed).parameters()]
    expect_tensor("the first layer's raw weight gradient", got["raw_grad"], params[0].shape, params[0].dtype,
                  none_ok=True)
    expect_tensors("the parameters after the step", got["params"], params, what="parameters")
    expect_float("the scale after the step", got["scale"])
    expect_bool("scaler.update() was called", got["updated"])
    return got


RUNS = EX.part("runs", "runs and returns the loss as a Python float", 1, ["amp_step"])
AUTOCAST = EX.part("autocast", "the forward runs under autocast float16", 1, ["amp_step"])
SCALED = EX.part("scaled", "the loss is scaled before backward", 1, ["amp_step"])
STEP = EX.part("step", "steps with unscaled gradients through the scaler, then updates the scale", 1, ["amp_step"])
OVERFLOW = EX.part("overflow", "an overflowing step is skipped and the scale backs off", 1, ["amp_step"])


@RUNS.observe
def _(amp_step, seed):
    return watch_step(amp_step, seed, SCALE)


@RUNS.judge
def _(got, seed):
    watched(got, seed)
    if got["loss_type"] != "float":
        raise CheckFailed(f"expected a Python float (loss.item()), got {got['loss_type']:.40}")
    expect_float("the returned loss", got["loss"])
    ref = fp32_step(seed)
    if abs(got["loss"] - ref["loss"]) > 1e-3 * max(1.0, abs(ref["loss"])):
        raise CheckFailed(f"the returned loss {got['loss']:.5g} is not the batch's cross-entropy "
                          f"({ref['loss']:.5g}) before the step")


@AUTOCAST.observe
def _(amp_step, seed):
    return watch_step(amp_step, seed, SCALE)


@AUTOCAST.judge
def _(got, seed):
    watched(got, seed)
    if got["dtypes"][0] != "torch.float16":
        raise CheckFailed(f"the first Linear produced {got['dtypes'][0]}: run the forward inside "
                          "torch.autocast(x.device.type, dtype=torch.float16)")


@SCALED.observe
def _(amp_step, seed):
    return watch_step(amp_step, seed, SCALE)


@SCALED.judge
def _(got, seed):
    watched(got, seed)
    if got["raw_grad"] is None:
        raise CheckFailed("no gradient reached the weights: was backward called?")
    expected = fp32_gradient(seed)
    ratio = (got["raw_grad"].norm() / expected.norm()).item()
    if abs(ratio - 1) < 1e-2:
        raise CheckFailed("the raw gradient has the size of the unscaled loss's: call "
                          "scaler.scale(loss).backward(), not loss.backward()")
    expect_close("raw weight gradient / scale", got["raw_grad"] / SCALE, expected, atol=1e-4, rtol=1e-2)


@STEP.observe
def _(amp_step, seed):
    return watch_step(amp_step, seed, SCALE)


@STEP.judge
def _(got, seed):
    watched(got, seed)
    ref = fp32_step(seed)
    for k, (p, e) in enumerate(zip(got["params"], ref["params"], strict=True)):
        expect_close(f"parameter {k} after the step", p, e, atol=1e-4, rtol=1e-2)
    if not got["updated"]:
        raise CheckFailed("scaler.update() was not called after scaler.step(optimizer)")


@OVERFLOW.observe
def _(amp_step, seed):
    return watch_step(amp_step, seed, OVERFLOW_SCALE)


@OVERFLOW.judge
def _(got, seed):
    watched(got, seed)
    before = _model(seed)
    if not all(torch.isfinite(p).all() for p in got["params"]):
        raise CheckFailed("the parameters became inf/NaN: the gradients overflowed, and a step through "
                          "scaler.step(optimizer) would have been skipped")
    for k, (p, e) in enumerate(zip(got["params"], before.parameters(), strict=True)):
        expect_close(f"parameter {k} after an overflowing step (it must stay unchanged)", p, e.detach())
    if got["scale"] != OVERFLOW_SCALE * torch.amp.GradScaler("cpu").get_backoff_factor():
        raise CheckFailed(f"the scale is {got['scale']:g} after an overflowing step; the scaler "
                          "halves it there: call scaler.update() after scaler.step(optimizer)")


def check_amp_step(amp_step, verbose: bool = True):
    """Instant feedback on your ``amp_step``."""
    return EX.run([p.key for p in EX.parts], {"amp_step": amp_step}, verbose=verbose)
