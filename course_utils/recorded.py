"""Figures recorded on a real CUDA GPU, shown where the learner's machine has none.

A notebook cell that needs a GPU has two branches::

    if cfg.is_cuda:
        table = measure_something()                 # the real torch.cuda figure
        recorded.record("02/expandable_segments", table)
        display(table)
    else:
        recorded.show("02/expandable_segments")     # the figure a GPU showed, labelled

``record`` writes nothing unless ``$COURSE_RECORD_DIR`` is set: the GPU kit
(``python -m course_utils.gpu_report``) sets it while it executes every notebook at full size,
then collects what the cells recorded into ``recorded/<gpu>.json`` in the repository. ``show``
reads those files and prints the figure with the GPU, the date and the torch version it was
recorded with -- or, when no GPU run has been recorded yet, says so in one line.

``gpu_runs`` reads what each GPU run of the kit measured on its own, from its record under
``docs/gpu-runs/`` (the first run, on an H100, predates ``recorded/``): the CUDA context at the
run's start and seed 000's large U-Net's step (allocated, reserved, the driver's used memory);
``show_runs`` prints them as a table, with the method and its limits.

Installed from its wheel (a hosted notebook), ``course_utils`` has no checkout beside it: the
course's zip, unpacked where the notebooks' first cell looks for it (``PLACES``, as in
``course_setup.py``), holds ``recorded/`` and ``docs/gpu-runs/``.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ENV_VAR = "COURSE_RECORD_DIR"
# where ``show``/``lookup`` read recorded figures from, instead of the repository's recorded/
# (the site's build points it at a fixture recording in its tests)
SHOW_ENV_VAR = "COURSE_RECORDED"
ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "recorded"


#: where a hosted notebook's kernel looks for the unpacked course, relative to its working
#: directory: the places course_setup.py's cell searches (beside the notebook, one folder up, one
#: down, Colab's /content and Drive, Kaggle's inputs)
PLACES = ("", "../", "*/", "/content/*/", "/content/drive/MyDrive/*/", "/kaggle/input/*/", "/kaggle/input/*/*/")


def recorded_folder() -> Path:
    """Where recorded figures are read from: ``$COURSE_RECORDED``; else the checkout's
    ``recorded/``; else, for course_utils installed from its wheel (a hosted notebook, where
    the course's zip is unpacked near it), the first ``recorded/`` folder holding a recording
    found in ``PLACES`` from the notebook's working directory (Colab's kernel runs in /content,
    Kaggle's in /kaggle/working: the zip is not the notebook's folder there)."""
    if os.environ.get(SHOW_ENV_VAR):
        return Path(os.environ[SHOW_ENV_VAR])
    if RECORDED.is_dir():
        return RECORDED
    for place in PLACES:
        for folder in sorted(glob.glob(place + "recorded")):
            if glob.glob(os.path.join(folder, "*.json")):
                return Path(folder).resolve()
    return RECORDED


def _encode(value: Any) -> dict[str, Any]:
    """A JSON form of a figure: a pandas DataFrame, a string, or anything ``json`` accepts."""
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(value, pd.DataFrame):
        return {"kind": "table", "columns": [str(c) for c in value.columns],
                "index": [str(i) for i in value.index],
                "data": json.loads(value.to_json(orient="values", double_precision=6))}
    if isinstance(value, str):
        return {"kind": "text", "data": value}
    try:
        json.dumps(value)
    except TypeError as err:
        raise TypeError(
            f"recorded figures must be a DataFrame, a string or JSON data, got "
            f"{type(value).__name__} ({err}). Fix: convert it, e.g. to a dict of numbers."
        ) from None
    return {"kind": "json", "data": value}


def _decode(entry: dict[str, Any]) -> Any:
    if entry["kind"] == "table":
        import pandas as pd

        return pd.DataFrame(entry["data"], columns=entry["columns"], index=entry.get("index"))
    return entry["data"]


def machine() -> dict[str, str]:
    """What a figure was recorded on: GPU name, torch and CUDA versions, date."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu-{platform.machine()}"
    return {"gpu": gpu, "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "date": datetime.date.today().isoformat()}


def file_stem(gpu: str) -> str:
    """A GPU's name as a file name: ``NVIDIA H100 80GB HBM3`` -> ``NVIDIA_H100_80GB_HBM3``."""
    return gpu.replace(" ", "_").replace("/", "_")


def record(key: str, value: Any, folder: str | Path | None = None) -> Any:
    """Keep ``value`` (measured on a GPU) under ``key`` in ``folder``, or, without one, in
    ``$COURSE_RECORD_DIR`` if the GPU kit is collecting figures from notebooks; otherwise do
    nothing. Returns ``value``."""
    out = folder or os.environ.get(ENV_VAR)
    if not out:
        return value
    if not key or any(c in key for c in "\\:*?\"<>| "):
        raise ValueError(f"record key {key!r}: use letters, digits, '_', '-', '.' and '/'")
    entry = {"key": key, **machine(), **_encode(value)}
    path = Path(out) / (key.replace("/", "__") + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry, indent=1))
    return value


def merged(src: str | Path) -> dict[str, Any]:
    """The per-figure files ``record`` wrote under ``src``, as one recording:
    ``{"meta": {gpu, torch, cuda, date}, "figures": {key: figure}}``."""
    entries = [json.loads(p.read_text()) for p in sorted(Path(src).glob("*.json"))]
    if not entries:
        raise FileNotFoundError(f"no recorded figures under {src}")
    meta = {k: entries[0][k] for k in ("gpu", "torch", "cuda", "date")}
    figures = {e["key"]: {k: v for k, v in e.items() if k not in meta and k != "key"} for e in entries}
    return {"meta": meta, "figures": figures}


def write(data: dict[str, Any], dest: str | Path) -> Path:
    """Write a recording (``merged``'s form) to ``dest`` whole or not at all (a temporary file
    beside it, then a rename: a full disk never leaves half a file for ``show`` to read)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def collect(src: str | Path, dest: str | Path | None = None) -> Path:
    """Merge the per-figure files ``record`` wrote under ``src`` into one
    ``recorded/<gpu>.json`` (what the repository keeps). Returns its path."""
    data = merged(src)
    return write(data, Path(dest) if dest else RECORDED / (file_stem(data["meta"]["gpu"]) + ".json"))


@dataclass
class Recorded:
    """One figure recorded on a GPU (``lookup``'s answer): its key, its value, and the run's GPU,
    date and versions; ``label`` says so in words."""

    key: str
    value: Any
    meta: dict[str, str]

    @property
    def label(self) -> str:
        m = self.meta
        return f"recorded on {m['gpu']}, {m['date']}, torch {m['torch']} (CUDA {m['cuda']})"


def lookup(key: str, folder: str | Path | None = None) -> Recorded | None:
    """The newest recording of ``key`` among the ``*.json`` of ``folder`` (by default
    ``recorded_folder()``), or None."""
    found = []
    for path in sorted(Path(folder or recorded_folder()).glob("*.json")):
        data = json.loads(path.read_text())
        if key in data.get("figures", {}):
            found.append((data["meta"]["date"], data["meta"], data["figures"][key]))
    if not found:
        return None
    _, meta, entry = max(found, key=lambda f: f[0])
    return Recorded(key, _decode(entry), meta)


def show(key: str, what: str = "", folder: str | Path | None = None) -> Any:
    """Print (and display, in a notebook) the GPU figure recorded under ``key``, labelled with
    where it came from; without a recording, say so. ``what`` describes the figure for that
    case. Returns the value or None."""
    rec = lookup(key, folder)
    if rec is None:
        print(f"No GPU run has been recorded for this figure yet{f' ({what})' if what else ''}: "
              "this machine has no CUDA GPU. On one, `python -m course_utils.gpu_report` records it.")
        return None
    print(f"This machine has no CUDA GPU. The figure below was {rec.label}:")
    try:
        from IPython.display import display
    except ImportError:  # plain Python
        display = print
    display(rec.value)
    return rec.value


# --------------------------------------------------------------------------------------------
# What each GPU run measured on its own: docs/gpu-runs/<run>/
# --------------------------------------------------------------------------------------------
#: the files of a run's record that ``gpu_runs`` reads (make dist's zip ships them)
RUN_FILES = ("docs/gpu-runs/*/kit.json", "docs/gpu-runs/*/limit.json", "docs/gpu-runs/*/benchmark-large.json",
             "docs/gpu-runs/*/details/benchmark-large-*.json")
#: the step ``gpu_runs`` reads from each run's benchmark: seed 000's large U-Net, fp32, batch 2
STEP = ("large", "baseline fp32")


@dataclass
class GpuRun:
    """One GPU run of the course's kit, as its record under docs/gpu-runs/ says: where it ran
    (``meta``: gpu, date, torch, cuda), the CUDA context it measured at its start (MiB), and the
    large U-Net's step (``step``: the benchmark's row, MiB); ``folders`` it was read from."""

    meta: dict[str, str]
    context_mib: float | None
    step: dict[str, Any] | None
    folders: list[str]

    @property
    def label(self) -> str:
        m = self.meta
        return f"{m['gpu']}, {m['date']}, torch {m['torch']}"


def _run_parts(folder: Path) -> tuple[dict[str, str], float | None, dict[str, Any] | None] | None:
    """A run folder's machine, context and large-net step; None if it records neither."""
    meta, context, step = None, None, None
    kit = folder / "kit.json"
    if kit.exists():
        m = json.loads(kit.read_text())["machine"]
        meta, context = {k: str(m[k]) for k in ("gpu", "date", "torch", "cuda")}, m.get("context MiB")
    limit = folder / "limit.json"
    if limit.exists():  # the first run (2026-11-24) had no kit.json: its limit step kept the machine
        data = json.loads(limit.read_text())
        meta = meta or {k: str(data["machine"][k]) for k in ("gpu", "date", "torch", "cuda")}
        context = context if context is not None else data.get("overheads", {}).get("context MiB")
    for path in sorted([*folder.glob("benchmark-large.json"), *folder.glob("details/benchmark-large-*.json")]):
        data = json.loads(path.read_text())
        row = next((r for r in data["rows"] if (r.get("net"), r.get("technique")) == STEP
                    and r.get("measured peak MiB") is not None), None)
        if row is not None:
            d = data["meta"]
            meta = meta or {"gpu": d["device"], "date": d["date"], "torch": d["torch"], "cuda": str(d["cuda"])}
            step = {k: row[k] for k in ("predicted peak MiB", "measured peak MiB", "measured reserved MiB",
                                        "driver used MiB")}
            step["what"] = f"{STEP[0]} net, {STEP[1]}: {d['model']}"
    if meta is None or (context is None and step is None):
        return None
    return meta, context, step


def gpu_runs(folder: str | Path | None = None) -> list[GpuRun]:
    """Every GPU run recorded under ``folder`` (by default ``docs/gpu-runs/`` beside
    ``recorded_folder()``), oldest first: the folders of one run (one GPU, one day, one torch: the
    kit resumes a run in several calls) merged into one ``GpuRun``."""
    folder = Path(folder) if folder else recorded_folder().parent / "docs" / "gpu-runs"
    runs: dict[tuple[str, ...], GpuRun] = {}
    for sub in sorted(p for p in folder.glob("*") if p.is_dir()) if folder.is_dir() else []:
        parts = _run_parts(sub)
        if parts is None:
            continue
        meta, context, step = parts
        run = runs.setdefault((meta["date"], meta["gpu"], meta["torch"]), GpuRun(meta, None, None, []))
        run.context_mib = run.context_mib if run.context_mib is not None else context
        run.step = run.step or step
        run.folders.append(sub.name)
    return list(runs.values())


def runs_table(runs: list[GpuRun]):
    """The runs as a table (pandas), one row each, indexed by the run's label: the context at the
    run's start, and the large U-Net's step as predicted and as the three counters saw it, with
    what lies outside the allocator (the driver's used memory minus reserved)."""
    import pandas as pd

    rows = []
    for r in runs:
        s = r.step or {}
        smi, reserved = s.get("driver used MiB"), s.get("measured reserved MiB")
        rows.append({"context at start MiB": r.context_mib, "predicted MiB": s.get("predicted peak MiB"),
                     "allocated MiB": s.get("measured peak MiB"), "reserved MiB": reserved, "nvidia-smi MiB": smi,
                     "outside the allocator MiB": smi - reserved if smi is not None and reserved is not None else None})
    return pd.DataFrame(rows, index=pd.Index([r.label for r in runs], name="GPU run"))


def show_runs(folder: str | Path | None = None):
    """Print (and display) what each recorded GPU run measured on its own, with the method and
    its limits; without a run, say so. Returns ``runs_table``'s table or None."""
    runs = gpu_runs(folder)
    if not runs:
        print("No GPU run has been recorded yet (docs/gpu-runs/ holds none): on a CUDA GPU, "
              "`python -m course_utils.gpu_report` records one.")
        return None
    what = next((r.step["what"] for r in runs if r.step), "none recorded")
    print(f"Recorded by the course's GPU kit in {len(runs)} run(s) (docs/gpu-runs/), not measured on this machine.\n"
          "- context at start: the driver's used memory minus the allocator's reserved memory, after a first "
          "convolution, when the run began\n"
          f"- the step: {what}; predicted on a CPU (the course's predictor), then measured once per run: "
          "torch.cuda.max_memory_allocated, max_memory_reserved, and the driver's used memory "
          "(cudaMemGetInfo, as nvidia-smi shows it) after the step\n"
          "- limits: one step on one card a run; the driver counts every process on the GPU (in these runs, the "
          "kit's own); each run's record in docs/gpu-runs/ says what else held and what did not")
    table = runs_table(runs)
    try:
        from IPython.display import display
    except ImportError:  # plain Python
        display = print
    display(table)
    return table
