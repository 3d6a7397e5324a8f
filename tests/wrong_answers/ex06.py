"""Exercise 06's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/06_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("batch statistics ignored", "dx = g * (dy - (dbias / m).view(shape) - x_hat * (dscale / m).view(shape))",
     "dx = g * dy", ["train", "dims", "module"]),
    ("5D only", "dims = [0, *range(2, z.dim())]", "dims = [0, 2, 3, 4]", ["dims"]),
    ("leaky ReLU not inverted", "y = torch.where(pos, z, z / slope)", "y = z", ["train", "eval"]),
]
