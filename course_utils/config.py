"""Device and size: the one switch every notebook goes through.

``setup()`` picks CUDA when it is present and CPU otherwise, and a *size preset*:

* ``full`` -- seed 000's real problem: a 26 x 150 x 320 volume, batch 2, the U-Net at 64 base
  channels. The default on a GPU.
* ``tiny`` -- the same code on shapes small enough that every notebook runs in well under a
  minute on two CPU cores. The default on CPU (and in CI).

The environment variable ``COURSE_SIZE=tiny|full`` overrides the default; it is read here and
nowhere else.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch

from .checks import SetupError, guard

ENV_VAR = "COURSE_SIZE"

#: Seed 000's volume as (depth, height, width): 26 slices of 150 x 320 pixels.
SEED000_VOLUME: tuple[int, int, int] = (26, 150, 320)


@dataclass(frozen=True)
class Preset:
    """Shapes a notebook uses. Every size a notebook needs comes from here."""

    name: str
    volume: tuple[int, int, int]  # (D, H, W) of the U-Net input
    batch: int
    base_channels: int  # width of the U-Net used for *training* demos
    train_steps: int
    limit_test_ns: tuple[int, ...]  # seed 003's cube sizes N for measured runs


PRESETS: dict[str, Preset] = {
    "full": Preset(
        name="full",
        volume=SEED000_VOLUME,
        batch=2,
        base_channels=64,
        train_steps=60,
        limit_test_ns=(50, 64, 100, 128, 200, 256, 300, 350, 400),
    ),
    "tiny": Preset(
        name="tiny",
        volume=(16, 32, 32),
        batch=2,
        base_channels=8,
        train_steps=30,
        limit_test_ns=(16, 24, 32, 48),
    ),
}


@dataclass(frozen=True)
class CourseSetup:
    """What ``setup()`` chose: the device, the preset, and why."""

    device: torch.device
    preset: Preset
    reason: str

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def __str__(self) -> str:
        p = self.preset
        d, h, w = p.volume
        name = torch.cuda.get_device_name(self.device) if self.is_cuda else "CPU"
        return (
            f"device: {self.device} ({name}) | preset: {p.name} "
            f"(volume {d}x{h}x{w}, batch {p.batch}) | {self.reason}"
        )


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``None`` -> CUDA if available else CPU. Asking for CUDA without one is an error."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a device name ({err}). Fix: use 'cpu', 'cuda' "
                         "or 'cuda:N', or leave it out to pick CUDA when present.") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(
            f"device {str(device)!r}: the course runs on 'cpu' or 'cuda' only (its memory figures "
            "are CUDA's allocator or CPU tensors; 'mps', 'meta' and others are not supported). "
            "Fix: setup(device='cpu') or setup(device='cuda')."
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"device {str(device)!r} was requested but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda is not None}). "
            "Fix: run on a machine with an NVIDIA GPU and a CUDA build of torch, "
            "or call setup(device='cpu') / setup() to use the CPU."
        )
    return dev


def resolve_preset(size: str | None, device: torch.device) -> tuple[Preset, str]:
    """The preset named by ``size``, else by ``$COURSE_SIZE``, else full on CUDA / tiny on CPU."""
    source = "argument"
    if size is None:
        size = os.environ.get(ENV_VAR) or None
        source = f"${ENV_VAR}"
    if size is None:
        size = "full" if device.type == "cuda" else "tiny"
        source = f"default for {device.type}; set {ENV_VAR}=tiny|full to change"
    key = size.strip().lower()
    if key not in PRESETS:
        raise ValueError(
            f"unknown size preset {size!r} (from {source}). "
            f"Fix: use one of {sorted(PRESETS)}, e.g. {ENV_VAR}=tiny."
        )
    return PRESETS[key], f"preset from {source}"


def seed_everything(seed: int = 0) -> None:
    """Seed Python, and torch (CPU and CUDA) so that runs repeat."""
    random.seed(seed)
    torch.manual_seed(seed)


def setup(
    device: str | torch.device | None = None,
    size: str | None = None,
    seed: int = 0,
    verbose: bool = True,
) -> CourseSetup:
    """Choose device and size preset, seed the RNGs and print the choice.

    >>> cfg = setup(device="cpu", size="tiny", verbose=False)
    >>> cfg.preset.name
    'tiny'
    """
    dev = resolve_device(device)
    preset, reason = resolve_preset(size, dev)
    seed_everything(seed)
    cfg = CourseSetup(device=dev, preset=preset, reason=reason)
    if verbose:
        print(cfg)
    return cfg


guard(globals(), SetupError)
