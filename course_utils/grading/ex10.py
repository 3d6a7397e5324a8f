"""Exercise 10 -- design a configuration for a new volume and budget.

``design(volume, budget_gib) -> explorer.Config``: seed 000's large U-Net on one GPU with fp32
master weights (fp32 or autocast) that fits at least the largest batch of notebook 10's
section-2 search (precision, lean Up, activation trick, checkpointing none / per level /
selective). The check asks for volumes and budgets the notebooks never show and compares with
that search's best (``best_batch``); section 4's finer switches may beat it, and are not asked.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from .. import explorer
from .core import CheckFailed, Exercise, answer, describe, expect_equal, expect_keys, expect_list, same, seeded, short

EX = Exercise("10", "Design a configuration", names=("design",))

#: precisions that keep fp32 master weights (notebook 04)
MASTER_FP32 = ("fp32", "autocast_fp16", "autocast_bf16")
VOLUMES = ((32, 128, 128), (24, 160, 160), (48, 96, 128), (16, 192, 192), (40, 112, 112))
BUDGETS_GIB = (4, 8, 12)


def design_cases(seed: int) -> list[tuple[tuple[int, int, int], int]]:
    """One (volume, budget) per seed, from lists the notebooks never use."""
    g = seeded(seed, 100)
    v = int(torch.randint(0, len(VOLUMES), (1,), generator=g))
    b = int(torch.randint(0, len(BUDGETS_GIB), (1,), generator=g))
    return [(VOLUMES[v], BUDGETS_GIB[b])]


def baseline(volume, budget_gib: int) -> explorer.Config:
    """Seed 000's large net in fp32 with no technique switched on."""
    return explorer.Config(volume=tuple(volume), budget_gib=budget_gib, precision="fp32")


@answer
@functools.lru_cache(maxsize=None)
def best_batch(volume: tuple[int, int, int], budget_gib: int) -> int:
    """The largest batch of the notebooks' fp32-master combinations (precision, lean Up,
    activation trick, checkpointing; the explorer's prediction). bf16 needs the same bytes as
    fp16 (notebook 04), so only fp16 is searched. A design may beat it with the frontier's
    finer switches (notebook 10): reaching it is what the part asks."""
    return max(explorer.estimate(c).largest_batch
               for c in explorer.all_combinations(baseline(volume, budget_gib), precisions=["fp32", "autocast_fp16"],
                                            lean_up=(False, True)))


def _observe(design, seed: int) -> list:
    out = []
    for volume, budget in design_cases(seed):
        cfg = design(volume, budget)
        if not isinstance(cfg, explorer.Config):
            raise CheckFailed(f"design({volume}, {budget}) must return a course_utils.explorer.Config, "
                              f"got {type(cfg).__name__}")
        out.append({"volume": list(volume), "budget": budget, "config": dataclasses.asdict(cfg)})
    return out


def _config(d: dict, what: str) -> explorer.Config:
    """The observed ``dataclasses.asdict(Config)``, checked for form: every field, each of its
    default's type (the volume: three ints)."""
    default = dataclasses.asdict(explorer.Config())
    expect_keys(f"{what}: the explorer.Config", d, default, "fields")
    for name, value in default.items():
        if isinstance(value, (list, tuple)):
            if not (isinstance(d[name], list) and len(d[name]) == len(value)
                    and all(type(v) is int for v in d[name])):
                raise CheckFailed(f"{what}: Config.{name} must be {len(value)} ints, got {describe(d[name])}")
        elif type(d[name]) is not type(value):
            kind = {"bool": "True or False", "int": "an int", "str": "a string"}.get(type(value).__name__, "")
            raise CheckFailed(f"{what}: Config.{name} must be {kind or type(value).__name__}, "
                              f"got {describe(d[name])}")
    try:
        return explorer.Config(**dict(d, volume=tuple(d["volume"])))
    except ValueError as err:
        raise CheckFailed(f"{what}: not a valid configuration: {err}") from None


def designs(got, seed: int) -> list[dict]:
    """The observed designs, one per case the seed gives (same volume, same budget, same order)."""
    cases = design_cases(seed)
    expect_list("design", got, len(cases), "design(s), one per volume and budget")
    for (volume, budget), case in zip(cases, got, strict=True):
        expect_keys(f"design({volume}, {budget})", case, ("volume", "budget", "config"))
        if not (same(case["volume"], list(volume)) and same(case["budget"], budget)):
            raise CheckFailed(f"the observation is for design({short(case['volume'], 40)}, {short(case['budget'], 20)}), "
                              f"not for the seed's design({volume}, {budget})")
    return got


def _valid(case: dict) -> explorer.Config:
    what = f"design({tuple(case['volume'])}, {case['budget']})"
    cfg = _config(case["config"], what)
    expect_equal(f"{what}: volume", tuple(cfg.volume), tuple(case["volume"]))
    expect_equal(f"{what}: budget_gib", cfg.budget_gib, case["budget"])
    expect_equal(f"{what}: (levels, base_channels, seed000)", (cfg.levels, cfg.base_channels, cfg.seed000),
                 (5, 64, True))
    expect_equal(f"{what}: dp_ranks (one GPU)", cfg.dp_ranks, 1)
    if cfg.precision not in MASTER_FP32:
        raise CheckFailed(f"{what}: precision {cfg.precision!r} has no fp32 master weights (notebook 04)")
    try:
        explorer.estimate(cfg)
    except ValueError as err:
        raise CheckFailed(f"{what}: not a valid configuration: {err}") from None
    return cfg


VALID = EX.part("valid", "a valid configuration of seed 000's net with fp32 master weights", 1, ["design"])
BEATS = EX.part("beats", "fits a larger batch than plain fp32", 1, ["design"])
BEST = EX.part("best", "fits at least the largest batch of notebook 10's section-2 search", 2, ["design"],
               secret=True)


@VALID.observe
def _(design, seed):
    return _observe(design, seed)


@VALID.judge
def _(got, seed):
    for case in designs(got, seed):
        _valid(case)


@BEATS.observe
def _(design, seed):
    return _observe(design, seed)


@BEATS.judge
def _(got, seed):
    for case in designs(got, seed):
        cfg = _valid(case)
        mine = explorer.estimate(cfg).largest_batch
        base = explorer.estimate(baseline(cfg.volume, cfg.budget_gib)).largest_batch
        if mine <= base:
            raise CheckFailed(f"design({tuple(cfg.volume)}, {cfg.budget_gib}): largest batch {mine}, no "
                              f"better than plain fp32 ({base})")


@BEST.observe
def _(design, seed):
    return _observe(design, seed)


@BEST.judge
def _(got, seed):
    for case in designs(got, seed):
        cfg = _valid(case)
        mine = explorer.estimate(cfg).largest_batch
        if mine < best_batch(tuple(cfg.volume), cfg.budget_gib):
            raise CheckFailed(f"design({tuple(cfg.volume)}, {cfg.budget_gib}) fits batch {mine}; another "
                              "combination of switches fits a larger one")


def check_design(design, verbose: bool = True):
    """Instant feedback on your ``design`` (predicts a few dozen configurations: about a minute)."""
    return EX.run([p.key for p in EX.parts], {"design": design}, verbose=verbose)
