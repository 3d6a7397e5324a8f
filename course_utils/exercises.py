"""Kept for ``python -m course_utils.exercises`` (the command COMMON.md gives): the generator now
lives in ``course_utils.grading.generate``."""

import sys

from .grading.generate import main

if __name__ == "__main__":
    sys.exit(main())
