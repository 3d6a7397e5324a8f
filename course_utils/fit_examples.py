"""Networks the course does not teach, for ``course_utils.fit``: each a builder function that
returns an ``nn.Module`` made from ``torch.nn`` only (torchvision is not a dependency).

* ``resnet18_2d`` -- a 2D ResNet-18 (He et al. 2016: BasicBlock, [2, 2, 2, 2]), laid out as
  torchvision's (``conv1``, ``bn1``, ``relu``, ``maxpool``, ``layer1`` .. ``layer4``, ``avgpool``,
  ``fc``), except that its ReLUs are not in-place (so that ``fit``'s ``inplace`` technique has
  something to switch);
* ``resnet50`` -- torchvision's ResNet-50 (``Bottleneck``, [3, 4, 6, 3], v1.5: the stride on the
  3x3 conv), the same layout with torchvision's in-place ReLUs: 25,557,032 parameters at 1000
  classes;
* ``vit_tiny`` -- a small Vision Transformer (Dosovitskiy et al. 2021) on ``nn.TransformerEncoder``:
  a patch-embedding convolution, a class token, a learned positional embedding, pre-norm encoder
  layers, a final LayerNorm and a linear head;
* ``conv1d_net`` -- a 1D conv net for signals: conv-BN-ReLU blocks (each halving the length with
  a stride-2 convolution), global average pooling, a linear head.

And a count by hand of what ``resnet18_2d`` keeps for backward, to check a prediction against
(notebook 11): ``stem_saved_by_hand`` (conv1, bn1, relu, maxpool), ``block_saved_by_hand`` (one
``BasicBlock`` of stride 1, module by module) and ``resnet18_saved_by_hand`` (the stem and the
first stage's two blocks, about 72 % of what the network keeps at 224 x 224).

``python -m course_utils.fit course_utils.fit_examples:resnet18_2d --input 32,3,224,224 --card 8``
"""

from __future__ import annotations

import torch
from torch import nn

from .checks import NetworkError, guard


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv-BN, the input added back (through a 1x1 conv-BN where
    the stride or the width changes), ReLU after the sum."""

    expansion = 1  # output channels per ``c_out``

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu2 = nn.ReLU()
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + identity)


class Bottleneck(nn.Module):
    """torchvision's ``Bottleneck`` (ResNet v1.5): 1x1 conv-BN-ReLU down to ``width``, 3x3
    conv-BN-ReLU (the stride here), 1x1 conv-BN up to ``width x 4``, the input added back in place
    (through a 1x1 conv-BN where the stride or the width changes, run after the main path),
    ReLU after the sum; one in-place ReLU module, called three times, as torchvision's."""

    expansion = 4  # output channels per ``width``

    def __init__(self, c_in: int, width: int, stride: int = 1):
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += x if self.downsample is None else self.downsample(x)  # after the main path, as torchvision's
        return self.relu(out)


class ResNet(nn.Module):
    """A 2D ResNet laid out as torchvision's: conv1-bn1-relu-maxpool, four stages of ``block``
    (``BasicBlock`` or ``Bottleneck``; ``layers`` blocks each, ``widths`` x ``block.expansion``
    channels out, the first block of stages 2-4 with stride 2), average pooling and a linear head.
    ``inplace``: whether the stem's ReLU is in-place (torchvision's is)."""

    def __init__(self, layers: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 10, in_channels: int = 3,
                 widths: tuple[int, ...] = (64, 128, 256, 512), block: type[nn.Module] = BasicBlock,
                 inplace: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=inplace)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        c = widths[0]
        stages = []
        for i, (n, w) in enumerate(zip(layers, widths, strict=True)):
            c_out = w * block.expansion
            blocks = [block(c, w, 1 if i == 0 else 2)] + [block(c_out, w) for _ in range(n - 1)]
            stages.append(nn.Sequential(*blocks))
            c = c_out
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18_2d(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """ResNet-18: 11.2 M parameters at 10 classes and 3 input channels."""
    return ResNet((2, 2, 2, 2), num_classes, in_channels)


def resnet50(num_classes: int = 1000, in_channels: int = 3) -> ResNet:
    """ResNet-50 as torchvision's ``resnet50()``: ``Bottleneck`` blocks [3, 4, 6, 3], in-place
    ReLUs; 25,557,032 parameters at 1000 classes and 3 input channels."""
    return ResNet((3, 4, 6, 3), num_classes, in_channels, block=Bottleneck, inplace=True)


class ViT(nn.Module):
    """Patch embedding (a conv with kernel = stride = ``patch``), class token, learned positional
    embedding, ``depth`` pre-norm ``nn.TransformerEncoderLayer`` (GELU, MLP 4 x dim), final
    LayerNorm, linear head on the class token."""

    def __init__(self, image: int = 64, patch: int = 8, dim: int = 192, depth: int = 6, heads: int = 3,
                 num_classes: int = 10, in_channels: int = 3, mlp_ratio: int = 4):
        super().__init__()
        if image % patch:
            raise ValueError(f"image ({image}) must be a multiple of patch ({patch})")
        self.image = image
        self.patch_embed = nn.Conv2d(in_channels, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, n + 1, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, mlp_ratio * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, patches, dim)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.encoder(x))
        return self.head(x[:, 0])


def vit_tiny(image: int = 64, patch: int = 8, dim: int = 192, depth: int = 6, heads: int = 3,
             num_classes: int = 10, in_channels: int = 3) -> ViT:
    """A ViT-Tiny-sized transformer (dim 192, 3 heads) on ``image`` x ``image`` inputs."""
    return ViT(image, patch, dim, depth, heads, num_classes, in_channels)


def conv1d_net(in_channels: int = 1, num_classes: int = 5, widths: tuple[int, ...] = (16, 32, 64, 128),
               kernel: int = 7) -> nn.Sequential:
    """``len(widths)`` blocks of Conv1d (stride 2, no bias) -> BatchNorm1d -> ReLU, then global
    average pooling and a linear head: a signal of length L leaves the blocks at L / 2**len(widths)."""
    layers: list[nn.Module] = []
    c = in_channels
    for w in widths:
        layers.append(nn.Sequential(nn.Conv1d(c, w, kernel, 2, kernel // 2, bias=False), nn.BatchNorm1d(w), nn.ReLU()))
        c = w
    layers += [nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(c, num_classes)]
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------------------------
# What resnet18_2d keeps for backward, counted by hand (fp32; the saved-tensor meter's rules:
# each storage once, at the first module that saves it; buffers count, parameters do not)
# --------------------------------------------------------------------------------------------
FP32, INT64 = 4, 8  # bytes per value


def _half(side: int, kernel: int) -> int:
    """The side after a stride-2 layer that pads ``kernel // 2`` (ResNet's 7 x 7 conv, 3 x 3 max pool)."""
    return (side + 2 * (kernel // 2) - kernel) // 2 + 1


def bn_stats_bytes(channels: int) -> int:
    """What a BatchNorm keeps beside its input: its batch mean and inverse standard deviation,
    and references to its running mean and variance (buffers: resident anyway, but the meter
    counts every storage that is not a parameter), 4 x C fp32 values."""
    return 4 * channels * FP32


def stem_saved_by_hand(batch: int, side: int, in_channels: int = 3, width: int = 64) -> dict[str, int]:
    """ResNet's stem on ``batch`` images of ``side`` x ``side``, module by module: ``conv1`` keeps
    its input (the images); ``bn1`` keeps its input (conv1's output, ``width`` channels at half
    the side) and its statistics; ``relu`` keeps its output (its backward needs where it is > 0),
    the same size again; ``maxpool`` keeps the int64 indices of its output (a quarter of the side),
    and its input, which is relu's output: counted there."""
    s1 = _half(side, 7)
    s2 = _half(s1, 3)
    stem = batch * width * s1 * s1 * FP32
    return {"conv1": batch * in_channels * side * side * FP32, "bn1": stem + bn_stats_bytes(width),
            "relu": stem, "maxpool": batch * width * s2 * s2 * INT64}


def block_saved_by_hand(batch: int, channels: int, side: int, input_counted: bool) -> dict[str, int]:
    """One ``BasicBlock`` of stride 1 without a downsample (``channels`` in and out, ``side`` x
    ``side``), module by module. Every tensor in it is ``batch x channels x side x side`` fp32:

    * ``conv1`` keeps its input x -- unless a module before kept x already (``input_counted``:
      the previous block's ``relu2``), then 0;
    * ``bn1`` keeps its input (conv1's output) and its statistics;
    * ``relu1`` keeps its output, which ``conv2`` keeps as its input (one storage: 0 for conv2);
    * ``bn2`` keeps its input (conv2's output) and its statistics;
    * the sum ``out + x`` keeps nothing (its backward passes the gradient through);
    * ``relu2`` keeps its output (the next block's input)."""
    t = batch * channels * side * side * FP32
    return {"conv1": 0 if input_counted else t, "bn1": t + bn_stats_bytes(channels), "relu1": t, "conv2": 0,
            "bn2": t + bn_stats_bytes(channels), "relu2": t}


def resnet18_saved_by_hand(batch: int, side: int, in_channels: int = 3) -> dict[str, int]:
    """``resnet18_2d``'s stem and its first stage (``layer1``: two blocks of 64 channels at a
    quarter of the side), by hand, keyed as the modules are named (``layer1.0.bn1``, ...). The
    first block's input is maxpool's output, which no module kept before: its conv1 counts it;
    the second block's input is the first block's output, kept by its relu2."""
    out = stem_saved_by_hand(batch, side, in_channels)
    s = _half(_half(side, 7), 3)
    for i in range(2):
        out.update({f"layer1.{i}.{k}": v for k, v in block_saved_by_hand(batch, 64, s, input_counted=i > 0).items()})
    return out


guard(globals(), NetworkError)
