"""course_utils.loops: each loop option changes the predicted step by what a hand count says,
on real CPU tensors (the prediction's second method) and on fake ones (the same figures); bad
combinations are refused with the fix; training_step's new switches do what a written loop does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_utils.loops import Loop, LoopError, OptimizerInBackward, select_output
from course_utils.memory import predict_step
from course_utils.train import training_step

B, D_IN, D_H, CLASSES = 64, 256, 512, 10


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(D_IN, D_H), nn.ReLU(), nn.Linear(D_H, D_H), nn.ReLU(), nn.Linear(D_H, CLASSES))


P = sum(p.numel() for p in mlp().parameters()) * 4  # fp32 parameter bytes = gradient bytes
LARGEST = D_H * D_H * 4  # the largest parameter (the middle weight)
OUT = B * CLASSES * 4  # the logits


def predict(loop: Loop, fake: bool = False):
    return predict_step(mlp, (B, D_IN), (B,), n_classes=CLASSES, loop=loop, fake=fake, target="cpu")


def after_forward(p) -> int:
    return p.after_forward["Total"]


@pytest.fixture(scope="module")
def adam():
    return predict(Loop(fused=True))


def test_optimizer_state_per_optimizer_by_hand(adam):
    """Steady state: Adam and AdamW keep two moments (2 x P, fused: plus one step count per
    parameter), SGD with momentum one buffer (P), SGD without momentum and no optimizer none."""
    n_params = len(list(mlp().parameters()))
    assert adam.after_forward["Optstate"] == 2 * P + 4 * n_params
    assert predict(Loop(optimizer="adamw", fused=True)).after_forward["Optstate"] == 2 * P + 4 * n_params
    assert predict(Loop(optimizer="sgd")).after_forward["Optstate"] == P
    assert predict(Loop(optimizer="sgd", momentum=0)).after_forward["Optstate"] == 0
    none = predict(Loop(optimizer="none"))
    assert none.after_forward["Optstate"] == 0 and none.breakdown["Optstate"] == 0
    assert Loop(optimizer="sgd", momentum=0).state_per_parameter() == 0 and Loop().state_per_parameter() == 2


def test_foreach_keeps_one_list_of_temporaries_where_the_for_loop_keeps_two_of_the_largest(adam):
    """Adam's step, the peak of this small-batch MLP: the multi-tensor (foreach) step holds one
    temporary per parameter at once (sqrt of the second moment, for every tensor: P); the
    for-loop step two of one parameter at a time (its sqrt, then the division: 2 x the largest)
    while its local ``denom`` still holds the previous parameter's (the first layer's bias, D_H
    floats, until the name is rebound); fused none."""
    n_params = len(list(mlp().parameters()))
    foreach = predict(Loop(foreach=True))
    loop = predict(Loop(foreach=False))
    assert foreach.log.peak_location[1] == loop.log.peak_location[1] == "optimizer/other"
    assert foreach.breakdown["Optstate"] == 2 * P + 4 * n_params + P
    assert loop.breakdown["Optstate"] == 2 * P + 4 * n_params + 2 * LARGEST + D_H * 4
    assert adam.log.peak_location[1] != "optimizer/other" and adam.peak < foreach.peak


def test_kept_gradients_are_alive_through_the_forward(adam):
    keep = predict(Loop(fused=True, keep_grads=True))
    assert after_forward(keep) - after_forward(adam) == P
    assert keep.after_forward["Gradient"] == P and adam.after_forward["Gradient"] == 0


def test_accumulation_holds_the_gradients_and_the_last_output(adam):
    """From the second micro-batch on, the gradients exist during the forward, and so do the
    previous micro-batch's logits and loss (still bound, as in a written loop)."""
    acc = predict(Loop(fused=True, accumulate=4))
    assert after_forward(acc) - after_forward(adam) == P + OUT + 4
    # micro-batches 3..K hold what the second holds: a real run of 3 equals the prediction's 2
    three = predict_step(mlp, (B, D_IN), (B,), n_classes=CLASSES, fake=False, target="cpu",
                         loop=Loop(fused=True, accumulate=3))
    assert three.peak == acc.peak


def test_optimizer_in_backward_never_holds_two_gradients(adam):
    inb = predict(Loop(fused=True, optimizer_in_backward=True))
    assert inb.breakdown["Gradient"] <= LARGEST < P and inb.after_forward["Gradient"] == 0
    assert inb.peak < adam.peak


def test_forward_and_inference_modes_by_hand(adam):
    fwd = predict(Loop(fused=True, mode="forward"))
    assert after_forward(fwd) == after_forward(adam)  # the same moment of the same step
    assert fwd.breakdown["Gradient"] == 0 and fwd.peak < adam.peak
    inf = predict(Loop(mode="inference"))
    # parameters, the input, and two activations of width D_H at once (a ReLU's input and output);
    # no target, no optimizer, nothing kept for backward
    assert inf.peak == P + B * D_IN * 4 + 2 * B * D_H * 4
    assert inf.breakdown["Optstate"] == inf.breakdown["Gradient"] == 0


@pytest.mark.parametrize("loop", [Loop(optimizer="sgd"), Loop(keep_grads=True, accumulate=2),
                                  Loop(optimizer_in_backward=True), Loop(mode="inference"),
                                  Loop(optimizer="adamw", foreach=True), Loop(fused=True, keep_grads=True)],
                         ids=["sgd", "keep+accumulate", "in-backward", "inference", "adamw-foreach", "fused+keep"])
def test_fake_prediction_equals_real_cpu_tensors(loop):
    real, fake = predict(loop), predict(loop, fake=True)
    assert fake.peak == real.peak and fake.breakdown == real.breakdown


@pytest.mark.parametrize("kwargs, fix", [
    (dict(optimizer="lamb"), "adam, adamw, sgd, none"),
    (dict(mode="eval"), "train, forward, inference"),
    (dict(accumulate=0), ">= 1"),
    (dict(accumulate=2.5), "whole number"),
    (dict(momentum=0.9), "optimizer 'sgd'"),
    (dict(optimizer="sgd", momentum=-1), ">= 0"),
    (dict(fused=True, foreach=True), "pick one"),
    (dict(optimizer="none", fused=True), "name an optimizer"),
    (dict(optimizer="none", optimizer_in_backward=True), "name one"),
    (dict(optimizer_in_backward=True, accumulate=2), "drop one of the two"),
    (dict(mode="inference", optimizer="adam"), "leave the optimizer out"),
    (dict(mode="inference", keep_grads=True), "mode 'forward'"),
    (dict(mode="forward", accumulate=2), "mode 'train'"),
])
def test_bad_combinations_name_the_fix(kwargs, fix):
    with pytest.raises(LoopError) as e:
        Loop(**kwargs)
    assert fix in str(e.value) and isinstance(e.value, ValueError)


def test_select_output():
    t = torch.zeros(1)
    assert select_output((t, 1), 0) is t and select_output({"logits": t}, "logits") is t
    assert select_output(t, None) is t and select_output({"loss": 0, "logits": t}, 1) is t
    with pytest.raises(LoopError, match="an index from 0 to 1"):
        select_output((t, t), 2)
    with pytest.raises(LoopError, match="'logits'"):
        select_output({"logits": t}, "logit")
    with pytest.raises(LoopError, match="one tensor"):
        select_output(t, 0)


def test_training_step_switches_match_a_written_loop():
    """keep grads, accumulation and the optimizer in backward leave the parameters where a loop
    written by hand leaves them."""
    torch.manual_seed(0)
    x, y = torch.randn(8, D_IN), torch.randint(0, CLASSES, (8,))

    def pair():
        torch.manual_seed(1)
        a = mlp()
        b = mlp()
        b.load_state_dict(a.state_dict())
        return a, b

    a, b = pair()  # 3 micro-batches, SGD, gradients zeroed not freed
    oa, ob = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    training_step(a, x, y, oa, set_to_none=False, accumulate=3)
    ob.zero_grad(set_to_none=False)
    for _ in range(3):
        (nn.functional.cross_entropy(b(x), y) / 3).backward()
    ob.step()
    assert all(torch.allclose(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert all(p.grad is not None for p in a.parameters())

    a, b = pair()  # the optimizer inside backward equals one step of the same optimizer
    inb = OptimizerInBackward(a.parameters(), lambda ps: torch.optim.SGD(ps, lr=0.1))
    training_step(a, x, y, inb)
    ob = torch.optim.SGD(b.parameters(), lr=0.1)
    nn.functional.cross_entropy(b(x), y).backward()
    ob.step()
    assert all(torch.allclose(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert all(p.grad is None for p in a.parameters())  # freed inside backward
    inb.remove()


def partly_frozen() -> nn.Sequential:
    """A fine-tuning setup: the first layer frozen, the head trained."""
    m = mlp()
    m[0].requires_grad_(False)
    return m


@pytest.mark.parametrize("loop", [Loop(), Loop(optimizer_in_backward=True, fused=True), Loop(mode="inference")],
                         ids=["adam", "in-backward", "inference"])
def test_frozen_parameters_are_predicted(loop):
    """MemTracker hooks every parameter's gradient, which torch refuses for a frozen one: the
    old MemoryLog failed on any model with a frozen parameter, in every mode."""
    real = predict_step(partly_frozen, (B, D_IN), (B,), n_classes=CLASSES, loop=loop, fake=False, target="cpu")
    fake = predict_step(partly_frozen, (B, D_IN), (B,), n_classes=CLASSES, loop=loop, fake=True, target="cpu")
    assert fake.peak == real.peak and fake.breakdown == real.breakdown
    if loop.mode == "train" and not loop.optimizer_in_backward:
        trained = [p for p in partly_frozen().parameters() if p.requires_grad]
        # Adam's two moments (and a 4-byte step count) for the trained parameters only
        assert real.after_forward["Optstate"] == sum(2 * p.numel() * 4 + 4 for p in trained)


@pytest.mark.parametrize("kwargs, fix", [
    (dict(fused="false"), "True or False"),
    (dict(keep_grads=1), "True or False"),
    (dict(foreach="no"), "True or False or None"),
    (dict(optimizer="sgd", momentum="0.9"), "a finite number"),
    (dict(optimizer="sgd", momentum=float("inf")), "a finite number"),
    (dict(optimizer="sgd", momentum=True), "a finite number"),
    (dict(output=1.5), "a whole number or a str or None"),
    (dict(mode="Train"), "lower case"),
])
def test_options_of_the_wrong_kind_are_refused_not_taken_as_true(kwargs, fix):
    with pytest.raises(LoopError, match=fix) as e:
        Loop(**kwargs)
    assert "Fix:" in str(e.value)


def test_select_output_never_takes_a_tensors_or_a_tuples_attributes():
    from collections import namedtuple

    t = torch.zeros(2)
    with pytest.raises(LoopError, match="one tensor"):
        select_output(t, "T")  # a tensor's transpose is no output of the model
    with pytest.raises(LoopError, match="an index"):
        select_output((t, t), "count")  # nor a tuple's method
    pair = namedtuple("Pair", "logits aux")(t, t * 2)
    assert select_output(pair, "logits") is pair.logits and select_output(pair, 1) is pair.aux
