"""Exercise 09's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/09_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("skips detached", "skips.append(down(skips[-1]))", "skips.append(down(skips[-1]).detach())", ["grads"]),
    ("inc forgotten", 'if name == "inc" or name.startswith("downs")', 'if name.startswith("downs")', ["boundary"]),
]
