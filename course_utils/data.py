"""Synthetic 3D segmentation volumes: no downloads, deterministic by seed.

Each sample is a 1-channel grey-value volume with a label map of 5 classes:

====  ==========  ============================================================
  0   background  noisy low intensity
  1   blobs       solid spheres
  2   tubes       cylinders running along the depth axis (like vessels)
  3   shells      hollow spherical shells (like membranes)
  4   boxes       small axis-aligned cuboids
====  ==========  ============================================================

Every class has its own mean intensity and the image is blurred and noised, so a net must use
both intensity and shape. ``SyntheticVolumes(n, shape, seed)[i]`` is a pure function of
``(shape, seed, i)``: the same index always returns the same tensors.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from .checks import SetupError, guard

N_CLASSES = 5
CLASS_NAMES = ("background", "blob", "tube", "shell", "box")
_CLASS_MEAN = torch.tensor([0.0, 1.0, 0.6, 1.4, 0.3])


def make_volume(shape: Sequence[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One (image, label) pair: image ``float32 [1, D, H, W]``, label ``int64 [D, H, W]``."""
    _check_shape(shape)
    g = torch.Generator().manual_seed(int(seed))
    d, h, w = (int(s) for s in shape)
    zz, yy, xx = torch.meshgrid(
        torch.arange(d, dtype=torch.float32),
        torch.arange(h, dtype=torch.float32),
        torch.arange(w, dtype=torch.float32),
        indexing="ij",
    )
    label = torch.zeros(d, h, w, dtype=torch.int64)
    scale = min(d, h, w)

    def rand(lo: float, hi: float) -> float:
        return lo + (hi - lo) * torch.rand((), generator=g).item()

    def centre() -> tuple[float, float, float]:
        return rand(0, d - 1), rand(0, h - 1), rand(0, w - 1)

    for _ in range(3):  # tubes first, so the other shapes draw over them
        cy, cx, r = rand(0, h - 1), rand(0, w - 1), rand(0.06, 0.12) * scale + 1
        label[(yy - cy) ** 2 + (xx - cx) ** 2 <= r**2] = 2
    for _ in range(2):
        cz, cy, cx = centre()
        r = rand(0.18, 0.3) * scale + 1.5
        dist = ((zz - cz) ** 2 + (yy - cy) ** 2 + (xx - cx) ** 2).sqrt()
        label[(dist <= r) & (dist >= r - max(1.0, 0.08 * scale))] = 3
    for _ in range(3):
        cz, cy, cx = centre()
        r = rand(0.1, 0.2) * scale + 1
        label[(zz - cz) ** 2 + (yy - cy) ** 2 + (xx - cx) ** 2 <= r**2] = 1
    for _ in range(2):
        cz, cy, cx = centre()
        half = rand(0.06, 0.14) * scale + 1
        box = ((zz - cz).abs() <= half) & ((yy - cy).abs() <= half) & ((xx - cx).abs() <= half)
        label[box] = 4

    image = _CLASS_MEAN[label][None, None]
    image = F.avg_pool3d(image, kernel_size=3, stride=1, padding=1, count_include_pad=False)
    image = image[0] + 0.15 * torch.randn(1, d, h, w, generator=g)
    return image.float(), label


def _check_shape(shape: Sequence[int]) -> None:
    if len(shape) != 3 or min(shape) < 4:
        raise ValueError(f"shape must be (D, H, W) with every side >= 4, got {tuple(shape)}")


class SyntheticVolumes(Dataset):
    """``n`` deterministic synthetic volumes of ``shape`` (D, H, W); usable with DataLoader."""

    def __init__(self, n: int, shape: Sequence[int], seed: int = 0):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n, self.shape, self.seed = int(n), tuple(int(s) for s in shape), int(seed)
        _check_shape(self.shape)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} volumes")
        return make_volume(self.shape, self.seed * 1_000_003 + i)


guard(globals(), SetupError)
