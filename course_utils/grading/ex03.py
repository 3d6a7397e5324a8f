"""Exercise 03 -- seed 003's naive estimate, the largest N for a budget, and a second net's
memory formula derived by reasoning."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from .. import limit_test
from ..memory import GiB, MiB, largest_that_fits, predict_step
from .core import CheckFailed, Exercise, answer, expect_equal, expect_int, expect_items, reference, seeded

EX = Exercise("03", "The memory-limit test", names=("naive_estimate", "largest_n", "saved_formula",
                                                    "largest_n_sigmoid"),
              refused={"course_utils.limit_test": ("naive_bytes", "expected_saved_bytes"),
                       "course_utils.memory.oom": ("largest_that_fits",)})


class SigmoidNet(nn.Sequential):
    """The exercise's second net: Conv3d(1,4) -> Sigmoid -> Conv3d(4,4) -> Tanh -> Conv3d(4,1),
    3x3x3 kernels with padding 1, on an N^3 volume, MSE loss against an N^3 target."""

    def __init__(self):
        super().__init__(nn.Conv3d(1, 4, 3, padding=1), nn.Sigmoid(), nn.Conv3d(4, 4, 3, padding=1),
                         nn.Tanh(), nn.Conv3d(4, 1, 3, padding=1))


@dataclass(frozen=True)
class SigmoidStep:
    """What ``sigmoid_net_step`` tells of ``SigmoidNet``'s predicted step at N: its peak (bytes).
    Only the peak: the bytes the step saves for backward are the formula part's answer."""

    n: int
    peak: int


def sigmoid_net_step(n: int) -> SigmoidStep:
    """The predicted peak of ``SigmoidNet``'s step at N (forward, MSE loss, backward; no optimizer)."""
    return SigmoidStep(n, predict_step(SigmoidNet, (1, 1, n, n, n), (1, 1, n, n, n), optimizer=None).peak)


def _budgets(seed: int, salt: int, low_mib: int, high_mib: int) -> list[int]:
    g = seeded(seed, salt)
    return [int(torch.randint(low_mib, high_mib, (1,), generator=g)) * MiB for _ in range(2)]


@reference
@functools.lru_cache(maxsize=None)
def largest_limit_test_n(budget: int) -> int:
    return largest_that_fits(lambda k: limit_test.run_limit_test(k).peak <= budget, start=8)


@reference
@functools.lru_cache(maxsize=None)
def largest_sigmoid_n(budget: int) -> int:
    return largest_that_fits(lambda k: sigmoid_net_step(k).peak <= budget, start=8)


NAIVE = EX.part("naive", "naive_estimate: the seed's naive estimate", 1, ["naive_estimate"], secret=True)
LARGEST = EX.part("largest_n", "largest_n: the largest N whose predicted peak fits a budget", 2, ["largest_n"])
FEW_CALLS = EX.part("few_calls", "largest_n: searches with few predictions (at most 40 per budget)", 1,
                    ["largest_n"])
FORMULA = EX.part("formula", "saved_formula: SigmoidNet's saved-for-backward bytes, by reasoning", 2,
                  ["saved_formula"], secret=True)
SIGMOID_N = EX.part("largest_sigmoid", "largest_n_sigmoid: SigmoidNet's largest N for a budget", 1,
                    ["largest_n_sigmoid"])

NAIVE_NS = (50, 128, 400)
FORMULA_NS = (8, 50, 333, 2000)


def naive_ns(seed: int) -> list[int]:
    """The volumes N the naive estimate is asked for (the sandbox and the judge)."""
    return list(NAIVE_NS) + [int(torch.randint(10, 999, (1,), generator=seeded(seed, 30)))]


def formula_ns(seed: int) -> list[int]:
    """The volumes N the formula is asked for."""
    return list(FORMULA_NS) + [int(torch.randint(10, 700, (1,), generator=seeded(seed, 33)))]


def largest_budgets(seed: int) -> list[int]:
    return _budgets(seed, 31, 200, 6000)


def few_calls_budgets(seed: int) -> list[int]:
    return _budgets(seed, 32, 200, 6000)


def sigmoid_budgets(seed: int) -> list[int]:
    return _budgets(seed, 34, 200, 6000)


@NAIVE.observe
def _(naive_estimate, seed):
    return [[n, naive_estimate(n)] for n in naive_ns(seed)]


@NAIVE.judge
def _(got, seed):
    ns = naive_ns(seed)
    for n, value in zip(ns, expect_items("naive_estimate", got, ns, what="volumes N"), strict=True):
        expect_int(f"naive_estimate({n})", value)
        if value != limit_test.naive_bytes(n):
            raise CheckFailed(f"naive_estimate({n}) = {value:,} bytes is not the seed's naive estimate "
                              "(notebook 03 says what it counts, and in which dtype)")


def _count_calls(largest_n, budgets: list[int]) -> list[list[int]]:
    """Run largest_n on each budget, counting the predictions it asks for."""
    calls = [0]
    real = limit_test.run_limit_test

    @functools.wraps(real)
    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    limit_test.run_limit_test = counted
    # the learner's notebook may have imported the function itself: swap it there too
    swapped = []
    for mod_globals in _learner_globals(largest_n):
        for name, val in list(mod_globals.items()):
            if val is real:
                mod_globals[name] = counted
                swapped.append((mod_globals, name))
    out = []
    try:
        for b in budgets:
            calls[0] = 0
            out.append([b, largest_n(b), calls[0]])
    finally:
        limit_test.run_limit_test = real
        for g, name in swapped:
            g[name] = real
    return out


def _learner_globals(fn) -> list[dict]:
    g = getattr(fn, "__globals__", None)
    return [g] if isinstance(g, dict) else []


def _searched(got, budgets: list[int]) -> list[tuple[int, int, int]]:
    """The observed [budget, N, calls] rows for the judge's own budgets: (budget, N, calls)."""
    rows = expect_items("largest_n", got, budgets, width=2, what="budgets")
    for budget, (n, calls) in zip(budgets, rows, strict=True):
        expect_int(f"largest_n({budget // MiB} MiB)", n)
        if expect_int(f"the number of predictions largest_n({budget // MiB} MiB) asked for", calls) < 0:
            raise CheckFailed(f"largest_n({budget // MiB} MiB): a negative number of predictions")
    return [(b, n, c) for b, (n, c) in zip(budgets, rows, strict=True)]


@LARGEST.observe
def _(largest_n, seed):
    return _count_calls(largest_n, largest_budgets(seed))


@LARGEST.judge
def _(got, seed):
    for budget, n, _ in _searched(got, largest_budgets(seed)):
        expect_int(f"largest_n({budget // MiB} MiB)", n)
        expect_equal(f"largest_n({budget // MiB} MiB)", n, largest_limit_test_n(budget))


@FEW_CALLS.observe
def _(largest_n, seed):
    return _count_calls(largest_n, few_calls_budgets(seed))


@FEW_CALLS.judge
def _(got, seed):
    for budget, n, calls in _searched(got, few_calls_budgets(seed)):
        if n != largest_limit_test_n(budget):
            raise CheckFailed(f"largest_n({budget // MiB} MiB) is not right yet (see the part above)")
        if calls > 40:
            raise CheckFailed(f"largest_n({budget // MiB} MiB) called run_limit_test {calls} times: "
                              "search in O(log N) steps, not one N at a time")


@FORMULA.observe
def _(saved_formula, seed):
    return [[n, saved_formula(n)] for n in formula_ns(seed)]


@answer
@functools.lru_cache(maxsize=None)
def sigmoid_saved(n: int) -> int:
    """The bytes ``SigmoidNet``'s predicted step at N saves for backward (their peak): the formula
    part's answer, which ``sigmoid_net_step``, the learners' helper, does not tell."""
    return predict_step(SigmoidNet, (1, 1, n, n, n), (1, 1, n, n, n), optimizer=None).saved_peak


@FORMULA.judge
def _(got, seed):
    wrong = []
    ns = formula_ns(seed)
    for n, value in zip(ns, expect_items("saved_formula", got, ns, what="volumes N"), strict=True):
        expect_int(f"saved_formula({n})", value)
        if value != sigmoid_saved(n):
            wrong.append(n)
    if wrong:
        raise CheckFailed(f"saved_formula is wrong for N in {wrong}: count what each op saves for "
                          "backward (conv, sigmoid, tanh, the MSE loss), once per storage, in fp32")


@SIGMOID_N.observe
def _(largest_n_sigmoid, seed):
    return [[b, largest_n_sigmoid(b)] for b in sigmoid_budgets(seed)]


@SIGMOID_N.judge
def _(got, seed):
    budgets = sigmoid_budgets(seed)
    for budget, n in zip(budgets, expect_items("largest_n_sigmoid", got, budgets, what="budgets"), strict=True):
        expect_int(f"largest_n_sigmoid({budget // MiB} MiB)", n)
        expect_equal(f"largest_n_sigmoid({budget // MiB} MiB)", n, largest_sigmoid_n(budget))


def check_limit_test(naive_estimate, largest_n, verbose: bool = True):
    """Instant feedback on ``naive_estimate`` and ``largest_n``."""
    return EX.run(["naive", "largest_n", "few_calls"],
                  {"naive_estimate": naive_estimate, "largest_n": largest_n}, verbose=verbose)


def check_sigmoid_net(saved_formula, largest_n_sigmoid, verbose: bool = True):
    """Instant feedback on your formula and largest N for ``SigmoidNet``."""
    return EX.run(["formula", "largest_sigmoid"],
                  {"saved_formula": saved_formula, "largest_n_sigmoid": largest_n_sigmoid},
                  verbose=verbose)


__all__ = ["SigmoidNet", "SigmoidStep", "sigmoid_net_step", "check_limit_test", "check_sigmoid_net", "GiB"]
