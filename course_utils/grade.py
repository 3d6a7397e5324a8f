"""Kept for ``python -m course_utils.grade`` (the command docs/teaching.md gives, beside
``python -m course_utils.grading.grade``): the grader lives in ``course_utils.grading.grade``."""

import sys

from .grading.grade import main

if __name__ == "__main__":
    sys.exit(main())
