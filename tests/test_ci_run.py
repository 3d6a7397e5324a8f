"""`.ci/run`, the CI script: it runs the README's CI commands, and a step that fails fails CI, also
when two steps run at once (`together`)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CI = (ROOT / ".ci" / "run").read_text()
BASH = shutil.which("bash")


def _targets() -> list[str]:
    """The make targets .ci/run runs, in order: `step make T` and `together T1 T2 ...` lines."""
    out = []
    for line in CI.splitlines():
        if m := re.fullmatch(r"step make (\S+)", line.strip()):
            out.append(m[1])
        elif m := re.fullmatch(r"together ((?:\S+ ?)+)", line.strip()):
            out += m[1].split()
    return out


def test_ci_runs_the_commands_the_readme_says_it_runs():
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"CI \(`\.ci/run`\) runs (.+?) on a clean clone", readme, re.S)
    assert said, "README: the sentence 'CI (`.ci/run`) runs ... on a clean clone' is gone"
    assert sorted(_targets()) == sorted(re.findall(r"`make ([\w-]+)`", said[1])), (_targets(), said[1])
    assert _targets()[0] == "test", "make test (lint, install) must come first: the other steps need its venv"


def _together(tmp_path: Path, *targets: str) -> subprocess.CompletedProcess:
    """.ci/run's `together` with a `make` that prints, sleeps a little and fails for target `bad`."""
    func = re.search(r"^together\(\) \{.*?^\}", CI, re.S | re.M)
    assert func, ".ci/run has no together() function"
    script = tmp_path / "t.sh"
    script.write_text("set -euo pipefail\n"
                      'make() { echo "ran $1"; sleep 0.2; [ "$1" != bad ] || { echo "$1 broke" >&2; return 3; }; }\n'
                      f"{func[0]}\ntogether {' '.join(targets)}\necho AFTER\n")
    return subprocess.run([BASH, str(script)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_steps_run_together_print_both_logs_whole(tmp_path):
    r = _together(tmp_path, "one", "two")
    assert r.returncode == 0 and "AFTER" in r.stdout, r.stdout + r.stderr
    for name in ("one", "two"):  # each log whole, under its own heading, in the order given
        assert f"=== make {name}:\nran {name}\n=== make {name} took" in r.stdout, r.stdout
    assert r.stdout.index("=== make one:") < r.stdout.index("=== make two:")


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize("targets", [("bad", "two"), ("one", "bad")])
def test_a_step_that_fails_together_fails_ci(tmp_path, targets):
    r = _together(tmp_path, *targets)
    assert r.returncode != 0 and "AFTER" not in r.stdout, r.stdout  # set -e stops CI there
    assert "=== make bad FAILED" in r.stdout and "bad broke" in r.stdout, r.stdout  # its stderr is in its log
    other = next(t for t in targets if t != "bad")
    assert f"ran {other}" in r.stdout  # the other step's log is printed too
