"""Exercise 08's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/08_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("whole batch on every rank", "loss = nn.functional.cross_entropy(ddp(xs), ys)",
     "loss = nn.functional.cross_entropy(ddp(x), y)", ["shard"]),
    ("losses not divided", "(nn.functional.cross_entropy(model(xs), ys) / micro_batches).backward()",
     "nn.functional.cross_entropy(model(xs), ys).backward()", ["accumulate"]),
]
