"""Exercise 07's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/07_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("the graph cut", "skips.append(checkpoint(down, skips[-1], use_reentrant=False))",
     "skips.append(checkpoint(down, skips[-1], use_reentrant=False).detach())", ["grads"]),
    ("no checkpoint", "skips = [checkpoint(net.inc, x, use_reentrant=False)]\n    for down in net.downs:\n"
     "        skips.append(checkpoint(down, skips[-1], use_reentrant=False))",
     "skips = [net.inc(x)]\n    for down in net.downs:\n        skips.append(down(skips[-1]))", ["less"]),
    ("one segment", "return min((s for s in range(1, n + 1) if n % s == 0), key=peak)", "return n", ["segments"]),
    ("checkpoint everything", "    for k in range(len(BLOCKS) + 1):", "    return list(BLOCKS)\n    for k in range(0):",
     ["plan"]),
]
