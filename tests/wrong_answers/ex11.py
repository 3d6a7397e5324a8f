"""Exercise 11's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/11_your_network.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

FIXED = 'breakdown["Parameter"] + breakdown["Buffer"] + breakdown["Gradient"] + breakdown["Optstate"]'
PER_SAMPLE = '-(-(breakdown["Total"] - fixed) // batch)'
USABLE = "usable = (card_gib * 2**30 - context_mib * 2**20) / (1 + slack)"
FITS = "o[1] * (1 + slack) + context_mib * 2**20 <= card_gib * 2**30"

WRONG = [
    ("Adam's state counted per sample", FIXED, 'breakdown["Parameter"] + breakdown["Buffer"] + breakdown["Gradient"]',
     ["split"]),
    ("per-sample bytes rounded down", PER_SAMPLE, '(breakdown["Total"] - fixed) // batch', ["split"]),
    ("only activations grow with the batch", PER_SAMPLE, '-(-breakdown["Activation"] // batch)', ["split"]),
    # the breakdown's keys as notebook 11 prints them: the input and target (Other) left out
    ("the input and target do not grow", PER_SAMPLE, '-(-(breakdown["Activation"] + breakdown["Temp"]) // batch)',
     ["split"]),
    ("no CUDA context", USABLE, "usable = card_gib * 2**30 / (1 + slack)", ["card"]),
    ("the slack taken off the card, not the peak", USABLE,
     "usable = card_gib * 2**30 / (1 + slack) - context_mib * 2**20", ["card"]),
    ("an exact fit refused", "int((usable - fixed) // per_sample)", "int((usable - fixed - 1) // per_sample)", ["card"]),
    ("a negative batch when nothing fits", "max(0, int((usable - fixed) // per_sample))",
     "int((usable - fixed) // per_sample)", ["card"]),
    ("the smallest peak, not the fastest", "min(fits, key=lambda o: (o[2], o[1]))[0]", "min(fits, key=lambda o: o[1])[0]",
     ["choose"]),
    ("the card's whole memory", FITS, "o[1] <= card_gib * 2**30", ["choose"]),
    ("ties broken by the larger peak", "min(fits, key=lambda o: (o[2], o[1]))[0]",
     "min(fits, key=lambda o: (o[2], -o[1]))[0]", ["choose"]),
]
