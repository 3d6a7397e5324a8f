"""A plain training step and a short loop with a progress bar, loss and Dice score."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

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


def train_step(
    model: nn.Module,
    image: torch.Tensor,
    label: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    loss_fn=F.cross_entropy,
) -> tuple[float, float]:
    """One forward + backward + optimizer step. Returns (loss, dice)."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    logits = model(image)
    loss = loss_fn(logits, label)
    loss.backward()
    optimizer.step()
    return loss.item(), dice_score(logits.detach(), label)


@dataclass
class History:
    loss: list[float] = field(default_factory=list)
    dice: list[float] = field(default_factory=list)


def train(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    device: torch.device | str = "cpu",
    lr: float = 3e-3,
    progress: bool = True,
) -> History:
    """Train for ``steps`` steps, cycling over ``batches`` (e.g. a DataLoader); Adam, fixed lr."""
    from tqdm.auto import tqdm

    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    hist = History()
    data = list(batches)
    if not data:
        raise ValueError("batches is empty: give a DataLoader or a list of (image, label) pairs")
    bar = tqdm(range(steps), desc="training", disable=not progress)
    for step in bar:
        image, label = data[step % len(data)]
        loss, dice = train_step(model, image.to(device), label.to(device), opt)
        hist.loss.append(loss)
        hist.dice.append(dice)
        bar.set_postfix(loss=f"{loss:.3f}", dice=f"{dice:.3f}")
    return hist
