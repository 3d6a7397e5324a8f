"""tools/no_leftovers.py, the check make test and make test-ci run pytest through: a command that
leaves a process (even one that double-forked away into its own session), a /dev/shm file or a
temporary file behind fails, and finds them removed; a clean command passes with its own status."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "no_leftovers.py"
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /dev/shm: Linux")


def _run(code: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "--grace", "0.5", "--strict-temp", *extra, "--",
                           sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120)


def _alive(tag: str) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and tag.encode() in _cmdline(p)]


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_clean_command_passes_with_its_own_status():
    assert _run("pass").returncode == 0
    r = _run("import sys; sys.exit(5)")
    assert r.returncode == 5 and "left work behind" not in r.stderr


@linux
def test_a_detached_process_a_shm_file_and_a_temporary_file_fail_the_run_and_are_removed():
    tag = f"leftover-{uuid.uuid4().hex[:12]}"
    # a grandchild in its own session, its parent gone: re-parented to the tool, not to init;
    # it would live ten minutes (the tool must end it, not wait for it)
    code = f"""
import os, subprocess, sys, tempfile
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{tag}"], start_new_session=True)
open("/dev/shm/{tag}", "w").write("x")
open(os.path.join(tempfile.gettempdir(), "{tag}.txt"), "w").write("x")
"""
    try:
        r = _run(code)
        assert r.returncode == 1, r.stderr
        assert "left work behind (3)" in r.stderr, r.stderr
        assert f"still running: {sys.executable} -c import time; time.sleep(600) {tag}" in r.stderr, r.stderr
        assert f"/dev/shm/{tag} left behind" in r.stderr and f"{tag}.txt" in r.stderr
        assert not _alive(tag) and not Path(f"/dev/shm/{tag}").exists()
    finally:
        for pid in _alive(tag):
            os.kill(pid, 9)
        Path(f"/dev/shm/{tag}").unlink(missing_ok=True)


@linux
def test_a_failing_command_keeps_its_status_and_its_leftovers_are_still_listed():
    r = _run("import os, sys, tempfile; open(os.path.join(tempfile.gettempdir(), 'x'), 'w'); sys.exit(4)")
    assert r.returncode == 4 and "temporary file left behind: x" in r.stderr


def test_it_refuses_a_missing_command_and_a_negative_grace():
    for args in ([], ["--grace", "-1", "--", "true"]):
        r = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and ("no command" in r.stderr or "--grace must be" in r.stderr), r.stderr


def test_temporary_files_alone_are_listed_and_fail_only_when_strict(tmp_path):
    code = ("import os, tempfile; d = tempfile.gettempdir(); os.makedirs(os.path.join(d, 'empty', 'tree'));"
            "os.makedirs(os.path.join(d, 'full')); open(os.path.join(d, 'full', 'f'), 'w')")
    lenient = subprocess.run([sys.executable, str(TOOL), "--", sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=120)
    assert lenient.returncode == 0 and "temporary folder left behind: full (holds f)" in lenient.stderr, lenient.stderr
    assert "left behind: empty" not in lenient.stderr  # folders with no file in them are not work left behind
    assert _run(code).returncode == 1
