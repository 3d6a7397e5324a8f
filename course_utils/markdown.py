"""Markdown as the course's layout checks and its student release read it: link targets, code spans.

``links(text)`` -- the relative link targets of a Markdown text, anchors cut, with code spans and
fenced blocks skipped (``CODE``), so that an example written in backticks is never taken for a
link. ``scaffold.check_links`` checks every notebook's and document's links with it;
``grading.release`` checks the student release's. ``table(rows)`` -- rows of dicts as a
Markdown table (the GPU kit's summary, ``fit_validation``'s page).
"""

from __future__ import annotations

import re
from typing import Any

from .checks import ScaffoldError, guard

LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def links(text: str) -> list[str]:
    """The relative link targets of a markdown text (code spans and blocks skipped), anchors cut."""
    out = []
    for m in LINK.finditer(CODE.sub("", text)):
        target = m.group(1)
        if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
            out.append(target.split("#", 1)[0])
    return out


def table(rows: list[dict[str, Any]], cols: list[str] | None = None) -> list[str]:
    """``rows`` as the lines of a Markdown table (then a blank line); ``cols`` default to every
    key in order of appearance. None is written "-", an int with thousands separators, and a
    "|" inside a cell as "/" (it would end the cell)."""
    if not rows:
        return []
    cols = cols or list(dict.fromkeys(k for r in rows for k in r))

    def cell(v: Any) -> str:
        return "-" if v is None else (f"{v:,}" if isinstance(v, int) else str(v)).replace("|", "/")

    return (["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            + ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows] + [""])


guard(globals(), ScaffoldError)
