"""`.ci/run`, the CI script: it runs the README's CI command, a step that fails fails CI, and it
prints the CPU seconds of everything it ran; `make test-ci` covers every target CI used to run
one by one."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CI = (ROOT / ".ci" / "run").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()
BASH = shutil.which("bash")


def _targets() -> list[str]:
    """The make targets .ci/run runs, in order (`step make T` lines)."""
    return [m[1] for line in CI.splitlines() if (m := re.fullmatch(r"step make (\S+)", line.strip()))]


def _recipe(target: str) -> str:
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    assert m, f"Makefile has no target {target}"
    return m[1]


def test_ci_runs_the_commands_the_readme_says_it_runs():
    """README and docs/testing.md (where CI's detail is) name the targets CI runs."""
    for name in ("README.md", "docs/testing.md"):
        text = (ROOT / name).read_text()
        said = re.search(r"CI\s+\(`\.ci/run`\)\s+runs\s+(.+?)\s+on\s+a\s+clean\s+clone", text, re.S)
        assert said, f"{name}: the sentence 'CI (`.ci/run`) runs ... on a clean clone' is gone"
        assert sorted(_targets()) == sorted(re.findall(r"`make ([\w-]+)`", said[1])), (name, _targets(), said[1])
    assert _targets() == ["test-ci"]


def test_test_ci_is_one_session_of_every_ci_target():
    """make test-ci selects what make test, test-grader, test-emulated and test-scaffold select (less
    the grader's and the hosted tests' sweeps), plus exercise 08's solution on TF32 ranks, and it
    runs through tools/no_leftovers.py like make test."""
    ci = _recipe("test-ci")
    marks = re.search(r'^CI_MARKS = (.+)$', MAKEFILE, re.M)[1]
    assert marks == "not hosted and not sweep"  # grader, emulated and scaffold tests included
    assert '-m "$(CI_MARKS)"' in ci and "tests notebooks solutions/08_data_parallel.ipynb" in ci
    assert "$(NO_LEFTOVERS)" in ci and "$(NO_LEFTOVERS)" in _recipe("test")
    # a temporary file left behind fails the run too (issue 40), not only a process or a /dev/shm file
    assert re.search(r"^NO_LEFTOVERS = .*tools/no_leftovers\.py --strict-temp --$", MAKEFILE, re.M)
    assert re.search(r"^test-ci: .*\$\(GRADING_STAMP\)", MAKEFILE, re.M)  # nbgrader, for the grader's tests
    assert '".[grading]"' in _recipe("$(GRADING_STAMP)")
    assert "solutions/08_data_parallel.ipynb" in _recipe("test-emulated")
    from course_utils.tf32 import TF32_RANK_NOTEBOOKS

    assert "08_data_parallel.ipynb" in TF32_RANK_NOTEBOOKS  # conftest.py runs it on TF32 ranks, as test-emulated did


def _ci_functions(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """.ci/run's step() and cpu_seconds() in a script with a `make` that prints, burns a little
    CPU and fails for target `bad`."""
    funcs = "\n".join(m[0] for name in ("step", "cpu_seconds")
                      if (m := re.search(rf"^{name}\(\) \{{.*?^\}}", CI, re.S | re.M)))
    assert funcs.count("()") == 2, ".ci/run lost step() or cpu_seconds()"
    script = tmp_path / "t.sh"
    script.write_text("set -euo pipefail\n"
                      'make() { echo "ran $1"; python3 -c "import time; t = time.process_time()\n'
                      'while time.process_time() - t < 1.2: pass"; [ "$1" != bad ] || return 3; }\n'
                      f"{funcs}\n{body}\necho AFTER\n")
    return subprocess.run([BASH, str(script)], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_a_failing_step_fails_ci_and_cpu_seconds_counts_the_children(tmp_path):
    r = _ci_functions(tmp_path, 'step make one\ncpu_seconds\necho "CPU $CPU_SECONDS"')
    assert r.returncode == 0 and "ran one" in r.stdout and "=== make one took" in r.stdout, r.stdout + r.stderr
    assert 1 <= int(re.search(r"CPU (\d+)", r.stdout)[1]) <= 30, r.stdout  # the 1.2 CPU-s the child burnt
    r = _ci_functions(tmp_path, "step make bad\nstep make two")
    assert r.returncode != 0 and "AFTER" not in r.stdout and "ran two" not in r.stdout, r.stdout  # set -e


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads Linux's /proc")
def test_the_cpu_report_counts_what_a_test_and_its_children_burn(tmp_path):
    """conftest.py's report of CPU seconds per test: a child the test waited for counts, and one
    still running at the test's end (a kernel) counts too; a test that burns nothing stays near 0."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass"
    (tmp_path / "test_burn.py").write_text(
        "import subprocess, sys\n"
        "def test_waits_for_a_child():\n"
        f"    subprocess.run([sys.executable, '-c', '{burn}'], check=True, timeout=120)\n"
        "import pytest, time\n"
        "@pytest.fixture(scope='module')\n"
        "def kernel():\n"  # alive across tests, as a notebook's kernel is
        f"    p = subprocess.Popen([sys.executable, '-c', '{burn}\\ntime.sleep(60)'])\n"
        "    yield p\n"
        "    p.kill(); p.wait()\n"
        "def test_a_child_still_running(kernel):\n"
        "    def cpu():\n"
        "        f = open(f'/proc/{kernel.pid}/stat').read().rsplit(')', 1)[1].split()\n"
        "        return (int(f[11]) + int(f[12])) / 100\n"
        "    t = time.monotonic()\n"
        "    while cpu() < 1.0 and time.monotonic() - t < 120: time.sleep(0.1)\n"
        "def test_nothing(kernel):\n"
        "    pass\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COURSE_CPU_TOP": "5"}
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS"):  # .ci/run's --durations adds a section of its own
        env.pop(name, None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                        "-c", str(tmp_path / "pytest.ini"), str(tmp_path / "test_burn.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    report = r.stdout.split("CPU seconds:")[1].split("\n=")[0]  # to the next section's rule
    rows = {line.split("::")[-1]: float(line.split()[0]) for line in report.splitlines() if "::" in line}
    assert rows["test_waits_for_a_child"] >= 1.0 and rows["test_a_child_still_running"] >= 0.9, report
    assert rows["test_nothing"] < 0.5, report
