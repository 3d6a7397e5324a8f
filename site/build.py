"""Build the course as a static website: ``make site`` (or ``python site/build.py``).

1. Execute every notebook in ``notebooks/`` top to bottom with nbclient, in ``notebooks/`` (as
   JupyterLab would), at the ``tiny`` preset (``COURSE_SIZE=tiny``), on this machine, two kernels
   at a time (``--jobs``). Executed copies are cached in ``build/site-cache/`` under a hash of the
   notebook, the ``course_utils`` modules it uses (its imports, followed through the package with
   ``ast``: a change in a module it does not use executes nothing again), the recorded GPU
   figures, the preset and the torch version; ``--fresh`` ignores the cache, ``--only 04,10``
   builds a few pages while working on the site.
2. Assemble a Sphinx source tree in ``build/site-src/`` from COPIES (nothing in git is changed):
   README as the front page, the executed notebooks, the exercises (not executed; solutions are
   never copied), the pages of ``docs/`` in ``DOC_PAGES`` (the teaching notes and the pages the
   README's detail lives in) and every page in ``site/pages/``. Each notebook copy gets
   a banner (preset, device, build date, torch; what its GPU figures show; the notebooks before
   it; its measured CPU time and, once recorded, GPU time; a download link) and a footer (exercise,
   next page, open in JupyterLab); widget outputs are replaced by a static rendering of their
   state when executed plus a note that they are live in JupyterLab; relative links to files that
   are not pages become text (code spans and fenced blocks are never rewritten).
3. ``sphinx-build`` (myst-nb reader, Furo theme, MathJax from sphinx-mathjax-offline, all from
   pip, nothing downloaded) writes HTML into ``build/site/``; the notebooks and exercises (without
   outputs) are copied beside their pages to download, with ``code-spans.json`` (each page's code
   as its source has it) for site/check.py.

A CUDA cell executed here on the CPU shows the figure recorded on a GPU (``recorded/*.json``,
``course_utils.recorded.show``) where there is one; the build lists the pages that show recorded
figures and those that still say none is recorded.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import html
import json
import os
import platform
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "site"
BUILD = ROOT / "build"
SRC = BUILD / "site-src"
CACHE = BUILD / "site-cache"
OUT = BUILD / "site"
DOWNLOADS = BUILD / "site-extra"  # copied into the site after Sphinx: the .ipynb downloads
CODE_SPANS = "code-spans.json"  # in the site: each page's code as its source has it

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
JUPYTERLAB_PAGE = "open_in_jupyterlab.md"
#: the pages of docs/ on the site, in the navigation's order: the teaching notes, then the pages the
#: README points to for its detail (docs/hosted-gpu.md is site/pages/run_on_a_hosted_gpu.md here)
DOC_PAGES = ("docs/teaching.md", "docs/benchmark.md", "docs/gpu-kit.md", "docs/testing.md", "docs/website.md")


def _need(module: str, extra: str = "site") -> None:
    try:
        __import__(module)
    except ImportError:
        sys.exit(f"site: Python package '{module}' is missing. Install the site extra: "
                 f"pip install -e '.[{extra}]' (make site does it).")


# --------------------------------------------------------------------------- execution


MODULE_CACHE: dict[str, set[str]] = {}


def _module_file(name: str) -> Path | None:
    """The file of a ``course_utils`` module (``course_utils.memory`` -> course_utils/memory/__init__.py)."""
    parts = name.split(".")
    base = ROOT.joinpath(*parts)
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _imports(tree, package: str | None) -> set[str]:
    """The ``course_utils`` modules an AST imports (relative imports resolved against ``package``),
    anywhere in it: a lazy import inside a function counts too."""
    import ast

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "course_utils"}
        elif isinstance(node, ast.ImportFrom):
            if node.level and package:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "course_utils":
                continue
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names if _module_file(f"{mod}.{a.name}")}
    return found


def used_modules(code: str) -> set[str]:
    """Every ``course_utils`` module that running ``code`` can import: its own imports, each
    module's imports, transitively, and each package's ``__init__`` on the way (read with ``ast``,
    nothing imported). IPython magics and shell lines are skipped."""
    import ast

    lines = [ln for ln in code.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    try:
        todo = _imports(ast.parse("\n".join(lines)), None)
    except SyntaxError:  # a cell we cannot parse: assume it may use anything
        todo = {"course_utils." + f.relative_to(ROOT / "course_utils").with_suffix("").as_posix().replace("/", ".")
                for f in (ROOT / "course_utils").rglob("*.py")}
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__
            prefix = ".".join(parts[:i])
            if prefix in seen or _module_file(prefix) is None:
                continue
            seen.add(prefix)
            f = _module_file(prefix)
            if prefix not in MODULE_CACHE:
                pkg = prefix if f.name == "__init__.py" else prefix.rpartition(".")[0]
                MODULE_CACHE[prefix] = _imports(ast.parse(f.read_bytes()), pkg)
            todo |= MODULE_CACHE[prefix] - seen
    return seen


def notebook_inputs(nb_path: Path) -> list[Path]:
    """The files whose change can change the notebook's executed outputs: the notebook, the
    ``course_utils`` modules it uses, the package's data files (templates), and the recorded GPU
    figures it may show."""
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    files = [nb_path] + sorted(_module_file(m) for m in used_modules(code))
    files += sorted(f for f in (ROOT / "course_utils").rglob("*")
                    if f.is_file() and f.suffix not in (".py", ".pyc") and "__pycache__" not in f.parts)
    return files


def _digest(nb_path: Path, preset: str, recorded_dir: Path) -> str:
    import torch

    h = hashlib.sha256()
    for f in notebook_inputs(nb_path):
        h.update((f.relative_to(ROOT).as_posix() if f.is_relative_to(ROOT) else f.name).encode())
        h.update(f.read_bytes())
    from course_utils.recorded import RUN_FILES  # the GPU runs' records recorded.gpu_runs reads beside it

    runs = sorted(f for g in RUN_FILES for f in recorded_dir.parent.glob(g))
    for f in (sorted(recorded_dir.glob("*.json")) if recorded_dir.is_dir() else []) + runs:
        h.update(f.relative_to(recorded_dir.parent).as_posix().encode())
        h.update(f.read_bytes())
    h.update(f"{preset}|{torch.__version__}|{sys.version}|{recorded_dir}".encode())
    return h.hexdigest()[:16]


def kernel_env(preset: str, recorded_dir: Path) -> dict[str, str]:
    """The kernel's environment: the preset, inline figures (an MPLBACKEND=Agg set for tests would
    make plt.show() draw nothing), this checkout's course_utils first, and the recorded GPU figures
    to show; never recording."""
    from course_utils import recorded

    env = dict(os.environ)
    env.update(COURSE_SIZE=preset, MPLBACKEND="module://matplotlib_inline.backend_inline",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env[recorded.SHOW_ENV_VAR] = str(recorded_dir)
    env.pop(recorded.ENV_VAR, None)  # the site shows recorded figures, never records
    return env


def execute(nb_path: Path, preset: str, fresh: bool, timeout: int,
            recorded_dir: Path | None = None) -> tuple[dict, float, bool]:
    """The executed notebook (nbformat node), the seconds it took, and whether it came from cache.
    Safe to call from several threads at once (the environment is passed, not set)."""
    import nbformat
    from nbclient import NotebookClient

    recorded_dir = Path(recorded_dir or ROOT / "recorded")
    CACHE.mkdir(parents=True, exist_ok=True)
    cached = CACHE / f"{nb_path.stem}.{_digest(nb_path, preset, recorded_dir)}.ipynb"
    if cached.exists() and not fresh:
        meta = json.loads(cached.with_suffix(".json").read_text())
        return nbformat.read(cached, as_version=4), meta["seconds"], True
    for old in CACHE.glob(f"{nb_path.stem}.*"):
        old.unlink()
    nb = nbformat.read(nb_path, as_version=4)
    t0 = time.perf_counter()
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            store_widget_state=True,
                            resources={"metadata": {"path": str(nb_path.parent)}})
    client.execute(env=kernel_env(preset, recorded_dir))
    seconds = time.perf_counter() - t0
    nbformat.write(nb, cached)
    cached.with_suffix(".json").write_text(json.dumps({"seconds": seconds}))
    return nb, seconds, False


def cell_errors(nb) -> list[str]:
    out = []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                out.append(f"cell {i}: {o.get('ename')}: {o.get('evalue')}")
    return out


# --------------------------------------------------------------------------- widgets


def _widget_html(state: dict, model_id: str, outputs: list, depth: int = 0) -> str:
    """A static HTML rendering of one widget (and its children) from the saved widget state;
    the outputs captured by Output widgets are appended to ``outputs``."""
    entry = state.get(model_id)
    if entry is None or depth > 20:
        return ""
    name = entry.get("model_name", "")
    s = entry.get("state", {})
    desc = html.escape(str(s.get("description", "")))
    if name in ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel"):
        kids = [_widget_html(state, str(c).removeprefix("IPY_MODEL_"), outputs, depth + 1)
                for c in s.get("children", [])]
        cls = "row" if name == "HBoxModel" else "col"
        return f'<div class="static-widget-{cls}">' + "".join(kids) + "</div>"
    if name == "OutputModel":
        outputs.extend(s.get("outputs", []))
        return ""
    if name in ("HTMLModel", "HTMLMathModel"):
        return f"<span>{s.get('value', '')}</span>"  # the widget's own HTML, as the widget shows it
    if name == "LabelModel":
        return f"<span>{html.escape(str(s.get('value', '')))}</span>"
    if name in ("FloatProgressModel", "IntProgressModel"):
        return (f'<progress value="{s.get("value", 0)}" max="{s.get("max", 100)}"></progress>')
    if name in ("DropdownModel", "SelectModel", "RadioButtonsModel", "ToggleButtonsModel"):
        labels = s.get("_options_labels", [])
        idx = s.get("index")
        value = labels[idx] if isinstance(idx, int) and idx < len(labels) else ""
        return f'<span class="static-widget-control">{desc}: <b>{html.escape(str(value))}</b></span>'
    if name in ("CheckboxModel", "ToggleButtonModel"):
        mark = "&#9745;" if s.get("value") else "&#9744;"
        return f'<span class="static-widget-control">{mark} {desc}</span>'
    if "value" in s:
        return (f'<span class="static-widget-control">{desc}: '
                f'<b>{html.escape(str(s.get("value")))}</b></span>')
    return ""


def render_widgets(nb) -> int:
    """Replace every widget output with a static rendering of its saved state and a note;
    drop the widget state so that no widget JavaScript is put in the page. Returns how many."""
    import nbformat

    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    n = 0
    for cell in nb.cells:
        new = []
        for o in cell.get("outputs", []):
            view = o.get("data", {}).get(WIDGET_VIEW) if o.get("output_type") in ("display_data", "execute_result") else None
            if view is None:
                new.append(o)
                continue
            n += 1
            captured: list = []
            body = _widget_html(state, view.get("model_id", ""), captured)
            is_progress = "progress" in body and not captured
            if is_progress:  # a tqdm bar: its final state is all there is to show
                new.append(nbformat.from_dict({
                    "output_type": "display_data", "metadata": {},
                    "data": {"text/html": f'<div class="static-widget">{body}</div>',
                             "text/plain": "progress bar"}}))
                continue
            note = ("<p class=\"static-widget-note\"><b>Interactive widget, shown here as a static "
                    "picture.</b> On this page it cannot run: below are its controls and its "
                    "output as they were when the site was built (the widget's default state). "
                    f"In JupyterLab the widget is live: see <a href=\"../{JUPYTERLAB_PAGE[:-3]}.html\">"
                    "Open in JupyterLab</a>.</p>")
            if view.get("model_id", "") not in state:
                body = "<p>(the widget's state was not saved by the build)</p>"
            new.append(nbformat.from_dict({
                "output_type": "display_data", "metadata": {},
                "data": {"text/html": f'<div class="static-widget">{note}{body}</div>',
                         "text/plain": "interactive widget (live in JupyterLab)"}}))
            new.extend(nbformat.from_dict(o) for o in captured)
        if "outputs" in cell:
            cell["outputs"] = new
    nb.metadata.pop("widgets", None)
    return n


# --------------------------------------------------------------------------- pages

LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")
# code, which no rewriting may touch: a fenced block (``` or ~~~, to its closing fence or the end
# of the text) or an inline span (a run of backticks to the next run of the same length)
CODE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)"
                  r"|(?<!`)(`+)(?!`).+?(?<!`)\2(?!`)", re.M | re.S)
FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n(.*?)(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)


def code_spans(text: str) -> list[str]:
    """The inline code spans (their text) and fenced blocks (their body) of markdown ``text``,
    whitespace collapsed: what the page must show exactly (site/check.py compares)."""
    out = []
    for m in CODE.finditer(text):
        if m.group(1):  # a fenced block: its body
            body = FENCE.match(m.group(0)).group(2)
        else:
            body = m.group(0)[len(m.group(2)):-len(m.group(2))]
        body = " ".join(body.split())
        if body:
            out.append(body)
    return out


def protect_code(text: str) -> tuple[str, list[str]]:
    """``text`` with every code span and fenced block replaced by a placeholder, and the list
    to put them back with ``restore_code``."""
    saved: list[str] = []

    def keep(m: re.Match) -> str:
        saved.append(m.group(0))
        return f"\x00{len(saved) - 1}\x00"

    return CODE.sub(keep, text), saved


def restore_code(text: str, saved: list[str]) -> str:
    return re.sub("\x00(\\d+)\x00", lambda m: saved[int(m.group(1))], text)


def fix_links(text: str, here: Path, pages: set[str]) -> str:
    """Relative links to a file that is not a page of the site become plain text naming the file
    in the repository (a learner reading the site has no such file to open). Code (inline spans,
    fenced blocks) is never rewritten: ``[a](b)`` inside backticks is code, not a link."""

    def repl(m: re.Match) -> str:
        label, target = m.group(1), m.group(2)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return m.group(0)
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath((here / path).as_posix())
        if resolved == "README.md":  # the front page
            index = os.path.relpath("index.md", here.as_posix())
            return f"[{label}]({index}{'#' + anchor if anchor else ''})"
        if resolved in pages:
            return m.group(0)
        return f"{label} (`{resolved}` in the repository)"

    masked, saved = protect_code(text)
    return restore_code(LINK.sub(repl, masked), saved)


def notebook_title(nb, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+)$", cell.source, re.M)
            if m:
                return m.group(1).strip()
    return fallback


def _text(o) -> str:
    t = o.get("text", "") if o.get("output_type") == "stream" else o.get("data", {}).get("text/plain", "")
    return t if isinstance(t, str) else "".join(t)


def setup_line(nb) -> str | None:
    """What course_utils.setup() printed: 'device: ... | preset: ... | ...'."""
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            m = re.search(r"device: .*?\| preset: .*", _text(o))
            if m:
                return m.group(0).strip()
    return None


# what course_utils.recorded.show prints, with and without a recording
SHOWN_RECORDED = re.compile(r"The figure below was recorded on ([^,\n]+), ([0-9-]+)")
NOT_RECORDED = "No GPU run has been recorded for this figure yet"


def gpu_outputs(nb) -> dict:
    """The figures of an executed notebook that needed a GPU: how many were shown from a
    recorded GPU run (and on which GPUs), how many said that none is recorded."""
    shown, missing, gpus = 0, 0, set()
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            text = _text(o)
            for m in SHOWN_RECORDED.finditer(text):
                shown += 1
                gpus.add(m.group(1))
            missing += text.count(NOT_RECORDED)
    return {"recorded": shown, "not_recorded": missing, "gpus": sorted(gpus)}


def gpu_sentence(gpu: dict, machine: str) -> str:
    """What the banner says about the figures that need a GPU: computed from the outputs."""
    parts = []
    if gpu["recorded"]:
        parts.append(f"{gpu['recorded']} figure(s) that need a CUDA GPU are shown as recorded on "
                     f"{', '.join(gpu['gpus'])}, each labelled with its GPU, date and torch.")
    if gpu["not_recorded"]:
        parts.append(f"{gpu['not_recorded']} figure(s) need a CUDA GPU and no GPU run has been "
                     "recorded for them yet: those cells say so instead of showing one.")
    if not parts:
        parts.append(f"Every output was computed on this machine ({machine}).")
    return " ".join(parts)


def prerequisites(nb, stem: str, stems: list[str]) -> str:
    """The notebooks this one builds on: the one before it in the syllabus, and the earlier ones
    its text refers to ("notebook 02")."""
    i = stems.index(stem)
    if i == 0:
        return "none: the course starts here"
    nn = stem[:2]
    text = "\n".join(c.source for c in nb.cells if c.get("metadata", {}).get("site") is None)
    cited = sorted({m for m in re.findall(r"[Nn]otebooks? (\d\d)\b", text) if m < nn})
    by_nn = {s[:2]: s for s in stems}
    prev = stems[i - 1]
    refs = [by_nn[c] for c in cited if c in by_nn and by_nn[c] != prev]
    out = f"[{prev}]({prev}.ipynb) (the syllabus order: 00 to {prev[:2]})"
    if refs:
        out += "; it refers back to " + ", ".join(f"[{r}]({r}.ipynb)" for r in refs)
    return out


def timings() -> dict:
    """The measured times of the notebooks: CPU from results/timings.json (docs/teaching.md's
    table), GPU from a recorded GPU run (``gpu/notebook_seconds``), if any."""
    from course_utils import recorded

    out: dict = {"cpu": {}, "gpu": {}}
    f = ROOT / "results" / "timings.json"
    if f.exists():
        data = json.loads(f.read_text())
        for nn, r in data.get("rows", {}).items():
            if "notebooks" in r:
                m = r.get("measured", data["meta"])
                out["cpu"][nn] = (r["notebooks"], f"{m['cores']} cores, {m['date']}")
    rec = recorded.lookup("gpu/notebook_seconds")
    if rec is not None:
        for name, secs in rec.value.items():
            out["gpu"][name[:2]] = (secs, rec.meta["gpu"])
    return out


def time_sentence(nn: str, times: dict) -> str:
    parts = []
    if nn in times["cpu"]:
        secs, where = times["cpu"][nn]
        parts.append(f"{secs} s on a CPU at the tiny preset ({where}; "
                     "[teaching notes](../docs/teaching.md))")
    if nn in times["gpu"]:
        secs, gpu = times["gpu"][nn]
        parts.append(f"{secs:.0f} s on {gpu} at the full preset (recorded GPU run)")
    else:
        parts.append("on a GPU: not recorded yet")
    return "; ".join(parts)


def md_cell(source: str, kind: str):
    import nbformat

    cell = nbformat.v4.new_markdown_cell(source)
    cell.metadata["site"] = kind
    return cell


def insert_after_title(nb, cell) -> None:
    """Put ``cell`` right after the first markdown cell (the title), or first."""
    for i, c in enumerate(nb.cells):
        if c.cell_type == "markdown":
            nb.cells.insert(i + 1, cell)
            return
    nb.cells.insert(0, cell)


def build_info(preset: str) -> dict:
    import torch

    return {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "python": platform.python_version(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "preset": preset, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def download_link(stem: str, what: str) -> str:
    """Raw HTML (a Sphinx link would point at the page): the .ipynb copied beside the page."""
    return f'<a class="download-notebook" href="{stem}.ipynb" download>Download this {what} (.ipynb)</a>'


def notebook_page(nb, stem: str, stems: list[str], exercises: set[str], info: dict, seconds: float,
                  pages: set[str], gpu: dict | None = None, times: dict | None = None) -> None:
    from course_utils.layout import exercise_name  # lazy: course_utils imports torch, as this file's others wait

    i = stems.index(stem)
    line = setup_line(nb)
    gpu = gpu if gpu is not None else gpu_outputs(nb)
    times = times if times is not None else {"cpu": {}, "gpu": {}}
    where = (f"`{line}`" if line else
             f"{info['gpu'] or 'CPU'} ({info['machine']}), preset {info['preset']} "
             "(course_utils.setup() printed no device line)")
    links = []
    if stem in exercises:
        links.append(f"[Exercise {stem[:2]}](../exercises/{exercise_name(stem)})")
    if i + 1 < len(stems):
        links.append(f"[Next: {stems[i + 1]}]({stems[i + 1]}.ipynb)")
    links.append(f"[Open in JupyterLab](../{JUPYTERLAB_PAGE})")
    links.append(download_link(stem, "notebook"))
    banner = (
        ":::{admonition} Outputs on this page\n:class: course-banner\n"
        f"Executed by `make site` on {info['date']} with torch {info['torch']} "
        f"(Python {info['python']}, {info['machine']}) at `COURSE_SIZE={info['preset']}`, "
        f"top to bottom in {seconds:.0f} s. The notebook's setup printed: {where}. "
        f"{gpu_sentence(gpu, info['gpu'] or 'CPU')}\n\n"
        f"**Before this notebook:** {prerequisites(nb, stem, stems)}. "
        f"**Time to run it:** {time_sentence(stem[:2], times)}.\n\n"
        + " · ".join(links) + "\n:::\n"
    )
    insert_after_title(nb, md_cell(banner, "banner"))
    foot = ["---", "", "**Where next**", ""]
    if stem in exercises:
        foot.append(f"- Exercise: [exercises/{exercise_name(stem)}](../exercises/{exercise_name(stem)}) "
                    "(grades itself when you run it in JupyterLab)")
    if i + 1 < len(stems):
        foot.append(f"- Next notebook: [{stems[i + 1]}]({stems[i + 1]}.ipynb)")
    else:
        foot.append("- That was the last notebook: [teaching notes](../docs/teaching.md)")
    foot.append(f"- Run this notebook yourself: [open in JupyterLab](../{JUPYTERLAB_PAGE}) "
                f"(`notebooks/{stem}.ipynb`), or {download_link(stem, 'notebook')}")
    nb.cells.append(md_cell("\n".join(foot), "footer"))
    here = Path("notebooks")
    for c in nb.cells:
        if c.cell_type == "markdown":
            c.source = fix_links(c.source, here, pages)


def exercise_page(nb, stem: str, notebooks: set[str], pages: set[str]) -> None:
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = []
            c.execution_count = None
        if c.cell_type == "markdown":
            c.source = fix_links(c.source, Path("exercises"), pages)
    from course_utils.layout import lesson_stem  # lazy: course_utils imports torch

    lesson = lesson_stem(stem)
    back = f"[notebook {lesson}](../notebooks/{lesson}.ipynb)" if lesson in notebooks else "its notebook"
    insert_after_title(nb, md_cell(
        ":::{admonition} An exercise to run, not to read\n:class: course-banner\n"
        f"This page shows the exercise that goes with {back}, not executed: its stubs raise "
        "`NotImplementedError` until you fill them in, and its check cell grades your answers. "
        f"Run it in JupyterLab ([open in JupyterLab](../{JUPYTERLAB_PAGE})): `make lab` shows the "
        f"whole course, so open `exercises/{stem}.ipynb` in the file browser, beside `notebooks/`. "
        f"Or {download_link(stem, 'exercise')} and open it in a checkout of the course. "
        "Solutions are not published on this site.\n:::\n", "banner"))


def strip_outputs(nb) -> None:
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = []
            c.execution_count = None
    nb.metadata.pop("widgets", None)


def index_page(readme: str, stems: list[str], exercises: list[str], pages: set[str], info: dict,
               extra_pages: list[str] | None = None) -> str:
    text = readme
    for stem in stems:  # the notebook table names notebooks in backticks: make them links
        text = text.replace(f"`{stem}`", f"[`{stem}`](notebooks/{stem}.ipynb)")
    text = fix_links(text, Path("."), pages)
    gpu = info["gpu"] or "the CPU"
    text = text.replace("\n", (
        "\n\n:::{admonition} This website\n:class: course-banner\n"
        f"Built by `make site` on {info['date']} (torch {info['torch']}). Every notebook was "
        f"executed top to bottom on {gpu} ({info['machine']}) at `COURSE_SIZE={info['preset']}`; "
        "each page says so at its top. To run the notebooks yourself: "
        f"[open in JupyterLab]({JUPYTERLAB_PAGE}).\n:::\n\n"), 1)
    # every page of site/pages/ is in the navigation, the JupyterLab page first
    extra = sorted(extra_pages if extra_pages is not None else [JUPYTERLAB_PAGE],
                   key=lambda n: (n != JUPYTERLAB_PAGE, n))
    toc = ["", "```{toctree}", ":hidden:", ":caption: Notebooks", ""]
    toc += [f"notebooks/{s}" for s in stems]
    toc += ["```", "", "```{toctree}", ":hidden:", ":caption: Exercises", ""]
    toc += [f"exercises/{s}" for s in exercises]
    toc += ["```", "", "```{toctree}", ":hidden:", ":caption: Using the course", ""]
    toc += [*[d[:-3] for d in DOC_PAGES], *[n[:-3] for n in extra], "```", ""]
    return text + "\n".join(toc)


def _md_spans(nb) -> list[str]:
    return [s for c in nb.cells if c.cell_type == "markdown" for s in code_spans(c.source)]


def execute_all(nb_paths: list[Path], preset: str, fresh: bool, timeout: int, jobs: int,
                recorded_dir: Path | None = None) -> dict[Path, tuple]:
    """Execute (or take from the cache) every notebook, ``jobs`` kernels at a time; each line is
    printed as its notebook finishes."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    done = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(execute, p, preset, fresh, timeout, recorded_dir): p for p in nb_paths}
        for fut in as_completed(futures):
            p = futures[fut]
            done[p] = fut.result()
            _, seconds, hit = done[p]
            print(f"  executed {p.stem:32s} {seconds:6.1f} s{' (cached)' if hit else ''}", flush=True)
    return done


def assemble(preset: str, fresh: bool, timeout: int, jobs: int = 2, only: set[str] | None = None,
             recorded_dir: Path | None = None) -> tuple[list[str], dict]:
    import nbformat

    from course_utils.layout import lesson_stem

    info = build_info(preset)
    nb_paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    ex_paths = sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))
    if only:
        nb_paths = [p for p in nb_paths if p.name[:2] in only]
        ex_paths = [p for p in ex_paths if p.name[:2] in only]
    stems = [p.stem for p in nb_paths]
    ex_stems = [p.stem for p in ex_paths]
    extra_pages = sorted(p.name for p in (SITE / "pages").glob("*.md"))
    pages = ({f"notebooks/{s}.ipynb" for s in stems} | {f"exercises/{s}.ipynb" for s in ex_stems}
             | {*DOC_PAGES, *extra_pages})
    for folder in (SRC, DOWNLOADS):
        if folder.exists():
            shutil.rmtree(folder)
    (DOWNLOADS / "notebooks").mkdir(parents=True)
    (DOWNLOADS / "exercises").mkdir()
    (SRC / "notebooks").mkdir(parents=True)
    (SRC / "exercises").mkdir()
    (SRC / "docs").mkdir()
    report = []
    executed = execute_all(nb_paths, preset, fresh, timeout, jobs, recorded_dir)
    recorded_use = {}
    times = timings()
    spans: dict[str, list[str]] = {}  # page -> the code its source shows (site/check.py compares)
    for p in nb_paths:
        spans[f"notebooks/{p.stem}.html"] = _md_spans(nbformat.read(p, as_version=4))
        nb, seconds, hit = executed[p]
        errors = cell_errors(nb)
        n_widgets = render_widgets(nb)
        gpu = gpu_outputs(nb)
        recorded_use[p.stem] = gpu
        notebook_page(nb, p.stem, stems, {lesson_stem(s) for s in ex_stems}, info, seconds, pages, gpu=gpu, times=times)
        nbformat.write(nb, SRC / "notebooks" / p.name)
        report.append(f"  {p.stem:32s} {seconds:6.1f} s{' (cached)' if hit else ''}"
                      f"{f', {n_widgets} widget(s) rendered static' if n_widgets else ''}"
                      + "".join(f"\n      ERROR {e}" for e in errors))
    for p in ex_paths:
        nb = nbformat.read(p, as_version=4)
        spans[f"exercises/{p.stem}.html"] = _md_spans(nb)
        strip_outputs(nb)
        nbformat.write(nb, DOWNLOADS / "exercises" / p.name)
        exercise_page(nb, p.stem, set(stems), pages)
        nbformat.write(nb, SRC / "exercises" / p.name)
    for p in nb_paths:  # the notebooks as in git (no outputs), to download
        nb = nbformat.read(p, as_version=4)
        strip_outputs(nb)
        nbformat.write(nb, DOWNLOADS / "notebooks" / p.name)
    for doc in DOC_PAGES:
        text = (ROOT / doc).read_text()
        spans[f"{doc[:-3]}.html"] = code_spans(text)
        (SRC / doc).write_text(fix_links(text, Path("docs"), pages))
    for page in (SITE / "pages").glob("*.md"):
        (SRC / page.name).write_text(fix_links(page.read_text(), Path("."), pages))
        spans[f"{page.stem}.html"] = code_spans(page.read_text())
    readme = (ROOT / "README.md").read_text()
    spans["index.html"] = code_spans(readme)
    (DOWNLOADS / CODE_SPANS).write_text(json.dumps(spans, indent=0))
    (SRC / "index.md").write_text(index_page(readme, stems, ex_stems, pages, info, extra_pages))
    info["pages"] = len(stems) + len(ex_stems) + 1 + len(DOC_PAGES) + len(extra_pages)
    info["recorded"] = recorded_use
    (SRC / "site-info.json").write_text(json.dumps(info))
    return report, info


def sphinx(quiet: bool = True) -> int:
    from sphinx.cmd.build import build_main

    args = ["-b", "html", "-E", "-c", str(SITE), "-d", str(BUILD / "site-doctrees"), str(SRC), str(OUT)]
    rc = build_main((["-q"] if quiet else []) + args)
    if rc == 0:
        shutil.copytree(DOWNLOADS, OUT, dirs_exist_ok=True)
    return rc


def recorded_report(info: dict) -> list[str]:
    """Which pages show recorded GPU figures, and which still say none is recorded."""
    lines = []
    for stem, g in info["recorded"].items():
        if g["recorded"] or g["not_recorded"]:
            lines.append(f"  {stem:32s} {g['recorded']} recorded GPU figure(s)"
                         f"{' (' + ', '.join(g['gpus']) + ')' if g['gpus'] else ''}, "
                         f"{g['not_recorded']} not recorded")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", help="COURSE_SIZE for executing the notebooks (default tiny)")
    ap.add_argument("--fresh", action="store_true", help="execute every notebook again, ignoring the cache")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    ap.add_argument("--jobs", "-j", type=int, default=2,
                    help="notebooks executed at once, one kernel each (default 2)")
    ap.add_argument("--only", help="build the pages of these notebooks only, e.g. --only 04,10 "
                    "(to work on the site; the other pages are left out)")
    ap.add_argument("--recorded", type=Path, default=ROOT / "recorded",
                    help="folder of recorded GPU figures to show (default recorded/)")
    args = ap.parse_args(argv)
    for module in ("sphinx", "myst_nb", "furo", "nbclient", "nbformat", "ipykernel"):
        _need(module)
    only = None
    if args.only:
        only = {n.strip().zfill(2) for n in args.only.split(",") if n.strip()}
        known = {p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
        if not only <= known:
            ap.error(f"--only {args.only}: no notebook {', '.join(sorted(only - known))}; "
                     f"give numbers of notebooks/NN_*.ipynb, e.g. --only 04,10")
    if args.jobs < 1:
        ap.error("--jobs must be 1 or more")
    t0 = time.perf_counter()
    print(f"site: executing notebooks at COURSE_SIZE={args.preset}, {args.jobs} at a time "
          f"(cache: {CACHE.relative_to(ROOT)})", flush=True)
    report, info = assemble(args.preset, args.fresh, args.timeout, args.jobs, only, args.recorded)
    print("\n".join(report), flush=True)
    used = recorded_report(info)
    print("site: pages with figures that need a GPU (shown from recorded runs in "
          f"{args.recorded}, or saying none is recorded):" if used else
          "site: no page has a figure that needs a GPU", flush=True)
    if used:
        print("\n".join(used), flush=True)
    t1 = time.perf_counter()
    print(f"site: sphinx-build -> {OUT.relative_to(ROOT)}", flush=True)
    rc = sphinx()
    t2 = time.perf_counter()
    errors = [r for r in report if "ERROR" in r]
    print(f"site: {info['pages']} pages in {OUT.relative_to(ROOT)}/ ; notebooks {t1 - t0:.0f} s, "
          f"sphinx {t2 - t1:.0f} s, total {t2 - t0:.0f} s. Open {OUT.relative_to(ROOT)}/index.html")
    if errors:
        print("site: WARNING: cells raised errors (the pages show them; make site-check fails on them)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
