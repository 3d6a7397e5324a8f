"""Exercise 05's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/05_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

_SOLUTION_PEAK = "    return module, phase\n"

WRONG = [
    ("sigmoid said safe", '"Sigmoid": False', '"Sigmoid": True', ["answers"]),
    ("still in place", "return torch.sigmoid(x) * 2", "return torch.sigmoid(x).mul_(2)", ["fixed"]),
    ("always backward", _SOLUTION_PEAK, '    return module, "backward"\n', ["peak"]),
    ("always forward", _SOLUTION_PEAK, '    return module, "forward"\n', ["peak"]),
    ("phase first", _SOLUTION_PEAK, "    return phase, module\n", ["peak"]),
    # the hook table's largest row: sampled only when a hook fires, it misses a peak between rows
    # (the first net peaks in the loss's gradient, outside every module)
    ("largest hook-table row", _SOLUTION_PEAK,
     "    rows = predict_step(build, input_shape, n_classes=5, optimizer=None).log.rows\n"
     "    top = max(range(len(rows)), key=lambda i: rows[i].tracked)\n"
     "    first_bwd = next((i for i, r in enumerate(rows) if r.hook.startswith('bwd')), len(rows))\n"
     "    return rows[top].module, ('backward' if top >= first_bwd else 'forward')\n", ["peak"]),
    ("not lower but equal", "return inplace < plain", "return inplace <= plain", ["lowers"]),
]
