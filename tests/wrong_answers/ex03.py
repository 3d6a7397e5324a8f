"""Exercise 03's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/03_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("half the naive count", "return 26 * n**3 * 4", "return 13 * n**3 * 4", ["naive"]),
    ("counts a storage twice", "return 11 * n**3 * 4", "return 12 * n**3 * 4", ["formula"]),
    ("one N at a time",
     "run_limit_test(n).peak <= budget_bytes\n\n    lo, hi = 8, 16\n    while fits(hi):\n        lo, hi = hi, hi * 2\n"
     "    while hi - lo > 1:\n        mid = (lo + hi) // 2\n        lo, hi = (mid, hi) if fits(mid) else (lo, mid)\n"
     "    return lo\n",
     "run_limit_test(n).peak <= budget_bytes\n\n    n = 8\n    while fits(n + 8):\n        n += 8\n    while fits(n + 1):\n"
     "        n += 1\n    return n\n", ["few_calls"]),
]
