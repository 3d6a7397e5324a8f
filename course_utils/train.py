"""The course's one training step, a short loop with a progress bar, and the Dice score.

``training_step`` is the only training step in the course: the notebooks train with it, the
predictor (``memory.predict_step``) runs it on fake tensors, and the CUDA measurements
(``memory.measure_step``, the benchmark, the GPU kit) run it on the GPU. A predicted and a
measured figure therefore describe the same sequence of operations. ``require_data`` refuses a
model on the meta device (shapes, no data) before a real step reaches torch's internals with it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator as _OneShot
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .checks import MeasureError, guard
from .config import resolve_device
from .data import N_CLASSES


@torch.no_grad()
def dice_score(logits: torch.Tensor, target: torch.Tensor, n_classes: int = N_CLASSES) -> float:
    """Mean Dice over the foreground classes (1..n-1) that occur in target or prediction.

    ``logits``: [B, C, D, H, W]; ``target``: [B, D, H, W] of class indices.
    """
    pred = logits.argmax(dim=1)
    scores = []
    for c in range(1, n_classes):
        p, t = pred == c, target == c
        denom = p.sum() + t.sum()
        if denom > 0:
            scores.append((2 * (p & t).sum() / denom).item())
    return float(sum(scores) / len(scores)) if scores else 1.0


def require_data(model: nn.Module, *tensors: torch.Tensor, where: str = "a training step") -> None:
    """A ``MeasureError`` with the fix if ``model`` (or a tensor) is on the meta device: such a
    model has shapes but no data (``with torch.device("meta"):``, ``.to("meta")``), and a real
    step on it fails deep inside torch. Fake tensors (a prediction's) have their own device."""
    meta = [t for t in (*model.parameters(), *model.buffers()) if t.is_meta]
    if meta or any(isinstance(t, torch.Tensor) and t.is_meta for t in tensors):
        what = f"the {type(model).__name__}'s parameters are" if meta else "the batch is"
        raise MeasureError(
            f"{where} needs tensors with data, and {what} on the meta device (shapes only: made under "
            "torch.device('meta') or moved with .to('meta')).",
            "build the model on the CPU (without torch.device('meta')), or give it memory and values: "
            "model.to_empty(device='cpu') then initialise its parameters (e.g. reset_parameters() of each layer). "
            "To predict its memory from the shapes alone, memory.predict_step(lambda: build_on_meta(), ...) takes "
            "a builder of the meta model as it is.")


def step_autocast(x: torch.Tensor, autocast_dtype: torch.dtype | None) -> torch.autocast:
    """``torch.autocast`` on ``x``'s device in ``autocast_dtype``, or switched off for None: the
    region a step's forward and loss run in."""
    return torch.autocast(x.device.type, dtype=autocast_dtype or torch.float16, enabled=autocast_dtype is not None)


def training_step(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    optimizer: Any = None,  # a torch.optim.Optimizer, a loops.OptimizerInBackward, or None
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
    autocast_dtype: torch.dtype | None = None,
    scaler: "torch.amp.GradScaler | None" = None,
    after_backward: Callable[[torch.Tensor], None] | None = None,
    set_to_none: bool = True,
    accumulate: int = 1,
    output: Callable[[object], torch.Tensor] | None = None,
) -> torch.Tensor:
    """One training step, in the order of PyTorch's AMP recipe:

    1. ``optimizer.zero_grad(set_to_none=set_to_none)``: last step's gradients are freed
       (``set_to_none=False``: zeroed, and kept allocated);
    2. forward and loss, under ``torch.autocast(x.device.type, autocast_dtype)`` if given;
    3. backward (of ``scaler.scale(loss)`` if a ``GradScaler`` is given);
    4. ``optimizer.step()`` (through the scaler, which then updates its scale).

    ``accumulate=K`` runs steps 2-3 K times (on the same batch: memory and work are those of K
    micro-batches), each loss divided by K, before one optimizer step; as in a written loop, the
    previous micro-batch's output stays bound until the next forward returns. ``output`` picks
    what the loss takes from the model's output (a tuple's element, a dict's key). An optimizer
    with ``in_backward`` (``loops.OptimizerInBackward``) steps inside backward: neither
    ``zero_grad`` nor ``step`` is called here.

    The logits stay alive until the step returns (``after_backward(logits)`` may read them, e.g.
    for a Dice score), as in any loop that names them. Returns the loss, detached.
    """
    require_data(model, x, target, where="training_step")
    in_backward = getattr(optimizer, "in_backward", False)
    if optimizer is not None and not in_backward:
        optimizer.zero_grad(set_to_none=set_to_none)
    for _ in range(accumulate):
        with step_autocast(x, autocast_dtype):
            out = model(x)  # bound, like a written loop's: every part of the output lives on
            logits = output(out) if output is not None else out
            loss = loss_fn(logits, target)
            if accumulate > 1:
                loss = loss / accumulate
        (scaler.scale(loss) if scaler is not None else loss).backward()
    if after_backward is not None:
        after_backward(logits)
    if optimizer is not None and not in_backward:
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    return loss.detach()


def train_step(
    model: nn.Module,
    image: torch.Tensor,
    label: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    loss_fn=F.cross_entropy,
) -> tuple[float, float]:
    """``training_step`` in train mode; returns (loss, Dice of the step's logits)."""
    require_data(model, image, label, where="train_step")
    model.train()
    dice: list[float] = []
    loss = training_step(model, image, label, optimizer, loss_fn=loss_fn,
                         after_backward=lambda logits: dice.append(dice_score(logits, label)))
    return loss.item(), dice[0]


@dataclass
class History:
    """What ``train`` recorded: the loss and the Dice score of every step, in order."""

    loss: list[float] = field(default_factory=list)
    dice: list[float] = field(default_factory=list)


def _cycle(batches: Iterable) -> Iterator:
    """The batches again and again; a one-shot iterator (a generator) is read lazily, once."""
    if isinstance(batches, _OneShot):  # a generator or iterator: never call list() on it
        seen = []
        for b in batches:
            seen.append(b)
            yield b
        if not seen:
            raise MeasureError("train: batches is empty.", "give a DataLoader or a list of (image, label) pairs.")
        yield from itertools.cycle(seen)
        return
    while True:
        n = 0
        for b in batches:
            n += 1
            yield b
        if n == 0:
            raise MeasureError("train: batches is empty.", "give a DataLoader or a list of (image, label) pairs.")


def train(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    device: torch.device | str = "cpu",
    lr: float = 3e-3,
    progress: bool = True,
) -> History:
    """Train for ``steps`` steps, cycling over ``batches`` (a DataLoader, a list, or a generator,
    read lazily); Adam, fixed lr."""
    from tqdm.auto import tqdm

    if steps < 1:  # (a whole number: the guard)
        raise MeasureError(f"train: steps={steps!r} trains nothing.", "steps=1 or more.")
    require_data(model, where="train")
    device = resolve_device(device)  # a clear error if CUDA is asked for and absent
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    hist = History()
    data = _cycle(batches)
    bar = tqdm(range(steps), desc="training", disable=not progress)
    for _ in bar:
        image, label = next(data)
        loss, dice = train_step(model, image.to(device), label.to(device), opt)
        hist.loss.append(loss)
        hist.dice.append(dice)
        bar.set_postfix(loss=f"{loss:.3f}", dice=f"{dice:.3f}")
    return hist


guard(globals(), MeasureError)
