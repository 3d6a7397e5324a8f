"""Check the built website in a real browser: ``make site-check`` (or ``python site/check.py``).

Serves ``build/site`` on 127.0.0.1 and loads every page in headless Chromium (Debian's
``chromium`` + ``chromium-driver``, driven by selenium). It FAILS on:

* a request to any host other than the local server (a CDN script, a web font, an image), seen
  in Chromium's network log, and any external URL in a ``src``/``href`` of a script, stylesheet,
  font, image or frame, or in a CSS ``url()``/``@import``, found by reading the files;
* a broken internal link: a link to a page or file the site does not have, or to an anchor
  (``#id``) the target page does not have;
* an image that does not load, and any request the server answers with an error;
* a console error (``console.error``, an uncaught exception, a failed load);
* a cell error output: an ``output_type: error`` rendered by myst-nb, or an IPython traceback
  in any output;
* a search box that finds nothing for a word every notebook uses;
* a page without a favicon (``<link rel=icon>``), a notebook or exercise page without its
  "Download this notebook" link to the ``.ipynb`` beside it (an exercise's without outputs);
* code from a page's source (each inline code span and fenced block, listed by site/build.py in
  ``code-spans.json``) that is not on the page exactly as written: a mangled code span;
* math not typeset: an element Sphinx marks ``math`` without MathJax's output in it;
* at a phone's width (390 px; every page is loaded again): a page wider than the screen, a
  figure shown below 60 % of the size it was drawn (its labels unreadable), an output wider than
  its box without the scroll cue, the top banner (Furo's announcement) cut instead of wrapped,
  and Furo's "Back to top" pill over text after a scroll.

It also lists, without failing, what a learner reading the pages would notice: tables cut with
"...", NaN cells, long decimals, stderr boxes, widget error texts, and small figures. Screenshots
of the front page and of notebooks 02, 04 and 10 at 1600 px and 390 px go to
``build/site-check/``, with ``report.json``.

Chromium never reaches the network: every host name but 127.0.0.1/localhost resolves to nothing
and any other connection goes to a dead local proxy; the check relies on the logs, not on the
network's being closed.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import re
import shutil
import socketserver
import sys
import tempfile
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1600,1000", "--hide-scrollbars",
                # nothing leaves the machine: names other than localhost resolve to nothing, and
                # any other connection goes to a closed local port (loopback bypasses proxies)
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
                "--proxy-server=http://127.0.0.1:9"]
SEARCH_WORD = "memory"
NETWORK_SCHEMES = {"http", "https", "ws", "wss", "ftp"}  # chrome://, data:, blob: never leave
CODE_SPANS = "code-spans.json"  # written by site/build.py: each page's code as its source has it

# ------------------------------------------------------------------ static audit of the files

RESOURCE_ATTRS = {("script", "src"), ("img", "src"), ("iframe", "src"), ("source", "src"),
                  ("video", "src"), ("audio", "src"), ("embed", "src"), ("object", "data"),
                  ("input", "src"), ("track", "src"), ("image", "href")}
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""")


def is_external(url: str) -> bool:
    return bool(re.match(r"^(https?:)?//", url.strip(), re.I))


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.external: list[str] = []
        self.ids: set[str] = set()
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])
        for t, attr in RESOURCE_ATTRS:
            if tag == t and a.get(attr) and is_external(a[attr]):
                self.external.append(f"<{tag} {attr}={a[attr]}>")
        if tag == "img" and a.get("srcset") and is_external(a["srcset"]):
            self.external.append(f"<img srcset={a['srcset']}>")
        if tag == "link" and a.get("href") and is_external(a["href"]):
            rel = (a.get("rel") or "").lower()
            if any(r in rel for r in ("stylesheet", "preload", "prefetch", "preconnect", "icon",
                                      "modulepreload", "manifest", "dns-prefetch")):
                self.external.append(f"<link rel={rel} href={a['href']}>")
        if a.get("style"):
            self.external += [f"style url({u})" for u in _css_urls(a["style"]) if is_external(u)]
        self._in_style = tag == "style"

    def handle_data(self, data):
        if self._in_style:
            self.external += [f"<style> url({u})" for u in _css_urls(data) if is_external(u)]

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False


def _css_urls(text: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in CSS_URL.finditer(text)]


def audit_files(site: Path) -> tuple[list[str], dict[str, set[str]]]:
    """External resource URLs in the HTML and CSS files, and the ids of every HTML page."""
    problems, ids = [], {}
    for f in sorted(site.rglob("*")):
        rel = f.relative_to(site).as_posix()
        if f.suffix == ".html":
            c = _Collector()
            c.feed(f.read_text(errors="replace"))
            ids[rel] = c.ids
            problems += [f"{rel}: external resource {u}" for u in c.external]
        elif f.suffix == ".css":
            problems += [f"{rel}: external url({u})" for u in _css_urls(f.read_text(errors="replace"))
                         if is_external(u)]
    return problems, ids


# ------------------------------------------------------------------ local server


class _Handler(http.server.SimpleHTTPRequestHandler):
    errors: list[str]

    def log_message(self, *args):
        pass

    def send_error(self, code, message=None, explain=None):
        self.errors.append(f"{code} {self.path}")
        super().send_error(code, message, explain)


def serve(site: Path):
    handler = type("Handler", (_Handler,), {"errors": []})
    httpd = socketserver.ThreadingTCPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(site)))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, handler.errors


# ------------------------------------------------------------------ browser

PAGE_PROBE = r"""
const out = {};
out.badImages = Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)
  .map(i => i.currentSrc || i.src);
out.links = Array.from(document.querySelectorAll('a[href]')).map(a => a.href);
const outputs = Array.from(document.querySelectorAll('.cell_output'));
out.errorOutputs = Array.from(document.querySelectorAll('.output.traceback, .output.error'))
  .map(e => e.innerText.slice(0, 300));
for (const o of outputs) {
  if (o.querySelector('.output.traceback, .output.error')) continue;  // already counted
  const t = o.innerText;
  if (/Traceback \(most recent call last\)/.test(t) || /^\w+(Error|Exception)\s+Traceback/m.test(t))
    out.errorOutputs.push(t.slice(0, 300));
}
// what a reader notices (listed, not failed)
// "code cell N": the N-th code cell of the page, counted from 1 (markdown cells not counted)
const cellOf = el => { const c = el.closest('.cell'); if (!c) return '?';
  const all = Array.from(document.querySelectorAll('.cell')); return all.indexOf(c) + 1; };
const snippet = el => { const c = el.closest('.cell'); const s = c && c.querySelector('.cell_input');
  return s ? s.innerText.trim().split('\n')[0].slice(0, 90) : ''; };
out.notes = [];
for (const t of document.querySelectorAll('.cell_output table')) {
  const cells = Array.from(t.querySelectorAll('td, th')).map(c => c.innerText.trim());
  const trunc = cells.filter(c => c === '...' || c === '…' || /\.\.\.$/.test(c));
  const nan = cells.filter(c => /^(NaN|nan|<NA>|None|NaT)$/.test(c));
  const longdec = cells.filter(c => /\d\.\d{5,}/.test(c));
  if (trunc.length) out.notes.push(['truncated table', cellOf(t), snippet(t), trunc.slice(0, 3).join(' | ')]);
  if (nan.length) out.notes.push(['NaN cells', cellOf(t), snippet(t), nan.length + ' cell(s)']);
  if (longdec.length) out.notes.push(['long decimals', cellOf(t), snippet(t), longdec.slice(0, 3).join(' | ')]);
}
for (const o of document.querySelectorAll('.cell_output .output.stream, .cell_output .output.text_plain')) {
  const t = o.innerText;
  const longdec = t.match(/\d\.\d{6,}/g);
  if (longdec) out.notes.push(['long decimals (text)', cellOf(o), snippet(o), longdec.slice(0, 3).join(' | ')]);
}
for (const o of document.querySelectorAll('.cell_output .output.stderr'))
  out.notes.push(['stderr box', cellOf(o), snippet(o), o.innerText.trim().slice(0, 160)]);
for (const o of outputs)
  if (/Error displaying widget|model not found/.test(o.innerText))
    out.notes.push(['widget error', cellOf(o), snippet(o), o.innerText.trim().slice(0, 120)]);
for (const i of document.querySelectorAll('.cell_output img')) {
  const r = i.getBoundingClientRect();
  // matplotlib's 10 pt text is about 14 px at the inline backend's resolution: shrunk below
  // 75 % it is under about 10 px on the page
  const scale = i.naturalWidth ? r.width / i.naturalWidth : 1;
  if (i.naturalWidth && (scale < 0.75 || i.naturalWidth < 400))
    out.notes.push(['small figure', cellOf(i), snippet(i),
                    `drawn ${i.naturalWidth}x${i.naturalHeight} px, shown ${Math.round(r.width)} px wide ` +
                    `(${Math.round(100 * scale)} %: its text shrinks with it)`]);
}
const norm = t => t.replace(/\s+/g, ' ').trim();
out.code = Array.from(document.querySelectorAll('code'))
  .filter(c => !c.closest('pre')).map(c => norm(c.textContent));
out.pre = Array.from(document.querySelectorAll('pre')).map(p => norm(p.textContent));
out.icon = Array.from(document.querySelectorAll('link[rel~=icon]')).map(l => l.href);
out.downloads = Array.from(document.querySelectorAll('a.download-notebook')).map(a => a.href);
// math: Sphinx marks it "math"; MathJax puts an mjx-container in each it typeset
out.math = Array.from(document.querySelectorAll('.math')).map(m => ({
  typeset: !!m.querySelector('mjx-container') || m.tagName.toLowerCase() === 'mjx-container',
  text: m.innerText.slice(0, 80)}));
out.banner = document.querySelector('.course-banner') ? document.querySelector('.course-banner').innerText : '';
out.images = Array.from(document.querySelectorAll('.cell_output img')).map(i => [i.naturalWidth, i.naturalHeight]);
return out;
"""


# not "mobile": a mobile emulation zooms out to fit a page that is too wide, hiding the defect
PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": False}
DESKTOP = {"width": 1600, "height": 1000, "deviceScaleFactor": 1, "mobile": False}
# a figure shown below this fraction of the size it was drawn has labels under about 10 px
# (matplotlib's 10 pt text is about 14 px at the inline backend's resolution)
MIN_FIGURE_SCALE = 0.6

PHONE_PROBE = r"""
const out = {overflow: null, figures: [], uncued: [], cut: []};
const vw = document.documentElement.clientWidth;
if (document.documentElement.scrollWidth > vw + 1) {
  // the element sticking out furthest names the culprit
  let worst = null, right = vw;
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (r.width && r.right > right + 1 && !e.closest('.cell_output div.output, .highlight, pre, .table-wrapper')) { right = r.right; worst = e; }
  }
  out.overflow = `page is ${document.documentElement.scrollWidth} px wide in a ${vw} px viewport` +
    (worst ? `: <${worst.tagName.toLowerCase()} class="${worst.className}"> reaches ${Math.round(right)} px` : '');
}
for (const i of document.querySelectorAll('.cell_output img')) {
  if (!i.naturalWidth) continue;
  const scale = i.getBoundingClientRect().width / i.naturalWidth;
  if (scale < __MIN_SCALE__)
    out.figures.push(`${i.getAttribute('src')}: shown at ${Math.round(100 * scale)} % of its ${i.naturalWidth} px`);
}
// every figure and table: shown whole, or in a box that scrolls sideways with a cue above it; the
// first ancestor that does not let it overflow decides (Furo's html{overflow-x:hidden} would cut it)
for (const el of document.querySelectorAll('.cell_output img, .cell_output table')) {
  const r = el.getBoundingClientRect();
  if (!r.width) continue;
  let a = el.parentElement;
  while (a && a !== document.body && getComputedStyle(a).overflowX === 'visible') a = a.parentElement;
  const what = el.tagName === 'IMG' ? `figure ${el.getAttribute('src')}` : `table "${(el.innerText || '').trim().slice(0, 40)}"`;
  if (!a || a === document.body) {
    if (r.right > vw + 1) out.cut.push(`${what} runs past the screen's edge (${Math.round(r.right)} px)`);
    continue;
  }
  const box = a.getBoundingClientRect();
  if (r.right <= box.right + 1) continue;
  const ox = getComputedStyle(a).overflowX;
  if (ox !== 'auto' && ox !== 'scroll') {
    out.cut.push(`${what} is cut at ${Math.round(box.right)} px by <${a.tagName.toLowerCase()} class="${a.className}"> (overflow-x: ${ox})`);
    continue;
  }
  const cue = a.previousElementSibling;
  if (!a.classList.contains('scrolls-x') || !cue || !cue.classList.contains('scroll-cue'))
    out.uncued.push(what);
}
// the top banner (Furo's announcement): its whole text on the screen, wrapped, not in a box that
// scrolls sideways without a cue (Furo's default: one line, overflow-x auto, scrollbar hidden on phones)
const banner = document.querySelector('.announcement');
if (banner && banner.scrollWidth > banner.clientWidth + 1)
  out.cut.push(`the top banner is cut: its text is ${banner.scrollWidth} px wide in a ${banner.clientWidth} px box ` +
               `(overflow-x: ${getComputedStyle(banner).overflowX}, no cue): let it wrap (course.css)`);
return out;
""".replace("__MIN_SCALE__", str(MIN_FIGURE_SCALE))

PILL_PROBE = r"""
// after scrolling down and a little back up (when Furo shows "Back to top"): does it cover text?
const pill = document.querySelector('.back-to-top');
if (!pill) return null;
const st = getComputedStyle(pill);
const r = pill.getBoundingClientRect();
if (st.display === 'none' || st.visibility === 'hidden' || st.opacity === '0' || !r.width ||
    r.bottom <= 0 || r.top >= window.innerHeight) return null;
for (const e of document.querySelectorAll('article p, article li, article td, article th, article pre, article h1, article h2, article h3')) {
  const q = e.getBoundingClientRect();
  if (q.width && q.left < r.right && q.right > r.left && q.top < r.bottom && q.bottom > r.top)
    return `"Back to top" (${Math.round(r.left)},${Math.round(r.top)} ${Math.round(r.width)}x${Math.round(r.height)} px) covers <${e.tagName.toLowerCase()}> "${e.innerText.trim().slice(0, 50)}"`;
}
return null;
"""


def need_browser() -> tuple[str, str]:
    try:
        import selenium  # noqa: F401
    except ImportError:
        sys.exit("site-check: Python package 'selenium' is missing: pip install -e '.[site]' "
                 "(make site-check installs the site extra)")
    chrome = shutil.which(os.environ.get("CHROMIUM") or "chromium") or shutil.which("chromium-browser")
    driver = shutil.which(os.environ.get("CHROMEDRIVER") or "chromedriver")
    if not chrome or not driver:
        missing = " and ".join(n for n, p in (("chromium", chrome), ("chromium-driver", driver)) if not p)
        sys.exit(f"site-check: {missing} not found. Install Debian's packages: "
                 "apt-get update && apt-get install -y chromium chromium-driver "
                 "(or set CHROMIUM=/path/to/chromium and CHROMEDRIVER=/path/to/chromedriver)")
    return chrome, driver


def start_browser(chrome: str, driver_path: str, profile: str):
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium must never download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for flag in CHROME_FLAGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)


def _requests(driver) -> list[dict]:
    out = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            out.append({"url": msg["params"]["request"]["url"]})
        elif msg["method"] == "Network.responseReceived":
            r = msg["params"]["response"]
            if r.get("status", 200) >= 400:
                out.append({"url": r["url"], "status": r["status"]})
        elif msg["method"] == "Network.loadingFailed" and not msg["params"].get("canceled"):
            out.append({"failed": msg["params"].get("errorText"), "id": msg["params"].get("requestId")})
    return out


def check_site(site: Path, shots: Path | None, pages: list[str] | None = None,
               search: bool = True, screenshot_pages: tuple[str, ...] = (),
               phone: bool = True) -> dict:
    """Run every check on the site folder; returns {'failures': [...], 'notes': [...], ...}.
    Every page is loaded at a desktop width (1600 px) and, with ``phone``, again at 390 px."""
    site = site.resolve()
    if not (site / "index.html").exists():
        sys.exit(f"site-check: {site}/index.html not found: build the site first (make site)")
    chrome, driver_path = need_browser()
    failures, ids = audit_files(site)
    failures = [f"external resource in the files: {p}" for p in failures]
    spans_file = site / CODE_SPANS
    spans = json.loads(spans_file.read_text()) if spans_file.exists() else {}
    httpd, server_errors = serve(site)
    base = f"http://127.0.0.1:{httpd.server_address[1]}/"
    pages = pages or sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    notes, links, images = [], {}, {}
    profile = tempfile.mkdtemp(prefix="site-check-chromium-")
    driver = start_browser(chrome, driver_path, profile)
    try:
        driver.set_page_load_timeout(60)
        driver.get("about:blank")  # what the browser loaded at start (its new-tab page) is not ours
        driver.get_log("performance")
        driver.get_log("browser")
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", DESKTOP)
        for page in pages:
            _load(driver, base + page)
            probe = driver.execute_script(PAGE_PROBE)
            for r in _requests(driver):
                url = r.get("url", "")
                if url and url.split(":")[0].lower() in NETWORK_SCHEMES and not url.startswith(base):
                    failures.append(f"{page}: request to an external host: {url}")
                elif "status" in r:
                    failures.append(f"{page}: HTTP {r['status']} for {url}")
            for e in driver.get_log("browser"):
                if e["level"] == "SEVERE":
                    failures.append(f"{page}: console error: {e['message'][:300]}")
            if page.startswith("notebooks/") and not all(w in probe["banner"] for w in ("COURSE_SIZE=", "torch ")):
                failures.append(f"{page}: no banner saying the preset, date and torch version of its outputs")
            if not probe["icon"]:
                failures.append(f"{page}: no favicon (<link rel=icon>): the browser asks for /favicon.ico")
            failures += check_download(page, probe["downloads"], base, site)
            failures += check_code(page, spans.get(page), probe["code"], probe["pre"])
            failures += [f"{page}: math not typeset (shown as TeX source): {m['text']!r}"
                         for m in probe["math"] if not m["typeset"]]
            failures += [f"{page}: image does not load: {src}" for src in probe["badImages"]]
            failures += [f"{page}: cell error output: {t!r}" for t in probe["errorOutputs"]]
            for href in probe["links"]:
                links.setdefault(href, page)
            notes += [{"page": page, "kind": k, "cell": c, "code": code, "detail": d}
                      for k, c, code, d in probe["notes"]]
            images[page] = probe["images"]
            if shots is not None and page in screenshot_pages:
                _screenshots(driver, page, shots, "1600px")
        if phone:
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
            for page in pages:
                failures += check_phone(driver, base, page)
                if shots is not None and page in screenshot_pages:
                    _screenshots(driver, page, shots, "390px")
            driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        failures += check_links(links, base, site, ids)
        if search:
            failures += check_search(driver, base)
    finally:
        driver.quit()
        httpd.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    failures += [f"server answered {e}" for e in server_errors]
    return {"pages": pages, "failures": failures, "notes": notes, "images": images}


def _load(driver, url: str) -> None:
    driver.get(url)
    deadline = time.time() + 20
    while driver.execute_script("return document.readyState") != "complete" and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)  # let late scripts (search index, theme, MathJax) run and log
    if driver.execute_script("return document.querySelector('.math') !== null"):
        deadline = time.time() + 15  # MathJax typesets after load
        while time.time() < deadline and not driver.execute_script(
                "return Array.from(document.querySelectorAll('.math')).every(m => m.querySelector('mjx-container'))"):
            time.sleep(0.2)


def check_phone(driver, base: str, page: str) -> list[str]:
    """At 390 px: nothing wider than the screen, figures legible, wide outputs cued, and the
    "Back to top" pill not over the text after a scroll."""
    _load(driver, base + page)
    probe = driver.execute_script(PHONE_PROBE)
    bad = []
    if probe["overflow"]:
        bad.append(f"{page} at 390 px: {probe['overflow']}")
    bad += [f"{page} at 390 px: figure too small to read: {f}" for f in probe["figures"]]
    bad += [f"{page} at 390 px: output wider than its box without a scroll cue: {t}" for t in probe["uncued"]]
    bad += [f"{page} at 390 px: cut off: {t}" for t in probe["cut"]]
    height = driver.execute_script("return document.documentElement.scrollHeight - window.innerHeight")
    if height > 400:  # Furo shows the pill when the reader scrolls back up
        driver.execute_script(f"window.scrollTo(0, {height // 2})")
        time.sleep(0.15)
        driver.execute_script(f"window.scrollTo(0, {height // 2 - 200})")
        time.sleep(0.4)
        pill = driver.execute_script(PILL_PROBE)
        if pill:
            bad.append(f"{page} at 390 px: {pill}")
    return bad


def check_download(page: str, hrefs: list[str], base: str, site: Path) -> list[str]:
    """Every notebook and exercise page links its .ipynb, which the site has (an exercise's without
    outputs)."""
    if not page.startswith(("notebooks/", "exercises/")):
        return []
    want = page[:-len(".html")] + ".ipynb"
    if not any(h == base + want for h in hrefs):
        return [f"{page}: no 'Download this notebook' link to {want}"]
    f = site / want
    if not f.exists():
        return [f"{page}: its download {want} is not in the site"]
    try:
        nb = json.loads(f.read_text())
    except ValueError as err:
        return [f"{page}: its download {want} is not a notebook ({err})"]
    if page.startswith("exercises/") and any(c.get("outputs") for c in nb.get("cells", [])):
        return [f"{page}: its download {want} has outputs (exercises are published stripped)"]
    return []


def check_code(page: str, source: list[str] | None, code: list[str], pre: list[str]) -> list[str]:
    """Each code span and fenced block of the page's source is on the page exactly (a rewriter that
    turned ``[a](b)`` inside backticks into a link or text mangles it). ``source``: from
    code-spans.json, written by site/build.py."""
    if not source:
        return []
    have = set(code)
    missing = [c for c in source if c not in have and not any(c in p for p in pre)]
    return [f"{page}: code from the source is not on the page as written (mangled?): {c[:120]!r}"
            for c in missing]


def check_links(links: dict[str, str], base: str, site: Path, ids: dict[str, set[str]]) -> list[str]:
    bad = []
    for href, page in sorted(links.items()):
        if not href.startswith(base):
            continue  # a link to another site is a link, not a request: not followed
        parts = urlsplit(href)
        rel = unquote(parts.path[len(urlsplit(base).path):])
        target = site / rel
        if rel == "" or target.is_dir():
            target, rel = target / "index.html", (rel.rstrip("/") + "/index.html").lstrip("/")
        if not target.exists():
            bad.append(f"{page}: broken link to {rel} (no such file in the site)")
        elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in ids.get(rel, set()):
            bad.append(f"{page}: broken link to {rel}#{parts.fragment} (no such anchor)")
    return bad


def check_search(driver, base: str) -> list[str]:
    """The search box works offline: searching a word every notebook uses finds pages."""
    from selenium.webdriver.common.by import By

    driver.get(base + "index.html")
    box = driver.find_elements(By.CSS_SELECTOR, "input[name=q]")
    if not box:
        return ["index.html: no search box (input name=q)"]
    driver.get(base + f"search.html?q={SEARCH_WORD}")
    deadline = time.time() + 20
    found = []
    while time.time() < deadline:
        found = driver.find_elements(By.CSS_SELECTOR, "#search-results li, ul.search li")
        if found:
            break
        time.sleep(0.25)
    for e in driver.get_log("browser"):
        if e["level"] == "SEVERE":
            return [f"search.html: console error: {e['message'][:300]}"]
    return [] if found else [f"search.html?q={SEARCH_WORD}: the search found nothing"]


def _screenshots(driver, page: str, shots: Path, width: str) -> None:
    shots.mkdir(parents=True, exist_ok=True)
    name = f"{Path(page).stem}-{width}"
    driver.execute_script("window.scrollTo({top: 0, behavior: 'instant'})")
    driver.save_screenshot(str(shots / f"{name}.png"))
    # also the first figure, the first wide table and the first static widget, scrolled into view
    for kind, sel in (("figure", ".cell_output img"), ("table", ".cell_output table"),
                      ("widget", ".static-widget-note")):
        found = driver.execute_script(
            f"const e = document.querySelector('{sel}'); if (!e) return false;"
            "const y = e.getBoundingClientRect().top + window.scrollY - 80;"
            "window.scrollTo({top: y, behavior: 'instant'}); return true;")
        if found:
            time.sleep(0.2)
            driver.save_screenshot(str(shots / f"{name}-{kind}.png"))


def _learner_report(notes: list[dict]) -> str:
    lines = []
    for n in notes:
        lines.append(f"  {n['page']}  code cell {n['cell']}  [{n['kind']}]  {n['code']!r}: {n['detail']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="load every page of the built site in headless Chromium")
    ap.add_argument("--site", type=Path, default=ROOT / "build" / "site")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "site-check",
                    help="screenshots and report.json (default build/site-check)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    nb_pages = sorted(p.relative_to(args.site).as_posix() for p in (args.site / "notebooks").glob("*.html"))
    shot_pages = ("index.html", *[p for p in nb_pages if Path(p).stem[:2] in ("02", "04", "10")])
    result = check_site(args.site, args.out, screenshot_pages=shot_pages)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(result, indent=1))
    print(f"site-check: {len(result['pages'])} pages loaded in headless Chromium in "
          f"{time.perf_counter() - t0:.0f} s; screenshots and report.json in {args.out}")
    if result["notes"]:
        print(f"What a learner reading the pages would notice ({len(result['notes'])}; listed, not failed):")
        print(_learner_report(result["notes"]))
    if result["failures"]:
        print(f"site-check FAILED ({len(result['failures'])}):")
        print("\n".join(f"  {f}" for f in result["failures"]))
        return 1
    print("site-check: no external request, no broken link or image, no console error, no cell error; "
          "favicon, downloads, code as in the source, math typeset; at 390 px nothing wider than the "
          "screen, figures legible, wide outputs cued, 'Back to top' over no text")
    return 0


if __name__ == "__main__":
    sys.exit(main())
