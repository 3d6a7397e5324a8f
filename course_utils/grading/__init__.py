"""Grading: the exercises' checks, the exercise generator, the student release and the grader.

* ``exNN``      -- the checks of exercise NN (one module each); notebooks import ``check_*`` from here
* ``core``      -- parts, observations and judgements, scores
* ``registry``  -- exercise number -> module
* ``generate``  -- ``python -m course_utils.grading.generate``: exercises/ from solutions/
* ``release``   -- ``python -m course_utils.grading.release OUT``: what learners get for graded work
* ``expected``  -- the references' results recorded at the notebooks' seed: what the release checks with
* ``grade``     -- ``python -m course_utils.grading.grade submissions/``: grade a class
* ``grader``    -- one submission graded (``Grader``): notebook run, sandbox, judge; ``Options``, ``Result``
* ``intake``    -- what a submission hands the grader, checked first: the file, its texts, the observations
* ``notebook_code``, ``strip``, ``sandbox``, ``runner``, ``kernel_launch``, ``limits``, ``contain`` -- the
  grader's machinery (see docs/teaching.md, "Threat model")

Importing this package imports nothing heavy; each module is imported on use.
"""
