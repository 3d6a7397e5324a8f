"""Exercise 04's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/04_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("loss not scaled", "scaler.scale(loss).backward()", "loss.backward()", ["scaled"]),
    ("step around the scaler", "scaler.step(optimizer)", "optimizer.step()", ["overflow"]),
    ("no update", "    scaler.update()\n", "\n", ["step", "overflow"]),
    ("no autocast", "with torch.autocast(x.device.type, dtype=torch.float16):", "if True:", ["autocast"]),
]
