"""Exercise 01's typical wrong answers, each graded by tests/test_exercises.py: (what, text in
solutions/01_*.ipynb, its replacement, the parts that must fail). Every exercise needs at least one."""

WRONG = [
    ("conv -> ReLU -> BN", "nn.BatchNorm3d(out_channels), nn.ReLU(),\n            nn.Conv3d(out_channels",
     "nn.ReLU(), nn.BatchNorm3d(out_channels),\n            nn.Conv3d(out_channels", ["dc_values"]),
    ("nearest upsampling", 'mode="trilinear", align_corners=True', 'mode="nearest"', ["up_values"]),
    ("[x, skip]", "torch.cat([skip, x], dim=1)", "torch.cat([x, skip], dim=1)", ["up_values"]),
    ("one-sided padding", "pad += [(s - u) // 2, (s - u) - (s - u) // 2]", "pad += [0, s - u]", ["up_values"]),
    ("no bias", "nn.Conv3d(out_channels, out_channels, 3, padding=1)",
     "nn.Conv3d(out_channels, out_channels, 3, padding=1, bias=False)", ["dc_params", "seed000"]),
]
