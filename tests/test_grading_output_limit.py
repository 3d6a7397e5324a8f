"""The grader's output limit, on the runner and its kernel alone (no exercise, no sandbox): a flood
is stopped inside the kernel, at the limit, whatever form it takes, and nothing is sent to the
kernel from outside after the cell that flooded has ended.

Before: the runner sent SIGINT when the flood's output reached it. That came after the kernel had
already stopped the loop: in the next cell, or in ipykernel's code that sends the cell's reply,
where the reply was lost and the runner waited until the cell's time limit killed the kernel (CI's
class, at load 13 on two cores: the flood reported as "did not stop when interrupted"). One
``print`` bigger than the limit was sent whole, and a ``display()`` loop was stopped only by that
interrupt."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from course_utils.grading.kernel_launch import write_kernel_spec
from course_utils.grading.runner import OUTPUT_NOTICE, output_size

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 50_000  # characters, as the runner counts them
#: the most the runner may see: the limit, then the kernel's notice that it stopped sending
MOST = LIMIT + len(OUTPUT_NOTICE.format(mib=LIMIT / 2**20))
pytestmark = [pytest.mark.grader, pytest.mark.timeout(900)]

CAUGHT_FLOOD = """
import time
try:
    while True:
        print("x" * 10_000)
except KeyboardInterrupt as err:
    stopped_by = type(err).__name__
time.sleep(2)  # an interrupt sent from outside once the flood's output arrives lands here
survived = True
"""
NOTEBOOKS = {
    # the flood caught by the learner: the kernel stopped it, nothing else interrupts the cell
    "caught": [CAUGHT_FLOOD, "assert survived and stopped_by == 'OutputLimitExceeded'\nprint('dropped')"],
    "one_print": ['print("y" * 5_000_000)', "after = 1"],
    "display_loop": ['from IPython.display import HTML, display\nwhile True:\n    display(HTML("z" * 10_000))'],
    "result": ['"r" * 1_000_000', "after = 1"],
}


def run_notebook(folder: Path, cells: list[str], timeout: float = 60) -> dict:
    """The runner's report on ``cells``, in the grader's kernel with the output limit (no sandbox)."""
    work = folder / "work"
    work.mkdir(parents=True)
    nbformat.write(new_notebook(cells=[new_code_cell(c) for c in cells]), work / "nb.ipynb")
    write_kernel_spec(folder, {"scratch": str(folder), "landlock": False, "max_output": LIMIT})
    spec = {"notebook": str(work / "nb.ipynb"), "workdir": str(work), "scratch": str(folder),
            "cell_timeout": timeout, "grace": 5, "max_output": LIMIT, "startup_timeout": 300}
    (folder / "runner.json").write_text(json.dumps(spec))
    env = dict(os.environ, JUPYTER_PATH=str(folder / "jupyter"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               PYDEVD_DISABLE_FILE_VALIDATION="1")  # as the grader's
    out = subprocess.run([sys.executable, str(ROOT / "course_utils" / "grading" / "runner.py"),
                          str(folder / "runner.json")], env=env, cwd=folder, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("output_limit")
    with ThreadPoolExecutor(len(NOTEBOOKS)) as pool:
        jobs = {k: pool.submit(run_notebook, root / k, cells) for k, cells in NOTEBOOKS.items()}
        return {k: job.result() for k, job in jobs.items()}


def statuses(report: dict) -> list:
    return [(c["status"], c.get("ename")) for c in report["cells"]]


def why(report: dict) -> str:
    """The cells' statuses and what the runner said of its kernel: an assertion's message (CI,
    2026-11-28: both cells "not run" once, at load 2, and the message did not say why)."""
    return f"{statuses(report)}; {({k: report.get(k) for k in ('died', 'error', 'kernel_exit')})}"


def test_a_caught_flood_is_not_interrupted_from_outside(reports):
    r = reports["caught"]
    # old runner: its SIGINT raised KeyboardInterrupt in the sleep (or lost the reply)
    assert statuses(r) == [("flood", None), ("ok", None)], why(r)
    assert r["output_bytes"] <= MOST  # what the later cell printed was dropped


def test_one_print_bigger_than_the_limit_is_cut_at_the_limit(reports):
    r = reports["one_print"]
    assert statuses(r) == [("flood", "OutputLimitExceeded"), ("ok", None)], why(r)
    assert r["output_bytes"] <= MOST  # old: all 5,000,001 characters were sent


def test_a_display_loop_is_stopped_inside_the_kernel(reports):
    r = reports["display_loop"]
    # old: stopped only by the runner's SIGINT (ename KeyboardInterrupt), past the limit
    assert statuses(r) == [("flood", "OutputLimitExceeded")], why(r)
    assert r["output_bytes"] <= MOST


def test_a_cell_result_bigger_than_the_limit_is_not_sent(reports):
    r = reports["result"]
    assert statuses(r) == [("flood", "OutputLimitExceeded"), ("ok", None)], why(r)
    assert r["output_bytes"] <= MOST


def test_output_size_counts_images_as_the_base64_the_runner_sees():
    import base64

    png = bytes(range(256)) * 7 + b"x"
    assert output_size({"image/png": png}) == len(base64.b64encode(png))
    assert output_size({"text/plain": "abc", "text/html": "<b>x</b>"}) == 11
