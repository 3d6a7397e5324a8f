"""Exercise 07 -- checkpointing: the encoder under ``torch.utils.checkpoint``, the best segment
count for ``checkpoint_sequential``, and a checkpoint plan that meets a budget."""

from __future__ import annotations

import functools
import itertools

import torch
from torch import nn

from ..checkpointing import SegmentedStack, checkpointed, deep_stack
from ..memory import SavedTensorMeter, predict_step
from ..unet import UNet3D
from .core import (CheckFailed, Exercise, answer, expect_close, expect_equal, expect_grads_close, expect_int,
                   expect_items, expect_keys, expect_list, expect_str, expect_tensor, expect_tensors, reference, short,
                   seeded, seeded_build)

EX = Exercise("07", "Checkpointing", names=("encoder_forward", "best_segments", "checkpoint_plan"),
              refused={"course_utils.parallel.pipeline": ("EncoderStage",)})


def _encoder_net(seed: int) -> UNet3D:
    return seeded_build(lambda: UNet3D(levels=3, channels=4), seeded(seed, 70))


def _encoder_input(seed: int) -> torch.Tensor:
    return torch.randn(2, 1, 8, 8, 8, generator=seeded(seed, 71))


def run_encoder(encoder_forward, seed: int) -> dict:
    """Run ``encoder_forward`` on the seed's U-Net and input, then backward from the skips' sum;
    returns the skips, the encoder's gradients, the saved-for-backward peak (bytes) and BatchNorm's
    batch counts and running statistics."""
    net = _encoder_net(seed)
    x = _encoder_input(seed)
    with SavedTensorMeter(net.parameters()) as meter:
        skips = encoder_forward(net, x)
    skips = list(skips)
    sum(s.sum() for s in skips).backward()
    encoder = [p for m in (net.inc, net.downs) for p in m.parameters()]
    bns = [m for m in (net.inc, net.downs) for m in m.modules() if isinstance(m, nn.BatchNorm3d)]
    return {"skips": [s.detach() for s in skips], "grads": [p.grad for p in encoder],
            "saved": meter.peak,
            # after one forward and backward: a BN recomputed in backward without its statistics
            # frozen has counted two batches and moved its running mean/var twice
            "bn_batches": [int(m.num_batches_tracked) for m in bns],
            "bn_running": [torch.stack([m.running_mean, m.running_var]) for m in bns]}


@reference
def plain_encoder(net, x):
    """The encoder without checkpointing: ``inc`` and every ``down`` in turn, each output a skip."""
    skips = [net.inc(x)]
    for down in net.downs:
        skips.append(down(skips[-1]))
    return skips


@reference
@functools.lru_cache(maxsize=8)
def encoder_reference(seed: int) -> dict:
    """``run_encoder``'s observation of the plain encoder for ``seed`` (cached)."""
    return run_encoder(plain_encoder, seed)


SKIPS = EX.part("skips", "encoder_forward: the same skip tensors as without checkpointing", 1, ["encoder_forward"])
GRADS = EX.part("grads", "encoder_forward: the same gradients", 1, ["encoder_forward"])
LESS = EX.part("less", "encoder_forward: stores less for backward (every block checkpointed)", 1,
               ["encoder_forward"])
BN = EX.part("bn", "encoder_forward: BatchNorm's running statistics move once per step", 1,
             ["encoder_forward"])
for _part in (SKIPS, GRADS, LESS, BN):  # each part judges its own figures of the same run
    _part.observe(run_encoder)


def encoded(got, seed: int) -> dict:
    """``run_encoder``'s observation, checked for form against the judge's own run of the plain
    encoder: its keys, one gradient per encoder parameter (None: no gradient), the saved bytes,
    one count and one running mean/variance per BatchNorm. The skips are the learner's return
    value: the skips part checks their number and shapes."""
    ref = encoder_reference(seed)
    expect_keys("the observed encoder run", got, ref)
    for k, s in enumerate(expect_list("encoder_forward's skip tensors", got["skips"])):
        expect_tensor(f"skip {k}", s, dtype=torch.float32)
    expect_tensors("gradient of encoder parameter", got["grads"], ref["grads"], none_ok=True, what="gradients")
    if expect_int("saved-for-backward bytes", got["saved"]) < 0:
        raise CheckFailed(f"saved-for-backward bytes: {got['saved']:,} is negative")
    expect_list("batches counted by the encoder's BatchNorms", got["bn_batches"], len(ref["bn_batches"]),
                "counts (one per BatchNorm)")
    for k, n in enumerate(got["bn_batches"]):
        expect_int(f"batches counted by BatchNorm {k}", n)
    expect_tensors("BatchNorm running mean and variance", got["bn_running"], ref["bn_running"],
                   what="BatchNorms")
    return got


@SKIPS.judge
def _(got, seed):
    encoded(got, seed)
    ref = encoder_reference(seed)
    expect_equal("number of skip tensors", len(got["skips"]), len(ref["skips"]))
    for k, (a, b) in enumerate(zip(got["skips"], ref["skips"], strict=True)):
        expect_close(f"skip {k}", a, b)


@GRADS.judge
def _(got, seed):
    encoded(got, seed)
    ref = encoder_reference(seed)
    if any(g is None for g in got["grads"]):
        raise CheckFailed("some encoder parameters got no gradient: is every block still in the graph?")
    expect_grads_close("gradient of encoder parameter", got["grads"], ref["grads"])


@LESS.judge
def _(got, seed):
    encoded(got, seed)
    ref = encoder_reference(seed)
    if not got["saved"] < 0.5 * ref["saved"]:
        raise CheckFailed(f"saved {got['saved']:,} bytes for backward, {ref['saved']:,} without "
                          "checkpointing: run each block through "
                          "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, ...)")


@BN.judge
def _(got, seed):
    encoded(got, seed)
    ref = encoder_reference(seed)
    twice = sum(n > 1 for n in got["bn_batches"])
    if twice:
        raise CheckFailed(f"{twice} of {len(got['bn_batches'])} BatchNorms counted "
                          f"{max(got['bn_batches'])} batches in one step: the recomputation in backward "
                          "ran them again in training mode and moved their running statistics a second "
                          "time (notebook 07, section 5): give checkpoint a context_fn that freezes "
                          "them while it recomputes")
    if list(got["bn_batches"]) != list(ref["bn_batches"]):
        raise CheckFailed(f"BatchNorms counted {got['bn_batches']} batches in one step, "
                          f"{ref['bn_batches']} without checkpointing: each must count the step once")
    for k, (a, b) in enumerate(zip(got["bn_running"], ref["bn_running"], strict=True)):
        expect_close(f"BatchNorm {k}'s running mean and variance", a, b)


# -- best_segments(n) ---------------------------------------------------------------------------
SEGMENT_NS = (8, 18)


def segment_peak(n_layers: int, segments: int) -> int:
    """The predicted step peak of an n-layer stack in ``segments`` checkpointed segments."""
    return predict_step(lambda: SegmentedStack(deep_stack(n_layers, 8), segments),
                        (1, 1, 16, 16, 16), n_classes=5, optimizer=None).peak


@answer
@functools.lru_cache(maxsize=None)
def best_segment_count(n_layers: int) -> frozenset[int]:
    """The divisors s of n_layers with the lowest predicted peak."""
    peaks = {s: segment_peak(n_layers, s) for s in range(1, n_layers + 1) if n_layers % s == 0}
    low = min(peaks.values())
    return frozenset(s for s, v in peaks.items() if v == low)


SEGMENTS = EX.part("segments", "best_segments: the segment count with the lowest predicted peak", 1,
                   ["best_segments"], secret=True)


@SEGMENTS.observe
def _(best_segments, seed):
    return [[n, best_segments(n)] for n in SEGMENT_NS]


@SEGMENTS.judge
def _(got, seed):
    for n, s in zip(SEGMENT_NS, expect_items("best_segments", got, list(SEGMENT_NS), what="layer counts"),
                    strict=True):
        expect_int(f"best_segments({n})", s)
        if s < 1:
            raise CheckFailed(f"best_segments({n}) = {s} is not a number of segments")
        if n % s:
            raise CheckFailed(f"best_segments({n}) = {s} does not divide {n}")
        if s not in best_segment_count(n):
            raise CheckFailed(f"best_segments({n}) = {s}: another divisor gives a lower predicted peak")


# -- checkpoint_plan(budget): the fewest blocks to checkpoint to fit a budget --------------------
BLOCKS = ("inc", "downs.0", "downs.1", "ups.0", "ups.1")


def plan_net() -> UNet3D:
    """The net of the plan part: a 3-level U-Net, 4 base channels."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return UNet3D(levels=3, channels=4)


def plan_input() -> torch.Tensor:
    """The fixed input the checkpoint plans are measured on: (1, 1, 8, 8, 8), from generator seed 7."""
    return torch.randn(1, 1, 8, 8, 8, generator=torch.Generator().manual_seed(7))


class Checkpointed(nn.Module):
    """Wraps a U-Net block so that its forward runs under checkpointing (BN-safe)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args):
        if torch.is_grad_enabled():
            return checkpointed(self.block, *args)
        return self.block(*args)


def with_checkpoints(net: UNet3D, blocks) -> UNet3D:
    """``net`` with the named blocks (``"inc"``, ``"downs.0"``, ``"ups.1"``, ...) checkpointed."""
    for name in blocks:
        if name == "inc":
            net.inc = Checkpointed(net.inc)
        else:
            kind, k = name.split(".")
            getattr(net, kind)[int(k)] = Checkpointed(getattr(net, kind)[int(k)])
    return net


def saved_bytes_with(blocks) -> int:
    """Saved-for-backward bytes of one forward of ``plan_net()`` on ``plan_input()`` with the
    named blocks checkpointed."""
    net = with_checkpoints(plan_net(), blocks)
    with SavedTensorMeter(net.parameters()) as meter:
        out = net(plan_input())
    del out
    return meter.peak


def plan_budgets(seed: int) -> list[int]:
    """Two budgets between the fully checkpointed and the plain net's saved bytes (the sandbox
    and the judge)."""
    return list(_plan_budgets(seed))


@functools.lru_cache(maxsize=8)
def _plan_budgets(seed: int) -> tuple[int, ...]:
    low, high = saved_bytes_with(BLOCKS), saved_bytes_with(())
    g = seeded(seed, 72)
    fracs = sorted(float(v) for v in torch.rand(2, generator=g) * 0.6 + 0.15)
    return tuple(int(low + f * (high - low)) for f in fracs)


@reference
@functools.lru_cache(maxsize=None)
def plan_saved(plan: frozenset) -> int:
    """Saved-for-backward bytes with the blocks of ``plan`` checkpointed (cached per plan)."""
    return saved_bytes_with(sorted(plan))


@reference
def fewest_blocks(budget: int) -> int:
    """The fewest checkpointed blocks that fit ``budget``. Every plan is measured (cached: half a
    CPU-second for the 32): the student release's recording of ``plan_saved`` then holds every
    plan, so its check judges whichever plan a learner returns."""
    fits = [k for k in range(len(BLOCKS) + 1) for c in itertools.combinations(BLOCKS, k)
            if plan_saved(frozenset(c)) <= budget]
    if not fits:
        raise ValueError(f"no plan fits {budget:,} bytes")
    return min(fits)


PLAN = EX.part("plan", "checkpoint_plan: fits the budget with the fewest checkpointed blocks", 2,
               ["checkpoint_plan"])


@PLAN.observe
def _(checkpoint_plan, seed):
    out = []
    for b in plan_budgets(seed):
        plan = checkpoint_plan(b)
        out.append([b, sorted(str(p) for p in plan) if isinstance(plan, (list, tuple, set, frozenset)) else repr(plan)])
    return out


@PLAN.judge
def _(got, seed):
    budgets = plan_budgets(seed)
    for budget, plan in zip(budgets, expect_items("checkpoint_plan", got, budgets, what="budgets"), strict=True):
        if not isinstance(plan, list):
            raise CheckFailed(f"checkpoint_plan({budget:,}) must return a list of block names, got {short(plan, 80)}")
        for name in plan:
            expect_str(f"checkpoint_plan({budget:,}): a block name", name)
        if len(set(plan)) != len(plan):
            raise CheckFailed(f"checkpoint_plan({budget:,}) names a block twice: {plan}")
        unknown = sorted(set(plan) - set(BLOCKS))
        if unknown:
            raise CheckFailed(f"unknown block names {unknown}; the blocks are {list(BLOCKS)}")
        saved = plan_saved(frozenset(plan))
        if saved > budget:
            raise CheckFailed(f"with {plan} checkpointed the net saves {saved:,} bytes, over the "
                              f"budget of {budget:,}")
        fewest = fewest_blocks(budget)
        if len(set(plan)) > fewest:
            raise CheckFailed(f"{plan} fits the budget of {budget:,} bytes, but fewer blocks would: "
                              "every checkpointed block is recomputed in backward")


def check_encoder(encoder_forward, verbose: bool = True):
    """Instant feedback on your ``encoder_forward``."""
    return EX.run(["skips", "grads", "less", "bn"], {"encoder_forward": encoder_forward}, verbose=verbose)


def check_segments(best_segments, verbose: bool = True):
    """Instant feedback on your ``best_segments``."""
    return EX.run(["segments"], {"best_segments": best_segments}, verbose=verbose)


def check_plan(checkpoint_plan, verbose: bool = True):
    """Instant feedback on your ``checkpoint_plan``."""
    return EX.run(["plan"], {"checkpoint_plan": checkpoint_plan}, verbose=verbose)
