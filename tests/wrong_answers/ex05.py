"""Exercise 05's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/05_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("sigmoid said safe", '"Sigmoid": False', '"Sigmoid": True', ["answers"]),
    ("still in place", "return torch.sigmoid(x) * 2", "return torch.sigmoid(x).mul_(2)", ["fixed"]),
    ("always backward", 'return ("backward" if top >= first_bwd else "forward"), rows[top].module',
     'return "backward", rows[top].module', ["peak"]),
    ("always forward", 'return ("backward" if top >= first_bwd else "forward"), rows[top].module',
     'return "forward", rows[top].module', ["peak"]),
    ("not lower but equal", "return inplace < plain", "return inplace <= plain", ["lowers"]),
]
