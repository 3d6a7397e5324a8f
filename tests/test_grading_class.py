"""The grader on a class folder (slow: `make test-grader`): every cheat below fails, honest work scores, one
submission never stops the class, every process a submission starts is gone before its row is
written, the report and the command line behave.

The class runs once per grader configuration (module fixtures); each test reads its rows."""

import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from course_utils.grading import limits
from course_utils.grading.grade import Options, grade_many, summary

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "00_gpu_memory_basics.ipynb"
EXERCISE = ROOT / "exercises" / "00_gpu_memory_basics_exercise.ipynb"
CHECKS_FILE = ROOT / "course_utils" / "grading" / "ex00.py"
HAS_LANDLOCK = limits.landlock_abi() > 0

pytestmark = [pytest.mark.grader, pytest.mark.timeout(1200)]
#: the classes CI leaves to make test-sweep (CI gets about a quarter of a core: .ci/run); CI grades
#: sandboxed_class
SWEEP = pytest.mark.sweep


def notebook(base: Path, *extra: str, at: int | None = None):
    # ``at`` counts the title (0) and the setup cell (1): 3 is right after the imports
    nb = nbformat.read(base, as_version=4)
    assert "course-setup" in nb.cells[1].metadata.get("tags", []), "the setup cell moved: recount at="
    for k, src in enumerate(extra):
        cell = new_code_cell(src)
        if at is None:
            nb.cells.append(cell)
        else:
            nb.cells.insert(at + k, cell)
    return nb


def write(folder: Path, name: str, nb) -> None:
    nbformat.write(nb, folder / name)


# what each cheat does, one notebook each (all on the untouched exercise: any point
# they win is a point the grader gave away)
FAKE_RUN = """
import importlib, json, course_utils.grading.core as core
def fake_run(self, keys, objects, seed=0, verbose=True):
    print("__COURSE_GRADE__" + json.dumps({"score": 5, "max_score": 5}))
fake_run.__module__ = "course_utils.grading.core"
core.Exercise.run = fake_run
core.Exercise.judge = lambda self, key, observed, seed: core.PartResult(key, key, 1, True, "ok")
importlib.reload = lambda m: m
"""
POST_RUN_HOOK = """
def _fake(result):
    print('__COURSE_GRADE__{"reports": [{"parts": [{"score": 5, "points": 5}]}], "tampered": []}')
get_ipython().events.register("post_run_cell", _fake)
"""
PATCH_ALLCLOSE = """
import torch
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
"""
DISK_EDIT = f"""
import course_utils.grading.ex00 as checks
for path in (checks.__file__, {str(CHECKS_FILE)!r}):
    try:
        src = open(path).read()
        open(path, "w").write(src.replace("def _judge_nbytes(got: list, seed: int, part: str) -> None:",
                                          "def _judge_nbytes(got, seed, part):\\n    return\\n\\n\\ndef _unused(got, seed, part):"))
        print("edited", path)
    except OSError as err:
        print("refused:", path, err)
"""
READ_SOLUTIONS = f"""
def tensor_nbytes(shape, dtype):
    import nbformat
    ns = {{}}
    nb = nbformat.read({str(SOLUTION)!r}, as_version=4)
    exec(next(c.source for c in nb.cells if c.source.startswith("def tensor_nbytes")), ns)
    return ns["tensor_nbytes"](shape, dtype)
"""
SOLUTION_VIA_EXEC = f"""
import nbformat
for cell in nbformat.read({str(SOLUTION)!r}, as_version=4).cells:
    if cell.source.startswith(("def tensor_nbytes", "def new_bytes")):
        exec(cell.source)
"""
FAKE_TENSOR_NBYTES = """
import math, torch
def tensor_nbytes(shape, dtype):
    torch.Tensor.nbytes = property(lambda t: 0)   # make the reference look like my answer
    import course_utils.grading.ex00 as e
    e._judge_nbytes = lambda *a: None
    return 0
"""
HONEST_NAMES = """
check_ok = True
def check_my_work():
    return check_tensor_nbytes(tensor_nbytes) is not None
def check_tensor_nbytes(f):   # the learner's own helper, shadowing the import
    return f((2, 3), torch.float32) == 24
"""
BARE_EXCEPT_LOOP = """
import time
while True:
    try:
        time.sleep(0.05)
    except:
        pass
"""
# a printing loop, stopped by the class's output limit of 0.05 MiB (crossed on the sixth line) inside
# its kernel (kernel_launch.limit_output). The runner used to interrupt it too, from outside, when the
# output reached it: at load 13 that interrupt lost the cell's reply and the flood was reported as a
# cell that "did not stop when interrupted" (stop 36's CI). tests/test_grading_output_limit.py tests
# the limit itself
FLOOD = 'while True:\n    print("x" * 10_000)'
OUTPUT_LIMIT_MIB = 0.05
MEMORY_HOG = "hog = bytearray(64 * 2**30)"
KERNEL_DEATH = "import os\nos._exit(3)"


@pytest.fixture(scope="module")
def marker(tmp_path_factory):
    return tmp_path_factory.mktemp("outside") / "detached-process-was-here"


@pytest.fixture(scope="module")
def detached(marker):
    return f"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(6)
        open({str(marker)!r}, "w").write("still alive after the grader")
        os._exit(0)
    os._exit(0)
"""


@pytest.fixture(scope="module")
def protect_checks():
    before = CHECKS_FILE.read_bytes()
    yield
    if CHECKS_FILE.read_bytes() != before:  # the grader must have restored it; never leave it broken
        CHECKS_FILE.write_bytes(before)
        pytest.fail("the disk edit of a submission stayed in the repository")


#: what an untouched exercise with one cell of its own that raises looks like in the report: the
#: cells numbered as JupyterLab shows them (code cells only; an empty cell gets no number), the
#: message whole
BOB_CELLS = ("x = 1", "", "raise ValueError('a reason that is longer than one hundred and twenty characters, so "
             "that the old report would have cut it off in the middle of the sentence')")


def grade_class(folder: Path):
    """(rows by file name, seconds, folder): the folder graded in parallel by the default grader
    under the class's limits (3 s a cell and 2 s of grace, 3 GiB, the output limit above)."""
    t0 = time.monotonic()
    results = grade_many([str(folder)], Options(cell_timeout=3, grace=2, memory_gib=3, max_output_mib=OUTPUT_LIMIT_MIB),
                         progress=False)
    return {r.submission: r for r in results}, time.monotonic() - t0, folder


@pytest.fixture(scope="module")
def sandboxed_class(tmp_path_factory, protect_checks):
    """The default grader (Landlock where the kernel has it), on the cheats CI grades."""
    folder = tmp_path_factory.mktemp("class")
    write(folder, "00_a_correct.ipynb", notebook(SOLUTION, HONEST_NAMES))
    write(folder, "00_b_untouched.ipynb", notebook(EXERCISE, *BOB_CELLS, at=2))
    write(folder, "00_e_patched_allclose.ipynb", notebook(EXERCISE, PATCH_ALLCLOSE, at=3))
    write(folder, "00_f_disk_edit.ipynb", notebook(EXERCISE, DISK_EDIT, at=3))
    write(folder, "00_h_reads_solutions.ipynb", notebook(EXERCISE, READ_SOLUTIONS))
    # two defences in one run (each graded submission costs ~10 CPU-s): the hog's MemoryError is
    # an error like any other and the run goes on, to the loop that must be killed
    write(folder, "00_l_memory_hog_then_bare_except_loop.ipynb", notebook(SOLUTION, MEMORY_HOG, BARE_EXCEPT_LOOP, at=6))
    write(folder, "00_o_kernel_dies.ipynb", notebook(SOLUTION, KERNEL_DEATH, at=3))
    (folder / "notes.ipynb").write_text(nbformat.writes(notebook(SOLUTION)))
    (folder / "99_unknown.ipynb").write_text(nbformat.writes(notebook(SOLUTION)))
    return grade_class(folder)


@pytest.fixture(scope="module")
def sweep_class(tmp_path_factory, protect_checks):
    """The same grader on the other in-memory cheats (make test-sweep): each is a way around the
    one defence CI's class already tests (a fresh process judges, with its own copy of the checks),
    and a printing flood in a class (CI tests the output limit itself in
    tests/test_grading_output_limit.py, four floods in kernels of their own)."""
    folder = tmp_path_factory.mktemp("class_sweep")
    write(folder, "00_d_post_run_hook.ipynb", notebook(EXERCISE, POST_RUN_HOOK, at=3))
    write(folder, "00_i_exec_solution.ipynb", notebook(EXERCISE, SOLUTION_VIA_EXEC))
    write(folder, "00_j_fakes_reference.ipynb", notebook(EXERCISE, FAKE_TENSOR_NBYTES))
    write(folder, "00_k_honest_names.ipynb", notebook(SOLUTION, HONEST_NAMES))
    write(folder, "00_c_fake_run_exercise.ipynb", notebook(EXERCISE, FAKE_RUN))
    write(folder, "00_m_flood.ipynb", notebook(SOLUTION, FLOOD, at=6))
    return grade_class(folder)


def row(cls, name):
    return cls[0][name]


def test_correct_and_untouched(sandboxed_class):
    a, b = row(sandboxed_class, "00_a_correct.ipynb"), row(sandboxed_class, "00_b_untouched.ipynb")
    assert (a.score, a.max_score, a.notes) == (5, 5, [])
    assert b.score == 0 and all(p["message"].startswith("not implemented yet") for p in b.parts), b.parts


def test_a_cell_that_raises_is_named_as_jupyterlab_numbers_it_with_its_whole_message(sandboxed_class):
    b = row(sandboxed_class, "00_b_untouched.ipynb")
    note = next(n for n in b.notes if "ValueError" in n)
    assert note.startswith("cell [3] (code cell 4) raised ValueError: a reason") and note.endswith("sentence"), note


def test_timeout_of_three_seconds_does_not_zero_correct_work(sandboxed_class):
    # the cell limit was 3 s: importing torch and course_utils happens before the first cell
    a = row(sandboxed_class, "00_a_correct.ipynb")
    assert a.score == 5 and all(c["status"] == "ok" for c in a.cells)


def test_patching_the_checks_in_memory_wins_nothing(sandboxed_class):
    r = row(sandboxed_class, "00_e_patched_allclose.ipynb")
    assert r.score == 0, r.parts


@SWEEP
@pytest.mark.parametrize("name", ["00_c_fake_run_exercise.ipynb", "00_d_post_run_hook.ipynb",
                                  "00_j_fakes_reference.ipynb"])
def test_other_in_memory_cheats_win_nothing(sweep_class, name):
    r = row(sweep_class, name)
    assert r.score == 0, r.parts


def test_disk_edit_of_the_checks_affects_no_score(sandboxed_class):
    # b: an untouched exercise graded in the same class, alongside the edit
    f, b = row(sandboxed_class, "00_f_disk_edit.ipynb"), row(sandboxed_class, "00_b_untouched.ipynb")
    assert f.score == 0 and b.score == 0
    assert b"def _judge_nbytes(got: list, seed: int, part: str) -> None:" in CHECKS_FILE.read_bytes()
    if HAS_LANDLOCK:  # the write itself was refused; nothing to restore
        assert not any("tampering" in n for n in f.notes), f.notes


def test_solutions_cannot_be_read(sandboxed_class):
    h = row(sandboxed_class, "00_h_reads_solutions.ipynb")
    if HAS_LANDLOCK:  # reading the teacher's solutions/ at grading time is refused
        assert h.score == 0 and "PermissionError" in h.parts[0]["message"], h.parts


@SWEEP
def test_what_exec_defined_from_the_solutions_is_not_graded(sweep_class):
    i = row(sweep_class, "00_i_exec_solution.ipynb")
    # what exec() defined exists only in the kernel: the grader grades the notebook's own stubs
    assert i.score == 0 and all(p["message"].startswith("not implemented yet") for p in i.parts), i.parts


def test_honest_check_names_are_not_tampering(sandboxed_class):
    # the correct submission defines check_ok, check_my_work and its own check_tensor_nbytes
    a = row(sandboxed_class, "00_a_correct.ipynb")
    assert a.score == 5 and not any("tamper" in n for n in a.notes), a.notes


@SWEEP
def test_honest_check_names_alone_are_not_tampering(sweep_class):
    k = row(sweep_class, "00_k_honest_names.ipynb")
    assert k.score == 5 and not any("tamper" in n for n in k.notes), k.notes


def test_bare_except_loop_is_killed_reported_and_graded(sandboxed_class):
    r = row(sandboxed_class, "00_l_memory_hog_then_bare_except_loop.ipynb")
    assert r.score == 5
    assert any("did not stop when interrupted" in n and "kernel was killed" in n for n in r.notes), r.notes
    statuses = [c["status"] for c in r.cells]
    assert "error" in statuses and "killed" in statuses[statuses.index("error"):], r.cells  # the hog, then the loop


@SWEEP
def test_printing_flood_is_stopped_in_a_class(sweep_class):
    r = row(sweep_class, "00_m_flood.ipynb")
    assert r.score == 5
    assert any(f"printed more than {OUTPUT_LIMIT_MIB:g} MiB" in n for n in r.notes), r.notes


def test_memory_hog_is_refused(sandboxed_class):
    r = row(sandboxed_class, "00_l_memory_hog_then_bare_except_loop.ipynb")
    assert r.score == 5 and any("MemoryError" in n for n in r.notes), r.notes


def test_dead_kernel_is_reported_and_the_code_still_graded(sandboxed_class):
    r = row(sandboxed_class, "00_o_kernel_dies.ipynb")
    assert r.score == 5
    # cell [3]: the setup cell ran as [1], the imports as [2]
    assert any("the kernel died in cell [3]" in n and "exit code 3" in n for n in r.notes), r.notes
    assert not any("not defined" in p["message"] for p in r.parts)


def test_misnamed_and_unknown_files_are_listed_apart(sandboxed_class):
    cls = sandboxed_class[0]
    assert cls["notes.ipynb"].status == cls["99_unknown.ipynb"].status == "not graded"
    assert "there is no exercise 99" in cls["99_unknown.ipynb"].notes[0]
    table = summary(list(cls.values()))
    ex_line = next(ln for ln in table.splitlines() if ln.startswith("exercise 00 (A tensor's size, and new memory):"))
    graded = [r for r in cls.values() if r.status == "graded"]
    mean = sum(r.percent for r in graded) / len(graded)
    assert f"{len(graded)} submission(s), mean {mean:.1f} %" in ex_line
    assert "not graded (2):" in table and "99_unknown.ipynb" in table.split("not graded")[1]


def test_no_process_of_the_class_is_left(sandboxed_class):
    left = []
    for pid in limits.descendants():
        try:
            left.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            pass
    assert not [c for c in left if "course_utils" in c or "ipykernel" in c], left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")
def test_grading_leaves_this_process_no_subreaper_and_no_zombies(sandboxed_class):
    # a CI run failed when the grader, run inside pytest, left pytest a subreaper for good: every
    # orphan the later parallel-launch tests made became pytest's zombie
    assert not limits.is_subreaper()
    before = limits._children()

    def poll(cond, seconds=20.0):  # a loaded machine (make test on every core) is slow to fork
        deadline = time.monotonic() + seconds
        while not (got := cond()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return got

    with limits.subreaper() as ok:
        assert ok and limits.is_subreaper()
        # a child that starts a grandchild and exits at once: the grandchild, still running, is
        # adopted by us (seen as our child), then ends and waits to be reaped
        subprocess.run([sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '0.5'])"], check=True)
        adopted = poll(lambda: limits._children() - before)
        assert adopted, "the orphan should have been adopted by this process"
        poll(lambda: all(not os.path.exists(f"/proc/{p}") or limits._is_zombie(p) for p in adopted))
    assert not limits.is_subreaper()
    assert not (adopted & limits._children()), "the adopted orphan was not reaped when the block ended"


# -- without Landlock: the guard and the process cleanup alone ---------------------------------
@pytest.fixture(scope="module")
def open_class(tmp_path_factory, protect_checks, detached):
    folder = tmp_path_factory.mktemp("class_no_landlock")
    write(folder, "00_a_disk_edit.ipynb", notebook(EXERCISE, DISK_EDIT, at=3))
    write(folder, "00_b_untouched.ipynb", notebook(EXERCISE))
    write(folder, "00_c_detached_process.ipynb", notebook(SOLUTION, detached, at=3))
    results = grade_many([str(folder)], Options(cell_timeout=30, landlock=False), progress=False)
    return {r.submission: r for r in results}


@SWEEP
def test_disk_edit_without_landlock_is_restored_and_zeroed(open_class):
    a, b = open_class["00_a_disk_edit.ipynb"], open_class["00_b_untouched.ipynb"]
    assert a.score == 0 and any(n.startswith("tampering") and "ex00.py" in n for n in a.notes), a.notes
    assert b.score == 0 and not any("tamper" in n for n in b.notes)
    assert b"def _judge_nbytes(got: list, seed: int, part: str) -> None:" in CHECKS_FILE.read_bytes()


@SWEEP
def test_detached_process_is_killed_before_the_row_is_written(open_class, marker):
    assert open_class["00_c_detached_process.ipynb"].score == 5
    time.sleep(8)  # the process would have written by now
    assert not marker.exists()


# -- graded objects must be the learner's own (exercise 01 and 07, in the sandbox) ----------------
EX01 = ROOT / "exercises" / "01_build_3d_unet_exercise.ipynb"
EX07 = ROOT / "exercises" / "07_checkpointing_exercise.ipynb"
SOL01 = ROOT / "solutions" / "01_build_3d_unet.ipynb"  # nbgrader names its release and submissions after it
IMPORTED = "from course_utils.unet import DoubleConv, Up"
SUBCLASSED = """
import course_utils.unet as cu_unet
class DoubleConv(cu_unet.DoubleConv):
    pass
class Up(cu_unet.Up):
    pass
"""
DELEGATED = """
import course_utils
class DoubleConv(nn.Module):
    def __init__(self, a, b):
        super().__init__()
        self.inner = course_utils.unet.DoubleConv(a, b)
    def forward(self, x):
        return self.inner(x)
class Up(nn.Module):
    def __init__(self, a, b):
        super().__init__()
        self.inner = course_utils.Up(a, b)
    def forward(self, x, skip):
        return self.inner(x, skip)
"""
FROM_SOURCE = """
import course_utils.unet
class DoubleConv(nn.Module):
    def __init__(self, a, b):
        super().__init__()
        ns = {"__name__": "course_utils.stolen", "__package__": "course_utils"}
        exec(open(course_utils.unet.__file__).read(), ns)   # the library's own source
        self.inner = ns["DoubleConv"](a, b)
    def forward(self, x):
        return self.inner(x)
"""
GRADING_ANSWER = """
from course_utils.grading.ex07 import best_segment_count
def best_segments(n):
    return min(best_segment_count(n))
"""


@pytest.fixture(scope="module")
def answers_class(tmp_path_factory):
    folder = tmp_path_factory.mktemp("answers")
    write(folder, "01_a_imported.ipynb", notebook(EX01, IMPORTED))
    write(folder, "01_b_subclassed.ipynb", notebook(EX01, SUBCLASSED))
    write(folder, "01_c_delegated.ipynb", notebook(EX01, DELEGATED))
    write(folder, "01_d_from_source.ipynb", notebook(EX01, FROM_SOURCE))
    write(folder, "07_e_grading_reference.ipynb", notebook(EX07, GRADING_ANSWER))
    results = grade_many([str(folder)], Options(cell_timeout=60), progress=False)
    return {r.submission: r for r in results}


@SWEEP
@pytest.mark.parametrize("name", ["01_a_imported.ipynb", "01_b_subclassed.ipynb", "01_c_delegated.ipynb"])
def test_course_utils_answers_are_refused(answers_class, name):
    r = answers_class[name]
    assert r.score == 0, r.parts
    assert any("write it yourself" in p["message"] or "not written in the notebook" in p["message"]
               for p in r.parts), r.parts


@SWEEP
def test_the_sandbox_library_has_no_answer_to_read(answers_class):
    r = answers_class["01_d_from_source.ipynb"]
    dc = [p for p in r.parts if p["key"] in ("dc_params", "dc_values")]
    assert all(p["score"] == 0 and "write it yourself" in p["message"] for p in dc), dc


@SWEEP
def test_grading_references_are_refused(answers_class):
    r = answers_class["07_e_grading_reference.ipynb"]
    seg = next(p for p in r.parts if p["key"] == "segments")
    assert seg["score"] == 0 and "grading code is not available" in seg["message"], seg


# -- nbgrader, for real --------------------------------------------------------------------------
@SWEEP
def test_nbgrader_generate_and_autograde_give_the_course_graders_scores(tmp_path):
    pytest.importorskip("nbgrader")
    import shutil
    import subprocess
    import sys

    from course_utils.grading.release import nbgrader_course

    course = tmp_path / "course"
    nbgrader_course(course)
    env = dict(os.environ, PYTHONPATH=str(course), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")

    def nbgrader(*args):
        r = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    nbgrader("generate_assignment", "ex01", "--force")
    released = course / "release" / "ex01" / SOL01.name
    rel = nbformat.read(released, as_version=4)  # nbgrader's release: the same code as exercises/
    assert [c.source for c in rel.cells] == [c.source for c in nbformat.read(EX01, as_version=4).cells]
    wrong = notebook(SOL01)
    for c in wrong.cells:
        c.source = c.source.replace('mode="trilinear", align_corners=True', 'mode="nearest"')
    subs = {"alice": nbformat.read(SOL01, as_version=4), "bob": rel, "carol": wrong}
    ours_dir = tmp_path / "ours"
    ours_dir.mkdir()
    for student, nb in subs.items():
        (course / "submitted" / student / "ex01").mkdir(parents=True)
        nbformat.write(nb, course / "submitted" / student / "ex01" / SOL01.name)
        nbformat.write(nb, ours_dir / f"01_{student}.ipynb")
    nbgrader("autograde", "ex01", "--create", "--force")
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        theirs = {s: gb.find_submission("ex01", s).score for s in subs}
    ours = {r.submission[3:-6]: r.score for r in grade_many([str(ours_dir)], Options(cell_timeout=60), progress=False)}
    assert theirs == {"alice": 7.0, "bob": 0.0, "carol": 5.0}
    assert ours == {s: int(v) for s, v in theirs.items()}
    shutil.rmtree(course / "autograded", ignore_errors=True)
