"""Markdown as the course's layout checks and its student release read it: link targets, code spans.

``links(text)`` -- the relative link targets of a Markdown text, anchors cut, with code spans and
fenced blocks skipped (``CODE``), so that an example written in backticks is never taken for a
link. ``scaffold.check_links`` checks every notebook's and document's links with it;
``grading.release`` checks the student release's.
"""

from __future__ import annotations

import re

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
