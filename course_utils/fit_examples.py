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

``python -m course_utils.fit course_utils.fit_examples:resnet18_2d --input 32,3,224,224 --card 8``
"""

from __future__ import annotations

import torch
from torch import nn


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
