"""Exercise 10's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/10_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("the baseline", "return max(options, key=lambda cfg: ex.estimate(cfg).largest_batch)",
     'return replace(base, precision="fp32")',
     ["beats", "best"]),
    # the fp16 model (no fp32 master weights) as the answer, without the search (a search over the
    # fp16 model's switches would predict 8 more configurations to reach the same failure)
    ("no fp32 master weights", "return max(options, key=lambda cfg: ex.estimate(cfg).largest_batch)",
     'return replace(base, precision="fp16_model")', ["valid", "best"]),
    ("the notebooks' first table only", 'precisions=["autocast_fp16"], lean_up=(False, True))',
     'precisions=["autocast_fp16"])', ["best"]),
]
