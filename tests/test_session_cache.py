"""course_utils.session_cache: a prediction computed once per test session for all its processes,
in a folder each session makes afresh (conftest.py), never read by a grading sandbox."""

import os
import re
import subprocess
import sys
from pathlib import Path

from course_utils import session_cache

ROOT = Path(__file__).resolve().parent.parent


def _counting(calls):
    @session_cache.shared("test.square")
    def square(x):
        calls.append(x)
        return {"x": (x, x * x)}
    return square


def test_a_result_is_computed_once_per_folder_and_read_back_whole(tmp_path, monkeypatch):
    monkeypatch.setenv(session_cache.ENV_VAR, str(tmp_path))
    calls = []
    square = _counting(calls)
    assert square(3) == square(3) == {"x": (3, 9)} and calls == [3]  # a tuple stays a tuple
    assert _counting(calls)(3) == {"x": (3, 9)} and calls == [3]  # another "process": read, not computed
    assert square(4) == {"x": (4, 16)} and calls == [3, 4]
    assert not list(tmp_path.glob("*.tmp"))


def test_without_the_folder_or_in_a_sandbox_nothing_is_kept(tmp_path, monkeypatch):
    calls = []
    monkeypatch.delenv(session_cache.ENV_VAR, raising=False)
    square = _counting(calls)
    square(2), square(2)
    assert calls == [2, 2]
    monkeypatch.setenv(session_cache.ENV_VAR, str(tmp_path))
    monkeypatch.setenv("COURSE_GRADER_SANDBOX", "1")
    square(2), square(2)
    assert calls == [2, 2, 2, 2] and not list(tmp_path.iterdir())


def test_a_broken_file_is_computed_again(tmp_path, monkeypatch):
    monkeypatch.setenv(session_cache.ENV_VAR, str(tmp_path))
    calls = []
    square = _counting(calls)
    square(5)
    next(tmp_path.glob("test.square-*.pickle")).write_bytes(b"\x80")  # cut short
    assert square(5) == {"x": (5, 25)} and calls == [5, 5]


def test_every_session_makes_its_own_folder_and_removes_it(tmp_path):
    """conftest.py names the variable without importing torch; a pytest run inside a session (a
    mutant's, a scaffolded copy's) makes its own folder, whatever it inherited."""
    named = re.search(r'^SESSION_CACHE_VAR = "(\w+)"', (ROOT / "conftest.py").read_text(), re.M)
    assert named and named[1] == session_cache.ENV_VAR
    outer = os.environ.get(session_cache.ENV_VAR)
    assert outer and Path(outer).is_dir()  # this session's
    probe = tmp_path / "test_probe.py"
    probe.write_text("import os\n\ndef test_probe():\n    print('FOLDER=' + os.environ['COURSE_SESSION_CACHE'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COURSE_SIZE"))}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:xdist", "-p", "no:cacheprovider",
                        "-p", "conftest", str(probe)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    inner = r.stdout.split("FOLDER=")[1].split()[0]
    assert inner != outer and not Path(inner).exists()  # its own, removed at its end


def test_a_foreign_or_hostile_file_is_computed_again_and_a_failed_write_only_not_shared(tmp_path, monkeypatch):
    """Issue 43: a file unpickling raises anything else for (a class no longer importable, a
    folder where the file goes) broke the function it caches; a full disk now only means the
    result is not shared, with no temporary file left."""
    import errno
    import pickle

    monkeypatch.setenv(session_cache.ENV_VAR, str(tmp_path))
    calls = []
    square = _counting(calls)
    square(6)
    path = next(tmp_path.glob("test.square-*.pickle"))
    path.write_bytes(pickle.dumps(0)[:2] + b"cno_such_module\nThing\n.")  # a class of a module that is gone
    assert square(6) == {"x": (6, 36)} and calls == [6, 6]
    path.unlink()
    path.mkdir()
    assert square(6) == {"x": (6, 36)} and calls == [6, 6, 6]
    path.rmdir()

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "replace", full)
    assert square(7) == {"x": (7, 49)} and [p.name for p in tmp_path.iterdir()] == []
