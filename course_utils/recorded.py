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
``show_runs`` prints them as a table, with the method and its limits; ``latest_step`` gives any
other step of a run's benchmark (a technique on either seed net). A figure a run measured in a
notebook cell before that cell recorded it is read from the run's executed notebook
(``FROM_OUTPUTS``), labelled as such.

Installed from its wheel (a hosted notebook), ``course_utils`` has no checkout beside it: the
course's zip, unpacked where the notebooks' first cell looks for it (``PLACES``, as in
``course_setup.py``), holds ``recorded/`` and ``docs/gpu-runs/``.
"""

from __future__ import annotations

import datetime
import glob
import json
import math
import os
import platform
import re
from html.parser import HTMLParser
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .checks import RecordError, guard
from .files import atomic_write, parse_json, read_json, read_notebook, skipped

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
        raise RecordError(f"recorded figures must be a DataFrame, a string or JSON data, got "
                          f"{type(value).__name__} ({err}).", "convert it, e.g. to a dict of numbers.") from None
    return {"kind": "json", "data": value}


def _decode(entry: dict[str, Any], path: Path, key: str) -> Any:
    """A figure's value from its JSON form; RecordError naming ``path`` and ``key`` if it is not one."""
    if entry["kind"] != "table":
        return entry["data"]
    import pandas as pd

    try:
        return pd.DataFrame(entry["data"], columns=entry["columns"], index=entry.get("index"))
    except Exception as err:  # noqa: BLE001 - whatever pandas refuses, the file is what is wrong
        raise RecordError(f"{path}: figure {key!r} is not a table pandas can build ({type(err).__name__}: "
                          f"{str(err)[:120]}).", _REWRITE.replace("FILE", str(path))) from None


#: the fix for a recording that cannot be read
_REWRITE = ("restore FILE (`git checkout -- FILE`), or record it again on a GPU "
            "(`python -m course_utils.gpu_report`, then `--import`)")
MACHINE_KEYS = ("gpu", "torch", "cuda", "date")


def _machine(m: Any, where: str, fix: str) -> dict[str, str]:
    """``m`` as a machine (gpu, torch, cuda, date: each a string, ``str()`` of a number too), or
    RecordError saying what ``where`` lacks."""
    if not isinstance(m, dict) or any(not isinstance(m.get(k), (str, int, float)) or isinstance(m.get(k), bool)
                                      for k in MACHINE_KEYS):
        raise RecordError(f"{where} does not say what it was recorded on: it needs "
                          f"{', '.join(MACHINE_KEYS)}, each a string, and has {_shown(m)}.", fix)
    return {k: str(m[k]) for k in MACHINE_KEYS}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _figure(fig: Any, where: str, fix: str) -> dict[str, Any]:
    """``fig`` checked as a figure's JSON form (``_encode``'s, with its own ``meta`` if any)."""
    kinds = {"table": ("data", "columns"), "text": ("data",), "json": ("data",)}
    if not isinstance(fig, dict) or fig.get("kind") not in kinds or any(k not in fig for k in kinds[fig["kind"]]):
        raise RecordError(f"{where} is not a recorded figure: it needs a kind ('table', 'text' or 'json') "
                          f"and its data, and has {_shown(fig)}.", fix)
    if fig["kind"] == "table" and not (isinstance(fig["data"], list) and isinstance(fig["columns"], list)):
        raise RecordError(f"{where}: a table's data and columns are lists, not {_shown(fig['data'])}.", fix)
    if fig["kind"] == "text" and not isinstance(fig["data"], str):
        raise RecordError(f"{where}: a text figure's data is a string, not {_shown(fig['data'])}.", fix)
    if "meta" in fig:
        fig = {**fig, "meta": _machine(fig["meta"], f"{where}'s meta", fix)}
    return fig


def read_recording(path: str | Path) -> dict[str, Any]:
    """A recording (``merged``'s form) read from ``path`` and checked: its ``meta`` (the machine)
    and every figure's form. RecordError naming the file, what is wrong and the fix otherwise."""
    path = Path(path)
    fix = _REWRITE.replace("FILE", str(path))
    data = read_json(path, "a recording of GPU figures ({\"meta\": ..., \"figures\": ...})", fix)
    meta = _machine(data.get("meta"), f"{path}'s meta", fix)
    figures = data.get("figures")
    if not isinstance(figures, dict):
        raise RecordError(f"{path} has no figures (an object of key -> figure), it has {_shown(figures)}.", fix)
    return {"meta": meta, "figures": {k: _figure(f, f"{path}: figure {k!r}", fix) for k, f in figures.items()}}


def machine() -> dict[str, str]:
    """What a figure was recorded on: GPU name, torch and CUDA versions, date."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu-{platform.machine()}"
    return {"gpu": gpu, "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "date": datetime.date.today().isoformat()}


def file_stem(gpu: str) -> str:
    """A GPU's name as a file name: ``NVIDIA H100 80GB HBM3`` -> ``NVIDIA_H100_80GB_HBM3`` (every
    character but letters, digits, '.', '_' and '-' becomes '_', so that a name read from a file
    never leads out of the folder)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", gpu).strip(".") or "unnamed"


#: what a key may hold: it names a file (``/`` becomes ``__``)
KEY = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")


def record(key: str, value: Any, folder: str | Path | None = None) -> Any:
    """Keep ``value`` (measured on a GPU) under ``key`` in ``folder``, or, without one, in
    ``$COURSE_RECORD_DIR`` if the GPU kit is collecting figures from notebooks; otherwise do
    nothing. The file is written whole or not at all (``files.atomic_write``). Returns ``value``."""
    out = folder or os.environ.get(ENV_VAR)
    if not out:
        return value
    if not KEY.fullmatch(key) or len(key) > 150:
        raise RecordError(f"record key {_shown(key)}: a key names a file.",
                          "use letters, digits, '_', '-', '.' and '/' (not at either end), at most 150 of them, "
                          "e.g. '02/expandable_segments'")
    entry = {"key": key, **machine(), **_encode(value)}
    atomic_write(Path(out) / (key.replace("/", "__") + ".json"), json.dumps(entry, indent=1))
    return value


def _entry(path: Path) -> tuple[str, dict[str, Any]]:
    """A per-figure file ``record`` wrote: its key, and its figure with the machine as ``meta``."""
    fix = f"delete {path} and run its notebook's cell again on the GPU"
    e = read_json(path, "a figure recorded by recorded.record", fix)
    if not isinstance(e.get("key"), str) or not KEY.fullmatch(e["key"]):
        raise RecordError(f"{path} names no figure: its 'key' is {_shown(e.get('key'))}.", fix)
    fig = {k: v for k, v in e.items() if k not in MACHINE_KEYS and k != "key"}
    return e["key"], _figure({**fig, "meta": _machine(e, str(path), fix)}, str(path), fix)


def _gathered(figures: dict[str, dict[str, Any]], meta: dict[str, str] | None = None) -> dict[str, Any]:
    """Figures that each carry their machine (``meta``) as one recording: its ``meta`` the given
    one, or else the machine most of them were recorded on (the first such in key order on a tie);
    a figure recorded on another machine (another GPU, day or torch) keeps its own ``meta``, which
    ``lookup`` labels it with."""
    if meta is None:
        machines = [tuple(f["meta"][k] for k in MACHINE_KEYS) for f in figures.values()]
        meta = dict(zip(MACHINE_KEYS, max(dict.fromkeys(machines), key=machines.count), strict=True))
    return {"meta": meta, "figures": {k: f if f["meta"] != meta else {n: v for n, v in f.items() if n != "meta"}
                                      for k, f in figures.items()}}


def _spread(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A recording's figures, each carrying its own machine (``meta``)."""
    return {k: {**f, "meta": f.get("meta", data["meta"])} for k, f in data["figures"].items()}


def merge_recordings(old: dict[str, Any], new: dict[str, Any],
                     merge: Callable[[dict, dict], dict] | None = None) -> dict[str, Any]:
    """Two recordings (``read_recording``'s form) as one, under the new one's meta: a figure in both
    is the new one (or ``merge(old figures, new figures)``'s), and every figure keeps the machine
    it was recorded on."""
    both = merge(_spread(old), _spread(new)) if merge else {**_spread(old), **_spread(new)}
    return _gathered(both, new["meta"])


def merged(src: str | Path) -> dict[str, Any]:
    """The per-figure files ``record`` wrote under ``src``, as one recording:
    ``{"meta": {gpu, torch, cuda, date}, "figures": {key: figure}}``; a figure recorded on another
    machine than most (another GPU) keeps its own ``meta``. A file that cannot be read is skipped
    with a warning naming it; RecordError if none can."""
    figures = {}
    paths = sorted(Path(src).glob("*.json"))
    for path in paths:
        try:
            key, fig = _entry(path)
        except RecordError as err:
            skipped(err)
            continue
        figures[key] = fig
    if not figures:
        raise RecordError(f"{src} holds no readable recorded figures ({len(paths)} .json file(s)).",
                          f"pass the folder that ${ENV_VAR} named while the notebooks ran on the GPU")
    return _gathered(figures)


def write(data: dict[str, Any], dest: str | Path) -> Path:
    """Write a recording (``merged``'s form) to ``dest`` whole or not at all (``files.atomic_write``:
    a full disk never leaves half a file for ``show`` to read; it raises RecordError with the fix)."""
    atomic_write(dest, json.dumps(data, indent=1) + "\n")
    return Path(dest)


def collect(src: str | Path, dest: str | Path | None = None) -> Path:
    """Merge the per-figure files ``record`` wrote under ``src`` into one
    ``recorded/<gpu>.json`` (what the repository keeps), written whole or not at all. Returns its path."""
    data = merged(src)
    return write(data, Path(dest) if dest else RECORDED / (file_stem(data["meta"]["gpu"]) + ".json"))


@dataclass
class Recorded:
    """One figure recorded on a GPU (``lookup``'s answer): its key, its value, and the run's GPU,
    date and versions; ``label`` says so in words."""

    key: str
    value: Any
    meta: dict[str, str]
    source: str = ""  # where it was read from, when not from recorded/ (``FROM_OUTPUTS``)

    @property
    def label(self) -> str:
        m = self.meta
        where = f"; {self.source}" if self.source else ""
        return f"recorded on {m['gpu']}, {m['date']}, torch {m['torch']} (CUDA {m['cuda']}){where}"


def lookup(key: str, folder: str | Path | None = None) -> Recorded | None:
    """The newest recording of ``key`` among the ``*.json`` of ``folder`` (by default
    ``recorded_folder()``) or, for a key of ``FROM_OUTPUTS``, in the output of its cell in a GPU
    run's executed notebook (``docs/gpu-runs/`` beside ``folder``); recorded/ wins a tie. None if
    neither holds it. A file that cannot be read is skipped with a warning that names it and the
    fix (``files.SkippedFile``): the others still serve."""
    folder = Path(folder or recorded_folder())
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = read_recording(path)
            if key in data["figures"]:
                fig = data["figures"][key]
                meta = fig.get("meta", data["meta"])
                found.append((meta["date"], 1, Recorded(key, _decode(fig, path, key), meta)))
        except RecordError as err:  # one bad file: the others still serve
            skipped(err)
    found += [(rec.meta["date"], 0, rec) for rec in _from_outputs(key, folder.parent / "docs" / "gpu-runs")]
    if not found:
        return None
    return max(found, key=lambda f: f[:2])[2]


def show(key: str, what: str = "", folder: str | Path | None = None, drop: tuple[str, ...] = ()) -> Any:
    """Print (and display, in a notebook) the GPU figure recorded under ``key``, labelled with
    where it came from; without a recording, say so. ``what`` describes the figure for that
    case. ``drop``: columns of a table left out of the display (a table stays narrow), each
    printed below it instead, as one line per distinct value. Returns the value (whole) or None."""
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
    shown = [c for c in drop if hasattr(rec.value, "columns") and c in rec.value.columns]
    display(rec.value.drop(columns=shown) if shown else rec.value)
    for c in shown:
        print(f"{c}: " + "; ".join(map(str, dict.fromkeys(rec.value[c]))))
    return rec.value


# --------------------------------------------------------------------------------------------
# Figures a GPU run measured before their cell recorded them: read from its executed notebook
# --------------------------------------------------------------------------------------------
#: key -> (an executed notebook under a run's ``notebooks/``, the id of the cell that records the
#: key now, the columns of its table). The GPU kit's first H200 run executed these cells when they
#: displayed their table without ``record`` (notebook 04's) or before it (notebook 02's cell
#: failed later, so nothing of that notebook was collected); each entry was checked to be the very
#: computation the cell records now: the same code, the same configuration (the full preset). The
#: columns are checked too: an output of another shape is not the figure.
FROM_OUTPUTS = {
    "02/hooks_vs_memtracker": ("02_measure_memory_with_hooks.ipynb", "c11",
                               ("forward rows", "rows equal", "largest difference B", "our method", "MemoryLog")),
    "04/measured": ("04_mixed_precision.ipynb", "c27",
                    ("net", "variant", "peak MiB", "peak vs baseline %", "kept after forward MiB", "method")),
}


class _HtmlTable(HTMLParser):
    """The rows of the HTML tables in a text (pandas' ``to_html``, as a notebook shows a
    DataFrame): ``rows`` holds (in the header?, [cell texts]) per row."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[bool, list[str]]] = []
        self._head, self._row, self._cell = False, None, None

    def handle_starttag(self, tag: str, attrs: Any) -> None:  # noqa: ARG002 (HTMLParser's signature)
        if tag in ("thead", "tbody"):
            self._head = tag == "thead"
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = ""

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(self._cell.strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append((self._head, self._row))
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell += data


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def html_table(html: str):
    """A DataFrame (pandas) from the first table of ``html`` as pandas writes it: one header row
    (the index's cell blank), then one row per index value; numbers read back as numbers."""
    import pandas as pd

    parser = _HtmlTable()
    parser.feed(html)
    head = next((cells for in_head, cells in parser.rows if in_head), None)
    if head is None:
        raise RecordError("html_table: the HTML has no table with a header row (<thead>).",
                          "pass a table as pandas' DataFrame.to_html writes it")
    body = [cells for in_head, cells in parser.rows if not in_head]
    return pd.DataFrame([[_number(c) for c in cells[1:]] for cells in body], columns=head[1:],
                        index=[_number(cells[0]) for cells in body])


#: the fix for a file of a GPU run's record under docs/gpu-runs/ that cannot be read
def _run_fix(path: Path) -> str:
    """The fix for a GPU run's damaged file ``path`` (FILES_AT: the folder the kit's files came back to)."""
    return (f"restore it (`git checkout -- {path}`), or import its GPU run again "
            "(`python -m course_utils.gpu_report --import FILES_AT`)")


def _mib(value: Any, where: str, fix: str) -> float | None:
    """A recorded MiB figure: None, or a finite number >= 0; RecordError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise RecordError(f"{where} is {_shown(value)}, not a number of MiB (finite, >= 0).", fix)
    return value


def read_kit(path: str | Path) -> tuple[dict[str, Any], dict[str, str], float | None]:
    """A GPU run's ``kit.json`` (or the first run's ``limit.json``) read once: its data, the
    machine it recorded and the CUDA context it measured (MiB, or None); RecordError naming the
    file and the fix."""
    path = Path(path)
    fix = _run_fix(path)
    data = read_json(path, "a GPU run's record (kit.json or limit.json)", fix)
    m = data.get("machine")
    meta = _machine(m, f"{path}'s machine", fix)
    context = m.get("context MiB")
    if context is None and isinstance(data.get("overheads"), dict):
        context = data["overheads"].get("context MiB")
    return data, meta, _mib(context, f"{path}'s context MiB", fix)


def kit_machine(path: str | Path) -> tuple[dict[str, str], float | None]:
    """``read_kit``'s machine and CUDA context."""
    return read_kit(path)[1:]


def _executed_table(path: Path, cell_id: str, columns: tuple[str, ...]):
    """The table of ``columns`` that cell ``cell_id`` of the executed notebook ``path`` shows, or None."""
    cells = read_notebook(path, _run_fix(path))["cells"]
    cell = next((c for c in cells if c.get("id") == cell_id), None)
    for out in (cell or {}).get("outputs", []) if isinstance((cell or {}).get("outputs", []), list) else []:
        html = out.get("data", {}).get("text/html", "") if isinstance(out, dict) and isinstance(out.get("data"), dict) else ""
        html = "".join(html) if isinstance(html, list) and all(isinstance(h, str) for h in html) else html
        if not isinstance(html, str) or "<table" not in html:
            continue
        try:
            table = html_table(html)
        except Exception:  # noqa: BLE001 - an output that is not pandas' table is not the figure
            continue
        if tuple(table.columns) == columns:
            return table
    return None


def _from_outputs(key: str, runs: Path) -> list[Recorded]:
    """``key``'s table in each run under ``runs`` whose executed notebook shows it (``FROM_OUTPUTS``),
    with the run's machine (its kit.json). A file that cannot be read is skipped with a warning."""
    if key not in FROM_OUTPUTS or not runs.is_dir():
        return []
    name, cell_id, columns = FROM_OUTPUTS[key]
    found = []
    for path in sorted(runs.glob(f"*/notebooks/{name}")):
        kit = path.parent.parent / "kit.json"
        if not kit.exists():
            continue
        try:
            table = _executed_table(path, cell_id, columns)
            if table is not None:
                found.append(Recorded(key, table, kit_machine(kit)[0],
                                      f"read from the output of cell {cell_id} of the run's executed notebook "
                                      f"docs/gpu-runs/{path.relative_to(runs).as_posix()}"))
        except RecordError as err:
            skipped(err)
    return found


# --------------------------------------------------------------------------------------------
# What each GPU run measured on its own: docs/gpu-runs/<run>/
# --------------------------------------------------------------------------------------------
#: the files of a run's record that ``gpu_runs``, ``diagnosis`` and ``workspace_model`` read (make
#: dist's zip ships them; not the executed notebooks ``FROM_OUTPUTS`` reads: their links point into a
#: checkout, so a hosted notebook shows those figures once a GPU run has recorded them under recorded/)
RUN_FILES = ("docs/gpu-runs/*/kit.json", "docs/gpu-runs/*/limit.json", "docs/gpu-runs/*/benchmark-*.json",
             "docs/gpu-runs/*/details/benchmark-*-*.json", "docs/gpu-runs/*/details/diagnose-*.json",
             "docs/gpu-runs/*/workspaces.json")
#: the step ``gpu_runs`` reads from each run's benchmark by default: seed 000's large U-Net, fp32, batch 2
STEP = ("large", "baseline fp32")
#: runs whose record disowns every measured row of their benchmark but one: the step that holds, and why
ONLY_STEP = {"2026-11-24-h100": (STEP, "every row after the first kept a failed attempt's graph allocated "
                                       "(docs/gpu-runs/2026-11-24-h100.md, 'What did not' 1)")}


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


def read_benchmark(path: str | Path, raw: bytes | None = None) -> dict[str, Any]:
    """A benchmark record (``benchmark.run``'s JSON: ``meta`` with device, date, torch, cuda,
    model; ``rows``, one object per technique) read from ``path`` (or parsed from ``raw``, the
    bytes ``path`` names) and checked; RecordError naming the file, what is wrong and the fix."""
    path = Path(path)
    fix = _run_fix(path)
    what = "a benchmark record ({\"meta\": ..., \"rows\": [...]})"
    data = read_json(path, what, fix) if raw is None else parse_json(raw, str(path), what, fix)
    meta, rows = data.get("meta"), data.get("rows")
    if not isinstance(meta, dict) or any(not isinstance(meta.get(k), str) for k in ("device", "date", "torch")):
        raise RecordError(f"{path}'s meta does not name its device, date and torch (strings): {_shown(meta)}.", fix)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise RecordError(f"{path}'s rows are not a list of objects (one per technique): {_shown(rows)}.", fix)
    return data


def benchmark_records(net: str = "*", folder: str | Path | None = None, run: str = "*") -> list[tuple[Path, dict]]:
    """``(path, read_benchmark(path))`` for each of ``benchmark_files(net, folder, run)``; a file
    that cannot be read is skipped with a warning naming it and the fix (the others still serve)."""
    out = []
    for path in benchmark_files(net, folder, run):
        try:
            out.append((path, read_benchmark(path)))
        except RecordError as err:
            skipped(err)
    return out


def _step_row(data: dict[str, Any], path: Path, run: str, step: tuple[str, str]) -> dict[str, Any] | None:
    """``step``'s measured row in the benchmark record ``data`` (read from ``path``, of the run
    ``run``), its four MiB figures checked."""
    net = step[0]
    rows = [] if run in ONLY_STEP and step != ONLY_STEP[run][0] else data["rows"]
    row = next((r for r in rows if (r.get("net"), r.get("technique")) == step
                and r.get("measured peak MiB") is not None), None)
    if row is None:
        return None
    fix = _run_fix(path)
    found = {k: _mib(row.get(k), f"{path}: {step[1]}'s {k}", fix)
             for k in ("predicted peak MiB", "measured peak MiB", "measured reserved MiB", "driver used MiB")}
    found["what"] = f"{net} net, {step[1]}: {data['meta'].get('model', 'the model not named')}"
    return found


def _run_parts(folder: Path, step: tuple[str, str] = STEP
               ) -> tuple[dict[str, str], float | None, dict[str, Any] | None] | None:
    """A run folder's machine, context and ``step`` (net, technique: a benchmark row); None if it
    records neither. A file of it that cannot be read is skipped with a warning naming it."""
    meta, context = None, None
    # the first run (2026-11-24) had no kit.json: its limit step kept the machine
    for path in (folder / "kit.json", folder / "limit.json"):
        if path.exists() or path.is_symlink():
            try:
                m, c = kit_machine(path)
            except RecordError as err:
                skipped(err)
                continue
            meta, context = meta or m, context if context is not None else c
    for path, data in benchmark_records(step[0], folder.parent, run=folder.name):
        try:
            found = _step_row(data, path, folder.name, step)
        except RecordError as err:
            skipped(err)
            continue
        if found is not None:
            d = data["meta"]
            meta = meta or {"gpu": d["device"], "date": d["date"], "torch": d["torch"], "cuda": str(d.get("cuda"))}
            return meta, context, found
    if meta is None or context is None:
        return None
    return meta, context, None


def runs_folder(folder: str | Path | None = None) -> Path:
    """Where the GPU kit's runs are read from: ``folder``, or ``docs/gpu-runs/`` beside
    ``recorded_folder()`` (the checkout's, or the one the learner's zip unpacked)."""
    return Path(folder) if folder else recorded_folder().parent / "docs" / "gpu-runs"


def benchmark_files(net: str = "*", folder: str | Path | None = None, run: str = "*") -> list[Path]:
    """The benchmark records of ``net`` ("large", "small"; "*": both) in the runs ``run`` (a run's
    folder name; "*": every run) under ``runs_folder(folder)``, sorted: a run's
    ``benchmark-<net>.json`` and its kit's ``details/benchmark-<net>-<GPU>.json``."""
    root = runs_folder(folder)
    return sorted([*root.glob(f"{run}/benchmark-{net}.json"), *root.glob(f"{run}/details/benchmark-{net}-*.json")])


def kit_results(task: str, folder: str | Path | None = None) -> list[tuple[dict[str, str], dict[str, Any], Path]]:
    """``(machine, result, path)`` of every GPU run under ``runs_folder(folder)`` whose kit
    finished ``task`` (its ``kit.json`` says ``"status": "done"`` with a result), oldest first by
    the machine's date. A ``kit.json`` that cannot be read, or that lacks its machine, is skipped
    with a warning naming it and the fix (the others still serve)."""
    found = []
    for path in sorted(runs_folder(folder).glob("*/kit.json")):
        fix = _run_fix(path)
        try:
            data = read_json(path, "a GPU kit's record (kit.json)", fix)
            machine = _machine(data.get("machine"), f"{path}'s machine", fix)
        except RecordError as err:
            skipped(err)
            continue
        tasks = data.get("tasks") if isinstance(data.get("tasks"), list) else []
        done = next((t for t in tasks if isinstance(t, dict) and t.get("name") == task
                     and t.get("status") == "done" and isinstance(t.get("result"), dict)), None)
        if done is not None:
            found.append((machine | {"context MiB": data["machine"].get("context MiB")}, done["result"], path))
    return sorted(found, key=lambda f: f[0]["date"])


def checked_rows(rows: Any, keys: set[str], path: Path, what: str, empty_ok: bool = True) -> list[dict[str, Any]]:
    """``rows`` read from a GPU run's record ``path`` -- a list of objects, each with ``keys`` (and
    at least one unless ``empty_ok``) -- or RecordError naming the file, ``what`` lacks and the fix."""
    if not (isinstance(rows, list) and (rows or empty_ok)
            and all(isinstance(r, dict) and keys <= r.keys() for r in rows)):
        raise RecordError(f"{path}: {what} are not {'a' if empty_ok else 'a non-empty'} list of objects, "
                          f"each with {', '.join(sorted(keys))}.", _run_fix(path))
    return rows


#: what every op of a diagnosis carries, at least (``memory.OpMemory.as_dict`` writes more)
DIAGNOSIS_OP_KEYS = frozenset({"op", "before", "peak", "transient"})


def diagnosis(case: str, folder: str | Path | None = None) -> tuple[dict[str, list[dict[str, Any]]], str, Path] | None:
    """The newest GPU run's op-by-op diagnosis of ``case`` (``details/diagnose-<case>.json``,
    written by the kit's ``diagnose/<case>`` task) under ``runs_folder(folder)``: ``(settings,
    label, path)``, where ``settings`` maps a setting ("cuDNN default", "cudnn.benchmark", ...) to
    its ops as dicts (``DIAGNOSIS_OP_KEYS`` each), ``label`` names the run (GPU, date, torch); None
    without a recording. A damaged file is a RecordError naming it and the fix."""
    found = sorted(runs_folder(folder).glob(f"*/details/diagnose-{case}.json"))
    if not found:
        return None
    path = found[-1]
    fix = f"restore it (`git checkout -- {path}`), or run the kit's diagnose/{case} again"
    data = read_json(path, "the GPU kit's op-by-op diagnosis", fix, kind=dict)
    settings = {}
    for setting, ops in data.items():
        if setting == "blocks at the peak":  # the allocator's blocks, not an op list
            continue
        settings[setting] = checked_rows(ops, set(DIAGNOSIS_OP_KEYS), path, f"the ops of setting {setting!r}", empty_ok=False)
    try:  # the label only: what the kit says of its machine, else the run's folder name
        m = read_json(path.parent.parent / "kit.json", "a GPU kit's record (kit.json)").get("machine")
    except RecordError:
        m = None
    return settings, run_label(m if isinstance(m, dict) else {"gpu": path.parent.parent.name}), path


def workspace_model(folder: str | Path | None = None) -> tuple[dict[str, Any], Path] | None:
    """The newest GPU run's check of the convolution-workspace model (``workspaces.json``, written
    by ``python -m course_utils.gpu_kit.workspace_check``) and its path, or None if no run has
    one. Its ``rows``: every recorded peak, measured, predicted plain and with the workspaces."""
    found = sorted(runs_folder(folder).glob("*/workspaces.json"))
    if not found:
        return None
    path = found[-1]
    fix = "run `python -m course_utils.gpu_kit.workspace_check` again"
    data = read_json(path, "the workspace model's check (workspaces.json)", fix, kind=dict)
    checked_rows(data.get("rows"), {"row", "measured peak MiB", "miss %", "model miss %"}, path, "its rows", empty_ok=False)
    return data, path


def run_label(machine: dict[str, Any]) -> str:
    """A GPU run's label as the notebooks print it: "GPU, date, torch VERSION" (a kit's machine
    names its ``gpu``, a benchmark's meta its ``device``)."""
    gpu = machine.get("gpu") or machine.get("device") or "?"
    return f"{gpu}, {machine.get('date', '?')}, torch {machine.get('torch', '?')}"


def gpu_runs(folder: str | Path | None = None, step: tuple[str, str] = STEP) -> list[GpuRun]:
    """Every GPU run recorded under ``folder`` (by default ``docs/gpu-runs/`` beside
    ``recorded_folder()``), oldest first: the folders of one run (one GPU, one day, one torch: the
    kit resumes a run in several calls) merged into one ``GpuRun``, its ``step`` the benchmark's
    row for ``step`` = (net, technique), e.g. ``("small", "fp16 model (seed 000)")``."""
    folder = runs_folder(folder)
    runs: dict[tuple[str, ...], GpuRun] = {}
    for sub in sorted(p for p in folder.glob("*") if p.is_dir()) if folder.is_dir() else []:
        parts = _run_parts(sub, step)
        if parts is None:
            continue
        meta, context, row = parts
        run = runs.setdefault((meta["date"], meta["gpu"], meta["torch"]), GpuRun(meta, None, None, []))
        run.context_mib = run.context_mib if run.context_mib is not None else context
        run.step = run.step or row
        run.folders.append(sub.name)
    return list(runs.values())


def latest_step(net: str, technique: str, folder: str | Path | None = None) -> GpuRun | None:
    """The newest GPU run whose benchmark measured ``technique`` on seed 000's ``net`` (its
    ``step``: predicted, allocated, reserved and the driver's MiB), or None."""
    return next((r for r in reversed(gpu_runs(folder, (net, technique))) if r.step), None)


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


guard(globals(), RecordError)
