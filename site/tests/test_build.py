"""The site builder's transforms of the notebook copies (no kernel, no Sphinx: fast).

Run by ``make site-check``, not by ``make test``.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import build  # noqa: E402  (site/build.py)

PAGES = {"notebooks/00_a.ipynb", "notebooks/01_b.ipynb", "exercises/00_a_exercise.ipynb", "docs/teaching.md",
         build.JUPYTERLAB_PAGE}
INFO = {"date": "2026-01-01", "torch": "9.9.9", "python": "3.11", "machine": "x86_64, 2 cores",
        "preset": "tiny", "gpu": None}


@pytest.mark.parametrize("text, expected", [
    ("[ex](../exercises/00_a_exercise.ipynb)", "[ex](../exercises/00_a_exercise.ipynb)"),
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
    for link in ("(../exercises/00_a_exercise.ipynb)", "(01_b.ipynb)", f"(../{build.JUPYTERLAB_PAGE})"):
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
    build.exercise_page(nb, "00_a_exercise", {"00_a"}, PAGES)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    assert "Solutions are not published" in nb.cells[1].source


def test_index_links_notebooks_and_lists_every_page():
    readme = "# Course\n\n| 00 | `00_a` | x |\n| 01 | `01_b` | y |\nsee [notes](docs/teaching.md)\n"
    text = build.index_page(readme, ["00_a", "01_b"], ["00_a_exercise"], PAGES, INFO)
    assert "[`00_a`](notebooks/00_a.ipynb)" in text and "[notes](docs/teaching.md)" in text
    for entry in ("notebooks/00_a", "notebooks/01_b", "exercises/00_a_exercise", "docs/teaching", "open_in_jupyterlab"):
        assert f"\n{entry}\n" in text
    assert "solutions" not in text


# --- code is never rewritten (exercise 07's task 1 was garbled by the link rewriter)

TASK = "List them: `[inc(x), downs[0](...), ...]`, then see [the code](../course_utils/unet.py)."


def test_code_span_is_not_rewritten():
    out = build.fix_links(TASK, Path("exercises"), PAGES)
    assert "`[inc(x), downs[0](...), ...]`" in out
    assert "the code (`course_utils/unet.py` in the repository)" in out  # the real link still is


def test_fenced_block_is_not_rewritten():
    text = "```python\nx = [a](b)\n```\nand [code](../course_utils/unet.py)\n~~~\n[c](d.py)\n"
    out = build.fix_links(text, Path("notebooks"), PAGES)
    assert "x = [a](b)" in out and "[c](d.py)" in out and "code (`course_utils/unet.py`" in out


def test_link_whose_label_is_code_is_rewritten_whole():
    out = build.fix_links("[`unet.py`](../course_utils/unet.py)", Path("notebooks"), PAGES)
    assert out == "`unet.py` (`course_utils/unet.py` in the repository)"


def test_code_spans_for_the_check():
    assert build.code_spans(TASK) == ["[inc(x), downs[0](...), ...]"]
    assert build.code_spans("``a ` b`` and\n```bash\nmake   lab\n```\n") == ["a ` b", "make lab"]


# --- what the banner says about figures that need a GPU: computed from the outputs


def gpu_nb(*texts: str) -> nbformat.NotebookNode:
    nb = widget_nb()
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in texts]
    return nb


@pytest.mark.parametrize("texts, says, never", [
    ((), "Every output was computed on this machine", "need a CUDA GPU"),
    (("No GPU run has been recorded for this figure yet (x): this machine has no CUDA GPU.",),
     "1 figure(s) need a CUDA GPU and no GPU run has been recorded", "shown as recorded"),
    (("This machine has no CUDA GPU. The figure below was recorded on Tesla T4, 2026-12-01, torch 2.6",) * 2,
     "2 figure(s) that need a CUDA GPU are shown as recorded on Tesla T4", "no GPU run"),
])
def test_banner_says_what_is_shown(texts, says, never):
    nb = gpu_nb(*texts)
    build.notebook_page(nb, "00_a", ["00_a", "01_b"], {"00_a"}, INFO, 1.0, PAGES)
    banner = nb.cells[1].source
    assert says in banner and never not in banner
    assert "printed from recorded GPU runs" not in banner  # the old claim, true of no build yet


def test_banner_prerequisites_time_and_download():
    nb = widget_nb()
    nb.cells[0].source += "\nAs notebook 00 showed, and notebook 05 will."
    times = {"cpu": {"01": (9, "2 cores, 2026-11-24")}, "gpu": {"01": (31.5, "Tesla T4")}}
    build.notebook_page(nb, "01_b", ["00_a", "01_b"], {"00_a"}, INFO, 1.0, PAGES, times=times)
    banner = nb.cells[1].source
    assert "**Before this notebook:** [00_a](00_a.ipynb)" in banner and "05" not in banner
    assert "9 s on a CPU" in banner and "32 s on Tesla T4" in banner
    assert 'href="01_b.ipynb" download' in banner
    nb = widget_nb()
    build.notebook_page(nb, "00_a", ["00_a", "01_b"], {"00_a"}, INFO, 1.0, PAGES)
    assert "none: the course starts here" in nb.cells[1].source
    assert "on a GPU: not recorded yet" in nb.cells[1].source


# --- make lab roots JupyterLab at the repository: no "one folder up" advice


def test_no_one_folder_up_advice():
    nb = widget_nb()
    build.exercise_page(nb, "00_a", {"00_a"}, PAGES)
    texts = [nb.cells[1].source, (build.SITE / "pages" / build.JUPYTERLAB_PAGE).read_text()]
    for text in texts:
        assert "one folder up" not in text and "`..`" not in text, text
    assert 'href="00_a.ipynb" download' in nb.cells[1].source


def test_every_page_of_site_pages_is_in_the_navigation():
    extra = ["open_in_jupyterlab.md", "run_on_a_hosted_gpu.md"]
    text = build.index_page("# Course\n", ["00_a"], ["00_a"], PAGES, INFO, extra)
    toc = text[text.index(":caption: Using the course"):]
    assert "\nopen_in_jupyterlab\n" in toc and "\nrun_on_a_hosted_gpu\n" in toc


# --- the cache: a notebook is executed again only when what it uses changes


def test_cache_key_follows_the_modules_a_notebook_uses(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    shutil.copytree(build.ROOT / "course_utils", root / "course_utils",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%matplotlib inline\nfrom course_utils import recorded\n"
                                          "recorded.show('00/x')")]
    path = root / "notebooks" / "00_a.ipynb"
    nbformat.write(nb, path)
    monkeypatch.setattr(build, "ROOT", root)
    monkeypatch.setattr(build, "MODULE_CACHE", {})
    used = build.used_modules(nb.cells[0].source)
    assert {"course_utils", "course_utils.recorded", "course_utils.config"} <= used  # via __init__
    assert "course_utils.readme" not in used and "course_utils.grading" not in used

    def key() -> str:
        build.MODULE_CACHE.clear()
        return build._digest(path, "tiny", root / "recorded")

    before = key()
    with open(root / "course_utils" / "readme.py", "a") as f:
        f.write("\n# a one-line change in a module the notebook does not use\n")
    assert key() == before
    with open(root / "course_utils" / "recorded.py", "a") as f:
        f.write("\n# a change in a module it uses\n")
    assert key() != before
    (root / "recorded").mkdir()
    after = key()
    (root / "recorded" / "gpu.json").write_text("{}")  # a new recording: shown by the notebook
    assert key() != after
    run = root / "docs" / "gpu-runs" / "2026-12-01-t4"
    run.mkdir(parents=True)
    with_recording = key()
    (run / "kit.json").write_text("{}")  # a new GPU run's record: read by recorded.gpu_runs
    assert key() != with_recording


# --- recorded GPU figures: a fixture recording made by the course's own recording code


@pytest.fixture
def fixture_recording(tmp_path, monkeypatch):
    from course_utils import recorded

    fake = {"gpu": "NVIDIA Fixture T4", "torch": "2.6.0+cu124", "cuda": "12.4", "date": "2026-12-01"}
    monkeypatch.setattr(recorded, "machine", lambda: fake)
    raw = tmp_path / "raw"
    recorded.record("99/fixture_table", {"peak MiB": 1234.5}, folder=raw)
    recorded.record("gpu/notebook_seconds", {"00_a.ipynb": 31.5}, folder=raw)
    folder = tmp_path / "recorded"
    recorded.collect(raw, folder / "NVIDIA_Fixture_T4.json")
    return folder


def test_cuda_cells_show_the_recorded_figure_at_build_time(fixture_recording, tmp_path, monkeypatch):
    monkeypatch.setattr(build, "CACHE", tmp_path / "cache")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 99 · fixture"),
                nbformat.v4.new_code_cell("from course_utils import recorded\n"
                                          "recorded.show('99/fixture_table', 'a fixture figure')")]
    path = tmp_path / "99_fixture.ipynb"
    nbformat.write(nb, path)
    # with the recording: the kernel (executed as make site does, on this CPU) shows it, labelled
    executed, _, hit = build.execute(path, "tiny", False, 120, fixture_recording)
    assert not hit and build.cell_errors(executed) == []
    g = build.gpu_outputs(executed)
    assert g == {"recorded": 1, "not_recorded": 0, "gpus": ["NVIDIA Fixture T4"]}, executed.cells[1].outputs
    info = dict(INFO, recorded={"99_fixture": g})
    assert "99_fixture" in "\n".join(build.recorded_report(info))  # the build says which pages
    # without it: the cell says none is recorded (and the cache does not serve the other run)
    executed, _, hit = build.execute(path, "tiny", False, 120, tmp_path / "none")
    assert not hit and build.gpu_outputs(executed)["not_recorded"] == 1


def test_gpu_time_from_a_recorded_run(fixture_recording, monkeypatch):
    monkeypatch.setenv("COURSE_RECORDED", str(fixture_recording))
    assert build.timings()["gpu"]["00"] == (31.5, "NVIDIA Fixture T4")


def test_math_is_typeset_by_mathjax_served_from_the_site(tmp_path):
    """site/conf.py with a page of math: MathJax's script is the site's own copy (no CDN); the
    browser check (test_check.py, make site-check) sees it typeset."""
    from sphinx.cmd.build import build_main

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "index.md").write_text("# Math\n\nInline $\\frac{a}{b}$.\n")
    assert build_main(["-q", "-b", "html", "-c", str(build.SITE), str(src), str(out)]) == 0
    page = (out / "index.html").read_text()
    scripts = re.findall(r'<script[^>]*src="([^"]*mathjax[^"]*)"', page)
    assert scripts == ["_static/mathjax/tex-chtml.js"], scripts
    assert (out / "_static" / "mathjax" / "tex-chtml.js").exists()
    assert "cdn" not in page.lower()


def test_every_docs_page_the_readme_points_to_is_a_page_of_the_site():
    """README (the front page) keeps its detail in docs/ pages: each one it links is built and in
    the navigation (docs/hosted-gpu.md is site/pages/run_on_a_hosted_gpu.md on the site)."""
    import re

    readme = (build.ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)\s#]+\.md)", readme))
    assert {"docs/benchmark.md", "docs/gpu-kit.md", "docs/testing.md", "docs/website.md"} <= linked
    assert linked - {"docs/hosted-gpu.md"} <= set(build.DOC_PAGES), linked - set(build.DOC_PAGES)
    assert all((build.ROOT / d).is_file() for d in build.DOC_PAGES)
    toc = build.index_page("# Course\n", ["00_a"], ["00_a"], PAGES, INFO)
    for doc in build.DOC_PAGES:
        assert f"\n{doc[:-3]}\n" in toc
    assert build.fix_links("[t](testing.md#pytorch-versions)", Path("docs"), set(build.DOC_PAGES)) == \
        "[t](testing.md#pytorch-versions)"
