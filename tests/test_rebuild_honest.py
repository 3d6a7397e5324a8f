"""Honest top-level code is graded as it runs: the grader's rebuild of a notebook keeps
the computed statements its graded code needs (a dict of element sizes, an import with a
fallback, a tensor constant, a decorated function), still refuses objects that are not the
learner's own, skips what the graded code does not need, and names the statement it did not
run in the message of a part that fails because of it.

Small notebooks, rebuilt and observed in this process (``observe_notebook``), judged like the
grader does (``Exercise.judge`` on the data after ``torch.save``/``torch.load``)."""

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from course_utils.grading.core import Raised, roundtrip
from course_utils.grading.notebook_code import WHY_MAGIC, WHY_UNUSED, graded_objects, rebuild
from course_utils.grading.registry import exercise
from course_utils.grading.sandbox import observe_notebook

ROOT = Path(__file__).resolve().parent.parent
SEED = 11


def notebook(*cells: str):
    return new_notebook(cells=[new_code_cell(c) for c in cells])


def solution_code(nn: str, name: str) -> str:
    """The code cell of ``solutions/NN_*.ipynb`` that defines ``name``."""
    path = next((ROOT / "solutions").glob(f"{nn}_*.ipynb"))
    cells = nbformat.read(path, as_version=4).cells
    return next(c.source for c in cells if c.cell_type == "code" and f"def {name}(" in c.source)


def grade(nb, nn: str, keys) -> dict:
    """{part: PartResult} as the grader computes them: observed on a rebuild, judged on data."""
    ex = exercise(nn)
    obs = observe_notebook(nb, nn, keys, SEED)
    return {k: ex.judge(k, roundtrip(obs[k]), SEED) for k in keys}


def assert_full_marks(results: dict) -> None:
    failed = {k: r.message for k, r in results.items() if not r.passed}
    assert not failed, failed


DTYPES = ("(torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, "
          "torch.int16, torch.int32, torch.int64, torch.bool)")
ELEMENT_SIZE = f"ELEMENT_SIZE = {{dt: torch.empty((), dtype=dt).element_size() for dt in {DTYPES}}}"
NBYTES = "def tensor_nbytes(shape, dtype):\n    return math.prod(shape) * ELEMENT_SIZE[dtype]"
EX00_PARTS = ["float", "small", "edge", "new_bytes"]


# -- four examples: full marks -------------------------------------------------------------------
def test_a_computed_dict_of_element_sizes_is_carried_over():
    # was 2/5: NameError: name 'ELEMENT_SIZE' is not defined
    nb = notebook("import math\nimport torch", ELEMENT_SIZE, NBYTES, solution_code("00", "new_bytes"),
                  "check_tensor_nbytes(tensor_nbytes)")
    assert_full_marks(grade(nb, "00", EX00_PARTS))


def test_an_import_with_a_fallback_is_carried_over():
    # was 0 on the four encoder parts: the try/except that imports checkpoint was dropped
    nb = notebook("import contextlib\nimport torch\nfrom course_utils.checkpointing import frozen_bn_stats",
                  "try:\n    from torch.utils.checkpoint import checkpoint\nexcept ImportError:  # an old torch\n"
                  "    checkpoint = None",
                  solution_code("07", "encoder_forward"))
    assert_full_marks(grade(nb, "07", ["skips", "grads", "less", "bn"]))


def test_a_computed_tensor_constant_is_carried_over():
    # In-Place ABN's backward with its zero as a tensor constant: was 0/6 (NameError)
    code = solution_code("06", "abn_backward").replace("pos = z >= 0", "pos = z >= ZERO")
    assert "z >= ZERO" in code
    nb = notebook("import torch", "ZERO = torch.tensor(0.0, dtype=torch.float64)", code)
    assert_full_marks(grade(nb, "06", ["train", "eval", "dims", "module"]))


def test_a_graded_function_under_lru_cache_is_accepted():
    # was refused: "best_segments is not a class or function in the notebook (it comes from module
    # __main__)"; its full marks through the real grader: test_one_submission_through_the_grader
    nb = notebook("import functools", "@functools.lru_cache(maxsize=None)\ndef best_segments(n):\n    return n // 2")
    rb = rebuild(nb, graded=["best_segments"])
    got = graded_objects(rb, ["best_segments"])
    assert exercise("07").observe("segments", got, SEED) == [[8, 4], [18, 9]]
    assert rb.sources["best_segments"].startswith("@functools.lru_cache")


# -- what is still refused, and the other decorations that are accepted ---------------------------
REF = "import functools\nimport torch\nimport course_utils.grading.ex07 as ref\n"


@pytest.mark.parametrize("code", [
    "best_segments = functools.lru_cache(ref.best_segment_count)",
    "@lambda f: ref.best_segment_count\ndef best_segments(n):\n    return 1",
    "best_segments = functools.lru_cache(maxsize=None)(ref.segment_peak)",
    # a wrapper that claims to wrap the learner's function but calls the reference
    "def mine(n):\n    return 1\n\nbest_segments = functools.update_wrapper(functools.partial(ref.best_segment_count), mine)",
    "@lambda f: functools.update_wrapper(functools.partial(ref.best_segment_count), f)\ndef best_segments(n):\n"
    "    return 1",
], ids=["lru_cache-of-reference", "decorator-returns-reference", "lru_cache-call-of-reference",
        "partial-with-wrapped", "decorator-partial-with-wrapped"])
def test_wrappers_do_not_make_course_utils_objects_gradable(code):
    nb = notebook(REF, code)
    got = graded_objects(rebuild(nb, graded=["best_segments"]), ["best_segments"])["best_segments"]
    assert isinstance(got, Raised) and got.kind == "refused", got
    assert "raded objects must be your own" in got.message
    # without the graded names, a computed best_segments that no definition reads is not even run
    got = graded_objects(rebuild(nb), ["best_segments"])["best_segments"]
    assert isinstance(got, Raised) and got.kind in ("refused", "missing"), got
    if got.kind == "missing":
        assert "(`best_segments = " in got.message and "the grader did not run it" in got.message


@pytest.mark.parametrize("code", [
    "@torch.no_grad()\ndef best_segments(n):\n    return n",
    "@functools.lru_cache(maxsize=None)\ndef best_segments(n):\n    return n",
    "def logged(f):\n    @functools.wraps(f)\n    def inner(*a):\n        return f(*a)\n    return inner\n\n"
    "@logged\ndef best_segments(n):\n    return n",
    "def best_segments(n):\n    return n\n\nbest_segments = functools.lru_cache(best_segments)",
    "@functools.cache\n@torch.no_grad()\ndef best_segments(n):\n    return n",
], ids=["no_grad", "lru_cache", "own-decorator", "lru_cache-assigned", "stacked"])
def test_decorated_notebook_functions_are_graded(code):
    rb = rebuild(notebook(REF, code))
    got = graded_objects(rb, ["best_segments"])["best_segments"]
    assert not isinstance(got, Raised), got
    assert got(6) == 6 and "return n" in rb.sources["best_segments"]


# -- what is not needed is not run, and is listed -----------------------------------------------------
def test_statements_no_graded_code_reads_are_listed_and_not_run(tmp_path):
    marker = tmp_path / "ran"
    nb = notebook("import math\nimport torch", ELEMENT_SIZE, NBYTES,
                  f"def train(epoch):\n    open({str(marker)!r}, 'a').write('x')\n    return epoch",
                  "for epoch in range(3):\n    history = train(epoch)\nprint(history)",
                  "HISTORY = [train(e) for e in range(3)]\ndef plot():\n    return HISTORY")
    rb = rebuild(nb, graded=exercise("00").names)
    assert not marker.exists(), "a statement that no graded code needs ran"
    assert [(d.cell, d.line, d.code, d.why) for d in rb.dropped] == [
        (5, 1, "for epoch in range(3):", WHY_UNUSED), (5, 3, "print(history)", WHY_UNUSED),
        (6, 1, "HISTORY = [train(e) for e in range(3)]", WHY_UNUSED)]
    assert rb.namespace["ELEMENT_SIZE"][__import__("torch").float16] == 2
    # without the graded names, what any kept def reads is run: plot() reads HISTORY
    everything = rebuild(nb)
    assert marker.read_text() == "xxx" and everything.namespace["plot"]() == [0, 1, 2]


def test_later_rebinding_and_globals_set_by_a_function_are_carried_over():
    nb = notebook("import torch\nSCALE = torch.tensor(1.0)",
                  "def scaled(v):\n    return v * SCALE + OFFSET",
                  "def init():\n    global OFFSET\n    OFFSET = torch.tensor(0.5)\n\ninit()",
                  "SCALE = torch.tensor(2.0)")
    f = graded_objects(rebuild(nb, graded=["scaled"]), ["scaled"])["scaled"]
    assert float(f(3.0)) == 6.5


# -- a part that fails because of a statement not run names it ---------------------------------------
def test_a_failed_statement_is_named_in_the_parts_message():
    nb = notebook("import math\nimport torch", ELEMENT_SIZE.replace(DTYPES, "DTPYES"), NBYTES)
    msg = grade(nb, "00", ["float"])["float"].message
    assert "name 'ELEMENT_SIZE' is not defined" in msg
    assert "code cell 2, line 1 (`ELEMENT_SIZE = {dt: torch.empty" in msg and "which sets ELEMENT_SIZE" in msg
    assert "name 'DTPYES' is not defined" in msg


def test_a_magic_is_named_in_the_parts_message():
    nb = notebook("import math\nimport torch", "%store -r ELEMENT_SIZE", NBYTES)
    msg = grade(nb, "00", ["small"])["small"].message
    assert "ELEMENT_SIZE appears in code cell 2, line 1 (`%store -r ELEMENT_SIZE`), which the grader did not run" in msg
    assert WHY_MAGIC in msg


def test_timed_cells_run_as_python():
    nb = notebook("import math\nimport torch", "%%time\n" + ELEMENT_SIZE, NBYTES,
                  "%time SIZES = dict(ELEMENT_SIZE)\ndef new_bytes(fn, x):\n    return SIZES[x.dtype] * 0")
    rb = rebuild(nb)
    assert rb.dropped == [] and rb.namespace["SIZES"] == rb.namespace["ELEMENT_SIZE"]


def test_a_cell_that_does_not_parse_is_named_in_the_parts_message():
    nb = notebook("import math\nimport torch", ELEMENT_SIZE + "\nprint(ELEMENT_SIZE[torch.float32)", NBYTES)
    msg = grade(nb, "00", ["edge"])["edge"].message
    assert "ELEMENT_SIZE appears in code cell 2, line 1 (`ELEMENT_SIZE = {dt: torch.empty" in msg
    assert "the cell does not parse (" in msg and "line 2), so none of it was run" in msg


def test_an_attribute_set_by_a_statement_not_run_is_named():
    # the graded function imports the module itself: the grader does not see that it reads
    # course_utils.ELEMENT_SIZE, so the top-level assignment is not run for it
    nb = notebook("import math\nimport torch\nimport course_utils", "course_utils.ELEMENT_SIZE = "
                  + ELEMENT_SIZE.split(" = ", 1)[1] + "\nprint('sizes set')",
                  "def tensor_nbytes(shape, dtype):\n    import course_utils\n"
                  "    return math.prod(shape) * course_utils.ELEMENT_SIZE[dtype]")
    ex = exercise("00")
    rb = rebuild(nb, graded=ex.names)
    objects = graded_objects(rb, ex.names)
    msg = ex.judge("float", roundtrip(ex.observe("float", objects, SEED)), SEED).message
    assert "AttributeError" in msg and "course_utils.ELEMENT_SIZE is set by code cell 2, line 1" in msg


# -- end to end: one submission through the real grader (make test-sweep, not CI: CI's CPU, .ci/run) -
@pytest.mark.sweep
@pytest.mark.grader
@pytest.mark.timeout(900)
def test_one_submission_through_the_grader(tmp_path):
    """Exercise 07's solution with checkpoint imported with a fallback and best_segments under
    @functools.lru_cache: full marks (the old rebuild gave 2/7)."""
    from course_utils.grading.grade import Options, grade_many

    nb = nbformat.read(next((ROOT / "solutions").glob("07_*.ipynb")), as_version=4)
    imports = nb.cells[next(i for i, c in enumerate(nb.cells) if "import checkpoint" in c.source)]
    imports.source = imports.source.replace(
        "from torch.utils.checkpoint import checkpoint\n",
        "try:\n    from torch.utils.checkpoint import checkpoint\nexcept ImportError:\n    checkpoint = None\n")
    segments = next(c for c in nb.cells if "def best_segments(" in c.source)
    segments.source = "import functools\n\n@functools.lru_cache(maxsize=None)\n" + segments.source
    nbformat.write(nb, tmp_path / "07_honest.ipynb")
    [r] = grade_many([str(tmp_path)], Options(cell_timeout=120), progress=False)
    assert (r.score, r.max_score) == (exercise("07").max_score, exercise("07").max_score), r.parts
