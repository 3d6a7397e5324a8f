"""Exercise 11 -- your network: the three decisions ``course_utils.fit`` makes, written by the
learner and checked on breakdowns, cards and technique tables drawn from the seed.

* ``fixed_and_per_sample(breakdown, batch)``: split a steady-state peak into what does not grow
  with the batch and what each sample adds: the line ``peak(batch) = fixed + per_sample x batch``
  that notebook 11 (section 2) defines, ``budget.batch_model``'s, which ``fit`` uses;
* ``largest_batch(fixed, per_sample, card_gib, context_mib, slack)``: the largest batch whose
  peak fits the card, under ``budget.Overheads``' model of the card;
* ``cheapest_fit(options, card_gib, context_mib, slack)``: the fastest technique that fits.

Each part observes the learner's function on inputs drawn from the seed (``observe``: data only)
and compares with a reference computed from the course's own functions (``judge``)."""

from __future__ import annotations

from typing import Any


from ..budget import BatchModel, Overheads, fixed_bytes
from .core import CheckFailed, Exercise, drawn_int, expect_equal, expect_int, expect_list, reference, seeded

EX = Exercise("11", "Your network", names=("fixed_and_per_sample", "largest_batch", "cheapest_fit"))

MIB = 2**20
CARDS = (8, 16, 24, 40, 80)


def breakdown_cases(seed: int) -> list[tuple[dict[str, int], int]]:
    """(steady-state breakdown, batch): a fixed DenseNet-169-like one, then drawn ones. Every
    batch leaves a remainder, so rounding the per-sample bytes down is seen."""
    out = [({"Parameter": 50_855_424, "Buffer": 1_043_968, "Gradient": 48_299_008, "Optstate": 101_710_848,
             "Activation": 6_270_795_264, "Temp": 238_551_552, "Other": 8_388_608, "Total": 6_719_644_672}, 6)]
    g = seeded(seed, 110)
    for _ in range(5):
        p = drawn_int(g, 1_000, 2_000_000) * 512
        b = {"Parameter": p, "Buffer": drawn_int(g, 0, 20_000) * 512, "Gradient": drawn_int(g, 0, p // 512 + 1) * 512,
             "Optstate": 2 * p, "Activation": drawn_int(g, 10_000, 20_000_000) * 512,
             "Temp": drawn_int(g, 0, 2_000_000) * 512, "Other": drawn_int(g, 1, 100_000) * 512}
        b["Total"] = sum(b.values())
        batch = drawn_int(g, 3, 65)
        while (b["Total"] - fixed_bytes(b)) % batch == 0:
            batch += 1
        out.append((b, batch))
    return out


@reference
def reference_split(breakdown: dict[str, int], batch: int) -> tuple[int, int]:
    """``budget.batch_model``'s split: fixed = parameters + buffers + gradients + Adam's state;
    per sample = the rest of the total over the batch, rounded up."""
    fixed = fixed_bytes(breakdown)
    return fixed, -(-(breakdown["Total"] - fixed) // batch)


def card_cases(seed: int) -> list[tuple[int, int, float, float, float]]:
    """(fixed, per_sample, card_gib, context_mib, slack): an exact fit (the peak equals what the
    card holds), a card too small for the fixed part alone, then drawn ones."""
    exact = (1030 * MIB, 665 * MIB, 8, 512.0, 0.0)  # 8192 - 512 - 1030 = 6650 = 10 x 665: batch 10 fits exactly
    out = [exact, (9 * 2**30, 100 * MIB, 8, 500.0, 0.1)]
    g = seeded(seed, 111)
    for _ in range(6):
        out.append((drawn_int(g, 1, 4_000) * MIB, drawn_int(g, 1, 3_000) * MIB, CARDS[drawn_int(g, 0, len(CARDS))],
                    float(drawn_int(g, 300, 900)), drawn_int(g, 0, 25) / 100))
    return out


@reference
def reference_largest(fixed: int, per_sample: int, card_gib: float, context_mib: float, slack: float) -> int:
    """``BatchModel.largest_batch`` of the bytes ``budget.Overheads`` says the card holds."""
    usable = Overheads(context_mib, slack, "the exercise's").usable(card_gib * 2**30)
    return int(BatchModel(fixed, per_sample, {}, 1).largest_batch(usable))


def option_cases(seed: int) -> list[tuple[list[tuple[str, int, float]], float, float, float]]:
    """(options, card_gib, context_mib, slack); options are (technique, predicted peak bytes,
    time per step x the baseline). Drawn around what the card holds, with a tie in time, and
    one table where nothing fits."""
    names = ("baseline", "autocast-fp16", "autocast-bf16", "inplace", "checkpoint-blocks", "selective", "offload")
    # fixed: autocast fits the card's 8 GiB but not what is left after the context and the slack
    out = [([("baseline", 9000 * MIB, 1.0), ("autocast-fp16", 7500 * MIB, 0.6), ("checkpoint-blocks", 5000 * MIB, 1.3),
             ("selective", 6000 * MIB, 1.1)], 8, 512.0, 0.1)]
    g = seeded(seed, 112)
    for k in range(5):
        card, context, slack = CARDS[drawn_int(g, 0, 3)], float(drawn_int(g, 300, 900)), drawn_int(g, 0, 20) / 100
        usable = Overheads(context, slack, "").usable(card * 2**30)
        scale = 3.0 if k == 4 else 1.0  # the last table: every option too big
        opts = [(n, int(usable * scale * (0.6 + drawn_int(g, 0, 80) / 100)) // 512 * 512,
                 round(0.5 + drawn_int(g, 0, 110) / 100, 2)) for n in names[:drawn_int(g, 4, len(names) + 1)]]
        # the baseline: time 1 by definition, and most often too big for the card
        opts[0] = (opts[0][0], int(usable * scale * (0.9 + drawn_int(g, 0, 60) / 100)) // 512 * 512, 1.0)
        opts.append(("twin of " + opts[1][0], opts[1][1] + 512 * drawn_int(g, 1, 50), opts[1][2]))  # same time, more memory
        out.append((opts, card, context, slack))
    return out


@reference
def reference_cheapest(options: list[tuple[str, int, float]], card_gib: float, context_mib: float,
                       slack: float) -> str | None:
    """The fastest option whose card needs (``Overheads.needed``) fit the card; on equal time,
    the smaller peak; None when nothing fits."""
    over = Overheads(context_mib, slack, "")
    fits = [o for o in options if over.needed(o[1]) <= card_gib * 2**30]
    return min(fits, key=lambda o: (o[2], o[1]))[0] if fits else None


def _judge_each(label: str, got: Any, expected: list, check) -> None:
    got = expect_list(label, got, len(expected), "answers")
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        check(f"{label} #{k + 1}", g, e)


def _pair(label: str, got: Any, expected: tuple[int, int]) -> None:
    got = expect_list(label, got, 2, "numbers (fixed, per_sample)")
    expect_int(f"{label}: fixed", got[0])
    expect_int(f"{label}: per_sample", got[1])
    if got[0] != expected[0]:
        raise CheckFailed(f"{label}: fixed = {got[0]:,} bytes, expected {expected[0]:,}: which parts of the "
                          "breakdown do not grow with the batch?")
    expect_equal(f"{label}: per_sample", got[1], expected[1])


def _largest(label: str, got: Any, expected: int) -> None:
    expect_int(label, got)
    expect_equal(label, got, expected)


def _cheapest(label: str, got: Any, expected: str | None) -> None:
    if got is not None and not isinstance(got, str):
        raise CheckFailed(f"{label}: return a technique's name (str) or None, got {type(got).__name__}")
    expect_equal(label, got, expected)


SPLIT = EX.part("split", "fixed_and_per_sample: what grows with the batch", 1, ["fixed_and_per_sample"])
CARD = EX.part("card", "largest_batch: the largest batch a card holds", 1, ["largest_batch"])
CHOOSE = EX.part("choose", "cheapest_fit: the fastest technique that fits", 1, ["cheapest_fit"])


@SPLIT.observe
def _(fixed_and_per_sample, seed):
    return [list(fixed_and_per_sample(dict(b), n)) for b, n in breakdown_cases(seed)]


@SPLIT.judge
def _(got, seed):
    cases = breakdown_cases(seed)
    _judge_each("fixed_and_per_sample", got, [reference_split(b, n) for b, n in cases], _pair)


@CARD.observe
def _(largest_batch, seed):
    return [largest_batch(*c) for c in card_cases(seed)]


@CARD.judge
def _(got, seed):
    _judge_each("largest_batch", got, [reference_largest(*c) for c in card_cases(seed)], _largest)


@CHOOSE.observe
def _(cheapest_fit, seed):
    return [cheapest_fit([tuple(o) for o in opts], card, ctx, slack) for opts, card, ctx, slack in option_cases(seed)]


@CHOOSE.judge
def _(got, seed):
    _judge_each("cheapest_fit", got, [reference_cheapest(*c) for c in option_cases(seed)], _cheapest)


def check_split(fixed_and_per_sample, verbose: bool = True):
    """Instant feedback on your ``fixed_and_per_sample(breakdown, batch)``."""
    return EX.run(["split"], {"fixed_and_per_sample": fixed_and_per_sample}, verbose=verbose)


def check_card(largest_batch, verbose: bool = True):
    """Instant feedback on your ``largest_batch(fixed, per_sample, card_gib, context_mib, slack)``."""
    return EX.run(["card"], {"largest_batch": largest_batch}, verbose=verbose)


def check_choice(cheapest_fit, verbose: bool = True):
    """Instant feedback on your ``cheapest_fit(options, card_gib, context_mib, slack)``."""
    return EX.run(["choose"], {"cheapest_fit": cheapest_fit}, verbose=verbose)


def budget_answers(report, fixed_and_per_sample, largest_batch, cheapest_fit) -> dict[str, Any]:
    """The exercise's budget question answered with the learner's three functions on ``report``
    (a ``fit.FitReport``), printed beside ``fit``'s own answers (not graded: the parts are).
    ``report.breakdown`` has the keys the exercise names (MemTracker's: ``Temp``, not a longer
    name). ``fit`` also takes cuBLAS's workspaces off the card (``Overheads.workspace_bytes``);
    the learner's card model has no such line, so they are passed in as part of the context:
    (card - context - workspaces) / (1 + slack) is then one card model for both."""
    over, batch = report.overheads, report.input_shape[0]
    context = over.context_mib + over.workspace_bytes / MIB  # fit's cuBLAS workspaces, counted as context
    fixed, per_sample = fixed_and_per_sample(dict(report.breakdown), batch)
    yours = largest_batch(fixed, per_sample, report.card_gib, context, over.slack)
    base = report.rows[0].seconds
    one_gpu = [r for r in report.rows if r.gpus == 1]
    choice = cheapest_fit([(r.technique, r.peak, r.seconds / base) for r in one_gpu], report.card_gib,
                          context, over.slack)
    fitting = [r for r in one_gpu if r.fits]
    theirs = min(fitting, key=lambda r: (r.seconds, r.peak)).technique if fitting else None
    print(f"{report.name} at batch {batch} on a {report.card_gib:g} GiB card "
          f"(context {over.context_mib:.0f} MiB, slack {over.slack:.0%}: {over.source.split(':')[0]})")
    if over.workspace_bytes:
        print(f"  your functions get context_mib = {context:.1f}: the context and fit's {report.workspace}")
    print(f"  largest batch of the plain fp32 step: yours {yours}, fit's {report.rows[0].largest_batch} "
          "(fit's is verified by predictions at that batch and the next)")
    print(f"  fastest technique that trains batch {batch} on one GPU: yours {choice}, fit's {theirs}")
    return {"largest batch": yours, "fastest that fits": choice, "fit's largest batch": report.rows[0].largest_batch,
            "fit's fastest that fits": theirs, "context_mib passed": context}
