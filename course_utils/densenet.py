"""Seed 004's network as it was: DenseNet-169 on 512 x 512 X-rays, naive and memory-efficient.

Seed 004 (slides, 2022): "a large CNN model that can predict multiple outcomes from X-ray
images", a DenseNet-169 ("DenseNet169 Model-based Parallelization", "DenseNet169 Gradient
Checkpointing"), out of memory "with batch size as small as 8, after downsampling image to
512 x 512". torchvision's ``densenet169`` cannot be imported beside the course's pinned CPU torch
build, so the architecture is written out here, layer for layer as torchvision builds it
(Huang et al. 2017, DenseNet-BC):

* stem: Conv 7x7 stride 2 (64 channels) -> BN -> ReLU -> MaxPool 3x3 stride 2 (512 -> 128 px);
* 4 dense blocks of (6, 12, 32, 32) layers, growth rate 32; each layer is
  BN -> ReLU -> Conv 1x1 (bottleneck, 4 x 32 = 128 channels) -> BN -> ReLU -> Conv 3x3 (32),
  applied to the **concatenation of every earlier feature map of its block**;
* a transition after blocks 1-3: BN -> ReLU -> Conv 1x1 (compression 0.5) -> AvgPool 2;
* BN, ReLU, global average pool, Linear.

The course's choices, stated: **1 input channel** (grey-value X-rays; torchvision's 3 channels
add 2 x 64 x 49 = 6,272 parameters) and **14 outputs** (the 14 observations of CheXpert, the data
set the slides cite; multi-label, ``binary_cross_entropy_with_logits``). ``parameter_count``
computes the count from the architecture by formula; with 3 channels and 1000 classes it gives
torchvision's documented 14,149,480 (a test checks both).

Why it runs out of memory: every dense layer concatenates all earlier outputs of its block and
BatchNorm keeps that concatenation for backward -- memory quadratic in the block's depth.
``memory_efficient=True`` (Pleiss et al. 2017, torchvision's ``memory_efficient=True``)
recomputes concatenation + BN + ReLU + 1x1 conv in backward instead of storing them;
``checkpoint_blocks=True`` recomputes whole dense blocks (what the slides' "gradient
checkpointing" did, per block). Both keep BatchNorm's running statistics updated once.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from . import session_cache
from .checkpointing import checkpointed
from .checks import NetworkError, guard
from .memory import predict_step
from .memory.meters import storage_key
from .recorded import checked_rows, kit_results, run_label

#: DenseNet-169 (torchvision's densenet169): growth 32, blocks (6, 12, 32, 32), bn_size 4,
#: 64 initial features, compression 0.5
DENSENET169 = dict(growth_rate=32, block_config=(6, 12, 32, 32), num_init_features=64, bn_size=4)
#: torchvision's documented parameter count of densenet169 (3 input channels, 1000 classes)
TORCHVISION_DENSENET169_PARAMS = 14_149_480
#: seed 004's input: 512 x 512 X-rays (downsampled from about 2000 x 2000), batch 8
SEED004_IMAGE = (512, 512)
SEED004_BATCH = 8
#: the course's stated choice of outputs: CheXpert's 14 observations, multi-label
SEED004_CLASSES = 14


class DenseLayer(nn.Module):
    """BN -> ReLU -> Conv1x1 (bn_size x growth) -> BN -> ReLU -> Conv3x3 (growth), applied to
    the concatenation of its inputs. ``memory_efficient``: concatenation -> BN -> ReLU -> 1x1 conv
    runs under a checkpoint, so the concatenation and its BN/ReLU output (``c_in`` channels each)
    are not stored but recomputed in backward; the layer still stores the 1x1 conv's output and
    its BN -> ReLU output (``bn_size x growth`` channels each) and, as inputs of the later layers'
    checkpoints, its ``growth`` new channels (``stored_per_layer`` counts them)."""

    def __init__(self, in_channels: int, growth_rate: int, bn_size: int,
                 memory_efficient: bool = False):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(in_channels)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(in_channels, bn_size * growth_rate, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, 3, padding=1, bias=False)
        self.memory_efficient = memory_efficient

    def bottleneck(self, *features: torch.Tensor) -> torch.Tensor:
        return self.conv1(self.relu1(self.norm1(torch.cat(features, 1))))

    def forward(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.memory_efficient and torch.is_grad_enabled() and any(
                f.requires_grad for f in features):
            # BN-safe: norm1's running statistics are frozen while it is recomputed
            out = checkpointed(self.bottleneck, *features, bn_scope=self.norm1)
        else:
            out = self.bottleneck(*features)
        return self.conv2(self.relu2(self.norm2(out)))


class DenseBlock(nn.Module):
    """``n_layers`` DenseLayers; each sees every earlier output of the block. Returns the
    concatenation of the block's input and every new feature map."""

    def __init__(self, n_layers: int, in_channels: int, growth_rate: int = 32, bn_size: int = 4,
                 memory_efficient: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(
            DenseLayer(in_channels + i * growth_rate, growth_rate, bn_size, memory_efficient)
            for i in range(n_layers))
        self.out_channels = in_channels + n_layers * growth_rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Sequential):
    """BN -> ReLU -> Conv1x1 (compression) -> AvgPool2d(2): halves resolution and channels."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(nn.BatchNorm2d(in_channels), nn.ReLU(inplace=True),
                         nn.Conv2d(in_channels, out_channels, 1, bias=False), nn.AvgPool2d(2))


class DenseNet(nn.Module):
    """DenseNet-BC for 2D images (torchvision's layout; defaults: DenseNet-169, 1 channel,
    14 outputs).

    Args:
        memory_efficient: recompute each layer's concatenation + BN + ReLU + 1x1 conv in
            backward (Pleiss et al. 2017).
        checkpoint_blocks: recompute each dense block (and the transition after it) in
            backward, storing only its input (checkpointing per block, as in seed 004's slides).
    """

    def __init__(self, growth_rate: int = 32, block_config: Sequence[int] = (6, 12, 32, 32),
                 num_init_features: int = 64, bn_size: int = 4, in_channels: int = 1,
                 num_classes: int = SEED004_CLASSES, memory_efficient: bool = False,
                 checkpoint_blocks: bool = False):
        super().__init__()
        self.in_channels, self.num_classes = in_channels, num_classes
        self.checkpoint_blocks = checkpoint_blocks
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, num_init_features, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(num_init_features), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1))
        stages = []
        c = num_init_features
        for i, n in enumerate(block_config):
            block = DenseBlock(n, c, growth_rate, bn_size, memory_efficient)
            c = block.out_channels
            if i < len(block_config) - 1:
                stages.append(nn.Sequential(block, Transition(c, c // 2)))
                c //= 2
            else:
                stages.append(nn.Sequential(block))
        self.stages = nn.ModuleList(stages)
        self.norm5 = nn.BatchNorm2d(c)
        self.classifier = nn.Linear(c, num_classes)
        self.num_features = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"DenseNet expects (batch, {self.in_channels}, height, width), got shape "
                f"{tuple(x.shape)}. Fix: add the channel dim (x[:, None]) or build with "
                f"in_channels={x.shape[1] if x.dim() == 4 else '...'}.")
        if min(x.shape[2:]) < 32:
            raise ValueError(f"images must be at least 32 x 32 (5 halvings), got {tuple(x.shape[2:])}")
        x = self.stem(x)
        for stage in self.stages:
            if self.checkpoint_blocks and torch.is_grad_enabled():
                x = checkpointed(stage, x)
            else:
                x = stage(x)
        x = F.relu(self.norm5(x), inplace=True)
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def stored_per_layer(memory_efficient: bool, n_layers: int = 6, in_channels: int = 64,
                     growth_rate: int = 32, bn_size: int = 4, image: Sequence[int] = (16, 16),
                     batch: int = 2):
    """What each layer of a ``DenseBlock`` stores for backward, counted with
    ``saved_tensors_hooks`` during one forward (each storage once; parameters and per-channel
    vectors left out). A stored map is charged to the layer that produced it (a layer's output,
    kept by the later layers' checkpoints, is its own), else to the layer during whose forward
    it was saved; the block's input is its own row. Defaults: DenseNet-169's first block.
    Returns a DataFrame: ``layer``, ``c_in`` (channels of its concatenated input), ``stored maps
    (channels)`` (sorted, largest first), ``channels stored`` (method: saved-tensor hooks)."""
    import pandas as pd

    block = DenseBlock(n_layers, in_channels, growth_rate, bn_size, memory_efficient)
    current: list[int | None] = [None]
    made_by: dict[int, int] = {}
    saved: dict[int, tuple[int | None, int]] = {}

    def pre(i):
        def hook(module, args):  # noqa: ARG001 - nn.Module forward pre-hook (module, args)
            current[0] = i
        return hook

    def post(i):
        def hook(module, args, out):  # noqa: ARG001 - nn.Module forward hook (module, args, output)
            made_by[storage_key(out)] = i
            current[0] = None
        return hook

    handles = [h for i, layer in enumerate(block.layers)
               for h in (layer.register_forward_pre_hook(pre(i)), layer.register_forward_hook(post(i)))]
    params = {storage_key(t) for t in block.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in params and t.dim() == 4 and key not in saved:
            saved[key] = (current[0], t.shape[1])
        return t

    x = torch.randn(batch, in_channels, *image, requires_grad=True)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(x)
    finally:
        for h in handles:
            h.remove()
    x_key = storage_key(x)
    per: dict[str, list[int]] = {}
    for key, (during, channels) in saved.items():
        who = "block input" if key == x_key else made_by.get(key, during)
        per.setdefault(str(who), []).append(channels)
    rows = [{"layer": "block input", "c_in": None, "stored maps (channels)": sorted(per.get("block input", []), reverse=True)}]
    rows += [{"layer": str(i), "c_in": in_channels + i * growth_rate,
              "stored maps (channels)": sorted(per.get(str(i), []), reverse=True)} for i in range(n_layers)]
    df = pd.DataFrame(rows)
    df["c_in"] = df["c_in"].astype("Int64")
    df["channels stored"] = [sum(v) for v in df["stored maps (channels)"]]
    return df


def densenet169(**kwargs) -> DenseNet:
    """DenseNet-169 with seed 004's stated choices (1 channel, 14 outputs) unless overridden."""
    return DenseNet(**{**DENSENET169, **kwargs})


def parameter_count(growth_rate: int = 32, block_config: Sequence[int] = (6, 12, 32, 32),
                    num_init_features: int = 64, bn_size: int = 4, in_channels: int = 1,
                    num_classes: int = SEED004_CLASSES) -> int:
    """The number of trainable parameters of ``DenseNet(...)``, by formula (no model built):
    convs have no bias, each BatchNorm has 2 per channel, the classifier has a bias."""
    bottleneck = bn_size * growth_rate
    total = in_channels * num_init_features * 7 * 7 + 2 * num_init_features  # conv0, norm0
    c = num_init_features
    for i, n in enumerate(block_config):
        for j in range(n):
            c_in = c + j * growth_rate
            total += 2 * c_in + c_in * bottleneck  # norm1, conv1 (1x1)
            total += 2 * bottleneck + bottleneck * growth_rate * 9  # norm2, conv2 (3x3)
        c += n * growth_rate
        if i < len(block_config) - 1:
            total += 2 * c + c * (c // 2)  # transition: norm, conv 1x1
            c //= 2
    return total + 2 * c + c * num_classes + num_classes  # norm5, classifier


def seed004_step_args(batch: int = SEED004_BATCH, image: Sequence[int] = SEED004_IMAGE,
                      in_channels: int = 1, num_classes: int = SEED004_CLASSES) -> dict:
    """``predict_step`` arguments for seed 004's training step: images (batch, 1, 512, 512),
    multi-label targets (batch, 14), binary cross-entropy on the logits."""
    return dict(input_shape=(batch, in_channels, *image), target_shape=(batch, num_classes),
                loss_fn=F.binary_cross_entropy_with_logits)


def predict_seed004(build: Callable[[], nn.Module], batch: int = SEED004_BATCH, **kwargs):
    """``predict_step`` of seed 004's step (Adam; ``dtype`` / ``autocast_dtype`` passed on)."""
    kwargs.setdefault("module_peaks", False)
    return predict_step(build, **seed004_step_args(batch), **kwargs)


def predict_densenet169(batch: int = SEED004_BATCH, **switches: bool):
    """Seed 004's step on ``densenet169(**switches)`` (``memory_efficient``,
    ``checkpoint_blocks``), predicted at most once per process -- and once per test session, for
    every process of it (``session_cache``): notebooks 10 and 12 ask for the same variants. The
    per-op log is not kept (``log`` is None); peak, breakdown and method are."""
    unknown = set(switches) - {"memory_efficient", "checkpoint_blocks"}
    if unknown:
        raise TypeError(f"predict_densenet169: unknown switch(es) {sorted(unknown)}; "
                        "use memory_efficient=True and/or checkpoint_blocks=True")
    return _densenet169_step(tuple(sorted((k, bool(v)) for k, v in switches.items())), int(batch))


@functools.lru_cache(maxsize=None)
@session_cache.shared("densenet.seed004")
def _densenet169_step(switches: tuple[tuple[str, bool], ...], batch: int):
    prediction = predict_seed004(lambda: densenet169(**dict(switches)), batch)
    return dataclasses.replace(prediction, log=None)  # the log holds weak references: not picklable


# --------------------------------------------------------------------------------------------
# The cards seed 004's question is asked for (what each holds: budget.usable_bytes)
# --------------------------------------------------------------------------------------------
#: GPU classes of 2022 by memory (a "6 GB" card has 6 GiB); the slides name none
CARDS_GIB = {"6 GB (GTX 1060 / RTX 2060)": 6, "8 GB (GTX 1080 / RTX 2080 / 3070)": 8,
             "11 GB (GTX 1080 Ti / RTX 2080 Ti)": 11, "12 GB (K80 per GPU / Titan Xp)": 12,
             "16 GB (V100 / T4)": 16}




#: the GPU kit's task that measures section 2's two nets of notebook 12 (batch 8, 512 x 512, fp32, Adam)
KIT_TASK = "examples/densenet"


def recorded_kit_rows(task: str = KIT_TASK, folder=None):
    """What the newest GPU run whose kit finished ``task`` recorded (``docs/gpu-runs/*/kit.json``,
    beside ``recorded.recorded_folder()``): one row per case, the predicted and measured
    (``max_memory_allocated``) peak, the measured reserved MiB, where the prediction put the peak.
    A pandas DataFrame with ``attrs`` ``run`` (GPU, date, torch) and ``context MiB`` (the CUDA
    context the run measured at its start); an empty one if no run finished the task."""
    import pandas as pd

    found = kit_results(task, folder)
    if not found:
        return pd.DataFrame()
    machine, result, path = found[-1]
    rows = checked_rows(result.get("rows"), {"case", "measured peak MiB", "predicted peak MiB"}, path,
                        f"task {task!r}'s rows", empty_ok=False)
    df = pd.DataFrame(rows).set_index("case")
    df["measured / predicted"] = (df["measured peak MiB"] / df["predicted peak MiB"]).round(3)
    df.attrs.update({"run": run_label(machine), "context MiB": machine.get("context MiB")})
    return df


guard(globals(), NetworkError)
