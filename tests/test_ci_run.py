"""`.ci/run`, the CI script: it runs the README's CI command, a step that fails fails CI, and it
prints the CPU seconds of everything it ran; `make test-ci` covers every target CI used to run
one by one."""

import re
import shutil
import subprocess
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
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"CI \(`\.ci/run`\) runs (.+?) on a clean clone", readme, re.S)
    assert said, "README: the sentence 'CI (`.ci/run`) runs ... on a clean clone' is gone"
    assert sorted(_targets()) == sorted(re.findall(r"`make ([\w-]+)`", said[1])), (_targets(), said[1])
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
