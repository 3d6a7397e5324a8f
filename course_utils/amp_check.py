"""``amp_rules`` checked on the course's own nets: the emulation against the real AutocastCUDA kernels.

    python -m course_utils.amp_check          # one line per net and dtype; exit 1 if any differs
    python -m course_utils.amp_check --json   # every op's dtypes, both ways

For both seed 000 U-Nets, the lean-Up one and seed 004's DenseNet-169, at full size on fake
tensors, ``compare_with_real_kernels`` traces the dtypes every op runs in through this torch's
real AutocastCUDA kernels (fake CUDA tensors, no GPU needed) and through ``amp_rules``' emulation
on the CPU. It lives apart from the rules because it needs the model zoo, which the rules do not.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from .amp_rules import trace_dtypes
from .checks import TechniqueError, guard
from .config import SEED000_VOLUME
from .densenet import densenet169, seed004_step_args
from .unet import UNet3D, seed000_unet


def _checks() -> list[tuple]:
    """(name, build, input shape, target shape, loss, autocast dtypes) of the nets whose autocast
    dtypes the course predicts. bf16 only for the U-Nets: the lists are the same for both dtypes
    (the test of one is the test of the other), and DenseNet's 600 ops take seconds per trace.
    Seed 004's memory-efficient DenseNet is not traced apart: without autograd its checkpointed
    layers run the same ops as the plain ones."""
    both = (torch.float16, torch.bfloat16)
    unet = ((2, 1, *SEED000_VOLUME), (2, *SEED000_VOLUME), F.cross_entropy)
    d = seed004_step_args()
    return [("seed 000 large", lambda: seed000_unet("large"), *unet, both),
            ("seed 000 small", lambda: seed000_unet("small"), *unet, both),
            ("seed 000 large, lean Up", lambda: UNet3D(lean_up=True), *unet, both),
            ("seed 004 DenseNet-169", densenet169, d["input_shape"], d["target_shape"], d["loss_fn"],
             (torch.float16,))]


def compare_with_real_kernels() -> dict:
    """For each net of the course (both seed 000 U-Nets, the lean-Up one, seed 004's
    DenseNet-169) and autocast dtype: the traces of ``trace_dtypes`` through the real
    AutocastCUDA kernels ("cuda"), through the emulation ("cpu"), and through the emulation in
    training mode ("cpu train"), at full size on fake tensors. JSON-ready."""
    out = {}
    for name, build, x, target, loss, dtypes in _checks():
        for dtype in dtypes:
            key = f"{name}, {str(dtype).removeprefix('torch.')}"
            out[key] = {mode: [[op, list(d)] for op, d in trace_dtypes(build, x, target, loss, device, dtype, train)]
                        for mode, device, train in (("cuda", "cuda", False), ("cpu", "cpu", False),
                                                    ("cpu train", "cpu", True))}
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils.amp_check [--json]``: one line per net and dtype (``--json``: every
    op's dtypes, both ways); returns 1 if the emulation differs from the real kernels anywhere.
    Its arguments are read before the traces (seconds of CPU each) start: a wrong one is refused first."""
    ap = argparse.ArgumentParser(prog="python -m course_utils.amp_check", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print every op's dtypes, both ways, as JSON")
    args = ap.parse_args(argv)
    report = compare_with_real_kernels()
    if args.json:
        print(json.dumps({"torch": torch.__version__, "nets": report}))
        return 0
    for key, traces in report.items():
        same = traces["cuda"] == traces["cpu"]
        print(f"{key}: {len(traces['cuda'])} ops, emulation {'agrees' if same else 'DIFFERS'}")
    return 0 if all(t["cuda"] == t["cpu"] for t in report.values()) else 1


guard(globals(), TechniqueError)


if __name__ == "__main__":
    # in a process of its own: a fake CUDA tensor that reaches a CUDA device guard aborts the
    # process on a CPU build
    sys.exit(main())
