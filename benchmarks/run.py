"""Benchmark every technique of the course on seed 000's U-Nets. Not a test: it measures.

    python benchmarks/run.py                 # writes benchmarks/results/<device>.json, .md, .png
    python benchmarks/run.py --nets large small

On a CUDA GPU every row is predicted *and* measured (course_utils.benchmark explains each
column); on a CPU the rows are predictions for a CUDA GPU, named as such.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course_utils import benchmark  # noqa: E402
from course_utils.checks import TechniqueError  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=8, help="the card's memory in GiB (default 8)")
    ap.add_argument("--nets", nargs="+", default=["large", "small"], choices=list(benchmark.NETS))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    if args.budget <= 0:
        ap.error("--budget must be > 0")
    try:  # run checks its arguments and makes the folder before its first prediction
        benchmark.run(args.out, nets=tuple(args.nets), budget_gib=args.budget)
    except TechniqueError as err:  # a budget no card has, a folder that cannot be made
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
