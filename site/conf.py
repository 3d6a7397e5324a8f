"""Sphinx configuration of the course website (``make site``; see site/build.py).

The source tree is assembled by site/build.py in build/site-src/ (copies of README, the executed
notebooks, the exercises and docs); this file is used with ``sphinx-build -c site``. Everything
the pages load is served from the site itself: Furo's and Sphinx's own files, course.css, and no
CDN (myst-nb's require.js / widget manager are switched off below; MathJax 3 comes from the
PyPI package sphinx-mathjax-offline and is served from _static/mathjax/).
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_info_file = ROOT / "build" / "site-src" / "site-info.json"
INFO = json.loads(_info_file.read_text()) if _info_file.exists() else {}

project = "GPU memory for deep learning"
author = "the course authors"
copyright = "the course authors"
# math ($...$, $$...$$) is typeset by MathJax served from the site itself: the PyPI package
# "sphinx-mathjax-offline" (its module name has dashes) copies MathJax 3 into _static/mathjax/
extensions = ["myst_nb", "sphinx-mathjax-offline"]
exclude_patterns = ["site-info.json", "**/.ipynb_checkpoints"]
root_doc = "index"

# --- notebooks: executed by site/build.py beforehand, never by Sphinx
nb_execution_mode = "off"
nb_ipywidgets_js = {}  # default: require.js + @jupyter-widgets/html-manager from two CDNs
nb_merge_streams = True  # one box per stream instead of one per print()
nb_output_stderr = "show"  # honest: what the learner sees in JupyterLab

myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3

# --- HTML
html_theme = "furo"
html_title = project
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_js_files = ["course.js"]
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None
html_favicon = "_static/favicon.svg"  # without one, the browser's request for /favicon.ico fails
if INFO:
    _where = INFO.get("gpu") or "CPU"
    html_theme_options = {
        "announcement": (f"Built {INFO['date']} &middot; outputs executed on {_where} at the "
                         f"<code>{INFO['preset']}</code> preset &middot; torch {INFO['torch']}"),
    }
