"""Exercise 10's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/10_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("the baseline", "return max(options, key=lambda cfg: ex.estimate(cfg).largest_batch)",
     'return replace(base, precision="fp32")',
     ["beats", "best"]),
    ("no fp32 master weights", 'precisions=["autocast_fp16"], lean_up', 'precisions=["fp16_model"], lean_up',
     ["valid", "best"]),
    ("the notebooks' first table only", 'precisions=["autocast_fp16"], lean_up=(False, True))',
     'precisions=["autocast_fp16"])', ["best"]),
]
