"""The browser check fails on each defect it exists for, and passes a clean site.

Run by ``make site-check`` (before it checks build/site), not by ``make test``: it starts
headless Chromium (about 10 s). Skipped, with the reason, where Chromium is not installed.
"""

from __future__ import annotations

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
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>{head}</head>
<body><h1 id="top">{title}</h1>{body}</body></html>"""


def write(site: Path, name: str, body: str = "", head: str = "") -> None:
    path = site / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PAGE.format(title=name, head=head, body=body))


@pytest.fixture
def clean_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "_images").mkdir(parents=True)
    (site / "_images" / "fig.png").write_bytes(PNG)
    write(site, "index.html", '<a href="notebooks/a.html#top">a</a> <a href="https://example.org/">out</a>'
          '<div class="cell"><div class="cell_output"><img src="_images/fig.png"></div></div>')
    write(site, "notebooks/a.html", BANNER + '<a href="../index.html">home</a>'
          '<div class="cell"><div class="cell_output"><pre class="output stream">ok</pre></div></div>')
    return site


def run(site: Path) -> dict:
    return check.check_site(site, None, search=False)


def only(result: dict, text: str) -> None:
    assert result["failures"], "the check passed a site with a defect"
    assert all(text in f for f in result["failures"]), result["failures"]


def test_clean_site_passes(clean_site):
    # a plain link to another site is fine: it is not loaded
    assert run(clean_site)["failures"] == []


def test_external_script_fails(clean_site):
    write(clean_site, "notebooks/a.html", BANNER, head='<script src="https://cdn.example.invalid/require.js"></script>')
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
