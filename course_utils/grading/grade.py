"""Grade a class: ``python -m course_utils.grading.grade PATH... [--csv F] [--json F]``.

PATH is a notebook or a folder of them, named with the exercise's number first
(``01_alice.ipynb``). For each submission, one at a time:

1. **the notebook run** -- the notebook runs top to bottom in a fresh kernel, in a scratch folder
   with its own copy of ``course_utils``, under the submission's limits (time per cell, total
   time, memory, output, Landlock where available). It only reports which cells raised, looped
   or killed the kernel; nothing it prints or computes is trusted;
2. **the sandbox** -- a fresh process rebuilds the graded functions and classes from the
   notebook's *file* (definitions only), with a copy of ``course_utils`` from which this
   exercise's answers and every reference are removed, and runs them on the parts' inputs; it
   saves what it observed as data;
3. **the judge** -- this process, which never runs learner code, recomputes each part's reference
   with the ``course_utils`` it imported before the first submission ran, and compares.

Every process a submission started is killed before its result is recorded (the grader adopts
orphans: ``PR_SET_CHILD_SUBREAPER``); the teacher's ``course_utils`` files are checked after each
submission and restored if a submission changed them (0 points, "tampering"). One submission
never stops the class: every failure becomes a note on its row.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
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

from . import limits
from .core import PartResult, Raised
from .registry import MODULES, load_all
from .strip import strip_source

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the teacher's course_utils
NOTE_TEXT = 2000  # characters kept from a learner-controlled text in a note


@dataclass
class Options:
    cell_timeout: float = 120.0  # seconds per cell of the notebook run
    total_timeout: float | None = None  # seconds for the whole notebook run (default 10 x cell, >= 600)
    check_timeout: float = 300.0  # seconds per graded part in the sandbox
    memory_gib: float = 4.0  # per process, and for all of a submission's processes together
    max_output_mib: float = 8.0  # output of the notebook run before it is interrupted
    seed: int | None = None  # None: a new random seed per submission
    keep: str | None = None  # keep the scratch folders here (debugging)
    grace: float = 5.0  # seconds after an interrupt before the kernel is killed
    landlock: bool = True  # False: no filesystem sandbox even where Landlock exists (tests, debugging)

    def __post_init__(self):
        for name in ("cell_timeout", "check_timeout", "memory_gib", "max_output_mib"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.total_timeout is None:
            self.total_timeout = max(600.0, 10 * self.cell_timeout)
        if not self.total_timeout > 0:
            raise ValueError(f"total-timeout must be > 0, got {self.total_timeout}")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)


@dataclass
class Result:
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
    seconds: dict = field(default_factory=dict)  # where the time went

    @property
    def percent(self) -> float:
        return round(100 * self.score / self.max_score, 1) if self.max_score else 0.0

    def as_dict(self) -> dict:
        return dict(asdict(self), percent=self.percent)


def exercise_id(path: Path) -> str:
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


def _clip(text: str, n: int = NOTE_TEXT) -> str:
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

    def __init__(self, options: Options | None = None):
        self.opts = options or Options()
        self.exercises = load_all()
        _import_everything()
        self.package = _snapshot(PACKAGE_DIR)
        self._libs: dict[str, dict[str, bytes]] = {}
        self.workdir = Path(tempfile.mkdtemp(prefix="course-grader-"))
        os.chmod(self.workdir, 0o700)
        self.count = 0

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
        env.update(extra or {})
        return env

    # -- one submission ---------------------------------------------------------------------------
    def grade(self, path: str | Path) -> Result:
        path = Path(path)
        t0 = time.monotonic()
        try:
            nn_id = exercise_id(path)
        except ValueError as err:
            return Result(path.name, "?", status="not graded", notes=[str(err)])
        ex = self.exercises[nn_id]
        seed = self.opts.seed if self.opts.seed is not None else secrets.randbelow(2**31)
        result = Result(path.name, nn_id, ex.title, max_score=ex.max_score, seed=seed,
                        parts=[_unchecked(p) for p in ex.parts])
        try:
            data = path.read_bytes()
            import nbformat

            nbformat.reads(data.decode(), as_version=4)
        except Exception as err:  # noqa: BLE001 - not a notebook at all
            result.notes.append(f"unreadable notebook: {type(err).__name__}: {_clip(err, 300)}")
            for p in result.parts:
                p["message"] = "not checked: the file is not a readable notebook"
            return result
        with limits.subreaper():  # only while a submission runs: see limits.subreaper
            return self._grade(path, nn_id, data, seed, result, t0)

    def _grade(self, path: Path, nn_id: str, data: bytes, seed: int, result: Result, t0: float) -> Result:
        self.count += 1
        scratch = self.workdir / f"sub-{self.count:04d}"
        scratch.mkdir()
        before = limits.descendants()
        try:
            self._run_notebook(path.name, data, scratch, before, result)
            self._guard(before, result)
            t1 = time.monotonic()
            observations = self._observe(nn_id, data, scratch, seed, before, result)
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

        def limit():  # runs in the child before exec
            limits.apply_rlimits(mem, 2**30)

        with open(log, "wb") as err:
            return subprocess.Popen([sys.executable, *args], cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                                    stdout=stdout, stderr=err, start_new_session=True, preexec_fn=limit)

    def _wait(self, proc, before: set[int], deadline: float, poll=None) -> str | None:
        """Wait for ``proc``; returns None, "timeout" or "memory" (and then kills it all)."""
        while proc.poll() is None:
            if time.monotonic() > deadline:
                self._kill(proc, before)
                return "timeout"
            if limits.tree_rss(limits.descendants() - before) > self.opts.memory_bytes:
                self._kill(proc, before)
                return "memory"
            if poll is not None and poll():
                self._kill(proc, before)
                return "part timeout"
            time.sleep(0.2)
        return None

    @staticmethod
    def _kill(proc, before: set[int]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        limits.kill_new_descendants(before)
        proc.wait()

    def _run_notebook(self, name: str, data: bytes, scratch: Path, before: set[int], result: Result) -> None:
        import ast

        work, lib = scratch / "work", scratch / "lib"
        work.mkdir()
        (work / name).write_bytes(data)
        _write_tree(self.package, lib / "course_utils")
        preimport = {"torch", "course_utils"}
        import nbformat

        from .notebook_code import code_cells

        cells = code_cells(nbformat.reads(data.decode(), as_version=4))
        for cell in cells:
            try:
                tree = ast.parse(cell.python)
            except SyntaxError:
                continue
            for stmt in tree.body:
                if isinstance(stmt, ast.Import):
                    preimport.update(a.name for a in stmt.names)
                elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                    preimport.add(stmt.module)
        limits_spec = {"scratch": str(scratch), "memory_bytes": self.opts.memory_bytes, "file_bytes": 2**30,
                       "preimport": sorted(preimport), "landlock": self.opts.landlock,
                       "max_output": int(self.opts.max_output_mib * 2**20)}
        (scratch / "kernel.json").write_text(json.dumps(limits_spec))
        kdir = scratch / "jupyter" / "kernels" / "course-grader"
        kdir.mkdir(parents=True)
        (kdir / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "course_utils.grading.kernel_launch", str(scratch / "kernel.json"),
                     "-f", "{connection_file}"],
            "display_name": "course grader", "language": "python", "interrupt_mode": "signal"}))
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
            why = self._wait(proc, before, time.monotonic() + self.opts.total_timeout)
        lines = out_path.read_bytes()[-2_000_000:].decode(errors="replace").splitlines()
        out_path.unlink()
        report = None
        started = None
        for line in lines:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "start" in msg:
                started = msg["start"]
            elif "cells" in msg:
                report = msg
        at = next((f" in code cell {c.number}" for c in cells if c.index == started), "") if started is not None else ""
        if why == "timeout":
            result.notes.append(f"the notebook run passed the total time limit ({self.opts.total_timeout:.0f} s) "
                                f"and was stopped{at}")
        elif why == "memory":
            result.notes.append(f"the notebook run used more than {self.opts.memory_gib:g} GiB (all its "
                                f"processes together) and was stopped{at}")
        if report is None:
            if why is None:
                result.notes.append("the notebook run ended without a report (see runner.log with --keep)")
            return
        result.cells = report["cells"]
        result.seconds.update({f"kernel {k}": v for k, v in report.get("seconds", {}).items()})
        if report.get("error"):
            result.notes.append(f"the notebook could not run: {_clip(report['error'], 500)}")
        for cell in report["cells"]:
            status, where = cell["status"], _cell_name(cell)
            if status == "error":
                result.notes.append(f"{where} raised {cell.get('ename')}: {_clip(cell.get('evalue', ''))}")
            elif status == "timeout":
                result.notes.append(f"{where} ran past the {self.opts.cell_timeout:g} s cell limit and was "
                                    "interrupted")
            elif status == "flood":
                result.notes.append(f"{where} printed more than {self.opts.max_output_mib:g} MiB and was "
                                    "interrupted (outputs are not kept)")
            elif status == "killed":
                result.notes.append(f"{where} did not stop when interrupted (a bare `except:` around a loop?): "
                                    f"its kernel was killed after {self.opts.cell_timeout + self.opts.grace:g} s; "
                                    "later cells did not run")
            elif status == "died":
                code = report.get("kernel_exit")
                how = f" (exit code {code})" if isinstance(code, int) and code >= 0 else \
                    f" (signal {-code})" if isinstance(code, int) else ""
                result.notes.append(f"the kernel died in {where}{how}; later cells did not run")

    def _observe(self, nn_id: str, data: bytes, scratch: Path, seed: int, before: set[int],
                 result: Result) -> dict:
        """Run the sandbox for every part (a new one after a part that hung or crashed)."""
        ex = self.exercises[nn_id]
        sb = scratch / "sandbox"
        sb.mkdir()
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

            def part_overdue():
                current = [k for k in remaining if (obs / f"{k}.started").exists()
                           and not (obs / f"{k}.pt").exists()]
                if not current:
                    return time.monotonic() - started_at > 180  # startup: imports and definitions
                return time.time() - (obs / f"{current[-1]}.started").stat().st_mtime > self.opts.check_timeout

            why = self._wait(proc, before, float("inf"), poll=part_overdue)
            code = proc.returncode
            done = [k for k in remaining if (obs / f"{k}.pt").exists()]
            for k in done:
                observations[k] = _load_observation(obs / f"{k}.pt")
            after = [k for k in remaining if k not in done]
            if not after:
                break
            culprit = next((k for k in after if (obs / f"{k}.started").exists()), None)
            if culprit is None:  # died before any part started: while rebuilding the definitions
                reason = {"part timeout": "took more than 180 s to start (imports, definitions)",
                          "memory": f"used more than {self.opts.memory_gib:g} GiB"}.get(
                    why, f"ended ({_exit(code)}) while rebuilding the notebook's definitions")
                for k in after:
                    observations[k] = Raised("Crashed", f"not checked: the grading process {reason}",
                                             "crashed").to_data()
                break
            reason = {"part timeout": f"took more than {self.opts.check_timeout:g} s and was stopped",
                      "memory": f"used more than {self.opts.memory_gib:g} GiB and was stopped"}.get(
                why, f"ended the grading process ({_exit(code)})")
            observations[culprit] = Raised("Crashed", f"your code {reason} while this part was checked",
                                           "timeout" if why else "crashed").to_data()
            remaining = after[after.index(culprit) + 1:]
        info = _read_json(obs / "_rebuild.json")
        if isinstance(info, dict):
            result.sources = {str(k): _clip(v, 20_000) for k, v in dict(info.get("sources", {})).items()}
            for problem in list(info.get("problems", []))[:10]:
                result.notes.append(f"rebuilding the graded code: {_clip(problem, 500)}")
        return observations

    def _judge(self, nn_id: str, observations: dict, seed: int, result: Result) -> None:
        ex = self.exercises[nn_id]
        parts = []
        for p in ex.parts:
            if p.key not in observations:
                parts.append(_unchecked(p))
                continue
            parts.append(ex.judge(p.key, observations[p.key], seed).as_dict())
        result.parts = parts
        result.score = sum(p["score"] for p in parts)


def _unchecked(part) -> dict:
    """A part's entry before (or without) its judgement."""
    return PartResult(part.key, part.name, part.points, message="not checked").as_dict()


def _exit(code) -> str:
    if code is None:
        return "still running"
    return f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"signal {-code}"


def _load_observation(path: Path):
    import torch

    try:
        if path.stat().st_size > 256 * 2**20:
            raise ValueError("too large")
        return torch.load(io.BytesIO(path.read_bytes()), weights_only=True)
    except Exception as err:  # noqa: BLE001 - not data: a planted file, a partial write
        return Raised("Unreadable", f"the observation could not be read as data ({type(err).__name__})",
                      "crashed").to_data()


def _read_json(path: Path):
    try:
        if path.stat().st_size > 4 * 2**20:
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _import_everything() -> None:
    """Import every course_utils module now, so that no judge imports a file later."""
    import importlib
    import pkgutil

    import course_utils

    for mod in pkgutil.walk_packages(course_utils.__path__, "course_utils."):
        if mod.name.endswith(("__main__",)):
            continue
        try:
            importlib.import_module(mod.name)
        except Exception:  # noqa: BLE001 - optional dependencies (ipywidgets, nbgrader)
            pass


# --------------------------------------------------------------------------------------------
# A class
# --------------------------------------------------------------------------------------------
def notebooks_in(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.glob("*.ipynb") if not q.name.startswith("."))
        elif p.exists():
            found.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return found


def grade_many(paths: list[str], options: Options | None = None, progress: bool = True) -> list[Result]:
    from tqdm.auto import tqdm

    notebooks = notebooks_in(paths)
    if not notebooks:
        raise FileNotFoundError(f"no notebooks (*.ipynb) in {', '.join(paths)}")
    grader = Grader(options)
    results = []
    try:
        for nb in tqdm(notebooks, desc="grading", unit="notebook", disable=not progress):
            results.append(grader.grade(nb))
    finally:
        shutil.rmtree(grader.workdir, ignore_errors=True)
    return results


def summary(results: list[Result], width: int = 160) -> str:
    """The class table: one line per graded submission, the mean per exercise, then the files
    that could not be graded."""
    graded = [r for r in results if r.status == "graded"]
    lines = [f"{'submission':<34} {'ex':>3} {'score':>9} {'%':>6}  notes"]
    for r in graded:
        failed = [p["name"] for p in r.parts if p["score"] < p["points"]]
        note = "; ".join(r.notes) or (f"failed: {'; '.join(failed)}" if failed else "all parts pass")
        line = f"{r.submission:<34} {r.exercise:>3} {r.score:>4}/{r.max_score:<4} {r.percent:>6.1f}  {note}"
        lines.append(line if len(line) <= width else line[:width - 26] + " [...] (full in CSV/JSON)")
    by_ex: dict[str, list[Result]] = {}
    for r in graded:
        by_ex.setdefault(r.exercise, []).append(r)
    for ex_id, rs in sorted(by_ex.items()):
        mean = sum(r.percent for r in rs) / len(rs)
        lines.append(f"exercise {ex_id} ({rs[0].title}): {len(rs)} submission(s), mean {mean:.1f} %")
    skipped = [r for r in results if r.status != "graded"]
    if skipped:
        lines.append(f"not graded ({len(skipped)}):")
        lines += [f"  {r.submission}: {'; '.join(r.notes)}" for r in skipped]
    return "\n".join(lines)


CSV_COLUMNS = ["submission", "exercise", "status", "score", "max_score", "percent", "failed_parts", "notes", "seed"]


def write_csv(results: list[Result], path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in results:
            failed = [f"{p['name']}: {p['message']}" for p in r.parts if p["score"] < p["points"]]
            w.writerow([r.submission, r.exercise, r.status, r.score, r.max_score, r.percent,
                        " | ".join(failed), " | ".join(r.notes), r.seed])


def _prepare_output(path: str | None, what: str) -> Path | None:
    """Create the output's folder now (before grading), or fail with a clear message."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--{what} {path} is a folder: give a file name, e.g. {p / ('class.' + what)}")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a"):
            pass
    except OSError as err:
        raise ValueError(f"--{what} {path}: cannot write there ({err.strerror})") from None
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course_utils.grading.grade",
                                 description="Grade exercise notebooks (a class folder).")
    ap.add_argument("paths", nargs="+", help="notebooks or folders of notebooks (NN_name.ipynb)")
    ap.add_argument("--json", help="write every detail here (folders are created)")
    ap.add_argument("--csv", help="write the class report here (folders are created)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per cell of the notebook run (default 120)")
    ap.add_argument("--total-timeout", type=float, default=None,
                    help="seconds for a whole notebook run (default 10 x --timeout, at least 600)")
    ap.add_argument("--check-timeout", type=float, default=300, help="seconds per graded part (default 300)")
    ap.add_argument("--memory", type=float, default=4.0, help="GiB per submission (default 4)")
    ap.add_argument("--max-output", type=float, default=8.0, help="MiB a notebook may print (default 8)")
    ap.add_argument("--seed", type=int, default=None, help="inputs' seed (default: a new one per submission)")
    ap.add_argument("--keep", help="keep each submission's scratch folder here (debugging)")
    ap.add_argument("--no-landlock", action="store_true",
                    help="do not confine submissions with Landlock even where the kernel has it")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    try:
        opts = Options(cell_timeout=args.timeout, total_timeout=args.total_timeout,
                       check_timeout=args.check_timeout, memory_gib=args.memory,
                       max_output_mib=args.max_output, seed=args.seed, keep=args.keep,
                       landlock=not args.no_landlock)
        csv_path, json_path = _prepare_output(args.csv, "csv"), _prepare_output(args.json, "json")
        notebooks = notebooks_in(args.paths)
        if not notebooks:
            raise FileNotFoundError(f"no notebooks (*.ipynb) in {', '.join(args.paths)}: nothing to grade")
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = grade_many([str(n) for n in notebooks], opts, progress=not args.no_progress)
    print(summary(results))
    abi = limits.landlock_abi() if opts.landlock else 0
    print(f"sandbox: {'Landlock ABI ' + str(abi) if abi else 'no Landlock (see docs/teaching.md)'}"
          f"; process cleanup: {'subreaper' if sys.platform.startswith('linux') else 'process groups'}")
    if json_path:
        json_path.write_text(json.dumps([r.as_dict() for r in results], indent=2))
    if csv_path:
        write_csv(results, csv_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
