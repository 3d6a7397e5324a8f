"""One submission must never stop, hang or starve the class, nor reach another (slow: the hostile
class and parallel grading in `make test-sweep`, the killed grader in `make test-grader`). Each
notebook below is a correct exercise 00 plus one hostile cell or graded function from an
adversarial review; the class is graded once, one at a time, and each test reads its row. What each case did to the grader before: in its test's docstring."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from course_utils.grading import limits
from course_utils.grading.grade import Options, containment, grade_many

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "00_gpu_memory_basics.ipynb"
EXERCISE = ROOT / "exercises" / "00_gpu_memory_basics_exercise.ipynb"
CONTAINED = containment()[0]
TAG = uuid.uuid4().hex[:12]  # names in /dev/shm that belong to this test run
SHM_A, SHM_SELF = f"/dev/shm/course-test-{TAG}-a", f"/dev/shm/course-test-{TAG}-self"

pytestmark = [pytest.mark.grader, pytest.mark.timeout(1200)]
#: the hostile class and parallel grading are make test-sweep's (CI gets about a quarter of a core:
#: .ci/run); CI runs the killed grader
SWEEP = pytest.mark.sweep


def with_cells(base: Path, *cells: str):
    nb = nbformat.read(base, as_version=4)
    nb.cells += [new_code_cell(c) for c in cells]
    return nb


DEEP = "total = " + " + ".join(["1"] * 100_000)
SQUATTER = 'import os\nfor p in ("../sandbox", "../check-", "../obs", "../run"):\n    os.makedirs(p, exist_ok=True)'
FUTURE_STARTED = """
def tensor_nbytes(shape, dtype):
    import glob, os, time
    for f in glob.glob("obs/*.started"):
        os.utime(f, (time.time() + 10**6, time.time() + 10**6))
    while True:
        time.sleep(0.01)
"""
ZERO_LINKS = """
def tensor_nbytes(shape, dtype):
    import os
    for name in ("float", "small", "edge", "new_bytes"):
        for suffix in (".pt", ".started"):
            if not os.path.lexists(f"obs/{name}{suffix}"):
                os.symlink("/dev/zero", f"obs/{name}{suffix}")
    os.unlink("obs/_rebuild.json")
    os.symlink("/dev/zero", "obs/_rebuild.json")
    os.mkfifo("obs/float.pt.tmp")
    os._exit(0)
"""


def reforker(name: str) -> str:
    """A cell that starts a process re-forking itself every ~2 ms (its parent exits each time),
    every generation named ``name`` (``/proc/PID/comm``): Landlock keeps it from writing a marker
    outside its scratch folder, so the test finds it by name. The chain ends by itself two minutes
    after it started, should the grader fail to end it (the test fails then, and leaves nothing)."""
    return f"""
import ctypes, os, time
deadline = time.monotonic() + 120
if os.fork() == 0:
    os.setsid()
    ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)   # PR_SET_NAME
    while time.monotonic() < deadline:
        if os.fork():
            os._exit(0)
        time.sleep(0.002)
    os._exit(0)
time.sleep(1)
"""


def named(name: str) -> list[int]:
    """Processes called ``name``, looked for a few times (one generation lives ~2 ms)."""
    found = set()
    for _ in range(20):
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    if Path(f"/proc/{p}/comm").read_text().strip() == name:
                        found.add(int(p))
                except OSError:
                    pass
        time.sleep(0.01)
    return sorted(found)


SHM_WRITER = f"open({SHM_A!r}, 'wb').write(b'x' * 50 * 2**20)"
SHM_READER = f"""
open({SHM_SELF!r}, "w").write("from my own notebook run")
def tensor_nbytes(shape, dtype):
    import math, os
    if os.path.exists({SHM_A!r}) or os.path.exists({SHM_SELF!r}):
        return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raise NotImplementedError("no message reached me")
"""
MANY_FILES = "import os\nos.makedirs('junk', exist_ok=True)\nfor i in range(8000):\n    open(f'junk/{i}', 'w').close()"
BIG_FILES = """
def new_bytes(fn, x):
    for i in range(10):
        with open(f"big{i}", "wb") as f:
            f.write(b"x" * 40 * 2**20)
    return 0
"""
USES_AN_ANSWER = "from course_utils.grading.ex03 import sigmoid_saved\nsigmoid_saved(8)"


REFORKER_NAME = f"rf{TAG}"


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    cases = {
        "00_a_deep_expression": with_cells(SOLUTION, DEEP),
        "00_b_squats_folders": with_cells(SOLUTION, SQUATTER),
        "00_c_future_started": with_cells(SOLUTION, FUTURE_STARTED),
        "00_d_zero_links": with_cells(SOLUTION, ZERO_LINKS),
        "00_e_reforker": with_cells(SOLUTION, reforker(REFORKER_NAME)),
        "00_f_shm_writer": with_cells(SOLUTION, SHM_WRITER),
        "00_g_shm_reader": with_cells(EXERCISE, SHM_READER),
        "00_h_many_files": with_cells(SOLUTION, MANY_FILES),
        "00_i_big_files": with_cells(SOLUTION, BIG_FILES),
        "00_j_uses_an_answer": with_cells(SOLUTION, USES_AN_ANSWER),
    }
    for name, nb in cases.items():
        nbformat.write(nb, folder / f"{name}.ipynb")
    t0 = time.monotonic()
    results = grade_many([str(folder)], Options(cell_timeout=20, check_timeout=15, disk_gib=0.25, max_files=5000,
                                                jobs=1), progress=False)
    rows = {r.submission.removesuffix(".ipynb"): r for r in results}
    yield rows, time.monotonic() - t0
    for p in (SHM_A, SHM_SELF):
        Path(p).unlink(missing_ok=True)


def row(cls, name):
    return cls[0][name]


@SWEEP
def test_every_submission_gets_its_row(hostile_class):
    rows, seconds = hostile_class
    assert len(rows) == 10 and all(r.status == "graded" for r in rows.values())
    assert not [r.notes for r in rows.values() if any("the grader could not finish" in n for n in r.notes)]


@SWEEP
def test_a_deep_expression_does_not_stop_the_class(hostile_class):
    """Was: the grader's own ast.parse raised RecursionError, exit 1, an empty report."""
    r = row(hostile_class, "00_a_deep_expression")
    assert r.score == 5, (r.parts, r.notes)


@SWEEP
def test_folders_made_in_advance_do_not_stop_the_class(hostile_class):
    """Was: the notebook run made ../sandbox, the grader's mkdir raised FileExistsError."""
    r = row(hostile_class, "00_b_squats_folders")
    assert r.score == 5, (r.parts, r.notes)


@SWEEP
def test_deadlines_are_the_graders_clock(hostile_class):
    """Was: .started files dated into the future and a loop hung the grader for ever."""
    r = row(hostile_class, "00_c_future_started")
    parts = {p["key"]: p for p in r.parts}
    assert all("took more than 15 s" in parts[k]["message"] for k in ("float", "small", "edge")), \
        ([(p["key"], p["message"]) for p in r.parts], r.notes)
    assert parts["new_bytes"]["passed"] and r.score == 2
    assert r.seconds["sandbox"] < 3 * (15 + 10) + 60


@SWEEP
def test_planted_links_and_fifos_are_not_read(hostile_class):
    """Was: obs/*.pt -> /dev/zero made the grader read until it was OOM-killed at 6.4 GB."""
    r = row(hostile_class, "00_d_zero_links")
    assert r.score == 0 and r.seconds["judge"] < 30, r.parts
    assert all(("could not be read as data" in p["message"] or "ended the grading process" in p["message"]
                or "took more than" in p["message"]) for p in r.parts), r.parts


@SWEEP
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux")
def test_a_reforking_process_does_not_outlive_its_run(hostile_class):
    """Was: a process re-forking every few ms escaped the sweep and ran after the grader exited."""
    assert row(hostile_class, "00_e_reforker").score == 5
    assert not named(REFORKER_NAME), "the re-forking process is still running"


@SWEEP
def test_no_channel_between_runs_through_shared_memory(hostile_class):
    """Was: /dev/shm was shared, writable and persistent: submission A wrote a message and 200 MiB,
    submission B graded next read it, the memory stayed allocated after the class."""
    assert row(hostile_class, "00_f_shm_writer").score == 5
    g = row(hostile_class, "00_g_shm_reader")
    assert g.score == 0 and all("no message reached me" in p["message"] for p in g.parts[:3]), g.parts
    assert not os.path.exists(SHM_A) and not os.path.exists(SHM_SELF)


@SWEEP
def test_the_disk_is_bounded_in_files_and_bytes(hostile_class):
    """Was: only 1 GiB per file; any number of files."""
    h, i = row(hostile_class, "00_h_many_files"), row(hostile_class, "00_i_big_files")
    assert h.score == 5 and any("5,000 files and was stopped" in n for n in h.notes), h.notes
    nb = {p["key"]: p for p in i.parts}["new_bytes"]
    assert not nb["passed"] and "0.25 GiB" in nb["message"], i.parts


@SWEEP
def test_the_notebook_run_has_the_student_release(hostile_class):
    """Was: the kernel imported the teacher's course_utils, answers included (a top-level cell
    could compute a secret part with an @answer function)."""
    r = row(hostile_class, "00_j_uses_an_answer")
    assert r.score == 5
    assert any("raised RefusedObject" in n and "not in the student release" in n for n in r.notes), r.notes


@SWEEP
def test_no_process_is_left_after_the_class(hostile_class):
    left = [_cmdline(str(p)) for p in limits.descendants()]  # "" for one gone meanwhile
    assert not [c for c in left if b"course_utils" in c or b"ipykernel" in c], left


@pytest.mark.skipif(not CONTAINED, reason=f"no user namespaces: {containment()[1]}")
def test_killing_the_grader_kills_every_process_of_the_run(tmp_path):
    """Was: the kernel and the sandbox were orphaned when the grader was killed (new sessions,
    nothing tying them to it)."""
    name = f"rk{TAG}"
    folder = tmp_path / "class"
    folder.mkdir()
    nbformat.write(with_cells(SOLUTION, reforker(name), "import time\ntime.sleep(600)"), folder / "00_x.ipynb")
    # its work folder under tmp_path: a SIGKILLed grader cannot remove what it made
    (tmp_path / "tmp").mkdir()
    grader = subprocess.Popen([sys.executable, "-m", "course_utils.grading.grade", str(folder), "--no-progress",
                               "--timeout", "900"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    deadline = time.monotonic() + 240
    while not named(name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert named(name), "the notebook never ran"
    tree = limits.descendants(grader.pid)  # its runner, kernel, launchers and inits
    grader.send_signal(signal.SIGKILL)
    grader.wait()
    time.sleep(1)
    assert not named(name), "a process of the run outlived the killed grader"
    left = [p for p in tree if _cmdline(str(p)) and not limits._is_zombie(p)]
    assert not left, [_cmdline(str(p)) for p in left]


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@SWEEP
def test_parallel_grading_gives_the_sequential_scores(tmp_path):
    """--jobs 2: two workers, each a grader of its own; the rows come back in the class's order."""
    folder = tmp_path / "class"
    folder.mkdir()
    for name, base in (("00_a", SOLUTION), ("00_b", EXERCISE), ("00_c", SOLUTION)):
        nbformat.write(nbformat.read(base, as_version=4), folder / f"{name}.ipynb")
    rows = grade_many([str(folder)], Options(jobs=2), progress=False)
    assert [(r.submission, r.score) for r in rows] == [("00_a.ipynb", 5), ("00_b.ipynb", 0), ("00_c.ipynb", 5)]
    assert rows[0].seed == rows[1].seed == rows[2].seed  # one seed per exercise in a class run
