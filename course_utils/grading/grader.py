"""One submission graded: the notebook run, the sandbox, the judge (``Grader``).

``grade.py`` grades a class with it (one ``Grader`` per worker process) and describes the three
stages a submission goes through. Here: the grader's ``Options`` (the limits a teacher sets) and
``Result`` (one row of the class's report), ``Grader.grade`` (one notebook, every process it
started ended before its result is recorded), ``containment()`` (what this machine can enforce)
and the student release the notebook run gets (``_release_package``: no answers).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import math
import os
import pkgutil
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..checks import CourseError
from . import limits
from .core import PartResult, Raised
from .intake import Unreadable, clean, in_child, memory_window, observation_problem, read_submission
from .kernel_launch import write_kernel_spec
from .notebook_code import code_cells
from .registry import MODULES, load_all
from .release import release_course_utils
from .strip import strip_source

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the teacher's course_utils
CONTAIN = Path(__file__).resolve().parent / "contain.py"
NOTE_TEXT = 2000  # characters kept from a learner-controlled text in a note
OBSERVATION_BYTES = 256 * 2**20  # the largest observation file the judge reads
STARTUP_S = 180.0  # the sandbox's imports and the rebuild of the notebook's definitions


SECONDS_MAX = 7 * 86400.0  # a week: the longest time limit a run takes (zmq and asyncio take it in ms)
SIZE_MAX = float(2**20)  # GiB of memory or disk, MiB of output: 1 Pi/TiB, far inside what setrlimit takes
#: Options' limits: field -> (the command line's flag, its unit, its largest value, its default)
LIMITS = {
    "cell_timeout": ("--timeout", "seconds", SECONDS_MAX, "120"),
    "total_timeout": ("--total-timeout", "seconds", SECONDS_MAX, "10 x --timeout, at least 600"),
    "check_timeout": ("--check-timeout", "seconds", SECONDS_MAX, "300"),
    "memory_gib": ("--memory", "GiB", SIZE_MAX, "4"),
    "max_output_mib": ("--max-output", "MiB", SIZE_MAX, "8"),
    "disk_gib": ("--disk", "GiB", SIZE_MAX, "2"),
}


def _check_limit(name: str, value: object, flag: str, unit: str, top: float, default: str) -> None:
    """A limit is a number of ``unit`` above 0, finite and at most ``top`` (CourseError otherwise)."""
    fix = f"give {flag} a number of {unit} above 0 and at most {top:,.0f} (default {default})"
    shown = name.replace("_", "-")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CourseError(f"{shown} must be a number of {unit}, got {value!r}.", fix)
    if not value > 0:
        raise CourseError(f"{shown} must be > 0, got {value!r}.", fix)
    if not math.isfinite(value) or value > top:
        raise CourseError(f"{shown} must be finite and at most {top:,.0f} {unit}, got {value!r}.", fix)


@dataclass
class Options:
    """The limits a teacher sets for a class run (``grade``'s command line): time in seconds,
    memory and disk in GiB, output in MiB, the sandbox's confinement and the inputs' seed."""

    cell_timeout: float = 120.0  # seconds per cell of the notebook run
    total_timeout: float | None = None  # seconds for the whole notebook run (default 10 x cell, >= 600)
    check_timeout: float = 300.0  # seconds per graded part in the sandbox
    memory_gib: float = 4.0  # per process, and for all of a submission's processes together
    max_output_mib: float = 8.0  # output of the notebook run before it is interrupted
    seed: int | None = None  # None: a new random seed per submission
    keep: str | None = None  # keep the scratch folders here (debugging)
    grace: float = 5.0  # seconds after an interrupt before the kernel is killed
    landlock: bool = True  # False: no filesystem sandbox even where Landlock exists (tests, debugging)
    contain: bool = True  # False: no namespaces even where the system has them (tests, debugging)
    disk_gib: float = 2.0  # all the files of one run (its scratch folder, its /dev/shm) together
    max_files: int = 20_000  # files and folders one run may create
    jobs: int | None = None  # submissions graded at once (None: see default_jobs)
    seed_per_submission: bool = False  # False: one seed per exercise for the whole class run
    threads: int | None = None  # CPU threads of a notebook run (None: as the environment says; grade_many: cores / jobs)

    def __post_init__(self):
        """Refuse a limit no run can keep (zero, negative, NaN, infinite, beyond what the system
        takes) before any work, with the fix: the teacher's mistake, never a class graded badly."""
        for name, (flag, unit, top, default) in LIMITS.items():
            if name != "total_timeout" or self.total_timeout is not None:
                _check_limit(name, getattr(self, name), flag, unit, top, default)
        if self.total_timeout is None:
            self.total_timeout = min(max(600.0, 10 * self.cell_timeout), SECONDS_MAX)
        for name, flag in (("max_files", "max_files"), ("jobs", "--jobs"), ("threads", "threads")):
            value = getattr(self, name)
            if value is None and name != "max_files":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CourseError(f"{name.replace('_', '-')} must be >= 1, got {value!r}.",
                                  f"give {flag} a whole number of 1 or more"
                                  + (" (or leave it out: one per core, as memory allows)" if name == "jobs" else ""))

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def disk_bytes(self) -> int:
        return int(self.disk_gib * 2**30)


@dataclass
class Result:
    """One submission graded: one row of the class's report (its score and each part's), with the
    notes, the notebook run's cells and the graded sources for the teacher."""

    submission: str
    exercise: str
    title: str = ""
    status: str = "graded"  # graded | not graded
    score: int = 0
    max_score: int = 0
    parts: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seed: int | None = None
    cells: list[dict] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    not_run: list[dict] = field(default_factory=list)  # top-level statements the sandbox did not run, and why
    seconds: dict = field(default_factory=dict)  # where the time went

    @property
    def percent(self) -> float:
        return round(100 * self.score / self.max_score, 1) if self.max_score else 0.0

    def as_dict(self) -> dict:
        return dict(asdict(self), percent=self.percent)


def exercise_id(path: Path) -> str:
    """The exercise number of a submission, from its file name (``01_alice.ipynb``: "01"); a name
    without one, or with no such exercise, raises ValueError."""
    m = re.match(r"(\d\d)_", path.name)
    if not m:
        raise ValueError(f"{path.name}: cannot tell the exercise; name it NN_name.ipynb (e.g. 01_alice.ipynb)")
    if m.group(1) not in MODULES:
        raise ValueError(f"{path.name}: there is no exercise {m.group(1)} (exercises: "
                         f"{', '.join(sorted(MODULES))})")
    return m.group(1)


def _cell_name(cell: dict) -> str:
    ec, k = cell.get("execution_count"), cell["number"]
    if ec is None:
        return f"code cell {k}"
    return f"cell [{ec}]" + ("" if ec == k else f" (code cell {k})")


def clip_text(text: str, n: int = NOTE_TEXT) -> str:
    """``text`` cut to ``n`` characters (marked ``[...]``): a note never holds a learner's flood."""
    text = str(text)
    return text if len(text) <= n else text[:n] + " [...]"


def _snapshot(root: Path) -> dict[str, bytes]:
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".pyc", ".pyo")):
            files[str(p.relative_to(root))] = p.read_bytes()
    return files


def _write_tree(files: dict[str, bytes], dest: Path) -> None:
    for rel, data in files.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def package_paths(pythonpath: str | None = None) -> list[str]:
    """The grader's ``PYTHONPATH`` entries that a submission's processes may import from too:
    where packages were installed with ``pip install --target`` (a GPU machine without network
    gets its Jupyter packages that way) -- every entry but those holding a ``course_utils``
    package (a checkout run with ``PYTHONPATH=.``): a submission sees only the grader's stripped
    copy of the course, never the one with the answers."""
    pythonpath = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    return [p for p in pythonpath.split(os.pathsep)
            if p and os.path.isdir(p) and not os.path.exists(os.path.join(p, "course_utils"))]


class Grader:
    """Grades submissions one at a time; create once per class (it snapshots ``course_utils``
    and imports every check before any submission runs)."""

    def __init__(self, options: Options | None = None, workroot: str | Path | None = None):
        """``workroot``: the folder its working folder goes in (``grade_many``'s folder for the
        class, removed at the end even if this grader's process is killed); default: the system's."""
        self.opts = options or Options()
        self.exercises = load_all()
        _import_everything()
        self.package = _snapshot(PACKAGE_DIR)
        self.workdir = Path(tempfile.mkdtemp(prefix="course-grader-", dir=workroot))
        os.chmod(self.workdir, 0o700)
        self.release = _release_package(self.workdir / "release")  # what the notebook run imports
        self._libs: dict[str, dict[str, bytes]] = {}
        self.contained, self.containment = containment() if self.opts.contain else (False, "switched off")
        self.count = 0

    def close(self) -> None:
        """Remove the grader's working folder (every submission's scratch folder is in it)."""
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what the processes get ---------------------------------------------------------------
    def sandbox_lib(self, nn_id: str) -> dict[str, bytes]:
        """course_utils without this exercise's answers and without any reference or judge."""
        if nn_id not in self._libs:
            ex = self.exercises[nn_id]
            files = dict(self.package)
            by_file: dict[str, list[str]] = {}
            for module, names in ex.refused.items():
                rel = module.split(".", 1)[1].replace(".", "/") + ".py"
                by_file.setdefault(rel, []).extend(names)
            for rel, data in files.items():
                if not rel.endswith(".py"):
                    continue
                names = by_file.get(rel, [])
                grading = rel.startswith("grading/")
                if not names and not grading:
                    continue
                files[rel] = strip_source(
                    data.decode(), names, strip_marked=grading,
                    message=f"this object is part of the answer to exercise {nn_id}: write it yourself "
                            "in the notebook (graded code may not use course_utils' own)",
                    marked_message="grading code is not available to graded code").encode()
            self._libs[nn_id] = files
        return self._libs[nn_id]

    def _env(self, scratch: Path, lib: Path, extra: dict | None = None) -> dict:
        env = {k: v for k, v in os.environ.items()
               if k in ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "COURSE_SIZE", "COURSE_EMULATE_TF32", "OMP_NUM_THREADS",
                        "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "SYSTEMROOT")}
        for d in ("home", "tmp", "runtime", "mpl", "ipython", "jupyter-config"):
            (scratch / d).mkdir(exist_ok=True)
        env.update(HOME=str(scratch / "home"), TMPDIR=str(scratch / "tmp"),
                   PYTHONPATH=os.pathsep.join([str(lib), *package_paths()]),
                   JUPYTER_PATH=str(scratch / "jupyter"), JUPYTER_RUNTIME_DIR=str(scratch / "runtime"),
                   JUPYTER_CONFIG_DIR=str(scratch / "jupyter-config"), IPYTHONDIR=str(scratch / "ipython"),
                   MPLCONFIGDIR=str(scratch / "mpl"), MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1",
                   PYDEVD_DISABLE_FILE_VALIDATION="1", PYTHONUNBUFFERED="1")
        if self.opts.threads and "OMP_NUM_THREADS" not in os.environ:  # workers side by side share the cores
            env.update(OMP_NUM_THREADS=str(self.opts.threads), MKL_NUM_THREADS=str(self.opts.threads))
        env.update(extra or {})
        return env

    # -- one submission ---------------------------------------------------------------------------
    def grade(self, path: str | Path, seed: int | None = None, name: str | None = None,
              root: str | Path | None = None) -> Result:
        """Grade one submission. ``seed``: its inputs (default: ``Options.seed``, else a new one);
        ``name``: the report's name for it (default: the file's name); ``root``: the class folder
        (a link in it is followed only to a file inside it). Every text of the result is
        sanitised (``intake.clean``): nothing a learner wrote can stop the report."""
        return _clean(self._grade_file(Path(path), seed, name or Path(path).name, root))

    def _grade_file(self, path: Path, seed: int | None, name: str, root) -> Result:
        t0 = time.monotonic()
        try:
            nn_id = exercise_id(path)
        except ValueError as err:
            return Result(name, "?", status="not graded", notes=[str(err)])
        ex = self.exercises[nn_id]
        if seed is None:
            seed = self.opts.seed if self.opts.seed is not None else secrets.randbelow(2**31)
        result = Result(name, nn_id, ex.title, max_score=ex.max_score, seed=seed,
                        parts=[_unchecked(p) for p in ex.parts])
        try:
            data, result.notes = read_submission(path, root, self.opts.memory_bytes)
        except Unreadable as err:  # not a notebook: listed apart, never counted as a 0
            result.status = "not graded"
            result.notes = [f"unreadable: {err}"]
            for p in result.parts:
                p["message"] = "not checked: the file is not a readable notebook"
            return result
        try:
            with limits.subreaper():  # only while a submission runs: see limits.subreaper
                return self._grade(path, nn_id, data, seed, result, t0)
        except Exception as err:  # noqa: BLE001 - the grader's own failure on this one submission
            result.notes.append(f"the grader could not finish this submission ({type(err).__name__}: "
                                f"{clip_text(err, 300)}); it is scored 0 -- grade it again alone, and report "
                                "this if it persists")
            result.parts = [dict(p, score=0, passed=False, message=p["message"] if p["message"] != "not checked"
                                 else "not checked: the grader failed on this submission (see notes)")
                            for p in result.parts]
            result.score = 0
            return result

    def _grade(self, path: Path, nn_id: str, data: bytes, seed: int, result: Result, t0: float) -> Result:
        self.count += 1
        scratch = Path(tempfile.mkdtemp(prefix=f"sub-{self.count:04d}-", dir=self.workdir))
        before = limits.descendants()
        try:
            run = scratch / "run"  # the notebook run may write here only (Landlock)
            run.mkdir()
            with self._shm_sweep():
                self._run_notebook(path.name, data, run, before, result)
            self._guard(before, result)
            t1 = time.monotonic()
            with self._shm_sweep():  # the sandbox's folder: made now, a name the run could not guess
                observations = self._observe(nn_id, data, Path(tempfile.mkdtemp(prefix="check-", dir=scratch)),
                                             seed, before, result)
            self._guard(before, result)
            t2 = time.monotonic()
            if any(n.startswith("tampering") for n in result.notes):
                for p in result.parts:
                    p["message"] = "not scored: tampering"
            else:
                self._judge(nn_id, observations, seed, result)
            result.seconds.update({"notebook run": round(t1 - t0, 1), "sandbox": round(t2 - t1, 1),
                                   "judge": round(time.monotonic() - t2, 1)})
        finally:
            limits.kill_new_descendants(before)
            if self.opts.keep:
                dest = Path(self.opts.keep) / f"{self.count:04d}_{path.stem}"
                shutil.copytree(scratch, dest, dirs_exist_ok=True, ignore_dangling_symlinks=True, symlinks=True)
            shutil.rmtree(scratch, ignore_errors=True)
            result.seconds["total"] = round(time.monotonic() - t0, 1)
        return result

    @contextlib.contextmanager
    def _shm_sweep(self):
        """Without namespaces /dev/shm is the system's: remove what a run left there (a file
        written for the next run to read, memory that would stay allocated after the class)."""
        if self.contained:
            yield  # each run had its own /dev/shm, gone with it
            return
        before = _shm_entries()
        try:
            yield
        finally:
            for name, uid in _shm_entries().items():
                if name not in before and uid == os.getuid():
                    try:
                        os.unlink(os.path.join("/dev/shm", name))
                    except OSError:
                        pass

    def _guard(self, before: set[int], result: Result) -> None:
        """Kill what is left, then make sure the teacher's course_utils is as it was."""
        limits.kill_new_descendants(before)
        now = _snapshot(PACKAGE_DIR)
        changed = sorted(k for k in set(now) | set(self.package)
                         if now.get(k) != self.package.get(k))
        if changed:
            for rel in changed:
                target = PACKAGE_DIR / rel
                if rel in self.package:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(self.package[rel])
                else:
                    target.unlink(missing_ok=True)
            result.notes.append("tampering: the submission changed the grader's files outside its scratch "
                                f"folder (course_utils/{', course_utils/'.join(changed[:5])}); they were "
                                "restored -> 0 points")

    def _spawn(self, args: list[str], scratch: Path, env: dict, log: Path, stdout=subprocess.DEVNULL):
        mem = self.opts.memory_bytes
        argv = [sys.executable, *args]
        if self.contained:  # its own PID namespace and /dev/shm: see contain.py
            argv = [sys.executable, str(CONTAIN), "--shm-bytes", str(min(self.opts.disk_bytes, mem)), "--", *argv]

        def limit():  # runs in the child before exec
            limits.set_pdeathsig()  # dies with the grader
            limits.apply_rlimits(mem, 2**30)

        with open(log, "wb") as err:
            return subprocess.Popen(argv, cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                                    stdout=stdout, stderr=err, start_new_session=True, preexec_fn=limit)

    def _wait(self, proc, before: set[int], deadline: float, poll=None, folder: Path | None = None) -> str | None:
        """Wait for ``proc``; returns None, "timeout", "memory", "disk" or "part timeout" (and then
        kills it all). Every deadline is on the grader's own clock."""
        next_disk = 0.0
        while proc.poll() is None:
            now = time.monotonic()
            if now > deadline:
                self._kill(proc, before)
                return "timeout"
            if limits.tree_rss(limits.descendants() - before) > self.opts.memory_bytes:
                self._kill(proc, before)
                return "memory"
            if folder is not None and now >= next_disk:
                used, files = limits.disk_usage(folder, self.opts.max_files)
                if used > self.opts.disk_bytes or files > self.opts.max_files:
                    self._kill(proc, before)
                    return "disk"
                next_disk = now + 1.0
            if poll is not None and poll():
                self._kill(proc, before)
                return "part timeout"
            time.sleep(0.2)
        return None

    def _disk_note(self, what: str) -> str:
        return (f"{what} wrote more than {self.opts.disk_gib:g} GiB or {self.opts.max_files:,} files "
                "and was stopped")

    @staticmethod
    def _kill(proc, before: set[int]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        limits.kill_new_descendants(before)
        proc.wait()

    def _run_notebook(self, name: str, data: bytes, scratch: Path, before: set[int], result: Result) -> None:
        """The notebook run: the submission top to bottom in the grader's kernel, under its limits;
        its cells' statuses and a note for each cell that failed go into ``result``."""
        work, lib = scratch / "work", scratch / "lib"
        work.mkdir()
        (work / name).write_bytes(data)
        _write_tree(self.release, lib / "course_utils")  # the student release: no @answer
        import nbformat

        cells = code_cells(nbformat.reads(data.decode(), as_version=4))
        limits_spec = {"scratch": str(scratch), "memory_bytes": self.opts.memory_bytes, "file_bytes": 2**30,
                       "preimport": _preimports(cells), "landlock": self.opts.landlock,
                       "max_output": int(self.opts.max_output_mib * 2**20)}
        write_kernel_spec(scratch, limits_spec)
        ipc = scratch / "ipc"
        ipc.mkdir()
        spec = {"notebook": str(work / name), "workdir": str(work), "scratch": str(scratch),
                "cell_timeout": self.opts.cell_timeout, "grace": self.opts.grace,
                "max_output": int(self.opts.max_output_mib * 2**20),
                "ipc_dir": str(ipc) if sys.platform.startswith("linux") and len(str(ipc)) < 80 else None}
        (scratch / "runner.json").write_text(json.dumps(spec))
        out_path = self.workdir / f"runner-{self.count:04d}.out"  # outside what the kernel may write
        with open(out_path, "wb") as out:
            # by path, not -m: "-m course_utils..." would import the package (and torch) first
            proc = self._spawn([str(lib / "course_utils" / "grading" / "runner.py"), str(scratch / "runner.json")], scratch,
                               self._env(scratch, lib, {"COURSE_GRADER_RUN": "1"}), scratch / "runner.log",
                               stdout=out)
            why = self._wait(proc, before, time.monotonic() + self.opts.total_timeout, folder=scratch)
        lines = out_path.read_bytes()[-2_000_000:].decode(errors="replace").splitlines()
        out_path.unlink()
        report, started = _runner_report(lines)
        at = next((f" in code cell {c.number}" for c in cells if c.index == started), "") if started is not None else ""
        if why == "timeout":
            result.notes.append(f"the notebook run passed the total time limit ({self.opts.total_timeout:.0f} s) "
                                f"and was stopped{at}")
        elif why == "memory":
            result.notes.append(f"the notebook run used more than {self.opts.memory_gib:g} GiB (all its "
                                f"processes together) and was stopped{at}")
        elif why == "disk":
            result.notes.append(self._disk_note("the notebook run") + at)
        if report is None:
            if why is None:
                result.notes.append("the notebook run ended without a report (see runner.log with --keep)")
            return
        result.cells = report["cells"]
        result.seconds.update({f"kernel {k}": v for k, v in report.get("seconds", {}).items()})
        if report.get("error"):
            result.notes.append(f"the notebook could not run: {clip_text(report['error'], 500)}")
        result.notes += _cell_notes(report, self.opts)

    def _observe(self, nn_id: str, data: bytes, scratch: Path, seed: int, before: set[int],
                 result: Result) -> dict:
        """Run the sandbox for every part (a new one after a part that hung or crashed)."""
        ex = self.exercises[nn_id]
        sb = scratch
        _write_tree(self.sandbox_lib(nn_id), sb / "lib" / "course_utils")
        (sb / "submission.ipynb").write_bytes(data)  # a fresh copy: the notebook run may have changed its own
        obs = sb / "obs"
        obs.mkdir()
        remaining = [p.key for p in ex.parts]
        observations: dict = {}
        env = self._env(sb, sb / "lib", {"COURSE_GRADER_SANDBOX": "1", "OMP_NUM_THREADS": "1"})
        while remaining:
            spec = {"exercise": nn_id, "notebook": str(sb / "submission.ipynb"), "parts": remaining,
                    "seed": seed, "obs_dir": str(obs), "scratch": str(sb),
                    "memory_bytes": self.opts.memory_bytes, "file_bytes": 256 * 2**20,
                    "landlock": self.opts.landlock}
            (sb / "spec.json").write_text(json.dumps(spec))
            proc = self._spawn(["-m", "course_utils.grading.sandbox", str(sb / "spec.json")], sb, env,
                               sb / "sandbox.log")
            started_at = time.monotonic()
            seen: dict[str, float] = {}  # when the grader first saw a part start: its own clock

            def part_overdue(remaining=remaining, seen=seen, started_at=started_at):
                now = time.monotonic()
                for k in remaining:
                    if k not in seen and os.path.lexists(obs / f"{k}.started"):
                        seen[k] = now
                current = [k for k in remaining if k in seen and not os.path.lexists(obs / f"{k}.pt")]
                if not current:
                    return now - max(seen.values(), default=started_at) > STARTUP_S
                return now - seen[current[-1]] > self.opts.check_timeout

            deadline = started_at + STARTUP_S + len(remaining) * (self.opts.check_timeout + 5)
            why = self._wait(proc, before, deadline, poll=part_overdue, folder=sb)
            code = proc.returncode
            done = [k for k in remaining if os.path.lexists(obs / f"{k}.pt")]
            for k in done:
                observations[k] = _load_observation(obs / f"{k}.pt", self.opts.memory_bytes)
            after = [k for k in remaining if k not in done]
            if not after:
                break
            culprit = next((k for k in after if os.path.lexists(obs / f"{k}.started")), None)
            if culprit is None:  # died before any part started: while rebuilding the definitions
                reason = {"part timeout": f"took more than {STARTUP_S:.0f} s to start (imports, definitions and "
                                          "the statements they need)",
                          "timeout": f"took more than {STARTUP_S:.0f} s to start (imports, definitions and "
                                     "the statements they need)",
                          "memory": f"used more than {self.opts.memory_gib:g} GiB",
                          "disk": self._disk_note("")[1:]}.get(
                    why, f"ended ({_exit(code)}) while rebuilding the notebook's definitions")
                for k in after:
                    observations[k] = Raised("Crashed", f"not checked: the grading process {reason}",
                                             "crashed").to_data()
                break
            reason = {"part timeout": f"took more than {self.opts.check_timeout:g} s and was stopped",
                      "timeout": f"took more than {self.opts.check_timeout:g} s and was stopped",
                      "memory": f"used more than {self.opts.memory_gib:g} GiB and was stopped",
                      "disk": self._disk_note("")[1:]}.get(
                why, f"ended the grading process ({_exit(code)})")
            observations[culprit] = Raised("Crashed", f"your code {reason} while this part was checked",
                                           "timeout" if why else "crashed").to_data()
            remaining = after[after.index(culprit) + 1:]
        info = _read_json(obs / "_rebuild.json")
        if isinstance(info, dict):
            result.sources = {str(k): clip_text(v, 20_000) for k, v in dict(info.get("sources", {})).items()}
            result.not_run = [d for d in list(info.get("dropped", []))[:200] if isinstance(d, dict)]
            for problem in list(info.get("problems", []))[:10]:
                result.notes.append(f"rebuilding the graded code: {clip_text(problem, 500)}")
        return observations

    def _judge(self, nn_id: str, observations: dict, seed: int, result: Result) -> None:
        ex = self.exercises[nn_id]
        parts = []
        for p in ex.parts:
            if p.key not in observations:
                parts.append(_unchecked(p))
                continue
            try:  # a judge's memory is bounded: one observation can only lose its own part
                with memory_window(self.opts.memory_bytes):
                    parts.append(ex.judge(p.key, observations[p.key], seed).as_dict())
            except MemoryError:
                parts.append(dict(_unchecked(p), message=f"judging this result needed more than "
                                  f"{self.opts.memory_gib:g} GiB: it is too large to check"))
        result.parts = parts
        result.score = sum(p["score"] for p in parts)


def _preimports(cells) -> list[str]:
    """The modules the notebook's cells import at top level (and torch, course_utils): the kernel
    imports them before its limits apply."""
    preimport = {"torch", "course_utils"}
    for cell in cells:
        try:
            tree = ast.parse(cell.python)
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # the kernel will report it
            continue
        for stmt in tree.body:
            if isinstance(stmt, ast.Import):
                preimport.update(a.name for a in stmt.names)
            elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                preimport.add(stmt.module)
    return sorted(preimport)


def _runner_report(lines: list[str]) -> tuple[dict | None, int | None]:
    """The runner's report (its ``cells`` line) and the last cell it started, from its output."""
    report = started = None
    for line in lines:
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "start" in msg:
            started = msg["start"]
        elif "cells" in msg:
            report = msg
    return report, started


def _cell_notes(report: dict, opts: Options) -> list[str]:
    """A note for each cell of the run's report that raised, timed out, flooded, was killed or
    killed the kernel."""
    notes = []
    for cell in report["cells"]:
        status, where = cell["status"], _cell_name(cell)
        if status == "error":
            notes.append(f"{where} raised {cell.get('ename')}: {clip_text(cell.get('evalue', ''))}")
        elif status == "timeout":
            notes.append(f"{where} ran past the {opts.cell_timeout:g} s cell limit and was "
                         "interrupted")
        elif status == "flood":
            notes.append(f"{where} printed more than {opts.max_output_mib:g} MiB and was "
                         "interrupted (outputs are not kept)")
        elif status == "killed":
            notes.append(f"{where} did not stop when interrupted (a bare `except:` around a loop?): "
                         f"its kernel was killed after {opts.cell_timeout + opts.grace:g} s; "
                         "later cells did not run")
        elif status == "died":
            code = report.get("kernel_exit")
            how = f" (exit code {code})" if isinstance(code, int) and code >= 0 else \
                f" (signal {-code})" if isinstance(code, int) else ""
            notes.append(f"the kernel died in {where}{how}; later cells did not run")
    return notes


def _clean(result: Result) -> Result:
    """``result`` with every text sanitised (``intake.clean``): names, notes, messages, sources."""
    return Result(**clean(asdict(result)))


def _unchecked(part) -> dict:
    """A part's entry before (or without) its judgement."""
    return PartResult(part.key, part.name, part.points, message="not checked").as_dict()


def _exit(code) -> str:
    if code is None:
        return "still running"
    return f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"signal {-code}"


def _load_observation(path: Path, memory_bytes: int = 4 << 30, timeout_s: float = 60.0):
    """The observation saved in ``path``, or a ``Raised`` (as data) saying why it is not judged.
    The sandbox wrote the file, and learner code may have forged it: it is first loaded and
    checked (``intake.observation_problem``) in a forked child, bounded in time and memory,
    and loaded here only if that child found plain data of a size a judge can walk."""
    try:
        data = limits.read_regular(path, OBSERVATION_BYTES)  # never through a link, never a device
    except OSError as err:  # a planted link, FIFO or device; a missing or half-written file
        return Raised("Unreadable", f"the observation could not be read as data ({type(err).__name__})",
                      "crashed").to_data()
    verdict = in_child(lambda: _first_look(data), timeout_s, memory_bytes)
    if verdict.startswith("unreadable: "):
        return Raised("Unreadable", verdict.removeprefix("unreadable: "), "crashed").to_data()
    if verdict != "ok":
        why = {"timeout": f"loading it took more than {timeout_s:g} s",
               "memory": f"loading it needed more than {memory_bytes / 2**30:g} GiB",
               "crashed": "loading it crashed"}.get(verdict)
        return Raised("TooLarge", f"the observation is not judged: {why}" if why else verdict, "check").to_data()
    import torch  # lazy: the grader imports torch once, before the first submission (_import_everything)

    return torch.load(io.BytesIO(data), weights_only=True)


def _first_look(data: bytes) -> str:
    """In ``_load_observation``'s child: "ok", or why the data is not an observation to judge."""
    import torch  # lazy: as _load_observation

    try:
        obj = torch.load(io.BytesIO(data), weights_only=True)
    except MemoryError:
        return "memory"
    except Exception as err:  # noqa: BLE001 - not data: a planted file, a partial write
        return f"unreadable: the observation could not be read as data ({type(err).__name__})"
    return observation_problem(obj) or "ok"


def _read_json(path: Path):
    try:
        return json.loads(limits.read_regular(path, 4 * 2**20))
    except (OSError, ValueError, RecursionError):
        return None


def _shm_entries() -> dict[str, int]:
    """/dev/shm's entries and their owners (empty where there is none)."""
    out = {}
    try:
        with os.scandir("/dev/shm") as it:
            for e in it:
                try:
                    out[e.name] = e.stat(follow_symlinks=False).st_uid
                except OSError:
                    continue
    except OSError:
        pass
    return out


_CONTAINMENT: list = []


def containment() -> tuple[bool, str]:
    """Whether this machine lets the grader run each program of a submission in its own user,
    mount and PID namespaces (``contain.py``), tried once per process; and why not."""
    if not _CONTAINMENT:
        if not sys.platform.startswith("linux"):
            _CONTAINMENT.append((False, "not Linux"))
        else:
            try:
                p = subprocess.run([sys.executable, str(CONTAIN), "--probe"], capture_output=True, text=True,
                                   timeout=60)
                _CONTAINMENT.append((p.returncode == 0, p.stdout.strip() or p.stderr.strip()[-300:]))
            except (OSError, subprocess.SubprocessError) as err:
                _CONTAINMENT.append((False, str(err)))
    return _CONTAINMENT[0]


def _release_package(dest: Path) -> dict[str, bytes]:
    """The student release's course_utils (no ``@answer``), as files: what a learner has, and so
    what the notebook run gets (the notebook run is not trusted; it must not hold answers)."""
    release_course_utils(PACKAGE_DIR, dest)
    files = _snapshot(dest)
    shutil.rmtree(dest, ignore_errors=True)
    return files


def _import_everything() -> None:
    """Import every course_utils module now, so that no judge imports a file later."""
    for mod in pkgutil.walk_packages([str(PACKAGE_DIR)], "course_utils."):
        if mod.name.endswith(("__main__",)):
            continue
        try:
            importlib.import_module(mod.name)
        except Exception:  # noqa: BLE001 - optional dependencies (ipywidgets, nbgrader)
            pass
