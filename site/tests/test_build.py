"""The site builder's transforms of the notebook copies (no kernel, no Sphinx: fast).

Run by ``make site-check``, not by ``make test``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import build  # noqa: E402  (site/build.py)

PAGES = {"notebooks/00_a.ipynb", "notebooks/01_b.ipynb", "exercises/00_a.ipynb", "docs/teaching.md",
         build.JUPYTERLAB_PAGE}
INFO = {"date": "2026-01-01", "torch": "9.9.9", "python": "3.11", "machine": "x86_64, 2 cores",
        "preset": "tiny", "gpu": None}


@pytest.mark.parametrize("text, expected", [
    ("[ex](../exercises/00_a.ipynb)", "[ex](../exercises/00_a.ipynb)"),
    ("[next](01_b.ipynb#setup)", "[next](01_b.ipynb#setup)"),
    ("[code](../course_utils/memory.py)", "code (`course_utils/memory.py` in the repository)"),
    ("[home](../README.md#start)", "[home](../index.md#start)"),
    ("[torch](https://pytorch.org/docs)", "[torch](https://pytorch.org/docs)"),
    ("[here](#section)", "[here](#section)"),
    ("![fig](../docs/fig.png)", "![fig](../docs/fig.png)"),  # images are not links
])
def test_fix_links(text, expected):
    assert build.fix_links(text, Path("notebooks"), PAGES) == expected


def widget_nb() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 00 · Title\nIntro"),
                nbformat.v4.new_code_cell("cfg = setup()"),
                nbformat.v4.new_code_cell("explorer()"),
                nbformat.v4.new_code_cell("train()")]
    nb.cells[1].outputs = [nbformat.v4.new_output(
        "stream", name="stdout", text="device: cpu (CPU) | preset: tiny (volume 16x32x32, batch 2) | default\n")]
    view = {"model_id": "box", "version_major": 2, "version_minor": 0}
    nb.cells[2].outputs = [nbformat.v4.new_output(
        "display_data", data={build.WIDGET_VIEW: view, "text/plain": "VBox(children=...)"})]
    nb.cells[3].outputs = [nbformat.v4.new_output(
        "display_data", data={build.WIDGET_VIEW: dict(view, model_id="bar"), "text/plain": "HBox()"})]
    figure = {"output_type": "display_data", "metadata": {}, "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}}
    state = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_row", "IPY_MODEL_out"]}},
        "row": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_s", "IPY_MODEL_d", "IPY_MODEL_c"]}},
        "s": {"model_name": "IntSliderModel", "state": {"description": "levels", "value": 5}},
        "d": {"model_name": "DropdownModel", "state": {"description": "precision", "index": 1,
                                                      "_options_labels": ["fp32", "fp16 model"]}},
        "c": {"model_name": "CheckboxModel", "state": {"description": "in-place ReLU", "value": False}},
        "out": {"model_name": "OutputModel", "state": {"outputs": [figure]}},
        "bar": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_p", "IPY_MODEL_t"]}},
        "p": {"model_name": "FloatProgressModel", "state": {"value": 30, "max": 30}},
        "t": {"model_name": "HTMLModel", "state": {"value": "30/30 [00:01]"}},
    }
    nb.metadata["widgets"] = {build.WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    return nb


def test_widgets_become_static_and_no_widget_state_is_left():
    nb = widget_nb()
    assert build.render_widgets(nb) == 2
    assert "widgets" not in nb.metadata  # myst-nb would add widget JavaScript from a CDN
    outs = [o for c in nb.cells for o in c.get("outputs", [])]
    assert not any(build.WIDGET_VIEW in o.get("data", {}) for o in outs)
    explorer = nb.cells[2].outputs
    html = explorer[0].data["text/html"]
    assert "live" in html and "Open in JupyterLab" in html
    assert "levels: <b>5</b>" in html and "precision: <b>fp16 model</b>" in html and "in-place ReLU" in html
    assert explorer[1].data["image/png"] == "iVBORw0KGgo="  # what the Output widget showed
    bar = nb.cells[3].outputs
    assert len(bar) == 1 and "<progress" in bar[0].data["text/html"] and "JupyterLab" not in bar[0].data["text/html"]
    nbformat.validate(nb)


def test_banner_and_footer():
    nb = widget_nb()
    build.notebook_page(nb, "00_a", ["00_a", "01_b"], {"00_a"}, INFO, 12.3, PAGES)
    banner, footer = nb.cells[1].source, nb.cells[-1].source
    assert nb.cells[0].source.startswith("# 00")  # the title stays first
    assert "COURSE_SIZE=tiny" in banner and "torch 9.9.9" in banner and "2026-01-01" in banner
    assert "device: cpu (CPU) | preset: tiny" in banner  # what setup() printed
    for link in ("(../exercises/00_a.ipynb)", "(01_b.ipynb)", f"(../{build.JUPYTERLAB_PAGE})"):
        assert link in banner and link in footer


def test_last_notebook_links_to_teaching_notes_and_without_exercise():
    nb = widget_nb()
    build.notebook_page(nb, "01_b", ["00_a", "01_b"], {"00_a"}, INFO, 1.0, PAGES)
    assert "exercises/" not in nb.cells[1].source
    assert "../docs/teaching.md" in nb.cells[-1].source


def test_setup_line_missing_is_said():
    nb = widget_nb()
    nb.cells[1].outputs = []
    build.notebook_page(nb, "00_a", ["00_a", "01_b"], {"00_a"}, INFO, 1.0, PAGES)
    assert "printed no device line" in nb.cells[1].source


def test_exercise_page_is_not_executed():
    nb = widget_nb()
    build.exercise_page(nb, "00_a", {"00_a"}, PAGES)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    assert "Solutions are not published" in nb.cells[1].source


def test_index_links_notebooks_and_lists_every_page():
    readme = "# Course\n\n| 00 | `00_a` | x |\n| 01 | `01_b` | y |\nsee [notes](docs/teaching.md)\n"
    text = build.index_page(readme, ["00_a", "01_b"], ["00_a"], PAGES, INFO)
    assert "[`00_a`](notebooks/00_a.ipynb)" in text and "[notes](docs/teaching.md)" in text
    for entry in ("notebooks/00_a", "notebooks/01_b", "exercises/00_a", "docs/teaching", "open_in_jupyterlab"):
        assert f"\n{entry}\n" in text
    assert "solutions" not in text
