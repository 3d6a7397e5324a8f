"""Spatial parallelism for seed 004's DenseNet-169: the X-ray split into strips, one per rank.

What: seed 004's X-rays are about 2000 x 2000 pixels; DenseNet-169 (``densenet.DenseNet``) does
not train on them at batch 8 on one card. Split the *image* instead of the batch: each of the
``world`` ranks holds one horizontal strip (``height / world`` rows, the full width) of the input
and of every activation, and runs the whole network on it (spatial parallelism, or domain
decomposition). The parameters are replicated; the activations -- what runs out of memory --
are divided by ``world``.

Why it gives the same step as one process:

* a 3x3 convolution, the stem's 7x7 one and the stem's max-pool read rows that the neighbour
  owns: before each of them every rank receives a *halo* (its neighbours' rows next to the cut,
  ``spatial.HaloExchange``; zeros at the image's true border, which is the convolutions' zero
  padding; for the max-pool, whose padding is -inf, the border's halo is -inf). The exchange is
  symmetric: the stride-2 stem uses 2 of the 3 rows from below, the max-pool none from below
  (they are sent anyway, and counted in the bytes exchanged);
* 1x1 convolutions, ReLU and the concatenations (along channels) need nothing from the
  neighbour; the transitions' 2x2 average pools need nothing either as long as every strip
  starts on an even row at that resolution: strips are aligned to the net's total stride (32),
  so ``height / world`` must be a multiple of 32 (``check_alignment`` refuses otherwise);
* every BatchNorm normalises with the statistics of the *whole* image: in forward each rank's
  per-channel count, mean and sum of squared deviations (M2) are all-gathered and combined with
  Chan et al.'s formula (``numerics.combine_moments``, as ``parallel.CrossReplicaBatchNorm3d``
  does), not as sums of x and x^2, whose ``E[x^2] - E[x]^2`` cancels in fp32 when the mean is
  large against the spread (``fp32_combination_error`` measures it); in backward two per-channel
  sums are all-reduced (``GlobalBatchNorm``); the running statistics are updated once, as one
  process would, with the unbiased variance over the global count;
* the global average pool is a per-rank sum, all-reduced (differentiably, ``spatial.all_reduce_sum``)
  and divided by the global pixel count: every rank ends with the *same* logits, the same loss.

::

          width W (whole on every rank)
     +---------------------------------+
     |  rank 0: rows [0, t)            |   t = H / world, a multiple of 32
     |.................................|  <- rank 0's last r rows: rank 1's lower halo
     |=================================|  cut
     |.................................|  <- rank 1's first r rows: rank 0's upper halo
     |  rank 1: rows [t, 2t)           |
     |.................................|
     |=================================|  cut
     |  rank 2: rows [2t, 3t)          |   r = 3 (stem conv 7x7), 1 (max-pool, 3x3 convs)
     +---------------------------------+   at every resolution: t/2, t/4, ..., t/32 rows

How the gradients are combined: every rank's loss is the *full* loss (the logits are replicated),
so the ranks' losses add up to ``world`` x the loss. The backward of an all-reduce (the pool's,
the BatchNorms') sums the incoming gradients over ranks -- the gradient of that sum of losses --
so rank r's weight gradient is ``world`` x its strip's share of the true gradient (the
classifier's, computed from the replicated features, is the whole true gradient on every rank).
Summing over ranks and dividing by ``world`` -- an average, what ``DistributedDataParallel``
does -- gives exactly one process's gradient (``spatial_densenet_worker``; ``check_split``
measures it). (``spatial.py`` instead gives each rank only its own voxels' loss and sums: with
replicated logits there is no "own part" of the loss to give.)

``memory_efficient=True`` nets: the bottleneck (concatenation -> BN -> ReLU -> 1x1 conv) is
recomputed in backward under a non-reentrant checkpoint, as ``DenseLayer`` does; its BatchNorm's
all-reduce runs again during the recomputation (the same sums: the same statistics), and the
statistics are logged only once, so the running statistics are updated once.

Memory: ``predict_strip`` runs one rank's strip through ``memory.predict_step`` (fake tensors,
MemTracker, CUDA's rules, Adam's steady state) under PyTorch's *fake* process group, whose
collectives and point-to-point messages move no data but give tensors of the right shapes;
``spatial_memory_table`` tabulates it for 1, 2, 4, 8 ranks. Its checks: at one rank the strip's
prediction is the plain ``predict_step`` of the whole image (``memory_check``, and the table's
``attrs["check"]`` at full size); ``measured_check`` compares the fake process group's figures
with real gloo ranks measuring the same step on real CPU tensors.

From a notebook::

    from course_utils.densenet_spatial import check_split, spatial_memory_table
    r = check_split(world=2, variants=[{"halo": False}, {"global_bn": False}])
    r["summary"], r["exchange"]          # differences vs one process; bytes exchanged per rank
    table = spatial_memory_table()       # 20 predictions of DenseNet-169 at 2048 x 2000: minutes
    fp32_combination_error()             # the statistics' fp32 error, old form vs new, at 2000^2: ~1 s
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .budget import fixed_bytes
from .checks import ParallelError, guard
from .densenet import DENSENET169, SEED004_CLASSES, DenseLayer, DenseNet
from .memory import default_dtype, mib, predict_step
from .numerics import combine_moments, update_running_stats
from .parallel import all_gather, compared, launch
from .spatial import EXCHANGED, HaloExchange, all_reduce_sum, conv_with_halos

#: the net's total stride: stem conv (2) x max-pool (2) x 3 transitions (2 each)
ALIGN = 32
#: the small DenseNet the checks train (float64, seconds on a CPU)
SMALL_DENSENET = dict(growth_rate=4, block_config=(2, 2, 2, 2), num_init_features=8, bn_size=2)
#: seed 004's X-rays at full resolution
FULL_IMAGE = (2000, 2000)
#: bytes this process sends to the BatchNorm collectives (forward: its statistics, all-gathered;
#: backward: two per-channel sums, all-reduced), and the bytes of the activations whose halos were
#: exchanged (reset by the worker)
REDUCED = {"forward": 0, "backward": 0}
HALO_SOURCES = {"bytes": 0, "exchanges": 0}


# --------------------------------------------------------------------------------------------
# Strips
# --------------------------------------------------------------------------------------------
def check_alignment(height: int, world: int) -> int:
    """The rows each rank holds, ``height // world``; a ParallelError naming the fix unless it is
    a whole multiple of the net's total stride (32), which keeps every pooling window and every
    strided convolution's grid inside one strip at every resolution."""
    if height % (ALIGN * world):
        lo = height // (ALIGN * world) * ALIGN * world
        hi = lo + ALIGN * world
        raise ParallelError(
            f"height {height} cannot be split into {world} strips aligned to the net's stride "
            f"({ALIGN}): height / world must be a multiple of {ALIGN}.",
            f"pad or crop the height to a multiple of {ALIGN} x world = {ALIGN * world} (e.g. {hi}"
            + (f" or {lo}" if lo else "") + ").")
    return height // world


def _check_rank(rank: int, world: int) -> None:
    if rank >= world:
        raise ParallelError(f"rank {rank} of a world of {world}: ranks count from 0 to world - 1.",
                            f"a rank from 0 to {world - 1}, or world > {rank}.")


def _check_image(image: Sequence[int], world: int | None = None) -> None:
    """An image is (height, width): the width at least one stride (32), the height split in
    ``world`` aligned strips (``check_alignment``) where ``world`` is given."""
    if isinstance(image, (str, bytes)) or len(image) != 2:
        raise ParallelError(f"image={image!r} is not (height, width).", "pass image=(height, width), e.g. (128, 64).")
    if image[1] < ALIGN:
        raise ParallelError(f"image {tuple(image)}: the width is below the net's stride ({ALIGN}).",
                            f"a width of {ALIGN} pixels or more.")
    if world is not None:
        check_alignment(image[0], world)


def aligned_height(height: int, world: int) -> int:
    """The smallest height >= ``height`` that ``world`` ranks can split (pad the rest)."""
    step = ALIGN * world
    return -(-height // step) * step


def strip_rows(height: int, world: int, rank: int) -> tuple[int, int]:
    """Rows [lo, hi) of the input that ``rank`` owns."""
    _check_rank(rank, world)
    t = check_alignment(height, world)
    return rank * t, (rank + 1) * t


# --------------------------------------------------------------------------------------------
# BatchNorm over the whole image
# --------------------------------------------------------------------------------------------
def _sum_over_ranks(t: torch.Tensor, direction: str) -> torch.Tensor:
    REDUCED[direction] += t.numel() * t.element_size()
    return all_reduce_sum(t)


def _gather_over_ranks(t: torch.Tensor, direction: str) -> torch.Tensor:
    """Every rank's ``t`` (1-d) as the rows of a (world, len) tensor; no autograd (the caller's
    backward is written by hand)."""
    REDUCED[direction] += t.numel() * t.element_size()
    return all_gather(t, autograd=False).view(-1, t.numel())


def strip_moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per channel of ``x`` (batch, channels, ...): the count (a (1,) tensor), the mean and the
    biased variance, by ``torch.var_mean`` (no temporary the size of ``x``). A rank sends
    ``(count, mean, var * count)`` -- its M2 -- to ``numerics.combine_moments``."""
    n = x.numel() // x.shape[1]
    var, mean = torch.var_mean(x, [0, *range(2, x.dim())], correction=0)
    return mean.new_full((1,), n), mean, var


def sums_combination(counts: torch.Tensor, means: torch.Tensor,
                     m2s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The form ``GlobalBatchNorm`` used before: each part's sums of x and of x^2 (from its count,
    mean and M2), summed over parts, then ``E[x^2] - E[x]^2``. Kept only to show what it loses
    (``fp32_combination_error``): the subtraction cancels the digits the mean shares with x^2.
    Arguments and result as ``numerics.combine_moments``'."""
    n = counts.sum()
    mean = (means * counts).sum(0) / n
    var = ((m2s / counts + means * means) * counts).sum(0) / n - mean * mean
    return n, mean, var


class GlobalBatchNorm(torch.autograd.Function):
    """Training-mode BatchNorm of this rank's strip with the statistics of the whole image.

    Forward: per-channel count, mean and M2 of the strip (``strip_moments``), all-gathered and
    combined by ``numerics.combine_moments`` (Chan et al.: no ``E[x^2] - E[x]^2`` cancellation);
    the output by ``F.batch_norm`` with those statistics. Saved for backward: the input and per-channel
    vectors, as ``nn.BatchNorm2d`` saves (so the memory figures match one process's).
    Backward: the per-channel sums of ``dy`` and ``dy * (x - mean)`` are all-reduced, then
    ``dx = (dy - mean(dy) - x_hat * mean(dy * x_hat)) * invstd * weight``; the weight and bias
    gradients are this strip's share (summed over ranks with the other parameters').
    ``sync=False``: the strip's own statistics (what a plain BatchNorm on each rank would do:
    wrong, kept to show it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                sync: bool, log: list, bn: nn.Module) -> torch.Tensor:
        c = x.shape[1]
        count, mean, var = strip_moments(x)  # count: a tensor (under fake tensors it cannot be read)
        if sync:
            s = _gather_over_ranks(torch.cat([count, mean, var * count]), "forward")
            count, mean, var = combine_moments(s[:, :1], s[:, 1:c + 1], s[:, c + 1:])
        else:
            count = count[0]
        log.append((bn, mean, var, count))
        y = F.batch_norm(x, mean, var, weight, bias, training=False, momentum=0.0, eps=eps)
        invstd = torch.rsqrt(var + eps)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.eps, ctx.sync, ctx.count = eps, sync, count
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple:
        x, weight, mean, invstd = ctx.saved_tensors
        c = x.shape[1]
        shape = (1, c) + (1,) * (x.dim() - 2)
        # the strip's sums of dy * x_hat and of dy, without a temporary the size of the input
        _, gw, gb = torch.ops.aten.native_batch_norm_backward(
            gy, x, weight, None, None, mean, invstd, True, ctx.eps, [False, True, True])
        sum_dy, sum_dy_xhat = gb, gw
        if ctx.sync:
            s = _sum_over_ranks(torch.cat([sum_dy, sum_dy_xhat]), "backward")
            sum_dy, sum_dy_xhat = s[:c], s[c:]
        mean_dy, mean_dy_xhat = sum_dy / ctx.count, sum_dy_xhat / ctx.count
        # dx = dy * b + x * a + k, per channel: one new tensor, updated in place
        b = invstd * weight if weight is not None else invstd
        a = -invstd * b * mean_dy_xhat
        k = -mean_dy * b - mean * a
        gx = torch.addcmul(k.view(shape), x, a.view(shape))
        gx.addcmul_(gy, b.view(shape))
        affine = weight is not None
        return gx, gw if affine else None, gb if affine else None, None, None, None, None


def fp32_combination_error(image: Sequence[int] = FULL_IMAGE, world: int = 8, channels: int = 8,
                           offsets: Sequence[float] = (0.0, 3.0, 30.0), seed: int = 0):
    """How many digits the old form (``sums_combination``, E[x^2] - E[x]^2) loses in fp32 against
    the new one (``combine_moments``), on the statistics of a stem-like activation of an X-ray at
    full resolution split in strips. About 1 CPU-s at the defaults.

    The activation: DenseNet-169's stem convolution (7x7, stride 2, its default initialisation
    under ``seed``; the first ``channels`` of its 64 filters) applied in fp32 to an image of
    ``image`` pixels, its height padded to a multiple of 32 x ``world`` as the split needs
    (2000 -> 2048), each pixel ``offset + N(0, 1)``; that is, the input of the stem's BatchNorm.
    ``world`` strips of its rows (one per rank) give their ``strip_moments``; both forms combine
    them. Reference: the float64 statistics of the same fp32 activation. Returns a DataFrame, one
    row per offset: the offset (in units of the image's spread), the activation's largest
    |mean| / std over channels, and the largest relative error of the variance over channels for
    the old form and the new one. ``df.attrs``: ``method``, ``assumption``, ``eps`` (fp32's
    machine epsilon) and ``seconds``."""
    import pandas as pd

    if isinstance(image, (str, bytes)) or len(image) != 2 or not 1 <= channels <= DENSENET169["num_init_features"]:
        raise ParallelError(f"fp32_combination_error(image={image!r}, channels={channels}): the image is "
                            f"(height, width), the stem has {DENSENET169['num_init_features']} filters.",
                            f"image=(height, width) and channels from 1 to {DENSENET169['num_init_features']}.")
    t0 = time.perf_counter()
    height = aligned_height(image[0], world)
    torch.manual_seed(seed)
    weight = nn.Conv2d(1, DENSENET169["num_init_features"], 7, stride=2, padding=3, bias=False).weight
    weight = weight.detach()[:channels]
    noise = torch.randn(1, 1, height, image[1], generator=torch.Generator().manual_seed(seed))
    rows = []
    for offset in offsets:
        with torch.no_grad():
            x = F.conv2d(noise + offset, weight, None, 2, 3)
        parts = [strip_moments(strip) for strip in x.chunk(world, 2)]
        sent = torch.stack([torch.cat([n, mean, var * n]) for n, mean, var in parts])  # (world, 2c + 1)
        gathered = sent[:, :1], sent[:, 1:channels + 1], sent[:, channels + 1:]
        ref_var, ref_mean = torch.var_mean(x.double(), [0, 2, 3], correction=0)
        err = {name: ((form(*gathered)[2].double() - ref_var).abs() / ref_var).max().item()
               for name, form in (("old", sums_combination), ("new", combine_moments))}
        rows.append({"image offset (spreads)": offset,
                     "activation |mean| / std": (ref_mean.abs() / ref_var.sqrt()).max().item(),
                     "old: E[x^2] - mean^2": err["old"], "new: count, mean, M2": err["new"],
                     "old / new": err["old"] / err["new"] if err["new"] else math.inf})
    df = pd.DataFrame(rows)
    df.attrs.update(
        method=(f"DenseNet-169's stem conv (first {channels} of 64 filters, seed {seed}) on a {height} x {image[1]} "
                f"image, fp32; {world} strips of {x.shape[2] // world} x {x.shape[3]} activation rows, one per "
                "rank; relative error of the variance, largest over channels, against float64 statistics of "
                "the same activation"),
        assumption=("each pixel is offset + N(0, 1): offset 0 is a normalised image; an X-ray scaled to [0, 1] "
                    "without subtracting its mean sits a few spreads above zero (offset ~3, assumed, not "
                    "measured on seed 004's X-rays). The old form's error grows as (mean / std)^2 of the "
                    "activation, the new form's does not: a larger offset widens the gap"),
        eps=torch.finfo(torch.float32).eps, seconds=time.perf_counter() - t0)
    return df


# --------------------------------------------------------------------------------------------
# Layers on a strip
# --------------------------------------------------------------------------------------------
def _count_halo_source(x: torch.Tensor) -> None:
    """Count ``x`` as an activation whose halos are exchanged (``HALO_SOURCES``)."""
    HALO_SOURCES["bytes"] += x.numel() * x.element_size()
    HALO_SOURCES["exchanges"] += 1


class _Strip:
    """How this rank's strip runs: its rank and world, whether halos are exchanged (``halo``)
    and BatchNorm statistics are global (``global_bn``), and the statistics logged."""

    def __init__(self, halo: bool, global_bn: bool, log: list):
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.halo, self.global_bn, self.log = halo, global_bn, log
        if (halo or global_bn) and not dist.is_initialized() and self.world > 1:
            raise RuntimeError("strip_forward needs a process group (course_utils.parallel.launch)")

    def halos(self, x: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``r`` rows above and below the strip: the neighbours' (zeros at the border), or
        zeros everywhere when halos are off (each strip padded as if it were a whole image)."""
        if self.halo and dist.is_initialized():
            _count_halo_source(x)
            return HaloExchange.apply(x, r, 2)
        zeros = x.new_zeros(x.shape[0], x.shape[1], r, x.shape[3])
        return zeros, zeros

    def bn(self, m: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
        if not (m.training or m.running_mean is None):  # eval: the running statistics, locally
            return m(x)
        return GlobalBatchNorm.apply(x, m.weight, m.bias, m.eps, self.global_bn and dist.is_initialized(),
                                     self.log, m)

    def bn_relu(self, m: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(m, x), inplace=True)


def rows_windowed(op: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, lower: torch.Tensor,
                  upper: torch.Tensor, k: int, s: int, r: int) -> torch.Tensor:
    """A windowed op along the rows (kernel ``k``, stride ``s``, padding ``r``; ``op`` pads
    nothing along rows) on the strip ``x`` with ``r`` halo rows above (``lower``) and below
    (``upper``), without a padded copy of the whole strip: the output rows whose windows lie
    inside the strip from ``x`` alone, the few at each end from a thin piece with the halo.
    Output row j reads strip rows ``s*j - r .. s*j - r + k - 1``; ``x`` has a multiple of ``s``
    rows, and the output ``rows / s``."""
    t = x.shape[2]
    if not (k >= 1 and s >= 1 and r < k and t % s == 0):
        raise ParallelError(f"rows_windowed(k={k}, s={s}, r={r}) on {t} rows: a window of k >= 1 rows, a stride "
                            "s >= 1 that divides the rows, padding r < k.", "e.g. k=3, s=2, r=1 on an even strip.")
    n_out = t // s
    j_lo, j_hi = -(-r // s), (t - k + r) // s  # the interior outputs j_lo..j_hi (inclusive)
    if j_hi < j_lo:  # too thin to have an interior: one op on the extended strip
        return op(torch.cat([lower, x, upper[:, :, :k - s - r]], 2))
    pieces = []
    if j_lo > 0:
        pieces.append(op(torch.cat([lower, x[:, :, :s * (j_lo - 1) - r + k]], 2)))
    if j_hi >= j_lo:
        pieces.append(op(x[:, :, s * j_lo - r:s * j_hi - r + k]))
    if j_hi < n_out - 1:
        pieces.append(op(torch.cat([x[:, :, s * (j_hi + 1) - r:], upper[:, :, :k - s - r]], 2)))
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, 2)


def _stem(net: DenseNet, x: torch.Tensor, st: _Strip) -> torch.Tensor:
    conv, norm = net.stem[0], net.stem[1]
    lower, upper = st.halos(x, 3)
    x = rows_windowed(lambda v: F.conv2d(v, conv.weight, conv.bias, 2, (0, 3)), x, lower, upper, 7, 2, 3)
    x = st.bn_relu(norm, x)
    lower, upper = st.halos(x, 1)
    if st.rank == 0 or not st.halo:  # the true border (or every cut, halos off): max-pool pads -inf
        # masked_fill, not a new tensor: the exchange must stay in the graph, or this rank would
        # skip its backward (whose messages the neighbour waits for) -- a deadlock
        lower = lower.masked_fill(torch.ones((), dtype=torch.bool, device=lower.device), -math.inf)
    return rows_windowed(lambda v: F.max_pool2d(v, 3, 2, (0, 1)), x, lower, upper, 3, 2, 1)


def _conv3x3(conv: nn.Conv2d, x: torch.Tensor, st: _Strip) -> torch.Tensor:
    if st.halo and dist.is_initialized():
        _count_halo_source(x)
        return conv_with_halos(F.conv2d, conv, x, 1, 2, (0, 1))
    lower, upper = st.halos(x, 1)
    return rows_windowed(lambda v: F.conv2d(v, conv.weight, conv.bias, 1, (0, 1)), x, lower, upper, 3, 1, 1)


def _dense_layer(layer: DenseLayer, features: list[torch.Tensor], st: _Strip) -> torch.Tensor:
    def bottleneck(*fs: torch.Tensor) -> torch.Tensor:
        return F.conv2d(st.bn_relu(layer.norm1, torch.cat(fs, 1)), layer.conv1.weight, layer.conv1.bias)

    if layer.memory_efficient and torch.is_grad_enabled() and any(f.requires_grad for f in features):
        out = checkpoint(bottleneck, *features, use_reentrant=False)  # BN stats: logged twice, used once
    else:
        out = bottleneck(*features)
    return _conv3x3(layer.conv2, st.bn_relu(layer.norm2, out), st)


def strip_forward(net: DenseNet, x: torch.Tensor, *, halo: bool = True, global_bn: bool = True,
                  stats_log: list | None = None) -> torch.Tensor:
    """``net``'s forward on this rank's strip ``x`` (batch, channels, height / world, width) of
    the image, with ``net``'s own parameters: halos exchanged before the stem's conv and
    max-pool and before every 3x3 conv, BatchNorm over the whole image, the global pool
    all-reduced. Returns the logits of the *whole* image (the same on every rank). ``halo=False``
    or ``global_bn=False`` switch the exchange or the global statistics off (wrong: to show the
    check failing). ``stats_log`` receives ``(bn, mean, var, count)`` per BatchNorm call (a
    recomputed bottleneck logs again: use ``update_running_stats_once``). Without a process
    group it runs as one rank (world 1)."""
    if x.dim() != 4 or x.shape[1] != net.in_channels:
        raise ParallelError(f"strip_forward expects (batch, {net.in_channels}, rows, width), got "
                            f"{tuple(x.shape)}.", "add the channel dim (x[:, None]).")
    if net.checkpoint_blocks:
        raise ParallelError("strip_forward does not checkpoint whole blocks.",
                            "build the net with checkpoint_blocks=False (memory_efficient=True is supported).")
    st = _Strip(halo, global_bn, stats_log if stats_log is not None else [])
    if x.shape[2] % ALIGN:
        raise ParallelError(f"a strip of {x.shape[2]} rows: strips must be a multiple of {ALIGN} rows.",
                            f"pad or crop the height to a multiple of {ALIGN} x world.")
    if x.shape[3] < ALIGN:
        raise ParallelError(f"images must be at least {ALIGN} pixels wide, got {x.shape[3]}.",
                            f"a width of {ALIGN} pixels or more.")
    x = _stem(net, x, st)
    for stage in net.stages:
        block = stage[0]
        features = [x]
        for layer in block.layers:
            features.append(_dense_layer(layer, features, st))
        x = torch.cat(features, 1)
        if len(stage) > 1:  # transition: BN -> ReLU -> 1x1 conv -> 2x2 average pool (no halo)
            norm, _, conv, _ = stage[1]
            x = F.avg_pool2d(F.conv2d(st.bn_relu(norm, x), conv.weight, conv.bias), 2)
    x = st.bn_relu(net.norm5, x)
    pixels = x.shape[2] * x.shape[3] * st.world  # every strip has the same shape
    pooled = x.sum((2, 3))
    if dist.is_initialized() and st.world > 1:
        pooled = all_reduce_sum(pooled)
    return net.classifier(pooled / pixels)


def update_running_stats_once(stats_log: list) -> int:
    """Update each BatchNorm's running statistics once, from the first statistics it logged (a
    checkpointed bottleneck logs them again when recomputed: the same values). Returns how many
    BatchNorms were updated."""
    seen: set[int] = set()
    for bn, mean, var, count in stats_log:
        if id(bn) not in seen:
            seen.add(id(bn))
            update_running_stats(bn, mean, var, int(count.item()))
    return len(seen)


class StripDenseNet(nn.Module):
    """A ``DenseNet`` whose forward is ``strip_forward``: one rank's strip in, the whole image's
    logits out (for ``memory.predict_step``, which takes a module)."""

    def __init__(self, net: DenseNet):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return strip_forward(self.net, x)


# --------------------------------------------------------------------------------------------
# The worker, its single-process reference, and the check
# --------------------------------------------------------------------------------------------
def build_densenet(config: dict) -> DenseNet:
    """The net of ``config``, identically initialised on every rank: ``SMALL_DENSENET`` (or
    ``config["net"]``, a dict of ``DenseNet`` arguments), ``memory_efficient``, in ``dtype``."""
    torch.manual_seed(config.get("seed", 0))
    kwargs = {**SMALL_DENSENET, **config.get("net", {})}
    with default_dtype(getattr(torch, config.get("dtype", "float64"))):
        net = DenseNet(**kwargs, num_classes=SEED004_CLASSES,
                       memory_efficient=config.get("memory_efficient", False))
    with torch.no_grad():  # non-trivial affine BatchNorms, so that their gradients are checked
        g = torch.Generator().manual_seed(config.get("seed", 0) + 1)
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))
    return net.train()


def densenet_batch(config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The same (batch, 1, H, W) images and (batch, 14) multi-label targets on every rank."""
    g = torch.Generator().manual_seed(config.get("data_seed", 1234))
    dtype = getattr(torch, config.get("dtype", "float64"))
    x = torch.randn((config.get("batch", 2), 1, *config.get("image", (128, 64))), generator=g, dtype=dtype)
    y = (torch.rand((x.shape[0], SEED004_CLASSES), generator=g) < 0.3).to(dtype)
    return x, y


@compared
def spatial_densenet_worker(rank: int, world: int, device: torch.device, config: dict) -> Any:
    """One training step of ``build_densenet(config)`` on this rank's strip of the batch's
    images (``strip_forward``; ``config["halo"]``, ``config["global_bn"]``). Every rank computes
    the full loss from the same logits; the weight gradients are summed over ranks and divided by
    the world size. Returns the gradients, loss, logits, running statistics, bytes exchanged and
    the strip's own bytes. ``config["runs"]``: a list of config overrides, run one after the
    other in the same processes (a start costs seconds); returns the list of results."""
    if config.get("runs"):
        return [spatial_densenet_worker(rank, world, device, {**config, **run, "runs": None})
                for run in config["runs"]]
    if config.get("measure"):
        return _measure_strip(rank, world, config)
    net = build_densenet(config).to(device)
    x, y = densenet_batch(config)
    lo, hi = strip_rows(x.shape[2], world, rank)
    xs, y = x[:, :, lo:hi].contiguous().to(device), y.to(device)  # a real run loads only its strip
    EXCHANGED.update(forward=0, backward=0)
    REDUCED.update(forward=0, backward=0)
    HALO_SOURCES.update(bytes=0, exchanges=0)
    log: list = []
    dist.barrier()
    t0 = time.perf_counter()
    logits = strip_forward(net, xs, halo=config.get("halo", True), global_bn=config.get("global_bn", True),
                           stats_log=log)
    loss = F.binary_cross_entropy_with_logits(logits, y)  # the full loss, on every rank
    loss.backward()
    for p in net.parameters():  # each rank's is world x its share: the average is the gradient
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad.div_(world)
    seconds = time.perf_counter() - t0
    n_bn = update_running_stats_once(log)
    return {"rank": rank, "rows": (lo, hi), "loss": loss.item(), "logits": logits.detach().cpu().clone(),
            "names": [n for n, _ in net.named_parameters()],
            "grads": [p.grad.detach().cpu().clone() for p in net.parameters()],
            "buffer_names": [n for n, _ in net.named_buffers()],
            "running": [b.detach().cpu().clone() for b in net.buffers()],
            "batchnorms": n_bn, "sent_bytes": dict(EXCHANGED), "reduced_bytes": dict(REDUCED),
            "halo_source_bytes": HALO_SOURCES["bytes"], "halo_exchanges": HALO_SOURCES["exchanges"],
            "strip_bytes": xs.numel() * xs.element_size(), "step_s": seconds}


def _measure_strip(rank: int, world: int, config: dict) -> dict:
    """``predict_step(fake=False, target="cpu")`` of this rank's strip: the same step on real
    CPU tensors, with real messages, under MemTracker (float32, Adam's steady state)."""
    kwargs = {**SMALL_DENSENET, **config.get("net", {})}
    batch, (height, width) = config.get("batch", 2), config.get("image", (128, 64))
    t = check_alignment(height, world)
    p = predict_step(lambda: StripDenseNet(DenseNet(**kwargs, memory_efficient=config.get("memory_efficient", False))),
                     (batch, 1, t, width), (batch, SEED004_CLASSES), loss_fn=F.binary_cross_entropy_with_logits,
                     fake=False, target="cpu", module_peaks=False)
    return {"rank": rank, "peak": p.peak, "breakdown": p.breakdown, "method": p.method}


def densenet_reference(config: dict) -> dict:
    """The same step in one process on the whole images, with the module's own forward."""
    net = build_densenet(config)
    x, y = densenet_batch(config)
    logits = net(x)
    loss = F.binary_cross_entropy_with_logits(logits, y)
    loss.backward()
    return {"loss": loss.item(), "logits": logits.detach().clone(),
            "names": [n for n, _ in net.named_parameters()],
            "grads": [p.grad.detach().clone() for p in net.parameters()],
            "buffer_names": [n for n, _ in net.named_buffers()],
            "running": [b.detach().clone() for b in net.buffers()]}


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 when both are zero): one number per tensor, robust to zeros."""
    a, b = a.double(), b.double()
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale if scale else diff


def compare(result: dict, reference: dict) -> dict:
    """One rank's result against the reference: per-parameter relative differences and the
    largest of the gradients, the loss, the logits and the running statistics."""
    grads = {n: relative_difference(g, r) for n, g, r in
             zip(result["names"], result["grads"], reference["grads"], strict=True)}
    running = [relative_difference(b, r) for n, b, r in
               zip(result["buffer_names"], result["running"], reference["running"], strict=True)
               if not n.endswith("num_batches_tracked")]
    tracked = all(torch.equal(b, r) for n, b, r in
                  zip(result["buffer_names"], result["running"], reference["running"], strict=True)
                  if n.endswith("num_batches_tracked"))
    return {"grads": grads, "grad": max(grads.values()), "loss": abs(result["loss"] - reference["loss"])
            / abs(reference["loss"]), "logits": relative_difference(result["logits"], reference["logits"]),
            "running": max(running), "batches tracked equal": tracked}


def run_split(world: int = 2, runs: Sequence[dict] = ({},), timeout_s: float = 180, **config: Any) -> list[dict]:
    """Launch ``spatial_densenet_worker`` on ``world`` gloo ranks (NCCL with a GPU per rank)
    once for all ``runs`` (config overrides on top of ``config``) and compare each run with its
    single-process reference. Returns one dict per run: ``compare``'s figures (worst rank),
    the spread of the logits over ranks, and the ranks' results."""
    results = launch(spatial_densenet_worker, world, {**config, "runs": [dict(r) for r in runs]},
                     timeout_s=timeout_s)
    out = []
    for i, run in enumerate(runs):
        per_rank = [results[r][i] for r in range(world)]
        reference = densenet_reference({**config, **run})
        comparisons = [compare(res, reference) for res in per_rank]
        worst = {k: max(c[k] for c in comparisons) for k in ("grad", "loss", "logits", "running")}
        spread = max(relative_difference(res["logits"], per_rank[0]["logits"]) for res in per_rank)
        out.append({"run": dict(run), **worst, "grads": comparisons[0]["grads"],
                    "batches tracked equal": all(c["batches tracked equal"] for c in comparisons),
                    "logits spread over ranks": spread, "ranks": per_rank})
    return out


def check_split(world: int = 2, image: Sequence[int] = (128, 64), batch: int = 2,
                memory_efficient: bool = False, variants: Sequence[dict] = (), timeout_s: float = 180) -> dict:
    """The split against one process, in float64, for a notebook: ``world`` gloo ranks train
    ``SMALL_DENSENET`` on strips of a (batch, 1, *image) batch.

    Returns a dict: ``summary`` (a DataFrame, one row per run -- the split itself, then each of
    ``variants``, e.g. ``{"halo": False}`` or ``{"global_bn": False}``: max relative difference
    of the parameter gradients, the loss, the logits and the running statistics vs one process,
    and the logits' spread over ranks), ``grads`` (the split's difference per parameter),
    ``exchange`` (per rank: rows owned, halo bytes sent in forward and backward, BatchNorm bytes
    sent (statistics and gradient sums), the bytes of the strip's input and of the activations whose halos were sent,
    halo / activation in %), ``seconds`` (the launch's wall time) and ``method``."""
    import pandas as pd

    _check_image(image, world)
    t0 = time.perf_counter()
    runs = run_split(world, [{}, *variants], timeout_s=timeout_s, image=tuple(image), batch=batch,
                     memory_efficient=memory_efficient)
    seconds = time.perf_counter() - t0
    summary = pd.DataFrame([{"run": ", ".join(f"{k}={v}" for k, v in r["run"].items()) or "split (halos, global BN)",
                             "max rel diff grads": r["grad"], "rel diff loss": r["loss"],
                             "max rel diff logits": r["logits"], "max rel diff running stats": r["running"],
                             "logits spread over ranks": r["logits spread over ranks"]} for r in runs])
    grads = pd.DataFrame({"parameter": list(runs[0]["grads"]), "max rel diff": list(runs[0]["grads"].values())})
    exchange = pd.DataFrame([{
        "rank": res["rank"], "rows": f"{res['rows'][0]}-{res['rows'][1]}",
        "halo sent fwd (KiB)": res["sent_bytes"]["forward"] / 1024,
        "halo sent bwd (KiB)": res["sent_bytes"]["backward"] / 1024,
        "BN statistics sent (KiB)": (res["reduced_bytes"]["forward"] + res["reduced_bytes"]["backward"]) / 1024,
        "input strip (KiB)": res["strip_bytes"] / 1024,
        "exchanged activations (KiB)": res["halo_source_bytes"] / 1024,
        "halo fwd / activations (%)": 100 * res["sent_bytes"]["forward"] / max(res["halo_source_bytes"], 1),
    } for res in runs[0]["ranks"]])
    return {"summary": summary, "grads": grads, "exchange": exchange, "seconds": seconds,
            "method": (f"{world} gloo ranks (course_utils.parallel.launch), float64, {batch} x 1 x "
                       f"{image[0]} x {image[1]} images, DenseNet{SMALL_DENSENET}"
                       f"{', memory_efficient' if memory_efficient else ''}; relative difference = "
                       "max|split - one process| / max|one process| per tensor")}


# --------------------------------------------------------------------------------------------
# Memory per GPU: one rank's strip under predict_step, with a fake process group
# --------------------------------------------------------------------------------------------
def _check_worlds(values: Sequence[int], name: str) -> None:
    """World sizes (or batches) to tabulate: at least one, each a whole number >= 1."""
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise ParallelError(f"{name}={values!r}: each must be a whole number >= 1, and at least one given.",
                            f"e.g. {name}=(1, 2, 4).")


@contextlib.contextmanager
def fake_process_group(rank: int, world: int) -> Iterator[None]:
    """PyTorch's fake process group (``torch.testing._internal.distributed.fake_pg``): this
    process plays ``rank`` of ``world``; collectives and messages move no data (the tensors have
    the right shapes). Destroyed on exit."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _check_rank(rank, world)
    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process: predict in a fresh "
                           "process (or call torch.distributed.destroy_process_group() first)")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def predict_strip(build: Callable[[], DenseNet], world: int, batch: int, image: Sequence[int],
                  rank: int | None = None, **kwargs: Any):
    """``memory.predict_step`` of one rank's training step: its strip (batch, 1, H / world, W)
    through ``strip_forward``, the full multi-label loss, backward, Adam. Default rank: an
    interior one (two neighbours) when there is one. The in-place all-reduce of the gradients
    allocates nothing and is not run. ``kwargs`` go to ``predict_step`` (default: no per-module
    peaks)."""
    _check_image(image, world)
    t = image[0] // world
    rank = min(1, world - 1) if rank is None else rank
    kwargs.setdefault("module_peaks", False)
    with fake_process_group(rank, world):
        return predict_step(lambda: StripDenseNet(build()), (batch, 1, t, image[1]), (batch, SEED004_CLASSES),
                            loss_fn=F.binary_cross_entropy_with_logits, **kwargs)


def spatial_memory_table(worlds: Sequence[int] = (1, 2, 4, 8), batches: Sequence[int] = (1, 8),
                         image: Sequence[int] = FULL_IMAGE, net: dict | None = None,
                         check: bool = True):
    """Predicted per-GPU peak (MiB, ``torch.cuda.max_memory_allocated`` of a steady-state Adam
    step, fp32, CUDA's rules) of DenseNet-169 (``net``: other ``DenseNet`` arguments) trained on
    strips of (batch, 1, H, W) images, for each world size, naive and ``memory_efficient=True``.

    The height is padded to the smallest multiple of 32 x max(worlds) (2000 -> 2048), the same
    image for every world size. Columns: per-GPU peak for each net and batch, parameters +
    buffers + gradients + Adam state per GPU (replicated: the same on every rank), and the
    activations per GPU (the peak less that) for each net and batch. ``check=True`` adds, per net
    and batch, the plain ``predict_step`` of the whole image on one GPU (``DenseNet.forward``,
    no strips, no process group): it must equal the world-1 row (``df.attrs["check"]``).
    ``df.attrs``: ``method``, ``image``, ``seconds``, ``predictions``, ``check``. Each
    prediction takes about 10-20 s on a laptop CPU at full size (fake tensors: the same at any
    batch)."""
    import pandas as pd

    _check_worlds(worlds, "worlds")
    _check_worlds(batches, "batches")
    _check_image(image)
    net = {**DENSENET169, **(net or {})}
    height = aligned_height(image[0], max(worlds))
    full = (height, image[1])
    t0 = time.perf_counter()
    rows: dict[int, dict[str, Any]] = {w: {"world": w, "strip (rows x cols)": f"{height // w} x {full[1]}"}
                                       for w in worlds}
    checks, method, n = [], "", 0
    for label, eff in (("naive", False), ("mem-eff", True)):
        def build(eff: bool = eff) -> DenseNet:
            return DenseNet(**net, memory_efficient=eff)
        for b in batches:
            for w in worlds:
                p = predict_strip(build, w, b, full)
                n += 1
                method = p.method
                rows[w][f"peak {label} b{b} (MiB)"] = mib(p.peak)
                rows[w]["params+grads+Adam (MiB)"] = mib(fixed_bytes(p.breakdown))
                rows[w][f"activations {label} b{b} (MiB)"] = mib(p.peak - fixed_bytes(p.breakdown))
                if check and w == 1:
                    plain = predict_step(build, (b, 1, *full), (b, SEED004_CLASSES),
                                         loss_fn=F.binary_cross_entropy_with_logits, module_peaks=False)
                    n += 1
                    checks.append({"net": label, "batch": b, "strip world 1 (MiB)": mib(p.peak),
                                   "plain predict_step (MiB)": mib(plain.peak),
                                   "rel diff": abs(p.peak - plain.peak) / plain.peak})
    df = pd.DataFrame(list(rows.values())).set_index("world")
    order = ["strip (rows x cols)"] + [c for c in df.columns if c.startswith("peak")] + \
        ["params+grads+Adam (MiB)"] + [c for c in df.columns if c.startswith("activations")]
    df = df[order]
    df.attrs.update(method=f"one rank's strip (an interior rank) under a fake process group, {method}",
                    image=full, seconds=time.perf_counter() - t0, predictions=n,
                    check=pd.DataFrame(checks))
    return df


def memory_check(image: Sequence[int] = (64, 64), batch: int = 2, net: dict | None = None,
                 memory_efficient: bool = False, worlds: Sequence[int] = (1, 2)) -> dict:
    """The predictor's independent check at a small size (fast): the world-1 strip prediction
    against the plain ``predict_step`` of the whole image (no strips, no process group), and
    each world size's strip prediction against it (activations must shrink by about the world
    size; parameters, gradients and Adam state must not). Returns the peaks and differences."""
    kwargs = {**SMALL_DENSENET, **(net or {})}
    _check_worlds(worlds, "worlds")
    for w in worlds:
        _check_image(image, w)

    def build() -> DenseNet:
        return DenseNet(**kwargs, memory_efficient=memory_efficient)

    plain = predict_step(build, (batch, 1, *image), (batch, SEED004_CLASSES),
                         loss_fn=F.binary_cross_entropy_with_logits, module_peaks=False)
    strips = {w: predict_strip(build, w, batch, image) for w in worlds}
    return {"plain peak": plain.peak, "plain fixed": fixed_bytes(plain.breakdown),
            "strip peaks": {w: p.peak for w, p in strips.items()},
            "strip fixed": {w: fixed_bytes(p.breakdown) for w, p in strips.items()},
            "world 1 rel diff": abs(strips[min(worlds)].peak - plain.peak) / plain.peak
            if min(worlds) == 1 else None,
            "method": strips[min(worlds)].method}


def measured_check(world: int = 2, image: Sequence[int] = (128, 64), batch: int = 2,
                   memory_efficient: bool = False, timeout_s: float = 180):
    """The fake process group against real messages: each of ``world`` gloo ranks runs its
    strip's step on real CPU tensors under MemTracker (``predict_step(fake=False,
    target="cpu")``) and reports its peak of live tensor bytes; here, ``predict_strip`` of the
    same rank with fake tensors and the fake process group (CPU's rules). Returns a DataFrame,
    one row per rank: measured, predicted, difference (bytes)."""
    import pandas as pd

    kwargs = dict(SMALL_DENSENET)
    _check_image(image, world)
    measured = launch(spatial_densenet_worker, world, {"measure": True, "image": tuple(image), "batch": batch,
                                                       "memory_efficient": memory_efficient}, timeout_s=timeout_s)
    rows = []
    for m in measured:
        p = predict_strip(lambda: DenseNet(**kwargs, memory_efficient=memory_efficient), world, batch, image,
                          rank=m["rank"], target="cpu")
        rows.append({"rank": m["rank"], "measured peak (bytes)": m["peak"], "predicted peak (bytes)": p.peak,
                     "difference (bytes)": p.peak - m["peak"]})
    df = pd.DataFrame(rows)
    df.attrs["method"] = (f"measured: {measured[0]['method']} on {world} gloo ranks; predicted: {p.method} "
                          "under the fake process group")
    return df


guard(globals(), ParallelError, signed=("offsets",))
