"""Exercise 02's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/02_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("hooks left", "        for h in handles:\n            h.remove()", "        pass", ["cleanup"]),
    ("forward hooks only", "        handles.append(module.register_full_backward_hook(", "        (print(", ["events"]),
    ("largest reading, not largest increase", "added[name] = added.get(name, 0) + nbytes - before.pop(name)",
     "added[name] = nbytes", ["biggest"]),
]
