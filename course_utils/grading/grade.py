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
import contextlib
import csv
import io
import json
import multiprocessing.util
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ..checks import CourseError
from ..files import atomic_write, cannot_make, shown_path
from . import limits
from .grader import Grader, Options, Result, clip_text, containment
from .intake import clean, clean_text


# --------------------------------------------------------------------------------------------
# A class
# --------------------------------------------------------------------------------------------
def notebooks_in(paths: list[str]) -> list[Path]:
    """The notebooks to grade: each path given, and the ``*.ipynb`` of each folder (hidden files
    left out); a path that does not exist raises FileNotFoundError."""
    return [path for path, _root in submissions_in(paths)]


def submissions_in(paths: list[str]) -> list[tuple[Path, Path]]:
    """``notebooks_in``'s notebooks, each with its class folder: the folder given, or a file's own
    folder (a link in it is followed only to a file inside it)."""
    found: list[tuple[Path, Path]] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += [(q, p) for q in sorted(p.glob("*.ipynb")) if not q.name.startswith(".")]
        elif p.exists() or p.is_symlink():
            found.append((p, p.parent))
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    seen: set[str] = set()  # a file given twice (a folder and a file in it, two spellings): graded once
    return [(q, root) for q, root in found
            if not (os.path.abspath(q) in seen or seen.add(os.path.abspath(q)))]


def report_names(found: list[tuple[Path, Path]]) -> list[str]:
    """Each submission's name in the report: its path relative to the folder the class folders
    share (one folder: the file's name), so two ``01_alice.ipynb`` from two folders are two names."""
    if not found:
        return []
    base = os.path.commonpath([os.path.abspath(root) for _path, root in found])
    return [os.path.relpath(os.path.abspath(path), base) for path, _root in found]


def default_jobs(options: Options) -> tuple[int, str]:
    """How many submissions to grade at once, and why: one per core, as many as the memory
    allows (each may use ``--memory`` GiB, plus ~1 GiB for its worker); one where runs cannot be
    told apart (no Landlock: a disk edit must be blamed on the right submission; no namespaces:
    /dev/shm is shared by runs graded at the same time)."""
    if not options.landlock or limits.landlock_abi() < 1:
        return 1, "one at a time: without Landlock a change to the grader's files could not be blamed on one submission"
    if options.contain and not containment()[0]:
        return 1, "one at a time: without namespaces runs graded together would share /dev/shm"
    cores = _cores()
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 0
    by_memory = max(1, int(ram // ((options.memory_gib + 1) * 2**30))) if ram else cores
    n = max(1, min(cores, by_memory))
    return n, f"{n} at a time ({cores} cores, {ram / 2**30:.0f} GiB of memory, {options.memory_gib:g} GiB per submission)"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def class_seeds(notebooks: list[Path], options: Options) -> list[int | None]:
    """The inputs' seed of each submission: ``--seed`` if given; else one new seed per exercise for
    this class run (drawn now, after the submissions are in: no learner can know it, and the judge
    computes each reference once per worker); with ``seed_per_submission``, one per file."""
    if options.seed is not None:
        return [options.seed] * len(notebooks)
    if options.seed_per_submission:
        return [None] * len(notebooks)
    by_exercise: dict[str, int] = {}
    out: list[int | None] = []
    for nb in notebooks:
        m = re.match(r"(\d\d)_", nb.name)
        out.append(by_exercise.setdefault(m.group(1), secrets.randbelow(2**31)) if m else None)
    return out


_WORKER: list = []


def _worker_start(options: Options, workroot: str | None = None) -> None:
    limits.set_pdeathsig()  # a worker dies with the grader (and its runs with it: contain.py)
    _WORKER.append(Grader(options, workroot=workroot))
    # at the worker's exit: a pool's worker leaves through os._exit, which skips atexit's handlers
    multiprocessing.util.Finalize(_WORKER[0], _WORKER[0].close, exitpriority=10)


def _worker_grade(path: str, seed: int | None, name: str, root: str) -> Result:
    return _WORKER[0].grade(path, seed=seed, name=name, root=root)


def _failed(name: str, err: BaseException | str) -> Result:
    why = err if isinstance(err, str) else f"{type(err).__name__}: {clip_text(err, 300)}"
    return Result(clean_text(name), Path(name).name[:2], status="not graded",
                  notes=[clean_text(f"the grader failed on this file ({why}); grade it again alone, and report "
                                    "this if it persists")])


def _pool(jobs: int, options: Options, workroot: str):
    from concurrent.futures import ProcessPoolExecutor  # lazy: only a class graded in parallel needs it

    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_start, initargs=(options, workroot))


def _grade_in_pools(jobs: int, todo: list[int], args: list[tuple], options: Options, workroot: str,
                    results: list, bar) -> None:
    """Grade submissions ``todo`` (``args[i]``: path, seed, name, root) in a pool of ``jobs``
    workers; after a worker died (the machine's OOM killer), each submission left gets a fresh
    worker of its own, and one that kills that worker too is listed as not graded -- the
    grader's own process never grades it, so it can never take the class's report with it."""
    from concurrent.futures import as_completed  # lazy: as _pool
    from concurrent.futures.process import BrokenProcessPool  # lazy: as _pool

    def run(indices: list[int], n: int) -> bool:
        broken = False
        try:
            with _pool(n, options, workroot) as pool:
                futures = {pool.submit(_worker_grade, *args[i]): i for i in indices}
                for fut in as_completed(futures):
                    i = futures[fut]
                    try:
                        results[i] = fut.result()
                    except BrokenProcessPool:
                        broken = True
                        break
                    except Exception as err:  # noqa: BLE001 - the worker's own failure: this file's note
                        results[i] = _failed(args[i][2], err)
                    bar.update()
        except BrokenProcessPool:
            broken = True
        return broken

    run(todo, jobs)
    for i in [i for i in todo if results[i] is None]:
        if run([i], 1) and results[i] is None:
            results[i] = _failed(args[i][2], "its worker process died twice while grading it, most likely "
                                 "killed for memory by the system")
            bar.update()


def grade_many(paths: list[str], options: Options | None = None, progress: bool = True) -> list[Result]:
    """Grade every notebook under ``paths``: ``options.jobs`` at a time (default: ``default_jobs``),
    each worker a grader of its own (its imports and references computed once); every grader's
    working folder is inside one folder for the class, removed at the end."""
    from tqdm.auto import tqdm

    options = options or Options()
    found = submissions_in(paths)
    if not found:
        raise FileNotFoundError(f"no notebooks (*.ipynb) in {', '.join(paths)}")
    notebooks = [path for path, _root in found]
    seeds = class_seeds(notebooks, options)
    args = [(str(path), seed, name, str(root))
            for (path, root), seed, name in zip(found, seeds, report_names(found), strict=True)]
    jobs = min(options.jobs or default_jobs(options)[0], len(notebooks))
    if jobs > 1 and options.threads is None:
        options = replace(options, threads=max(1, _cores() // jobs))
    bar = tqdm(total=len(notebooks), desc="grading", unit="notebook", disable=not progress)
    results: list[Result | None] = [None] * len(notebooks)
    workroot = tempfile.mkdtemp(prefix="course-grader-class-")
    try:
        if jobs > 1:
            _grade_in_pools(jobs, list(range(len(notebooks))), args, options, workroot, results, bar)
        else:
            grader = Grader(options, workroot=workroot)
            try:
                for i, (path, seed, name, root) in enumerate(args):
                    try:
                        results[i] = grader.grade(path, seed=seed, name=name, root=root)
                    except Exception as err:  # noqa: BLE001 - grade() notes its own failures; a last resort
                        results[i] = _failed(name, err)
                    bar.update()
            finally:
                grader.close()
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
        bar.close()
    return [r for r in results if r is not None]


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
    """Write the class report to ``path`` (whole or not at all): one row per submission with its
    score, the parts it failed and why, the grader's notes and the inputs' seed."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for r in results:
        failed = [f"{p['name']}: {p['message']}" for p in r.parts if p["score"] < p["points"]]
        w.writerow(clean([r.submission, r.exercise, r.status, r.score, r.max_score, r.percent,
                          " | ".join(failed), " | ".join(r.notes), r.seed]))
    atomic_write(path, buf.getvalue())


def write_json(results: list[Result], path: str | Path) -> None:
    """Write every detail of the class run to ``path`` (whole or not at all)."""
    atomic_write(path, json.dumps([clean(r.as_dict()) for r in results], indent=2))



def _prepare_output(path: str | None, what: str) -> Path | None:
    """Create the output's folder now (before grading), or fail with a clear message (CourseError)."""
    if path is None:
        return None
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a"):
            pass
    except OSError as err:
        raise CourseError(f"--{what} {shown_path(path)}: cannot write there ({err.strerror}).",
                          f"give a file in a folder you can write, e.g. --{what} results/class.{what}") from None
    return p


def _check_paths(paths: list[str]) -> list[Path]:
    """The submissions ``paths`` name (``notebooks_in``), each path checked first: it exists and
    can be read; CourseError otherwise, and when not one is a notebook (``*.ipynb``). A file that
    is not a notebook, given beside notebooks, stays a submission: the grader notes it."""
    fix = "give notebooks named NN_name.ipynb, or the folders they are in"
    for path in paths:
        if not path.strip() or "\0" in path:
            raise CourseError(f"PATH {shown_path(path)} is {'empty' if not path.strip() else 'not a path (a NUL)'}.", fix)
        try:
            os.lstat(path)  # a link that leads nowhere is a submission: the grader notes it
        except (FileNotFoundError, NotADirectoryError):
            raise CourseError(f"{shown_path(path)}: no such file or folder.", f"check the path; {fix}") from None
        except OSError as err:
            raise CourseError(f"{shown_path(path)}: cannot be read ({err.strerror}).", fix) from None
    notebooks = notebooks_in(paths)  # a stray file beside the notebooks (a CSV in the glob) is noted, not graded
    if not any(p.name.endswith(".ipynb") for p in notebooks):
        raise CourseError(f"no notebooks (*.ipynb) in {shown_path(', '.join(paths))}: nothing to grade.", fix)
    return notebooks


def _checked_arguments(args: argparse.Namespace) -> tuple[Options, Path | None, Path | None]:
    """``main``'s arguments checked before any work -- the limits (``Options``), the reports'
    files, ``--keep``, the submissions -- then the reports' folders made: (the options, the
    CSV's path, the JSON's path), or CourseError naming the argument and the fix."""
    opts = Options(cell_timeout=args.timeout, total_timeout=args.total_timeout,
                   check_timeout=args.check_timeout, memory_gib=args.memory,
                   max_output_mib=args.max_output, seed=args.seed, keep=args.keep,
                   landlock=not args.no_landlock, contain=not args.no_namespaces, disk_gib=args.disk,
                   jobs=args.jobs, seed_per_submission=args.seed_per_submission)
    outputs = {what: path for what, path in (("csv", args.csv), ("json", args.json)) if path is not None}
    for what, path in outputs.items():
        problem = cannot_make(path, folder=False)
        if problem:
            raise CourseError(f"--{what} {shown_path(path)}: cannot write there ({problem}).",
                              f"give a file in a folder you can write, e.g. --{what} results/class.{what}")
    if len({os.path.realpath(p) for p in outputs.values()}) < len(outputs):
        raise CourseError(f"--csv and --json are the same file ({shown_path(args.csv)}).",
                          "give each its own file, e.g. --csv class.csv --json class.json")
    if args.keep is not None:
        problem = cannot_make(args.keep, folder=True)
        if problem:
            raise CourseError(f"--keep {shown_path(args.keep)}: cannot keep the scratch folders there ({problem}).",
                              "give a folder you can write (made if new), e.g. --keep build/scratch")
    notebooks = {os.path.realpath(p) for p in _check_paths(args.paths)}
    for what, path in outputs.items():
        if os.path.realpath(path) in notebooks:
            raise CourseError(f"--{what} {shown_path(path)} is a submission: the report would replace it.",
                              f"give a new file, e.g. --{what} results/class.{what}")
    return opts, _prepare_output(args.csv, "csv"), _prepare_output(args.json, "json")


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils.grading.grade PATH...``: grade every notebook, print the summary and
    how runs were confined, write ``--json`` / ``--csv``; returns 0, or 2 on a wrong argument
    (refused before any work, one line naming the fix)."""
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
    ap.add_argument("--no-namespaces", action="store_true",
                    help="do not run submissions in their own PID namespace and /dev/shm even where possible")
    ap.add_argument("--disk", type=float, default=2.0, help="GiB of files one run may write (default 2)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="submissions graded at once (default: one per core, as memory allows; 1 without "
                         "Landlock or namespaces)")
    ap.add_argument("--seed-per-submission", action="store_true",
                    help="a new inputs' seed for every submission (default: one per exercise per class run)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    try:
        opts, csv_path, json_path = _checked_arguments(args)
    except CourseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    jobs, why = (opts.jobs, f"{opts.jobs} at a time (--jobs)") if opts.jobs else default_jobs(opts)
    with contextlib.suppress(AttributeError, ValueError):  # a terminal that cannot show a learner's script
        sys.stdout.reconfigure(errors="backslashreplace")
    t0 = time.monotonic()
    results = grade_many(args.paths, opts, progress=not args.no_progress)
    if json_path:  # the reports first: nothing printed after can cost the class its results
        write_json(results, json_path)
    if csv_path:
        write_csv(results, csv_path)
    print(clean_text(summary(results)))
    abi = limits.landlock_abi() if opts.landlock else 0
    contained, how = containment() if opts.contain else (False, "switched off")
    print(f"sandbox: {'Landlock ABI ' + str(abi) if abi else 'no Landlock (see docs/teaching.md)'}; processes: "
          + ("each run in its own PID namespace and /dev/shm" if contained else
             f"subreaper sweep, shared /dev/shm swept after each run (namespaces: {how})")
          + f"; {why}; {len(results)} notebook(s) in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
