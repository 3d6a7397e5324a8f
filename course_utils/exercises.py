"""Kept so that the old command ``python -m course_utils.exercises`` still works: the generator
(exercises/ from solutions/) now lives in ``course_utils.grading.generate``, whose command
docs/teaching.md gives."""

import sys

from .grading.generate import main

if __name__ == "__main__":
    sys.exit(main())
