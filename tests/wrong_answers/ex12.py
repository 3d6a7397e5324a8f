"""Exercise 12's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/12_densenet_at_full_resolution.ipynb, its replacement, the parts that must fail). Every exercise needs at least one.

TODO(scaffold): the template's example's wrong answers: list your exercise's, then delete this line.
"""

WRONG = [
    ("no element size", "batch * math.prod(volume) * torch.empty((), dtype=dtype).element_size()",
     "batch * math.prod(volume)", ["fp32", "half"]),
    ("allocates the batch", "batch * math.prod(volume) * torch.empty((), dtype=dtype).element_size()",
     "torch.empty((batch, 1, *volume), dtype=dtype).nbytes", ["huge"]),
]
