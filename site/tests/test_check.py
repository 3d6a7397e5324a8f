"""The browser check fails on each defect it exists for, and passes a clean site.

Run by ``make site-check`` (before it checks build/site), not by ``make test``: it starts
headless Chromium (about 10 s). Skipped, with the reason, where Chromium is not installed.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import check  # noqa: E402  (site/check.py)

pytestmark = pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)")

PNG = bytes.fromhex(  # a 1x1 PNG
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082")

BANNER = '<div class="course-banner">Executed at COURSE_SIZE=tiny with torch 2.13.0</div>'
ICON = '<link rel="icon" href="/favicon.svg">'
PAGE = """<!doctype html><html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>{title}</title>{head}</head>
<body><article><h1 id="top">{title}</h1>{body}</article></body></html>"""


def write(site: Path, name: str, body: str = "", head: str = ICON) -> None:
    path = site / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name.startswith(("notebooks/", "exercises/")) and "download-notebook" not in body:
        body += f'<a class="download-notebook" href="{Path(name).stem}.ipynb" download>Download</a>'
    path.write_text(PAGE.format(title=name, head=head, body=body))


@pytest.fixture
def clean_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "_images").mkdir(parents=True)
    (site / "_images" / "fig.png").write_bytes(PNG)
    (site / "favicon.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 1 1"/>')
    (site / "notebooks").mkdir()
    (site / "notebooks" / "a.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                            "nbformat_minor": 5}))
    write(site, "index.html", '<a href="notebooks/a.html#top">a</a> <a href="https://example.org/">out</a>'
          '<div class="cell"><div class="cell_output"><img src="_images/fig.png"></div></div>')
    write(site, "notebooks/a.html", BANNER + '<a href="../index.html">home</a>'
          '<div class="cell"><div class="cell_output"><pre class="output stream">ok</pre></div></div>')
    return site


def run(site: Path, phone: bool = False) -> dict:
    return check.check_site(site, None, search=False, phone=phone)


def only(result: dict, text: str) -> None:
    assert result["failures"], "the check passed a site with a defect"
    assert all(text in f for f in result["failures"]), result["failures"]


def test_clean_site_passes(clean_site):
    # a plain link to another site is fine: it is not loaded
    assert run(clean_site)["failures"] == []


def test_external_script_fails(clean_site):
    write(clean_site, "notebooks/a.html", BANNER, head=ICON + '<script src="https://cdn.example.invalid/require.js"></script>')
    failures = run(clean_site)["failures"]
    assert any("external resource in the files" in f and "cdn.example.invalid" in f for f in failures), failures
    assert any("request to an external host" in f for f in failures), failures


def test_font_in_css_fails_without_loading(clean_site):
    # found by reading the files even when no page uses the rule
    (clean_site / "x.css").write_text("@font-face { src: url(https://fonts.example.invalid/f.woff2); }")
    only(run(clean_site), "fonts.example.invalid")


def test_broken_link_fails(clean_site):
    write(clean_site, "notebooks/a.html", BANNER + '<a href="missing.html">gone</a>')
    only(run(clean_site), "broken link to notebooks/missing.html")


def test_broken_anchor_fails(clean_site):
    write(clean_site, "notebooks/a.html", BANNER + '<a href="../index.html#no-such-section">x</a>')
    only(run(clean_site), "no such anchor")


def test_missing_image_fails(clean_site):
    write(clean_site, "notebooks/a.html", BANNER + '<img src="../_images/gone.png">')
    failures = run(clean_site)["failures"]
    assert any("image does not load" in f for f in failures), failures


def test_console_error_fails(clean_site):
    write(clean_site, "notebooks/a.html", BANNER + "<script>console.error('widget manager missing')</script>")
    only(run(clean_site), "widget manager missing")


def test_cell_error_output_fails(clean_site):
    # myst-nb renders an output_type: error as class "output traceback"
    write(clean_site, "notebooks/a.html", BANNER + '<div class="cell"><div class="cell_output">'
          '<pre class="output traceback">ValueError: boom</pre></div></div>')
    only(run(clean_site), "cell error output")


def test_traceback_printed_as_text_fails(clean_site):
    write(clean_site, "notebooks/a.html", BANNER + '<div class="cell"><div class="cell_output"><pre class="output stream">'
          "Traceback (most recent call last):\n  File x\nRuntimeError: y</pre></div></div>")
    only(run(clean_site), "cell error output")


def test_reader_notes_are_listed_not_failed(clean_site):
    write(clean_site, "notebooks/a.html", BANNER + '<div class="cell"><div class="cell_input"><pre>df</pre></div>'
          '<div class="cell_output"><table><tr><td>...</td><td>NaN</td><td>281.928612</td></tr></table>'
          '<pre class="output stderr">Terminating process</pre></div></div>')
    result = run(clean_site)
    assert result["failures"] == []
    kinds = {n["kind"] for n in result["notes"]}
    assert {"truncated table", "NaN cells", "long decimals", "stderr box"} <= kinds, result["notes"]


def test_notebook_page_without_banner_fails(clean_site):
    write(clean_site, "notebooks/a.html", "<p>outputs from who knows where</p>")
    only(run(clean_site), "no banner")


def test_missing_favicon_fails(clean_site):
    write(clean_site, "index.html", "<p>home</p>", head="")
    failures = run(clean_site)["failures"]
    assert any("no favicon" in f for f in failures), failures
    assert any("favicon.ico" in f for f in failures), failures  # the browser's own request, 404


def test_notebook_page_without_download_fails(clean_site):
    write(clean_site, "notebooks/a.html", BANNER + '<a class="download-notebook" href="b.ipynb">x</a>')
    failures = run(clean_site)["failures"]
    assert any("no 'Download this notebook' link" in f for f in failures), failures


def test_exercise_download_with_outputs_fails(clean_site):
    nb = {"cells": [{"cell_type": "code", "source": "x", "metadata": {}, "execution_count": 1,
                     "outputs": [{"output_type": "stream", "name": "stdout", "text": "solution"}]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (clean_site / "exercises").mkdir()
    (clean_site / "exercises" / "a.ipynb").write_text(json.dumps(nb))
    write(clean_site, "exercises/a.html", "<p>exercise</p>")
    only(run(clean_site), "has outputs")


# exercise 07's task 1, as the old link rewriter left it
SOURCE_SPAN = "[inc(x), downs[0](...), ...]"
MANGLED = "inc(x), downs[0 (<code>exercises/...</code> in the repository), ...]"


def test_mangled_code_span_fails(clean_site):
    (clean_site / check.CODE_SPANS).write_text(json.dumps({"notebooks/a.html": [SOURCE_SPAN]}))
    write(clean_site, "notebooks/a.html", BANNER + f"<p>list <code>{MANGLED}</code></p>")
    only(run(clean_site), "mangled")
    # the span as written passes (myst splits it into <span class="pre"> words)
    words = "".join(f'<span class="pre">{w}</span> ' for w in SOURCE_SPAN.split())
    write(clean_site, "notebooks/a.html", BANNER + f'<p>list <code class="literal">{words}</code></p>')
    assert run(clean_site)["failures"] == []


def test_math_shown_as_tex_fails_and_offline_mathjax_passes(clean_site):
    math = r'<p><span class="math notranslate nohighlight">\(\frac{a}{b}\)</span></p>'
    write(clean_site, "notebooks/a.html", BANNER + math)
    only(run(clean_site), "math not typeset")
    mathjax = Path(check.__file__).parent  # the package the site extra installs
    import importlib.util
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is None:
        pytest.skip("sphinx-mathjax-offline is not installed (pip install -e '.[site]')")
    shutil.copytree(Path(spec.origin).parent / "static" / "mathjax", clean_site / "mathjax")
    write(clean_site, "notebooks/a.html", BANNER + math,
          head=ICON + '<script defer src="../mathjax/tex-chtml.js"></script>')
    assert run(clean_site)["failures"] == [], mathjax


STATIC = Path(check.__file__).parent / "_static"
COURSE = '<link rel="stylesheet" href="/course.css"><script src="/course.js"></script>'
WIDE = ('<div class="cell"><div class="cell_output"><div class="output text_html"><table>'
        + "<tr>" + "".join(f"<td>column_{i}_value_12345</td>" for i in range(12)) + "</tr></table></div>"
        '<div class="output"><img src="../_images/wide.png"></div></div></div>'
        # as myst-nb writes a figure: the <img> right in the cell's output box
        '<div class="cell"><div class="cell_output"><img src="../_images/wide.png"></div></div>')
LONG = "".join(f"<p>line {i} of the text a learner reads</p>" for i in range(200))
# Furo's top banner (the announcement) as furo 2025.12.19 renders and styles it (its furo.css):
# one line of the header's height that scrolls sideways, its scrollbar hidden on a phone
FURO_BANNER_CSS = ("<style>:root{--header-height:3rem}.announcement{align-items:center;display:flex;"
                   "height:var(--header-height);overflow-x:auto}.announcement-content{box-sizing:border-box;"
                   "min-width:100%;padding:.5rem;text-align:center;white-space:nowrap}</style>")
FURO_BANNER = ('<div class="announcement"><aside class="announcement-content">Built 2026-11-28 &middot; outputs '
               'executed on NVIDIA H200 at the <code>tiny</code> preset &middot; torch 2.13.0+cpu</aside></div>')


def phone_site(site: Path, with_course: bool) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(10, 3), dpi=100)  # 1000 px wide: 36 % at 360 px
    fig.savefig(site / "_images" / "wide.png")
    plt.close(fig)
    for name in ("course.css", "course.js"):
        shutil.copy(STATIC / name, site / name)
    pill = '<button class="back-to-top" style="position:fixed;top:40px;left:40px">Back to top</button>'
    write(site, "notebooks/a.html", FURO_BANNER + BANNER + WIDE + LONG + pill,
          head=ICON + FURO_BANNER_CSS + (COURSE if with_course else "<style>img{max-width:100%}</style>"))


def test_phone_defects_fail(clean_site):
    phone_site(clean_site, with_course=False)
    failures = run(clean_site, phone=True)["failures"]
    for defect in ("page is", "figure too small to read", "Back to top", "the top banner is cut"):
        assert any("390 px" in f and defect in f for f in failures), (defect, failures)
    assert all("390 px" in f for f in failures), failures  # the desktop pass finds nothing


def test_course_css_and_js_pass_the_phone_checks(clean_site):
    phone_site(clean_site, with_course=True)
    assert run(clean_site, phone=True)["failures"] == []


def test_a_top_banner_cut_at_390_px_fails_and_course_css_wraps_it(clean_site):
    """Furo's announcement showed "Built ... executed on CPU at the ti" at 390 px and nothing said
    that the rest scrolls: course.css lets it wrap."""
    phone_site(clean_site, with_course=True)
    assert run(clean_site, phone=True)["failures"] == []
    css = (clean_site / "course.css").read_text()
    (clean_site / "course.css").write_text(css.replace("white-space: normal", "white-space: nowrap"))
    only(run(clean_site, phone=True), "the top banner is cut")


def test_uncued_scrolling_box_fails(clean_site):
    phone_site(clean_site, with_course=True)
    js = (clean_site / "course.js").read_text()
    (clean_site / "course.js").write_text(js.replace("box.before(cue);", ""))  # marked, no cue
    only(run(clean_site, phone=True), "without a scroll cue")


def test_figure_cut_by_a_hidden_overflow_fails(clean_site):
    # Furo's html{overflow-x: hidden}: a figure wider than the screen is cut, not scrollable
    phone_site(clean_site, with_course=False)
    write(clean_site, "notebooks/a.html", BANNER + '<div style="overflow-x: hidden"><div class="cell">'
          '<div class="cell_output"><img src="../_images/wide.png" style="max-width: none"></div></div></div>')
    only(run(clean_site, phone=True), "cut off")
