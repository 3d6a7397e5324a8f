"""Exercise 12's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/12_densenet_at_full_resolution.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

PIXELS = "pixels_a, pixels_b = batch_a * side_a**2, batch_b * side_b**2"
PER_PIXEL = "per_pixel = (peak_b - peak_a) / (pixels_b - pixels_a)"
LOOP = ("    while fixed + batch * (side + 32) ** 2 * per_pixel <= budget:\n"
        "        side += 32\n")
PAD = "padded = -(-height // step) * step"

WRONG = [
    # pixel_line: the notebook's per_pixel is per input pixel of ONE image
    ("per pixel of the batch, not of one image", PIXELS, "pixels_a, pixels_b = side_a**2, side_b**2", ["line"]),
    ("no fixed part: one point's peak over its pixels", PER_PIXEL, "per_pixel = peak_b / pixels_b", ["line"]),
    ("the line through the points, backwards", PER_PIXEL, "per_pixel = (pixels_b - pixels_a) / (peak_b - peak_a)",
     ["line"]),
    # largest_side
    ("GB, not GiB", "budget = budget_gib * 2**30", "budget = budget_gib * 10**9", ["side", "edge"]),
    ("the side not rounded to a multiple of 32", LOOP,
     LOOP.replace("(side + 32)", "(side + 1)").replace("side += 32", "side += 1"), ["side"]),
    ("the fixed part forgotten", "while fixed + batch * (side + 32)", "while batch * (side + 32)", ["side", "edge"]),
    ("the batch forgotten", "while fixed + batch * (side + 32)", "while fixed + (side + 32)", ["side"]),
    ("an exact fit refused", "** 2 * per_pixel <= budget:", "** 2 * per_pixel < budget:", ["edge"]),
    ("one step of 32 too far", "    return side\n", "    return side + 32\n", ["side", "edge"]),
    # per_gpu_bytes
    ("everything divides, the model too", "return fixed + batch * rows * width * per_pixel",
     "return (fixed + batch * padded * width * per_pixel) / gpus", ["split", "pad"]),
    ("the image not padded", PAD, "padded = height", ["pad"]),
    ("padded to 32 rows, not 32 per GPU", "step = 32 * gpus", "step = 32", ["pad"]),
    ("the image cropped, not padded", PAD, "padded = height // step * step", ["pad"]),
]
