"""course_utils.train: the checks that kill the mutants (tools/mutants.py) the other tests let
through -- the step clears last step's gradients, honours autocast_dtype and a GradScaler; Dice
of an empty volume; train() cycles over a short generator and uses its lr."""

import torch
from torch import nn
from torch.nn import functional as F

from course_utils import UNet3D, dice_score, train
from course_utils.train import training_step


def _linear():
    torch.manual_seed(0)
    return nn.Linear(4, 3), torch.randn(5, 4), torch.randint(0, 3, (5,))


def _reference_grad(lin, x, y):
    w, b = lin.weight.detach().clone().requires_grad_(), lin.bias.detach().clone()
    F.cross_entropy(F.linear(x, w, b), y).backward()
    return w.grad


def test_each_step_starts_from_fresh_gradients():
    """lr=0: the weights stay put, so two steps on one batch must leave one step's gradient,
    not the sum of two."""
    lin, x, y = _linear()
    opt = torch.optim.SGD(lin.parameters(), lr=0.0)
    training_step(lin, x, y, opt)
    training_step(lin, x, y, opt)
    torch.testing.assert_close(lin.weight.grad, _reference_grad(lin, x, y))


def test_the_step_runs_under_the_autocast_dtype_it_is_given():
    lin, x, y = _linear()
    seen = []
    training_step(lin, x, y, None, autocast_dtype=torch.bfloat16, after_backward=seen.append)
    assert seen[0].dtype == torch.bfloat16
    training_step(lin, x, y, None, after_backward=seen.append)
    assert seen[1].dtype == torch.float32


def test_with_a_grad_scaler_the_loss_is_scaled_and_the_step_unscaled():
    lin, x, y = _linear()
    ref = _reference_grad(lin, x, y)
    w0 = lin.weight.detach().clone()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    grads = []
    training_step(lin, x, y, torch.optim.SGD(lin.parameters(), lr=1.0), scaler=scaler,
                  after_backward=lambda logits: grads.append(lin.weight.grad.clone()))
    torch.testing.assert_close(grads[0], 1024.0 * ref)  # backward of the scaled loss
    torch.testing.assert_close(lin.weight.detach(), w0 - ref)  # the step: unscaled


def test_dice_of_an_empty_volume_predicted_empty_is_perfect():
    target = torch.zeros(1, 4, 4, 4, dtype=torch.long)
    logits = torch.zeros(1, 5, 4, 4, 4)
    logits[:, 0] = 1.0  # background everywhere, as in the target
    assert dice_score(logits, target) == 1.0


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 1, 8, 8, 8, generator=g), torch.randint(0, 5, (2, 8, 8, 8), generator=g)


def test_a_short_generator_is_cycled():
    seen = []

    def two_batches():
        for s in (0, 1):
            seen.append(s)
            yield _batch(s)

    hist = train(UNet3D(levels=3, channels=4), two_batches(), steps=5, progress=False)
    assert len(hist.loss) == 5 and seen == [0, 1]  # read once, lazily, then replayed


def test_train_uses_its_learning_rate():
    net = UNet3D(levels=3, channels=4)
    before = [p.detach().clone() for p in net.parameters()]
    train(net, [_batch(0)], steps=1, lr=0.0, progress=False)
    assert all(torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))
    train(net, [_batch(0)], steps=1, lr=1e-2, progress=False)
    assert not all(torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))
