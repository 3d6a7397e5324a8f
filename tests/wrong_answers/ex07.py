"""Exercise 07's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/07_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

_RUN = ("        return checkpoint(block, inp, use_reentrant=False,\n"
        "                          context_fn=lambda: (contextlib.nullcontext(), frozen_bn_stats(block)))\n")

WRONG = [
    ("the graph cut", "skips.append(run(down, skips[-1]))", "skips.append(run(down, skips[-1]).detach())", ["grads"]),
    ("no checkpoint", _RUN, "        return block(inp)\n", ["less"]),
    # notebook 07's pitfall: recomputation in backward runs every BatchNorm a second time
    ("BatchNorm updated twice", _RUN, "        return checkpoint(block, inp, use_reentrant=False)\n", ["bn"]),
    ("one segment", "return min((s for s in range(1, n + 1) if n % s == 0), key=peak)", "return n", ["segments"]),
    ("checkpoint everything", "    for k in range(len(BLOCKS) + 1):", "    return list(BLOCKS)\n    for k in range(0):",
     ["plan"]),
]
