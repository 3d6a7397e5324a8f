"""Build the course as a static website: ``make site`` (or ``python site/build.py``).

1. Execute every notebook in ``notebooks/`` top to bottom with nbclient, in ``notebooks/`` (as
   JupyterLab would), at the ``tiny`` preset (``COURSE_SIZE=tiny``), on this machine. Executed
   copies are cached in ``build/site-cache/`` under a hash of the notebook, ``course_utils/``,
   ``recorded/``, the preset and the torch version; ``--fresh`` ignores the cache.
2. Assemble a Sphinx source tree in ``build/site-src/`` from COPIES (nothing in git is changed):
   README as the front page, the executed notebooks, the exercises (not executed; solutions are
   never copied), ``docs/teaching.md`` and the pages in ``site/pages/``. Each copy gets a banner
   (preset, device, build date, torch) and a footer (exercise, next page, open in JupyterLab);
   widget outputs are replaced by a static rendering of their state when executed plus a note
   that they are live in JupyterLab; relative links to files that are not pages become text.
3. ``sphinx-build`` (myst-nb reader, Furo theme, both from pip, nothing downloaded) writes HTML
   into ``build/site/``.
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

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
JUPYTERLAB_PAGE = "open_in_jupyterlab.md"


def _need(module: str, extra: str = "site") -> None:
    try:
        __import__(module)
    except ImportError:
        sys.exit(f"site: Python package '{module}' is missing. Install the site extra: "
                 f"pip install -e '.[{extra}]' (make site does it).")


# --------------------------------------------------------------------------- execution


def _digest(nb_path: Path, preset: str) -> str:
    import torch

    h = hashlib.sha256()
    h.update(nb_path.read_bytes())
    for folder in ("course_utils", "recorded"):
        for f in sorted((ROOT / folder).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(f.relative_to(ROOT).as_posix().encode())
                h.update(f.read_bytes())
    h.update(f"{preset}|{torch.__version__}|{sys.version}".encode())
    return h.hexdigest()[:16]


def execute(nb_path: Path, preset: str, fresh: bool, timeout: int) -> tuple[dict, float, bool]:
    """The executed notebook (nbformat node), the seconds it took, and whether it came from cache."""
    import nbformat
    from nbclient import NotebookClient

    CACHE.mkdir(parents=True, exist_ok=True)
    cached = CACHE / f"{nb_path.stem}.{_digest(nb_path, preset)}.ipynb"
    if cached.exists() and not fresh:
        meta = json.loads(cached.with_suffix(".json").read_text())
        return nbformat.read(cached, as_version=4), meta["seconds"], True
    for old in CACHE.glob(f"{nb_path.stem}.*"):
        old.unlink()
    nb = nbformat.read(nb_path, as_version=4)
    env_backup = dict(os.environ)
    # the kernel inherits this environment: the preset, inline figures (an MPLBACKEND=Agg set for
    # tests would make plt.show() draw nothing), and this checkout's course_utils first
    os.environ["COURSE_SIZE"] = preset
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env_backup.get("PYTHONPATH")])])
    os.environ.pop("COURSE_RECORD_DIR", None)  # the site shows recorded figures, never records
    t0 = time.perf_counter()
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                store_widget_state=True,
                                resources={"metadata": {"path": str(nb_path.parent)}})
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(env_backup)
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


def fix_links(text: str, here: Path, pages: set[str]) -> str:
    """Relative links to a file that is not a page of the site become plain text naming the file
    in the repository (a learner reading the site has no such file to open)."""

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

    return LINK.sub(repl, text)


def notebook_title(nb, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+)$", cell.source, re.M)
            if m:
                return m.group(1).strip()
    return fallback


def setup_line(nb) -> str | None:
    """What course_utils.setup() printed: 'device: ... | preset: ... | ...'."""
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            text = o.get("text", "") if o.get("output_type") == "stream" else o.get("data", {}).get("text/plain", "")
            m = re.search(r"device: .*?\| preset: .*", text if isinstance(text, str) else "".join(text))
            if m:
                return m.group(0).strip()
    return None


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


def notebook_page(nb, stem: str, stems: list[str], exercises: set[str], info: dict, seconds: float,
                  pages: set[str]) -> None:
    i = stems.index(stem)
    line = setup_line(nb)
    where = (f"`{line}`" if line else
             f"{info['gpu'] or 'CPU'} ({info['machine']}), preset {info['preset']} "
             "(course_utils.setup() printed no device line)")
    links = []
    if stem in exercises:
        links.append(f"[Exercise {stem[:2]}](../exercises/{stem}.ipynb)")
    if i + 1 < len(stems):
        links.append(f"[Next: {stems[i + 1]}]({stems[i + 1]}.ipynb)")
    links.append(f"[Open in JupyterLab](../{JUPYTERLAB_PAGE})")
    banner = (
        ":::{admonition} Outputs on this page\n:class: course-banner\n"
        f"Executed by `make site` on {info['date']} with torch {info['torch']} "
        f"(Python {info['python']}, {info['machine']}) at `COURSE_SIZE={info['preset']}`, "
        f"top to bottom in {seconds:.0f} s. The notebook's setup printed: {where}. "
        "Figures that need a GPU are printed from recorded GPU runs, labelled with their GPU.\n\n"
        + " · ".join(links) + "\n:::\n"
    )
    insert_after_title(nb, md_cell(banner, "banner"))
    foot = ["---", "", "**Where next**", ""]
    if stem in exercises:
        foot.append(f"- Exercise: [exercises/{stem}](../exercises/{stem}.ipynb) "
                    "(grades itself when you run it in JupyterLab)")
    if i + 1 < len(stems):
        foot.append(f"- Next notebook: [{stems[i + 1]}]({stems[i + 1]}.ipynb)")
    else:
        foot.append("- That was the last notebook: [teaching notes](../docs/teaching.md)")
    foot.append(f"- Run this notebook yourself: [open in JupyterLab](../{JUPYTERLAB_PAGE}) "
                f"(`notebooks/{stem}.ipynb`)")
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
    back = f"[notebook {stem}](../notebooks/{stem}.ipynb)" if stem in notebooks else "its notebook"
    insert_after_title(nb, md_cell(
        ":::{admonition} An exercise to run, not to read\n:class: course-banner\n"
        f"This page shows the exercise that goes with {back}, not executed: its stubs raise "
        "`NotImplementedError` until you fill them in, and its check cell grades your answers. "
        f"Run it in JupyterLab: [open in JupyterLab](../{JUPYTERLAB_PAGE}), then open "
        f"`exercises/{stem}.ipynb`. Solutions are not published on this site.\n:::\n", "banner"))


def index_page(readme: str, stems: list[str], exercises: list[str], pages: set[str], info: dict) -> str:
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
    toc = ["", "```{toctree}", ":hidden:", ":caption: Notebooks", ""]
    toc += [f"notebooks/{s}" for s in stems]
    toc += ["```", "", "```{toctree}", ":hidden:", ":caption: Exercises", ""]
    toc += [f"exercises/{s}" for s in exercises]
    toc += ["```", "", "```{toctree}", ":hidden:", ":caption: Using the course", ""]
    toc += ["docs/teaching", JUPYTERLAB_PAGE[:-3], "```", ""]
    return text + "\n".join(toc)


def assemble(preset: str, fresh: bool, timeout: int) -> tuple[list[str], dict]:
    import nbformat

    info = build_info(preset)
    nb_paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    ex_paths = sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))
    stems = [p.stem for p in nb_paths]
    ex_stems = [p.stem for p in ex_paths]
    pages = ({f"notebooks/{s}.ipynb" for s in stems} | {f"exercises/{s}.ipynb" for s in ex_stems}
             | {"docs/teaching.md", JUPYTERLAB_PAGE})
    if SRC.exists():
        shutil.rmtree(SRC)
    (SRC / "notebooks").mkdir(parents=True)
    (SRC / "exercises").mkdir()
    (SRC / "docs").mkdir()
    report = []
    for p in nb_paths:
        nb, seconds, hit = execute(p, preset, fresh, timeout)
        errors = cell_errors(nb)
        n_widgets = render_widgets(nb)
        notebook_page(nb, p.stem, stems, set(ex_stems), info, seconds, pages)
        nbformat.write(nb, SRC / "notebooks" / p.name)
        report.append(f"  {p.stem:32s} {seconds:6.1f} s{' (cached)' if hit else ''}"
                      f"{f', {n_widgets} widget(s) rendered static' if n_widgets else ''}"
                      + "".join(f"\n      ERROR {e}" for e in errors))
        print(report[-1], flush=True)
    for p in ex_paths:
        nb = nbformat.read(p, as_version=4)
        nb.metadata.pop("widgets", None)
        exercise_page(nb, p.stem, set(stems), pages)
        nbformat.write(nb, SRC / "exercises" / p.name)
    teaching = (ROOT / "docs" / "teaching.md").read_text()
    (SRC / "docs" / "teaching.md").write_text(fix_links(teaching, Path("docs"), pages))
    for page in (SITE / "pages").glob("*.md"):
        shutil.copy(page, SRC / page.name)
    readme = (ROOT / "README.md").read_text()
    (SRC / "index.md").write_text(index_page(readme, stems, ex_stems, pages, info))
    info["pages"] = len(stems) + len(ex_stems) + 3
    (SRC / "site-info.json").write_text(json.dumps(info))
    return report, info


def sphinx(quiet: bool = True) -> int:
    from sphinx.cmd.build import build_main

    args = ["-b", "html", "-E", "-c", str(SITE), "-d", str(BUILD / "site-doctrees"), str(SRC), str(OUT)]
    return build_main((["-q"] if quiet else []) + args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", help="COURSE_SIZE for executing the notebooks (default tiny)")
    ap.add_argument("--fresh", action="store_true", help="execute every notebook again, ignoring the cache")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    args = ap.parse_args(argv)
    for module in ("sphinx", "myst_nb", "furo", "nbclient", "nbformat", "ipykernel"):
        _need(module)
    t0 = time.perf_counter()
    print(f"site: executing notebooks at COURSE_SIZE={args.preset} (cache: {CACHE.relative_to(ROOT)})", flush=True)
    report, info = assemble(args.preset, args.fresh, args.timeout)
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
