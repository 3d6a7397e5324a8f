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
import shutil
import tarfile
from pathlib import Path
from typing import Any

from ..checks import RecordError, guard
from ..files import atomic_write
from .. import benchmark, recorded
from . import record
from .plan import ROOT, slug


class NotARun(ValueError):
    """The files cannot be imported; the message names the file and the fix."""


def _unpack(archive: Path, dest: Path) -> list[str]:
    """Extract the regular files of ``archive`` into ``dest`` (no absolute paths, no '..', no
    links). Returns their names."""
    names = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or member.name.startswith("/") or ".." in parts:
                continue
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src:
                atomic_write(target, src.read())
            names.append(member.name)
    return names


def _merge_figures(new: dict[str, Any], dest: Path) -> Path:
    data = new
    if dest.exists():
        old = json.loads(dest.read_text())
        data = {"meta": new["meta"], "figures": record.merge_figures(old.get("figures", {}), new["figures"])}
    return recorded.write(data, dest)


def _merge_benchmark(files: list[Path], dest_dir: Path) -> list[Path]:
    written = []
    for path in files:
        new = json.loads(path.read_text())
        stem = recorded.file_stem(new["meta"]["device"])
        dest = dest_dir / f"{stem}.json"
        if dest.exists():
            old = json.loads(dest.read_text())
            nets = {r["net"] for r in new["rows"]}
            new = {"meta": new["meta"], "rows": [r for r in old["rows"] if r["net"] not in nets] + new["rows"]}
        dest_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(dest, json.dumps(new, indent=2) + "\n")
        atomic_write(dest_dir / f"{stem}.md", benchmark.markdown(new))
        benchmark.plot(new, dest_dir / f"{stem}.png")
        written.append(dest)
    return written


def import_run(files_at: str | Path, root: Path = ROOT, name: str | None = None) -> Path:
    """Put the kit's files in ``files_at`` where ``root`` keeps them (module docstring). Returns
    the run's folder under ``docs/gpu-runs``."""
    src = Path(files_at)
    state_path = src / record.STATE
    try:
        state = json.loads(state_path.read_text())
        machine, tasks = state["machine"], state["tasks"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise NotARun(f"{state_path}: not a kit run's state ({type(err).__name__}: {err}). Fix: pass the "
                           f"folder the GPU call returned (it holds {', '.join(record.OUTPUTS)})") from None
    runs = root / "docs" / "gpu-runs"
    base = name or f"{machine['date']}-{slug(machine['gpu'])}{'-dry-run' if state.get('dry_run') else ''}"
    dest, k = runs / base, 1
    while dest.exists():
        k += 1
        dest = runs / f"{base}-{k}"
    dest.mkdir(parents=True)
    for f in (record.STATE, record.SUMMARY, record.LOG):
        if (src / f).exists():
            shutil.copyfile(src / f, dest / f)
    details = _unpack(src / record.DETAILS, dest / "details") if (src / record.DETAILS).exists() else []
    if (src / record.NOTEBOOKS).exists():
        _unpack(src / record.NOTEBOOKS, dest / "notebooks")
    print(f"{dest}: {len(tasks)} tasks, {sum(t['status'] in ('done', 'passed') for t in tasks)} done or passed")
    if state.get("dry_run"):
        return dest
    if (src / record.RECORDED).exists():
        figures = json.loads((src / record.RECORDED).read_text())
        out = _merge_figures(figures, root / "recorded" / (recorded.file_stem(figures["meta"]["gpu"]) + ".json"))
        print(f"{out}: {len(figures['figures'])} figures merged")
    bench = [dest / "details" / n for n in details if n.startswith("benchmark-") and n.endswith(".json")]
    for out in _merge_benchmark(bench, root / "benchmarks" / "results"):
        print(f"{out}: benchmark rows merged")
    print("Next: python -m course_utils.readme --render (the tables of README and docs/), then commit docs/gpu-runs/, "
          "recorded/ and benchmarks/results/.")
    return dest


guard(globals(), RecordError)
