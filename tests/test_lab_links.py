"""Every relative link of every notebook works under ``make lab``.

JupyterLab serves only what lies under its root (``--ServerApp.root_dir``): a link that leaves it
(``../exercises/05_inplace_relu_exercise.ipynb`` with the root at ``notebooks/``) is a 404 that the learner
sees as a click that does nothing. The root is read from the Makefile's ``lab`` recipe, so these
tests fail if ``make lab`` goes back to rooting JupyterLab at ``notebooks/``.
"""
from __future__ import annotations

import re
import string
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "exercises", "solutions")
TEMPLATE = ROOT / "course_utils" / "templates" / "notebook.ipynb"

#: code blocks and code spans: their text is code, never a link (`downs[0](...)` is an index and a call)
CODE = re.compile(r"```.*?```|~~~.*?~~~|`[^`\n]*`", re.S)
LINKS = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*[\"'])?\s*\)"  # [text](target "title")
                   r"|<a\s[^>]*?href\s*=\s*[\"']([^\"']+)[\"']"          # <a href="target">
                   r"|<img\s[^>]*?src\s*=\s*[\"']([^\"']+)[\"']", re.I)  # <img src="target">
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _assignments(makefile: str) -> dict[str, str]:
    """The Makefile's simple variables (``NAME := value`` / ``NAME ?= value`` / ``NAME = value``)."""
    return {m.group(1): m.group(2).strip()
            for m in re.finditer(r"(?m)^([A-Za-z_][A-Za-z0-9_]*)[ \t]*[:?]?=[ \t]*(.*)$", makefile)}


def _expand(text: str, variables: dict[str, str], curdir: Path, depth: int = 0) -> str:
    if depth > 10:
        raise ValueError(f"Makefile variables nest too deep in {text!r}")

    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name == "CURDIR":
            return str(curdir)
        return _expand(variables.get(name, ""), variables, curdir, depth + 1)

    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, text)


def lab_command(makefile: str) -> str:
    """The ``jupyter lab`` command line of the ``lab`` rule (its continuation lines joined)."""
    rule = re.search(r"(?ms)^lab\s*:[^\n]*\n((?:\t[^\n]*\n?)+)", makefile)
    if not rule:
        raise ValueError("the Makefile has no `lab:` rule with a recipe: make lab must start JupyterLab")
    recipe = rule.group(1).replace("\\\n", " ")
    for line in recipe.splitlines():
        if re.search(r"jupyter(-|\s+)lab\b", line):
            return line.strip()
    raise ValueError("the Makefile's lab rule runs no `jupyter lab`")


def lab_root(makefile_path: Path = ROOT / "Makefile") -> Path:
    """The folder ``make lab`` serves: ``--ServerApp.root_dir`` (or its older names), else the
    folder given as the command's argument, else the folder make runs in (the Makefile's)."""
    makefile = makefile_path.read_text()
    curdir = makefile_path.resolve().parent
    command = _expand(lab_command(makefile), _assignments(makefile), curdir)
    while re.search(r"\$\([^()]*\)", command):  # make's functions ($(if ...), $(shell ...)): flags, not a folder
        command = re.sub(r"\$\([^()]*\)", "", command)
    words = command.split()
    words = words[words.index("lab") + 1:] if "lab" in words else words
    for word in words:
        m = re.match(r"--(?:ServerApp\.root_dir|ServerApp\.notebook_dir|NotebookApp\.notebook_dir|"
                     r"notebook-dir)=(.+)", word)
        if m:
            return (curdir / m.group(1).strip("'\"")).resolve()
    positional = [w for w in words if not w.startswith("-")]
    return (curdir / positional[0]).resolve() if positional else curdir


def links(markdown: str) -> list[str]:
    """The relative link targets of a markdown text (markdown links and images, ``<a href>``,
    ``<img src>``), code spans and blocks skipped; URLs with a scheme (``https:``) left out."""
    found = []
    for m in LINKS.finditer(CODE.sub("", markdown)):
        target = next(g for g in m.groups() if g)
        if not re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target) and not target.startswith("//"):
            found.append(target)
    return found


def anchors(path: Path) -> set[str]:
    """The anchors a notebook or markdown file's headings make: JupyterLab's (the heading text,
    spaces as ``-``) and GitHub's (lower case, punctuation dropped)."""
    if path.suffix == ".ipynb":
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    else:
        text = path.read_text(encoding="utf-8")
    out = set()
    for m in HEADING.finditer(CODE.sub("", text)):
        heading = re.sub(r"[*_`]", "", m.group(1)).strip()
        out.add(heading.replace(" ", "-"))
        out.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return out


def documents() -> list[tuple[Path, str]]:
    """(where the notebook is served from, its markdown) for every notebook, exercise and solution,
    and for the new-notebook template as the scaffold writes it into notebooks/."""
    docs = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            cells = nbformat.read(path, as_version=4).cells
            docs.append((path, "\n".join(c.source for c in cells if c.cell_type == "markdown")))
    stems = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if TEMPLATE.exists() and stems:
        cells = nbformat.read(TEMPLATE, as_version=4).cells
        text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
        values = {"STEM": stems[-1], "FIRST_STEM": stems[0], "NN": stems[-1][:2], "TITLE": "t", "FIRST_TITLE": "t"}
        docs.append((ROOT / "notebooks" / f"{stems[-1]}.ipynb", string.Template(text).safe_substitute(values)))
    return docs


def dead_links(root: Path, docs: list[tuple[Path, str]]) -> list[str]:
    """Each link that JupyterLab rooted at ``root`` cannot follow, with what is wrong."""
    root = root.resolve()
    problems = []
    for path, text in docs:
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for target in links(text):
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.is_relative_to(root):
                problems.append(f"{where}: ({target}) leads out of JupyterLab's root {root}: the server "
                                "answers 404 and the click does nothing")
            elif not resolved.exists():
                problems.append(f"{where}: ({target}) leads to no file")
            elif anchor and resolved.suffix in (".ipynb", ".md") and anchor not in anchors(resolved):
                problems.append(f"{where}: ({target}): {resolved.name} has no heading #{anchor}")
    return problems


def test_every_notebook_link_resolves_under_make_labs_root():
    root = lab_root()
    assert root == ROOT, f"make lab serves {root}, not the repository: links to ../exercises/ break"
    docs = documents()
    assert sum(len(links(t)) for _, t in docs) >= 20, "the link parser found almost no links: it is broken"
    assert dead_links(root, docs) == []


def markdown_documents() -> list[tuple[Path, str]]:
    """README.md and the pages of docs/ (JupyterLab opens them from its file browser): the
    README's pointers to the pages its detail moved to, and the pages' links back."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [(p, p.read_text(encoding="utf-8")) for p in paths]


def test_every_readme_and_docs_link_resolves_under_make_labs_root():
    """A link of README.md or docs/*.md, with its anchor, opens in JupyterLab rooted at the
    repository (and on GitHub: an anchor is checked against both spellings of a heading)."""
    docs = markdown_documents()
    targets = [t for _, text in docs for t in links(text)]
    assert "docs/testing.md#pytorch-versions" in targets and "../README.md#what-the-course-found" in targets, targets
    assert dead_links(lab_root(), docs) == []


def test_old_makefile_rooted_at_notebooks_fails(tmp_path):
    """The Makefile before issue 26 rooted JupyterLab at notebooks/: the check must reject it."""
    makefile = tmp_path / "Makefile"
    makefile.write_text("ROOT_FLAG := --allow-root\nlab: install\n\t$(BIN)/jupyter lab $(ROOT_FLAG) notebooks/\n")
    assert lab_root(makefile) == tmp_path / "notebooks"
    problems = dead_links(ROOT / "notebooks", documents())
    assert any("../exercises/05_inplace_relu_exercise.ipynb" in p and "out of JupyterLab's root" in p for p in problems)
    assert any("../README.md" in p for p in problems)


@pytest.mark.parametrize("recipe, expected", [
    ("$(BIN)/jupyter lab --ServerApp.root_dir=$(LAB_ROOT) --LabApp.default_url=/lab/tree/notebooks", "."),
    ("$(BIN)/jupyter lab --notebook-dir=docs", "docs"),
    ("$(BIN)/jupyter lab", "."),
    ("jupyter lab $(ROOT_FLAG) \\\n\t\tnotebooks/", "notebooks"),
])
def test_lab_root_reads_the_recipe(tmp_path, recipe, expected):
    (tmp_path / "Makefile").write_text(f"LAB_ROOT := $(CURDIR)\nROOT_FLAG :=\nlab: install\n\t{recipe}\n")
    assert lab_root(tmp_path / "Makefile") == (tmp_path / expected).resolve()


def test_link_parser_skips_code_and_finds_html_and_anchors(tmp_path):
    text = ("See [ex](../exercises/a.ipynb#Part-1) and <a href='b.md'>b</a>, <img src=\"img/c.png\">, "
            "`[inc(x), downs[0](...), ...]`\n```\n[x](nowhere.md)\n```\n[web](https://pytorch.org)")
    assert links(text) == ["../exercises/a.ipynb#Part-1", "b.md", "img/c.png"]
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "b.md").write_text("# Part 1\n")
    probs = dead_links(tmp_path, [(tmp_path / "n" / "x.ipynb", "[b](b.md#Part-1) [c](b.md#Part-2) [d](../../e.md)")])
    assert len(probs) == 2 and "no heading #Part-2" in probs[0] and "out of JupyterLab's root" in probs[1]


def test_makefile_lab_opens_in_notebooks():
    command = lab_command((ROOT / "Makefile").read_text())
    makefile = (ROOT / "Makefile").read_text()
    expanded = _expand(command, _assignments(makefile), ROOT)
    assert "--LabApp.default_url=/lab/tree/notebooks" in expanded, expanded
    assert "$(ROOT_FLAG)" in command, "make lab must keep --allow-root for root users (containers)"
