"""What the kit leaves in its output folder, kept within what a GPU call can return, and what a
later run reads back to resume. Python's standard library only.

The output folder holds at most these files, each rewritten whole (a temporary file, then a
rename) the moment a task ends, so that a call cut short returns a consistent set:

* ``kit.json``          -- the machine, the plan and every task's record (``budget.Record``);
* ``summary.md``        -- the same for a reader;
* ``kit.log``           -- everything the kit and its commands printed (cut at ``LOG_BYTES``);
* ``recorded.json``     -- the figures the notebooks and the kit recorded (``recorded.collect``'s form);
* ``details.tar.gz``    -- the long results: the benchmark's files, every op of the diagnosis,
  the tests' JUnit XML;
* ``notebooks.tar.gz``  -- every notebook as executed, with each cell's time and outcome.

``LIMITS`` are a GPU call's return limits (8 files of 16 MiB, 64 MiB in all, two folders deep,
names of letters, digits, '.', '_' and '-'); ``check_limits`` lists what breaks them, and
``pack`` drops images from the largest notebooks until an archive fits.

Resume: a run's folder, imported into ``docs/gpu-runs/<run>/`` (``importer``), keeps its
``kit.json``; ``completed`` reads those of every recorded run and names the tasks done, which a
later run skips.
"""

from __future__ import annotations

import io
import json
import math
import re
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..checks import RecordError, guard
from ..files import atomic_write, read_json, skipped, write_error
from .budget import COMPLETE

MiB = 2**20
STATE, SUMMARY, LOG, RECORDED = "kit.json", "summary.md", "kit.log", "recorded.json"
DETAILS, NOTEBOOKS = "details.tar.gz", "notebooks.tar.gz"
OUTPUTS = (STATE, SUMMARY, LOG, RECORDED, DETAILS, NOTEBOOKS)
LOG_BYTES = 8 * MiB
RUNS = Path(__file__).resolve().parent.parent.parent / "docs" / "gpu-runs"


@dataclass(frozen=True)
class Limits:
    """What one GPU call returns from its output folder (the device tool's README)."""

    files: int = 8
    file_bytes: int = 16 * MiB
    total_bytes: int = 64 * MiB
    depth: int = 2  # folders below the output folder: OUT/a/b/file comes back, OUT/a/b/c/file does not
    name: str = r"[A-Za-z0-9._-]+"


LIMITS = Limits()


def check_limits(out: Path, limits: Limits = LIMITS) -> list[str]:
    """What in ``out`` a GPU call would not return whole, one line each ([] if all of it)."""
    files = [p for p in sorted(out.rglob("*")) if p.is_file() or p.is_symlink()]
    problems = []
    if len(files) > limits.files:
        problems.append(f"{len(files)} files, at most {limits.files} come back")
    total = 0
    for p in files:
        rel = p.relative_to(out)
        size = p.lstat().st_size
        total += size
        if p.is_symlink() or not p.is_file():
            problems.append(f"{rel}: not a plain file")
        if size > limits.file_bytes:
            problems.append(f"{rel}: {size / MiB:.1f} MiB, at most {limits.file_bytes / MiB:.0f} MiB")
        if len(rel.parts) - 1 > limits.depth:
            problems.append(f"{rel}: {len(rel.parts) - 1} folders deep, at most {limits.depth}")
        if any(not re.fullmatch(limits.name, part) for part in rel.parts):
            problems.append(f"{rel}: a name with characters other than letters, digits, '.', '_', '-'")
    if total > limits.total_bytes:
        problems.append(f"{total / MiB:.1f} MiB in all, at most {limits.total_bytes / MiB:.0f} MiB")
    return problems


class Log:
    """The kit's log: each line printed and appended to ``path``, which stops growing at
    ``limit`` bytes (one last line says so) so that it always comes back."""

    def __init__(self, path: Path, limit: int = LOG_BYTES, echo: bool = True):
        self.path, self.limit, self.echo = path, limit, echo
        self.stream = sys.stdout  # where it echoes: the output of the call, even while a task's prints are teed
        path.parent.mkdir(parents=True, exist_ok=True)
        self.size = path.stat().st_size if path.exists() else 0
        self.full = False

    def write(self, text: str, echo: bool | None = None) -> None:
        if self.echo if echo is None else echo:
            self.stream.write(text)
            self.stream.flush()
        if self.full:
            return
        data = text.encode(errors="replace")
        if self.size + len(data) > self.limit - 200:
            data = data[: max(0, self.limit - 200 - self.size)] + b"\n[kit.log cut here: its size limit]\n"
            self.full = True
        try:
            with open(self.path, "ab") as f:
                f.write(data)
        except OSError as err:  # a full disk: the kit goes on, saying so where it echoes
            self.full = True
            self.stream.write(f"[gpu kit] {write_error(self.path, err)} The log stops here; the run goes on.\n")
            return
        self.size += len(data)

    def __call__(self, msg: str) -> None:
        self.write(f"[gpu kit {time.strftime('%H:%M:%S')}] {msg}\n")


def _strip_images(nb_bytes: bytes) -> bytes:
    """A notebook's JSON with every image output replaced by a line saying so."""
    nb = json.loads(nb_bytes)
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            for mime in [m for m in data if m.startswith("image/")]:
                del data[mime]
                data.setdefault("text/plain", f"[{mime} left out: the GPU call's file size limit]")
    return json.dumps(nb, indent=1).encode()


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pack(path: Path, members: dict[str, bytes], limit: int = LIMITS.file_bytes) -> list[str]:
    """Write the archive ``path`` (name -> bytes) atomically, within ``limit`` bytes: while it is
    too large, the largest notebook (``.ipynb``) loses its images; then, if still too large, the
    largest members are left out. Returns what was dropped, one line each."""
    members, dropped = dict(members), []
    data = _tar(members)
    stripped: set[str] = set()
    while len(data) > limit:
        notebooks = [n for n in members if n.endswith(".ipynb") and n not in stripped]
        if notebooks:
            name = max(notebooks, key=lambda n: len(members[n]))
            members[name] = _strip_images(members[name])
            stripped.add(name)
            dropped.append(f"{name}: images left out")
        else:
            name = max(members, key=lambda n: len(members[n]))
            del members[name]
            dropped.append(f"{name}: left out ({len(members) + 1} members did not fit {limit / MiB:.0f} MiB)")
        data = _tar(members)
    atomic_write(path, data)
    return dropped


# --------------------------------------------------------------------------------------------
# Recorded runs: what a later run skips, and how long each task took
# --------------------------------------------------------------------------------------------
def _task_ok(t: Any) -> bool:
    seconds = t.get("seconds", 0) if isinstance(t, dict) else None
    return (isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(seconds, (int, float))
            and not isinstance(seconds, bool) and math.isfinite(seconds) and seconds >= 0)


def recordings(folder: Path = RUNS) -> list[tuple[str, dict[str, Any]]]:
    """``(run name, kit.json)`` of every recorded run under ``folder``, oldest first. A file that
    cannot be read is skipped with a warning that names it and the fix (``files.SkippedFile``)."""
    runs = []
    for path in sorted(folder.glob(f"*/{STATE}")):
        fix = f"restore {path} from git (`git checkout -- {path}`), or delete it to run its tasks again"
        try:
            state = read_json(path, "a kit recording (kit.json)", fix)
            tasks = state.get("tasks")
            if not isinstance(state.get("machine"), dict) or not isinstance(tasks, list) or not all(map(_task_ok, tasks)):
                raise RecordError(f"{path} is not a readable kit recording: it needs the machine and its tasks "
                                  "(a list of objects, each with its name and seconds, a number >= 0).", fix)
        except RecordError as err:
            skipped(err)
            continue
        runs.append((path.parent.name, state))
    return sorted(runs, key=lambda r: (str(r[1].get("started", "")), r[0]))


def _same_kind(runs: list[tuple[str, dict[str, Any]]], dry_run: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(run name, task record)`` of every task of the runs of the same kind (a dry run on a CPU
    never stands for a GPU's), oldest run first."""
    for name, state in runs:
        if bool(state.get("dry_run")) == dry_run:
            for t in state["tasks"]:
                yield name, t


def completed(runs: list[tuple[str, dict[str, Any]]], dry_run: bool) -> dict[str, str]:
    """task -> the run that completed it (``budget.COMPLETE``), among runs of the same kind."""
    return {t["name"]: name for name, t in _same_kind(runs, dry_run) if t.get("status") in COMPLETE}


def failed_before(runs: list[tuple[str, dict[str, Any]]], dry_run: bool) -> set[str]:
    """Tasks a recorded run of the same kind started and did not complete (failed, error, cut)."""
    tried = {t["name"]: t.get("status") for _, t in _same_kind(runs, dry_run)
             if t.get("seconds", 0) > 0 or t.get("status") in COMPLETE}
    return {n for n, status in tried.items() if status not in COMPLETE}


def measured_seconds(runs: list[tuple[str, dict[str, Any]]], dry_run: bool) -> dict[str, float]:
    """task -> its seconds in the newest run of the same kind that completed it."""
    return {t["name"]: float(t["seconds"]) for _, t in _same_kind(runs, dry_run) if t.get("status") in COMPLETE}

# --------------------------------------------------------------------------------------------
# Figures that several runs (or tasks) each measure a part of
# --------------------------------------------------------------------------------------------
def ratio_figure(by_net: dict[str, dict[str, float]]) -> dict[str, Any]:
    """``gpu/reserved_over_allocated`` (what ``budget.overheads`` reads: ``max``) from each
    net's benchmark rows: the largest ratio over the nets, and each net's own."""
    return {"max": max(v["max"] for v in by_net.values()),
            "median": sorted(v["median"] for v in by_net.values())[len(by_net) // 2],
            "by net": dict(sorted(by_net.items()))}


#: key -> how a new recording of it merges with an older one (others: the new one replaces it)
_MERGE = {
    "gpu/notebook_seconds": lambda old, new: {**old, **new},
    "gpu/reserved_over_allocated": lambda old, new: ratio_figure({**old.get("by net", {}), **new.get("by net", {})}),
}


def merge_figures(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Two recordings' figures (``{key: {"kind", "data"}}``) as one: a figure in both is the
    new one, except those ``_MERGE`` combines (notebooks' seconds from two windows, say)."""
    out = {**old, **new}
    for key, merge in _MERGE.items():
        if key in old and key in new and old[key].get("kind") == new[key].get("kind") == "json":
            out[key] = {**new[key], "data": merge(old[key]["data"], new[key]["data"])}
    return out


guard(globals(), RecordError)
