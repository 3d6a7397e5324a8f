"""Bringing a run home: the files a GPU call returned, put where the repository keeps them.

    python -m course_utils.gpu_report --import FILES_AT

* ``docs/gpu-runs/<date>-<gpu>/`` -- ``kit.json`` (what a later run reads to resume), ``summary.md``,
  ``kit.log``, the details unpacked into ``details/`` and the executed notebooks into ``notebooks/``
  (a name taken already gets ``-2``, ``-3``...);
* ``recorded/<gpu>.json`` -- the figures recorded, merged into what that GPU recorded before
  (a figure recorded again replaces the old one);
* ``benchmarks/results/<gpu>.json`` (and ``.md``, ``.png``) -- the benchmark's rows, merged by net.

Then ``python -m course_utils.readme`` renders README's and docs' tables from them. A dry run's files go to
``docs/gpu-runs/`` only (a CPU's figures are no GPU's).
"""

from __future__ import annotations

import json
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Any

from ..checks import RecordError, guard
from ..files import atomic_write, read_json
from .. import benchmark, recorded
from . import record
from .plan import ROOT, slug


class NotARun(RecordError):
    """The files cannot be imported; the message names the file and the fix."""


def _members(archive: Path) -> dict[str, bytes]:
    """The regular files of ``archive`` (name -> bytes; no absolute paths, no '..', no links),
    read whole before anything is written; NotARun naming the archive if it cannot be read."""
    members = {}
    try:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if not member.isfile() or member.name.startswith("/") or ".." in parts:
                    continue
                with tar.extractfile(member) as src:
                    members[Path(*parts).as_posix()] = src.read()
    except (OSError, tarfile.TarError, EOFError, zlib.error) as err:
        raise NotARun(f"{archive}: not a readable archive ({type(err).__name__}: {(str(err) or '-').splitlines()[0]}).",
                      "pass the folder the GPU call returned, whole (fetch its files again if one was cut short)") from None
    return members


def _unpack(members: dict[str, bytes], dest: Path) -> list[str]:
    """Write ``_members``' files under ``dest``, each whole or not at all. Returns their names."""
    for name, data in members.items():
        atomic_write(dest / name, data)
    return list(members)


_RESULTS_FIX = "restore it (`git checkout -- FILE`), or delete it to start that GPU's results afresh"


def _bench_checked(data: dict[str, Any], where: str, fix: str) -> dict[str, Any]:
    """A benchmark record whose rows ``benchmark.markdown`` and ``benchmark.plot`` can draw (each
    row's net and technique, its predicted peak a number; the card's GiB in the meta)."""
    for r in data["rows"]:
        if not (isinstance(r.get("net"), str) and isinstance(r.get("technique"), str)
                and isinstance(r.get("predicted peak MiB"), (int, float)) and not isinstance(r.get("predicted peak MiB"), bool)):
            raise RecordError(f"{where}: a row without its net, technique and predicted peak MiB: {str(r)[:100]}.", fix)
    if not isinstance(data["meta"].get("budget_gib"), (int, float)) or isinstance(data["meta"].get("budget_gib"), bool):
        raise RecordError(f"{where}'s meta has no budget_gib (the card's GiB, a number).", fix)
    try:
        benchmark.markdown(data).encode()  # a lone surrogate (JSON's \\ud800) cannot be written
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise RecordError(f"{where}: its rows do not make a table ({type(err).__name__}: {err}).", fix) from None
    return data


def _merged_benchmarks(details: dict[str, bytes], where: Path, dest_dir: Path) -> dict[Path, dict[str, Any]]:
    """Each benchmark in ``details`` (the kit's archive at ``where``) merged by net into what
    ``dest_dir`` holds for its GPU: destination -> record. Everything read and checked, nothing written."""
    out: dict[Path, dict[str, Any]] = {}
    for name in sorted(n for n in details if n.startswith("benchmark-") and n.endswith(".json")):
        fix = "run the benchmark again on the GPU (`python -m course_utils.gpu_report OUT --only benchmark`)"
        new = _bench_checked(recorded.read_benchmark(f"{where}:{name}", details[name]), f"{where}:{name}", fix)
        dest = dest_dir / f"{recorded.file_stem(new['meta']['device'])}.json"
        if dest in out or dest.exists():
            old = out.get(dest) or _bench_checked(recorded.read_benchmark(dest), str(dest),
                                                  _RESULTS_FIX.replace("FILE", str(dest)))
            nets = {r["net"] for r in new["rows"]}
            new = {"meta": new["meta"], "rows": [r for r in old["rows"] if r["net"] not in nets] + new["rows"]}
        out[dest] = new
    return out


def _rendered(merged: dict[Path, dict[str, Any]]) -> dict[Path, bytes | str]:
    """Every file the benchmarks make (``<gpu>.json``, ``.md``, ``.png``: drawn in a temporary
    folder), before any is written; RecordError naming the benchmark if one cannot be drawn (a
    technique's name matplotlib reads as bad math, say)."""
    out: dict[Path, bytes | str] = {}
    with tempfile.TemporaryDirectory(prefix="course-import-") as tmp:
        for dest, data in merged.items():
            png = Path(tmp) / f"{dest.stem}.png"
            try:
                benchmark.plot(data, png)
            except Exception as err:  # noqa: BLE001 - whatever matplotlib refuses, the record is what is wrong
                raise RecordError(f"{dest}: the merged benchmark cannot be drawn ({type(err).__name__}: "
                                  f"{str(err)[:160]}).", "run the benchmark again on the GPU, or correct the "
                                  "technique names of the benchmark the kit returned") from None
            out.update({dest: json.dumps(data, indent=2) + "\n", dest.with_suffix(".md"): benchmark.markdown(data),
                        dest.with_suffix(".png"): png.read_bytes()})
    return out


def _state(src: Path) -> dict[str, Any]:
    state_path = src / record.STATE
    fix = f"pass the folder the GPU call returned (it holds {', '.join(record.OUTPUTS)})"
    try:
        state = read_json(state_path, "a kit run's state (kit.json)", fix)
    except RecordError as err:
        raise NotARun(err.problem, fix) from None
    machine = state.get("machine")
    if not isinstance(state.get("tasks"), list) or not all(isinstance(t, dict) for t in state["tasks"]) \
            or not isinstance(machine, dict) or not all(isinstance(machine.get(k), str) for k in ("date", "gpu")):
        raise NotARun(f"{state_path}: not a kit run's state (it needs its tasks and the machine's date and gpu).", fix)
    return state


def import_run(files_at: str | Path, root: Path = ROOT, name: str | None = None) -> Path:
    """Put the kit's files in ``files_at`` where ``root`` keeps them (module docstring). Returns
    the run's folder under ``docs/gpu-runs``. Every file is read and checked before the first is
    written (a bad one raises NotARun / RecordError naming it and the fix, and nothing changes),
    and each is written whole or not at all."""
    src = Path(files_at)
    state = _state(src)
    machine, tasks = state["machine"], state["tasks"]
    details = _members(src / record.DETAILS) if (src / record.DETAILS).exists() else {}
    notebooks = _members(src / record.NOTEBOOKS) if (src / record.NOTEBOOKS).exists() else {}
    figures, benches = None, {}
    if not state.get("dry_run"):
        if (src / record.RECORDED).exists():
            new = recorded.read_recording(src / record.RECORDED)
            rec_dest = root / "recorded" / (recorded.file_stem(new["meta"]["gpu"]) + ".json")
            old = recorded.read_recording(rec_dest) if rec_dest.exists() else None
            figures = (rec_dest, len(new["figures"]),
                       recorded.merge_recordings(old, new, record.merge_figures) if old else new)
        benches = _rendered(_merged_benchmarks(details, src / record.DETAILS, root / "benchmarks" / "results"))
    runs = root / "docs" / "gpu-runs"
    # slugs: a kit.json's date or GPU name never leads the run's folder out of docs/gpu-runs
    base = name or f"{slug(machine['date'])}-{slug(machine['gpu'])}{'-dry-run' if state.get('dry_run') else ''}"
    dest, k = runs / base, 1
    while dest.exists():
        k += 1
        dest = runs / f"{base}-{k}"
    for f in (record.STATE, record.SUMMARY, record.LOG):
        if (src / f).is_file():
            atomic_write(dest / f, (src / f).read_bytes())
    _unpack(details, dest / "details")
    _unpack(notebooks, dest / "notebooks")
    print(f"{dest}: {len(tasks)} tasks, {sum(t.get('status') in ('done', 'passed') for t in tasks)} done or passed")
    if state.get("dry_run"):
        return dest
    if figures is not None:
        out = recorded.write(figures[2], figures[0])
        print(f"{out}: {figures[1]} figures merged")
    for out, data in benches.items():
        atomic_write(out, data)
        if out.suffix == ".json":
            print(f"{out}: benchmark rows merged")
    print("Next: python -m course_utils.readme --render (the tables of README and docs/), then commit docs/gpu-runs/, "
          "recorded/ and benchmarks/results/.")
    return dest


guard(globals(), RecordError)
