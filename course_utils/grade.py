"""Kept for ``python -m course_utils.grade`` (the README's command): the grader now lives in
``course_utils.grading.grade``."""

import sys

from .grading.grade import main

if __name__ == "__main__":
    sys.exit(main())
