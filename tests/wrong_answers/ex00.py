"""Exercise 00's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/00_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("no element size", "math.prod(shape) * torch.empty((), dtype=dtype).element_size()", "math.prod(shape)",
     ["float", "small"]),
    ("allocates the tensor", "math.prod(shape) * torch.empty((), dtype=dtype).element_size()",
     "torch.empty(shape, dtype=dtype).nbytes", ["edge"]),
    ("tensor, not storage", "out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()",
     "out.data_ptr() == x.data_ptr()", ["new_bytes"]),
]
