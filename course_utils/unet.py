"""The 3D U-Net of seed 000, block by block.

The blocks follow the popular 2D U-Net layout that seed 000 adapted to 3D:

* ``DoubleConv(in, out)`` = (Conv3d 3x3x3 -> BatchNorm3d -> ReLU) twice, middle channels = ``out``;
* ``Down(in, out)`` = MaxPool3d(2) -> DoubleConv;
* ``Up(in, out)`` = trilinear Upsample(x2) -> pad to the skip's shape -> concat -> DoubleConv;
* ``OutConv(in, classes)`` = Conv3d 1x1x1.

``seed000_unet("large")`` has exactly 40,158,853 trainable parameters and
``seed000_unet("small")`` 14,496,517, the two counts quoted in the forum question.

The activation after each BatchNorm is pluggable (``norm_act``) so that later notebooks can swap in
in-place ReLU or In-Place Activated BatchNorm without copying the network.
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .checkpointing import checkpointed, offload_saved, save_convolutions
from .checks import NetworkError, guard
from .config import SEED000_VOLUME
from .memory import predict_step

#: builds the normalisation + activation that follows each convolution, for ``channels`` channels.
NormAct = Callable[[int], Sequence[nn.Module]]


def bn_relu(channels: int, inplace: bool = False) -> list[nn.Module]:
    """The standard ``BatchNorm3d -> ReLU`` pair."""
    return [nn.BatchNorm3d(channels), nn.ReLU(inplace=inplace)]


def bn_relu_inplace(channels: int) -> list[nn.Module]:
    """``BatchNorm3d -> ReLU(inplace=True)``: the ReLU overwrites BN's output (notebook 05)."""
    return bn_relu(channels, inplace=True)


class DoubleConv(nn.Module):
    """(Conv3d 3x3x3 -> norm -> activation) x 2. Middle channels = ``out_channels``.

    ``checkpoint`` (set by ``UNet3D``, default None): ``"double_conv"`` recomputes the whole
    block in backward, ``"conv"`` each (conv -> norm -> activation) unit separately."""

    checkpoint: str | None = None

    def __init__(self, in_channels: int, out_channels: int, norm_act: NormAct | None = None):
        super().__init__()
        norm_act = norm_act or bn_relu
        self.double_conv = nn.Sequential(
            nn.Conv3d(in_channels, out_channels, kernel_size=3, padding=1),
            *norm_act(out_channels),
            nn.Conv3d(out_channels, out_channels, kernel_size=3, padding=1),
            *norm_act(out_channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpoint is None or not torch.is_grad_enabled():
            return self.double_conv(x)
        if self.checkpoint == "double_conv":
            return checkpointed(self.double_conv, x)
        # "conv": one checkpoint per unit that starts at a convolution
        mods = list(self.double_conv)
        starts = [i for i, m in enumerate(mods) if isinstance(m, nn.Conv3d)] + [len(mods)]
        for a, b in itertools.pairwise(starts):
            x = checkpointed(self.double_conv[a:b], x)
        return x


class Down(nn.Module):
    """Halve every spatial size with MaxPool3d(2), then DoubleConv."""

    def __init__(self, in_channels: int, out_channels: int, norm_act: NormAct | None = None):
        super().__init__()
        self.maxpool_conv = nn.Sequential(
            nn.MaxPool3d(2), DoubleConv(in_channels, out_channels, norm_act)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool_conv(x)


class Up(nn.Module):
    """Trilinear upsample x2, pad to the skip connection's shape, concatenate, DoubleConv.

    ``in_channels`` is the channel count *after* concatenation (upsampled + skip).

    ``lean=True`` changes no value the convolution sees, only memory: the upsampled map is cast
    to the skip's dtype at once and not kept in a local variable. Under CUDA autocast,
    trilinear upsampling runs in float32 (it is on autocast's fp32 list), so the upsampled map
    and the concatenation would be float32 -- and the default forward, like seed 000's, keeps
    both alive through the whole DoubleConv (its local ``x`` and the DoubleConv's argument).
    The convolution casts its input to float16 anyway, so casting earlier computes the same.
    """

    def __init__(self, in_channels: int, out_channels: int, norm_act: NormAct | None = None,
                 lean: bool = False):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="trilinear", align_corners=True)
        self.conv = DoubleConv(in_channels, out_channels, norm_act)
        self.lean = lean

    @staticmethod
    def pad_to(x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        """An odd size on the way down (26 -> 13 -> 6) leaves the upsampled map one voxel short:
        pad it (last dim first, as F.pad wants) so it lines up with the skip connection."""
        diff = [s - u for s, u in zip(skip.shape[2:], x.shape[2:], strict=True)]
        pad: list[int] = []
        for d in reversed(diff):
            pad += [d // 2, d - d // 2]
        return F.pad(x, pad) if any(pad) else x

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        if self.lean:
            return self.conv(torch.cat([skip, self.pad_to(self.up(x).to(skip.dtype), skip)], dim=1))
        x = self.up(x)
        x = self.pad_to(x, skip)
        return self.conv(torch.cat([skip, x], dim=1))


class OutConv(nn.Module):
    """1x1x1 convolution to one logit per class."""

    def __init__(self, in_channels: int, n_classes: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, n_classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def default_channels(levels: int, base: int) -> tuple[int, ...]:
    """Encoder widths base, 2*base, ... doubling per level; the deepest level repeats the one
    above it (the 'bilinear' U-Net: no learned up-convolution, so no factor 2 at the bottom)."""
    widths = [base * 2**i for i in range(levels - 1)]
    return tuple(widths + [widths[-1]])


def default_decoder_channels(channels: Sequence[int]) -> tuple[int, ...]:
    """Decoder output widths: half the skip connection's width, and ``channels[0]`` at the top."""
    skips = list(channels[:-1])[::-1]  # deepest skip first
    return tuple([c // 2 for c in skips[:-1]] + [channels[0]])


class UNet3D(nn.Module):
    """A configurable 3D U-Net for volumetric segmentation.

    Args:
        levels: number of resolution levels (``levels - 1`` poolings).
        channels: an int (base width, doubled per level, see ``default_channels``) or the explicit
            encoder widths, one per level.
        n_classes: output channels (logits), 5 in seed 000.
        in_channels: input channels, 1 for a grey-value volume.
        decoder_channels: output width of each ``Up`` block, deepest first; default
            ``default_decoder_channels``.
        norm_act: the norm + activation factory used in every DoubleConv (default BN + ReLU).
        checkpoint_levels: removed; raises a TypeError naming ``checkpoint="level"``, its one
            spelling now.
        checkpoint: recompute blocks in backward instead of storing their activations
            (``torch.utils.checkpoint``, non-reentrant; notebook 07), at this granularity: None
            (off), ``"level"`` (each block: inc, each Down, each Up), ``"double_conv"`` (each
            DoubleConv; pooling, upsampling and concatenation stay outside) or ``"conv"`` (each
            conv -> norm -> activation unit).
        checkpoint_policy: a selective-checkpointing policy (e.g.
            ``checkpointing.save_convolutions``): what to store inside a checkpointed block
            (``"level"`` only).
        checkpoint_fix_bn: freeze BatchNorm running statistics while a block is recomputed, so
            that they are updated once per step, as without checkpointing.
        lean_up: every ``Up`` block casts its upsampled map to the skip's dtype at once and keeps
            no reference to it (``Up(lean=True)``): the same values, less memory under autocast.
        offload_activations: copy what autograd saves to host memory during forward
            (``torch.autograd.graph.save_on_cpu(pin_memory=True)`` on a GPU, simulated under
            FakeTensorMode for predictions, nothing on a real CPU); see
            ``checkpointing.offload_saved``. Combines with every checkpointing option.
    """

    CHECKPOINT_MODES = (None, "level", "double_conv", "conv")

    def __init__(
        self,
        levels: int = 5,
        channels: int | Sequence[int] = 64,
        n_classes: int = 5,
        in_channels: int = 1,
        decoder_channels: Sequence[int] | None = None,
        norm_act: NormAct | None = None,
        checkpoint_levels: None = None,  # removed (keeps its place for positional callers)
        checkpoint_policy: Callable | None = None,
        checkpoint_fix_bn: bool = True,
        lean_up: bool = False,
        checkpoint: str | None = None,
        offload_activations: bool = False,
    ):
        super().__init__()
        if checkpoint_levels is not None:
            raise TypeError(f"UNet3D(checkpoint_levels={checkpoint_levels!r}) is no longer accepted: "
                            "write checkpoint=\"level\" (what checkpoint_levels=True meant), or leave "
                            "checkpoint out for no checkpointing")
        if checkpoint not in self.CHECKPOINT_MODES:
            raise ValueError(f"checkpoint must be one of {self.CHECKPOINT_MODES}, got {checkpoint!r}")
        if checkpoint_policy is not None and checkpoint != "level":
            raise ValueError("checkpoint_policy (selective checkpointing) needs checkpoint='level'")
        if levels < 2:
            raise ValueError(f"a U-Net needs at least 2 levels, got levels={levels}")
        enc = default_channels(levels, channels) if isinstance(channels, int) else tuple(channels)
        if len(enc) != levels:
            raise ValueError(
                f"channels has {len(enc)} entries but levels={levels}: give one width per level"
            )
        dec = tuple(decoder_channels) if decoder_channels else default_decoder_channels(enc)
        if len(dec) != levels - 1:
            raise ValueError(
                f"decoder_channels needs levels-1={levels - 1} entries (one per Up), got {len(dec)}"
            )
        self.levels, self.in_channels, self.n_classes = levels, in_channels, n_classes
        self.encoder_channels, self.decoder_channels = enc, dec
        self.checkpoint = checkpoint
        self.checkpoint_policy, self.checkpoint_fix_bn = checkpoint_policy, checkpoint_fix_bn
        self.offload_activations = offload_activations

        self.inc = DoubleConv(in_channels, enc[0], norm_act)
        self.downs = nn.ModuleList(
            Down(enc[i], enc[i + 1], norm_act) for i in range(levels - 1)
        )
        ups = []
        below = enc[-1]
        for i, out in enumerate(dec):
            skip = enc[levels - 2 - i]
            ups.append(Up(below + skip, out, norm_act, lean=lean_up))
            below = out
        self.ups = nn.ModuleList(ups)
        self.outc = OutConv(below, n_classes)
        if checkpoint_policy is not None and any(
                type(m).__name__ == "InPlaceABN"
                for m in self.modules()):
            raise ValueError(
                "selective checkpointing (checkpoint_policy) cannot be combined with In-Place ABN: "
                "the policy stores each convolution's output and In-Place ABN overwrites that "
                "output in place (PyTorch refuses: 'Tensor cached during selective activation "
                "checkpoint has been mutated'). Fix: full checkpointing (checkpoint='level', "
                "'double_conv' or 'conv', no policy) works with In-Place ABN.")
        if checkpoint in ("double_conv", "conv"):
            if not checkpoint_fix_bn:
                raise ValueError("checkpoint_fix_bn=False is only offered with checkpoint='level'")
            for m in self.modules():
                if isinstance(m, DoubleConv):
                    m.checkpoint = checkpoint

    @property
    def min_size(self) -> int:
        """The smallest spatial size each of D, H, W may have: one voxel at the deepest level."""
        return 2 ** (self.levels - 1)

    def check_input(self, x: torch.Tensor) -> None:
        """Raise a ValueError that names the fix when ``x`` cannot go through this net."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 5:
            hint = (
                " Add the batch and channel dims: x[None, None]." if x.dim() == 3 else
                " Add the batch dim: x.unsqueeze(0)." if x.dim() == 4 else ""
            )
            raise ValueError(
                f"UNet3D expects a 5D tensor (batch, channels, depth, height, width), "
                f"got {x.dim()}D with shape {tuple(x.shape)}.{hint}"
            )
        if x.shape[1] != self.in_channels:
            raise ValueError(
                f"UNet3D was built for {self.in_channels} input channel(s) but the input has "
                f"{x.shape[1]} (shape {tuple(x.shape)}). Fix: pass in_channels={x.shape[1]} "
                "when building the net, or select the right channels."
            )
        small = [s for s in x.shape[2:] if s < self.min_size]
        if small:
            raise ValueError(
                f"volume {tuple(x.shape[2:])} is too small for {self.levels} levels: each of "
                f"D, H, W must be at least 2**(levels-1) = {self.min_size} so that the deepest "
                f"level keeps one voxel. Fix: crop/pad to >= {self.min_size} per side, or use "
                f"fewer levels."
            )
        deepest = x.shape[0] * math.prod(s // self.min_size for s in x.shape[2:])
        if deepest < 2 and torch.is_grad_enabled() and any(  # the module walk only when it matters
                isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in self.modules()):
            raise ValueError(
                f"input {tuple(x.shape)}: at the deepest level each channel has a single value "
                f"(batch {x.shape[0]} x {tuple(s // self.min_size for s in x.shape[2:])} voxels), and "
                "BatchNorm in training mode needs more than one to compute a variance. Fix: a batch "
                f"of 2 or more, a volume of at least {2 * self.min_size} along one side, or model.eval()."
            )

    def _run(self, block: nn.Module, *args: torch.Tensor) -> torch.Tensor:
        if self.checkpoint == "level" and torch.is_grad_enabled():
            return checkpointed(block, *args, policy=self.checkpoint_policy,
                                fix_bn=self.checkpoint_fix_bn)
        return block(*args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        with offload_saved(x, self.offload_activations and torch.is_grad_enabled()):
            return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self._run(self.inc, x)]
        for down in self.downs:
            skips.append(self._run(down, skips[-1]))
        x = skips.pop()
        for up in self.ups:
            x = self._run(up, x, skips.pop())
        return self.outc(x)


SEED000_VARIANTS = {
    # NetULarge: inc(1,64) down(64,128) (128,256) (256,512) (512,512);
    # up(1024,256) (512,128) (256,64) (128,64); outc(64,5)
    "large": dict(levels=5, channels=(64, 128, 256, 512, 512), decoder_channels=(256, 128, 64, 64)),
    # NetU: inc(1,64) down(64,128) (128,256) (256,256); up(512,256) (384,128) (192,64); outc(64,5)
    "small": dict(levels=4, channels=(64, 128, 256, 256), decoder_channels=(256, 128, 64)),
}


def seed000_unet(variant: str = "large", **kwargs) -> UNet3D:
    """One of the two U-Nets from seed 000: ``"large"`` (40,158,853 params) or ``"small"``
    (14,496,517). Extra keyword arguments go to ``UNet3D`` (e.g. ``norm_act``)."""
    if variant not in SEED000_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: use one of {sorted(SEED000_VARIANTS)}")
    return UNet3D(n_classes=5, in_channels=1, **SEED000_VARIANTS[variant], **kwargs)


#: notebook 07's U-Net variants of README's checkpointing figure (keyword arguments of UNet3D)
SEED000_CHECKPOINT_HEADLINE = {"none": {}, "level": dict(checkpoint="level"),
                               "selective": dict(checkpoint="level", checkpoint_policy=save_convolutions)}


def predict_seed000_unet(lean_up: bool = True, **unet_kwargs):
    """``predict_step`` of seed 000's large U-Net at full size (batch 2, 26 x 150 x 320, 5
    classes, Adam, steady state) under CUDA's autocast fp16 rules, with ``lean_up`` (default
    True): the one configuration of notebook 07's granularity table and of README's
    checkpointing figure. ``unet_kwargs`` go to ``seed000_unet`` (``checkpoint=...``)."""
    return predict_step(lambda: seed000_unet("large", lean_up=lean_up, **unet_kwargs),
                        (2, 1, *SEED000_VOLUME), n_classes=5, autocast_dtype=torch.float16,
                        module_peaks=False)


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Seed 000's count: ``sum(p.numel() for p in model.parameters() if p.requires_grad)``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def named_blocks(model: UNet3D) -> list[tuple[str, nn.Module]]:
    """The U-Net's blocks in forward order, by the names the course's tables use: ``inc``,
    ``downs.k``, ``ups.k``, ``outc``."""
    return [("inc", model.inc), *[(f"downs.{k}", m) for k, m in enumerate(model.downs)],
            *[(f"ups.{k}", m) for k, m in enumerate(model.ups)], ("outc", model.outc)]


def level_shapes(model: UNet3D, volume: Sequence[int], batch: int = 1) -> list[tuple[str, tuple[int, ...]]]:
    """Output shape of every block (inc, downs.k, ups.k, outc), computed on a meta-device copy
    of ``model``: no memory is used, so any volume works, seed 000's full size included."""
    meta = copy.deepcopy(model).to("meta")
    x = torch.empty(batch, meta.in_channels, *volume, device="meta")
    meta.check_input(x)
    rows: list[tuple[str, tuple[int, ...]]] = []
    for name, m in named_blocks(meta):
        m.register_forward_hook(lambda mod, i, o, n=name: rows.append((n, tuple(o.shape))))  # noqa: ARG005 - forward hook
    with torch.no_grad():
        meta(x)
    return rows


def block_table(model: UNet3D, volume: Sequence[int], batch: int = 2,
                dtype: torch.dtype = torch.float16) -> list[dict]:
    """Per block (inc, downs.k, ups.k, outc): parameters, output shape, output resolution and the
    output's bytes in ``dtype`` at ``volume`` -- computed on the meta device."""
    size = torch.empty((), dtype=dtype).element_size()
    shapes = dict(level_shapes(model, volume, batch))
    return [{"block": name, "side": block_side(name), "parameters": count_parameters(m),
             "output shape": shapes[name], "resolution": "x".join(map(str, shapes[name][2:])),
             "channels": shapes[name][1], "output bytes": math.prod(shapes[name]) * size}
            for name, m in named_blocks(model)]


def block_side(block: str) -> str:
    """Where a block (``inc``, ``downs.k``, ``ups.k``, ``outc``) sits in the U: ``"encoder"``,
    ``"decoder"`` or ``"output"``. With its output resolution it pairs two nets' blocks by place,
    not by name: ``ups.2`` is 13x75x160 in seed 000's large net and 26x150x320 in the small one."""
    if block == "outc":
        return "output"
    return "decoder" if block.startswith("ups") else "encoder"


def place(row: dict) -> str:
    """Where a ``block_table`` row's block sits in the U: its side and output resolution, e.g.
    ``"decoder 26x150x320"`` -- the key that pairs two nets' blocks (notebooks 01 and 02)."""
    return f"{row['side']} {row['resolution']}"


def places(model: UNet3D, volume: Sequence[int], batch: int = 2,
           dtype: torch.dtype = torch.float16) -> dict[str, dict]:
    """``block_table``'s rows keyed by ``place``, in the net's order (the U's path)."""
    return {place(r): r for r in block_table(model, volume, batch, dtype)}


def u_order(where: str) -> tuple[int, int]:
    """A sort key for places: the encoder by falling resolution (full resolution first, down to
    the bottom), then the decoder by rising resolution, then the output conv."""
    side, res = where.split()
    voxels = math.prod(int(v) for v in res.split("x"))
    return {"encoder": 0, "decoder": 1, "output": 2}[side], -voxels if side == "encoder" else voxels


def side_by_side(nets: dict[str, dict[str, dict]], *keys: str):
    """One row per place in the U (every net's places, in the U's order), per net (``{name:
    places(...)}``) the given ``block_table`` keys, columns ``"<net> <key>"``; ``"-"`` where a net
    has no block at that place. A DataFrame (pandas)."""
    import pandas as pd

    rows = sorted({w for p in nets.values() for w in p}, key=u_order)
    return pd.DataFrame.from_dict({w: {f"{v} {k}": p[w][k] if w in p else "-" for v, p in nets.items() for k in keys}
                                   for w in rows}, orient="index")


def output_summary(nets: dict[str, dict[str, dict]]):
    """Per net (``{name: places(...)}``): its blocks' outputs added up (MiB), its largest block
    output (bytes), where that block sits and its channels. A DataFrame (pandas), one row a net."""
    import pandas as pd

    rows = {}
    for v, p in nets.items():
        top = max(p.values(), key=lambda r: r["output bytes"])
        rows[v] = {"block outputs MiB": sum(r["output bytes"] for r in p.values()) / 2**20,
                   "largest output B": top["output bytes"], "largest at": place(top), "its channels": top["channels"]}
    return pd.DataFrame.from_dict(rows, orient="index")


def place_of(model: UNet3D, volume: Sequence[int]) -> Callable[[str], str]:
    """A key function for a log's module names: the ``place`` of the block a module belongs to
    (``"ups.2.conv.double_conv.0"`` -> ``"decoder 26x150x320"`` in the small seed net); the model
    itself (``""``) has none: ``"model"``."""
    res = {r["block"]: place(r) for r in block_table(model, volume, batch=1)}

    def key(name: str) -> str:
        parts = name.split(".")
        block = ".".join(parts[:2]) if parts[0] in ("downs", "ups") else parts[0]
        return res.get(block, "model")
    return key


def draw_u(model: UNet3D, volume: Sequence[int]) -> str:
    """The U of ``model`` as text, computed from the net: one line per resolution, the encoder's
    block on the left (channels in -> out), the skip connection, the decoder's ``Up`` on the right
    (skip + upsampled channels, in the order of the concatenation, -> out), the output conv on
    the top line; the deepest encoder block is the bottom of the U."""
    enc, dec, top = model.encoder_channels, model.decoder_channels, model.levels - 1
    res = {r["block"]: r["resolution"] for r in block_table(model, volume, batch=1)}
    left, right = [], []
    for j in range(model.levels):
        name = "inc" if j == 0 else f"downs.{j - 1}"
        left.append((res[name], f"{name:<8} {model.in_channels if j == 0 else enc[j - 1]} -> {enc[j]}"))
        if j < top:  # ups.i joins level j = top - 1 - i: the skip of level j, the upsampled map from below
            i = top - 1 - j
            below = enc[-1] if i == 0 else dec[i - 1]
            right.append(f"{f'ups.{i}':<7}{enc[j]} + {below} -> {dec[i]}")
    width = max(len(text) for _, text in left)
    lines = [f"{'resolution':<11} {'encoder':<{width}}{'':13}decoder (Up: skip + upsampled -> out)"]
    for j, (r, text) in enumerate(left):
        if j:
            lines.append(f"{'':<11} {'| maxpool x2':<{width}}{'':13}^ upsample x2")
        tail = f"  --skip-->  {right[j]}" if j < top else "  -----------^  (the bottom of the U)"
        out = f"  --> outc {dec[-1]} -> {model.n_classes}" if j == 0 else ""
        lines.append(f"{r:<11} {text:<{width}}{tail}{out}")
    return "\n".join(lines)


def plot_memory_map(nets: dict[str, UNet3D], volume: Sequence[int], batch: int = 2,
                    dtype: torch.dtype = torch.float16):
    """Where the parameters sit and where the activations sit, block by block, for each net:
    bars of parameters (millions) over bars of each block's output size (MiB, ``dtype``), blocks
    laid out as the U (encoder down, decoder up), the resolution written under each block."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(nets), figsize=(7.5 * len(nets), 5.4), sharey="row", squeeze=False)
    for col, (name, net) in enumerate(nets.items()):
        rows = block_table(net, volume, batch, dtype)
        x = range(len(rows))
        labels = [f"{r['block']}\n{r['channels']} ch\n{r['resolution']}" for r in rows]
        top, bottom = axes[0][col], axes[1][col]
        top.bar(x, [r["parameters"] / 1e6 for r in rows], color="#4c72b0")
        top.set_title(f"{name}: {count_parameters(net):,} parameters", fontsize=10)
        top.set_ylabel("parameters (millions)")
        bottom.bar(x, [r["output bytes"] / 2**20 for r in rows], color="#8172b2")
        bottom.set_ylabel(f"block output, MiB\n({str(dtype)[6:]}, batch {batch})")
        bottom.set_xticks(list(x), labels, fontsize=6.5)
        top.set_xticks(list(x), [r["block"] for r in rows], fontsize=7)
        for ax in (top, bottom):
            ax.grid(axis="y", alpha=0.3)
    fig.suptitle("parameters sit in the deep, narrow-resolution blocks; activations in the "
                 f"full-resolution ones ({'x'.join(map(str, volume))})", fontsize=10)
    fig.tight_layout()
    return fig


guard(globals(), NetworkError)
