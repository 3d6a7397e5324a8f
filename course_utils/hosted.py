"""The course on a hosted GPU notebook (Colab, Kaggle, a JupyterHub) that has its own CUDA torch.

    python -m course_utils.hosted --update-cells   # put SETUP_CELL first in every notebook (after the title)
    python -m course_utils.hosted --check-cells    # exit 1 if a notebook's setup cell is missing or stale
    python -m course_utils.hosted --tiers          # rewrite the tiers table in docs/hosted-gpu.md
    python -m course_utils.hosted --dist [DIR]     # the wheel and the learner's zip in DIR (make dist)

``SETUP_CELL`` is the first code cell of every notebook, exercise and solution (and of the
scaffold's templates), six lines: where ``course_utils`` cannot be imported it finds the bootstrap
``course_setup.py`` (beside the notebook, one folder up, one down, under ``/content`` or
``/kaggle/input``) and runs it; on a checkout it does nothing and prints nothing, and where it
finds no bootstrap it raises an error naming the fix. The bootstrap (one copy, at the root of the
repository as at the root of ``make dist``'s zip: the notebooks reach it as ``../course_setup.py``
in both) installs the course's wheel found beside it (or what ``$COURSE_UTILS_SOURCE`` names) with
pip constrained to the installed torch, so pip can never replace it. The cell cannot import
``course_utils`` (that is what it installs), so it is plain code, written here once and copied
into the notebooks by ``--update-cells``; ``tests/test_hosted.py`` checks every copy and runs the
bootstrap with pip replaced by a recorder.

The zip has a README of its own (``zip_readme``, from ``templates/zip_README.md``): the
repository's speaks of ``make`` targets and files the zip does not hold.

``tiers()`` answers "what can each free GPU tier run" with the course's own predictor
(``explorer.estimate``, ``limit_test.run_limit_test``) against a card's usable memory.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import string
import subprocess
import sys
import zipfile
from pathlib import Path

from .allocator import caching_demo
from .budget import overheads
from .checks import CourseError, RecordError, ScaffoldError, guard
from .config import PRESETS
from .explorer import PRECISIONS, Config, estimate
from .files import atomic_write, make_folder, read_json, read_notebook, replacing
from .layout import exercise_name, notebook_title
from .limit_test import input_bytes, run_limit_test
from .memory import GiB, MiB
from .readme import replace_block
from .recorded import RUN_FILES

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "hosted-gpu.md"
#: the website's copy of DOC (site/build.py publishes site/pages/*.md)
SITE_PAGE = ROOT / "site" / "pages" / "run_on_a_hosted_gpu.md"
#: the first GPU run's benchmark of the large net (what a T4's verdict can be checked against)
FIRST_GPU_RUN = ROOT / "docs" / "gpu-runs" / "2026-11-24-h100" / "benchmark-large.json"
SITE_NOTE = "<!-- generated from docs/hosted-gpu.md by python -m course_utils.hosted --tiers: edit that file -->\n"
#: every notebook that gets the setup cell, and the scaffold's templates
NOTEBOOK_GLOBS = ("notebooks/[0-9][0-9]_*.ipynb", "solutions/[0-9][0-9]_*.ipynb",
                  "course_utils/templates/notebook.ipynb", "course_utils/templates/solution.ipynb")
#: the cell's metadata: a tag a site build or a test can find it by
TAG = "course-setup"

#: the one copy of the bootstrap the setup cell runs (shipped at the root of make dist's zip)
BOOTSTRAP = ROOT / "course_setup.py"
#: the zip's own README (a template: the notebook table and the figures are filled in by ``zip_readme``)
ZIP_README = Path(__file__).resolve().parent / "templates" / "zip_README.md"

SETUP_CELL = """\
import glob, importlib.util, runpy  # Colab, Kaggle: installs course_utils, keeping this torch (docs/hosted-gpu.md)
if not importlib.util.find_spec("course_utils"):  # on a checkout of the course this cell does nothing
    boot = [f for w in "./ ../ */ /content/*/ /content/drive/MyDrive/*/ /kaggle/input/*/ /kaggle/input/*/*/".split()
            for f in sorted(glob.glob(w + "course_setup.py"))]
    if not boot: raise RuntimeError("no course_setup.py here, one folder up, in /content or /kaggle/input. Fix: unzip the course zip")
    runpy.run_path(boot[0])"""


# --------------------------------------------------------------------------------------------
# The setup cell in every notebook
# --------------------------------------------------------------------------------------------
def notebook_paths(root: Path = ROOT) -> list[Path]:
    """Every notebook that carries the setup cell (exercises/ get it from their solutions)."""
    return sorted(p for g in NOTEBOOK_GLOBS for p in root.glob(g))


def setup_cell_index(nb: dict) -> int | None:
    """Where the setup cell is: the code cell tagged ``TAG``, or None."""
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code" and TAG in cell.get("metadata", {}).get("tags", []):
            return i
    return None


def _source(cell: dict) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def with_setup_cell(nb: dict) -> dict:
    """``nb`` (a notebook's JSON) with SETUP_CELL as its first code cell, right after the title
    (a markdown cell): inserted when missing, its text replaced when stale; in the style the file
    already has (source as one string or as lines), so that only the cell shows in a diff."""
    as_lines = not any(isinstance(c["source"], str) for c in nb["cells"])
    source = SETUP_CELL.splitlines(keepends=True) if as_lines else SETUP_CELL
    i = setup_cell_index(nb)
    if i is None:
        cell = {"cell_type": "code", "execution_count": None, "id": TAG, "metadata": {"tags": [TAG]},
                "outputs": [], "source": source}
        if nb.get("nbformat_minor", 0) < 5:
            del cell["id"]
        at = 1 if nb["cells"] and nb["cells"][0]["cell_type"] == "markdown" else 0
        nb["cells"].insert(at, cell)
    else:
        nb["cells"][i]["source"] = source
    return nb


def _notebook(path: Path, root: Path) -> dict:
    """A notebook's JSON, or ``ScaffoldError`` naming the file and the fix."""
    rel = path.relative_to(root).as_posix()
    try:
        nb = read_notebook(path, f"restore it (`git checkout -- {rel}`) or save it again from JupyterLab")
    except RecordError as err:
        raise ScaffoldError(err.problem.replace(str(path), rel), err.fix and err.fix.replace(str(path), rel)) from None
    return nb


def cell_problems(root: Path = ROOT) -> list[str]:
    """Each notebook whose setup cell is missing, stale, or not the first code cell, or that cannot
    be read, with the fix."""
    fix = "Fix: python -m course_utils.hosted --update-cells (then python -m course_utils.grading.generate)"
    out = []
    for path in notebook_paths(root) + sorted(root.glob("exercises/[0-9][0-9]_*.ipynb")):
        try:
            nb = _notebook(path, root)
        except ScaffoldError as err:
            out.append(str(err))
            continue
        i = setup_cell_index(nb)
        name = path.relative_to(root)
        first_code = next((k for k, c in enumerate(nb["cells"]) if c["cell_type"] == "code"), None)
        if i is None:
            out.append(f"{name}: no setup cell (a code cell tagged {TAG!r}). {fix}")
        elif _source(nb["cells"][i]) != SETUP_CELL:
            out.append(f"{name}: its setup cell differs from course_utils.hosted.SETUP_CELL. {fix}")
        elif i != first_code:
            out.append(f"{name}: the setup cell is code cell {i}, not the first code cell: it must run "
                       "before anything imports course_utils. Move it right after the title.")
    return out


def update_cells(root: Path = ROOT) -> list[str]:
    """Write SETUP_CELL into every notebook that lacks it or has a stale copy; returns their names.
    Every notebook is read first (``ScaffoldError`` naming one that cannot be, nothing written),
    and each is written whole or not at all."""
    new = {path: json.dumps(with_setup_cell(_notebook(path, root)), indent=1, ensure_ascii=False) + "\n"
           for path in notebook_paths(root)}
    changed = []
    for path, text in new.items():
        if text != path.read_text(encoding="utf-8"):
            atomic_write(path, text)
            changed.append(str(path.relative_to(root)))
    return changed


# --------------------------------------------------------------------------------------------
# What each free GPU tier can run: the course's predictor against a card's usable memory
# --------------------------------------------------------------------------------------------
#: a T4's memory as PyTorch sees it on hosted notebooks: "GPU 0 has a total capacity of 14.74 GiB"
#: (Colab, in zai-org/CogVideo#741's OOM message) and 14.56 GiB (a GCP T4, Zheng-Chong/CatVTON#133):
#: the lower of the two, of the nominal 16 GB (ECC and the driver's reservations take the rest)
T4_TOTAL_GIB = 14.56


def _unet_step() -> tuple[int, str]:
    """Seed 000's large U-Net, batch 2, one training step: the heaviest of its precisions."""
    peaks = {p: estimate(Config(levels=5, precision=p, batch=2)).total for p in PRECISIONS}
    worst = max(peaks, key=peaks.get)
    return peaks[worst], f"seed 000's large U-Net, batch 2, {worst} (the heaviest precision)"


def _limit_step() -> tuple[int, str]:
    n = max(PRESETS["full"].limit_test_ns)
    return run_limit_test(n).peak, f"seed 003's Conv3d net at N = {n}, fp32 (the full preset's largest N)"


def _caching_demo() -> tuple[int, str]:
    import inspect

    size = inspect.signature(caching_demo).parameters["mib_per_tensor"].default
    return 2 * size * MiB, f"the caching demo: two {size} MiB tensors (no training step)"


def _parallel_step() -> tuple[int, str]:
    """Notebooks 08-09 on two GPUs: their parallel runs use a small U-Net (notebook 09's GPU
    configuration: 3 levels, 16 channels, 32 x 64 x 64, global batch 8); the whole step on one
    GPU bounds what each of two ranks holds."""
    cfg = Config(levels=3, base_channels=16, volume=(32, 64, 64), batch=8, precision="fp32", seed000=False)
    return estimate(cfg).total, "the parallel demos' U-Net (3 levels, 16 channels, 32x64x64, batch 8), whole step"


#: notebook(s) -> (what bounds its GPU memory at the full preset, GPUs it needs for that part)
WORKLOADS = (
    ("00", _caching_demo, 1),
    ("01, 02, 04, 05, 06, 07, 10", _unet_step, 1),  # 05-07's techniques and 10's winner only lower it
    ("03", _limit_step, 1),
    ("08, 09: the NCCL parts", _parallel_step, 2),
)


def tiers(total_gib: float = T4_TOTAL_GIB) -> list[dict]:
    """One row per workload: its predicted peak, what a card needs for it (the explorer's
    ``Overheads``: CUDA context and slack) and whether a T4 holds it."""
    over = overheads()
    rows = []
    for notebooks, fn, gpus in WORKLOADS:
        peak, what = fn()
        needs = over.needed(peak)
        rows.append({"notebooks": notebooks, "heaviest step at the full preset": what,
                     "predicted allocated MiB": round(peak / MiB), "card needs MiB": round(needs / MiB),
                     "T4 usable MiB": round(total_gib * GiB / MiB), "gpus": gpus,
                     "fits": needs <= total_gib * GiB, "room MiB": round((total_gib * GiB - needs) / MiB)})
    return rows


def render_tiers(total_gib: float = T4_TOTAL_GIB) -> str:
    """The markdown block of docs/hosted-gpu.md between ``<!-- BEGIN tiers -->`` and ``<!-- END tiers -->``."""
    rows = tiers(total_gib)
    lines = ["| notebooks | heaviest step at the full preset | predicted allocated | a card needs | "
             "on a T4 (%.2f GiB) | GPUs |" % total_gib, "|---|---|---:|---:|---|---|"]
    for r in rows:
        verdict = (f"fits, {r['room MiB']:,} MiB to spare" if r["fits"]
                   else f"does not fit: {-r['room MiB']:,} MiB short")
        lines.append(f"| {r['notebooks']} | {r['heaviest step at the full preset']} | "
                     f"{r['predicted allocated MiB']:,} MiB | {r['card needs MiB']:,} MiB | {verdict} | "
                     f"{'2 x T4 (one per rank)' if r['gpus'] == 2 else '1'} |")
    one = all(r["fits"] for r in rows if r["gpus"] == 1)
    two = all(r["fits"] for r in rows)
    lines += ["", f"Predicted by `python -m course_utils.hosted --tiers` (`explorer.estimate`, "
              f"`limit_test.run_limit_test`: the steady-state step, 512-byte blocks); a card needs the "
              f"prediction plus the explorer's overheads: {overheads().source}.",
              "", f"- **One T4** (Colab free, Kaggle): {'every notebook at the full preset' if one else 'not every notebook'}"
              "; notebooks 08 and 09 run their two ranks on the CPU (gloo) and show the 2-GPU figures as recorded.",
              f"- **Two T4** (Kaggle's 'GPU T4 x2'): {'also' if two else 'not'} the NCCL parts of 08 and 09, "
              "one rank per card."]

    worst = max(rows, key=lambda r: r["card needs MiB"])
    n = max(PRESETS["full"].limit_test_ns)
    miss003 = 6 * input_bytes(n) / MiB  # docs/gpu-runs/2026-11-24-h100.md, "What did not", 3.
    room003 = next(r["room MiB"] for r in rows if r["notebooks"] == "03")
    run = read_json(FIRST_GPU_RUN, "the first GPU run's benchmark of the large net",
                    f"restore it (`git checkout -- {FIRST_GPU_RUN.relative_to(ROOT)}`)")
    base = next(r for r in run["rows"] if r["technique"] == "baseline fp32")
    miss = 100 * (base["measured peak MiB"] / base["predicted peak MiB"] - 1)
    t4_mib = T4_TOTAL_GIB * GiB / MiB
    lines += ["", f"If a T4 gives less than assumed, the answer moves at {worst['card needs MiB'] * MiB / GiB:.2f} GiB: "
              f"below that, notebooks {worst['notebooks']} no longer fit at the full preset. Where the "
              "prediction itself misses: the first GPU run (docs/gpu-runs/2026-11-24-h100.md) measured the large "
              f"U-Net's step {miss:+.1f} % from it, and seed 003's net 6 input volumes above it "
              f"({miss003:,.0f} MiB at N = {n}: {'within' if miss003 < room003 else 'more than'} notebook 03's "
              f"{room003:,} MiB of room).",
              "", f"**Not yet measured on a T4.** In that run the large U-Net's fp32 step at batch 2 left the "
              f"allocator holding {base['measured reserved MiB']:,} MiB (the driver saw "
              f"{base['driver used MiB']:,} MiB) for {base['measured peak MiB']:,} MiB allocated: "
              f"{100 * (base['measured reserved MiB'] / base['measured peak MiB'] - 1):.0f} % of cache, not the "
              f"10 % slack assumed, on an 80 GB card where nothing made it give memory back. A T4 shows "
              f"{t4_mib:,.0f} MiB. Before it reports an out-of-memory error, PyTorch's caching allocator frees its "
              "unused cached blocks and retries, so the cache is not a requirement, but fragmentation can be: "
              "the verdict for notebooks " + worst["notebooks"] + " is predicted, and the first T4 run (or a GPU "
              "run with `torch.cuda.set_per_process_memory_fraction` set to a T4's memory) settles it. If it "
              "fails there, `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (segments that grow, so less "
              "fragmentation) is the first thing to try."]
    return "\n".join(lines) + "\n"


def site_page(doc_text: str) -> str:
    """The website's page: docs/hosted-gpu.md as it is."""
    return SITE_NOTE + doc_text


def update_tiers(doc: Path = DOC, page: Path = SITE_PAGE) -> bool:
    """Rewrite the tiers block of ``doc`` and its copy ``page``; True if either changed."""
    text = doc.read_text(encoding="utf-8")
    new = replace_block(text, "tiers", render_tiers())
    changed = new != text or not page.exists() or page.read_text(encoding="utf-8") != site_page(new)
    if changed:
        atomic_write(doc, new)
        atomic_write(page, site_page(new))
    return changed


# --------------------------------------------------------------------------------------------
# make dist: the wheel and the learner's zip
# --------------------------------------------------------------------------------------------
#: what the learner's zip holds beside the wheel, the bootstrap and its own README: the notebooks,
#: the exercises (no solutions) and what their links point to (docs/*.md); recorded GPU figures and
#: what notebook 00 reads of each GPU run's record (``recorded.RUN_FILES``)
ZIP_GLOBS = ("notebooks/[0-9][0-9]_*.ipynb", "exercises/[0-9][0-9]_*.ipynb", "docs/*.md",
             "docs/gpu-runs/*.md", "docs/gpu-runs/*/*.md", "recorded/*.json", *RUN_FILES)
ZIP_TOP = "gpu-memory-course"


def build_wheel(out: Path, root: Path = ROOT) -> Path:
    """``pip wheel --no-deps`` of the checkout into ``out``; returns the wheel."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("course_utils-*.whl"):
        old.unlink()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(root)])
    if r.returncode:
        raise ScaffoldError(f"pip wheel of {root} failed (exit {r.returncode}; its output is above).",
                            "fix what pip says, then build again (make dist)")
    wheels = sorted(out.glob("course_utils-*.whl"))
    if len(wheels) != 1:
        raise ScaffoldError(f"expected one course_utils wheel in {out}, found {[w.name for w in wheels]}.",
                            "remove the other wheels from it, then build again (make dist)")
    return wheels[0]


def zip_readme(wheel_name: str, root: Path = ROOT) -> str:
    """The zip's README.md: what is in it, how to open it on Colab, Kaggle or a JupyterHub, the
    notebooks with their exercises and README's figures, every link to a file inside the zip."""
    rows = []
    for nb in sorted(root.glob("notebooks/[0-9][0-9]_*.ipynb")):
        ex = root / "exercises" / exercise_name(nb)
        exercise = f"[exercises/{ex.name}](exercises/{ex.name})" if ex.exists() else "-"
        rows.append(f"| {nb.name[:2]} | [{notebook_title(nb)}](notebooks/{nb.name}) | {exercise} |")
    readme = (root / "README.md").read_text(encoding="utf-8")
    figures = re.search(r"<!-- BEGIN figures -->\n(.*?)<!-- END figures -->", readme, re.S)
    torch_dep = re.search(r'"(torch[<>=][^"]*)"', (root / "pyproject.toml").read_text(encoding="utf-8"))
    return string.Template(ZIP_README.read_text(encoding="utf-8")).substitute(
        wheel=wheel_name, zipname=f"{ZIP_TOP}.zip", notebooks="\n".join(rows),
        torch=torch_dep.group(1) if torch_dep else "torch", figures=figures.group(1).strip() if figures else
        "See the course's repository for its figures.")


def build_zip(wheel: Path, out: Path, root: Path = ROOT) -> Path:
    """``out/gpu-memory-course.zip``: one folder with notebooks/, exercises/, docs/, recorded/, its
    own README.md, the bootstrap ``course_setup.py`` and the wheel at its top, so that
    ``../exercises/NN.ipynb`` from a notebook still resolves and the setup cell finds the bootstrap,
    and the bootstrap the wheel, one folder up."""
    files = sorted({p for g in ZIP_GLOBS for p in root.glob(g)})
    if not any(p.parent.name == "exercises" for p in files):
        raise ScaffoldError(f"no exercises under {root / 'exercises'} to put in the zip.",
                            "python -m course_utils.grading.generate (exercises/ from solutions/)")
    path = out / f"{ZIP_TOP}.zip"
    with replacing(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for p in files:
            z.write(p, f"{ZIP_TOP}/{p.relative_to(root).as_posix()}")
        z.write(root / BOOTSTRAP.name, f"{ZIP_TOP}/{BOOTSTRAP.name}")
        z.writestr(f"{ZIP_TOP}/README.md", zip_readme(wheel.name, root))
        z.write(wheel, f"{ZIP_TOP}/{wheel.name}")
    return path


def dist(out: Path = ROOT / "dist", root: Path = ROOT) -> tuple[Path, Path]:
    """``make dist``: the wheel and the learner's zip in ``out``; returns their paths."""
    wheel = build_wheel(out, root)
    shutil.rmtree(root / "build" / "lib", ignore_errors=True)  # setuptools' staging copy, not the site's
    return wheel, build_zip(wheel, out, root)


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils.hosted``: write or check the notebooks' setup cells, the tiers table,
    or build the wheel and zip; returns 1 when ``--check-cells`` finds a stale cell, 2 with a one-line
    error and its fix (``--dist``'s folder checked before anything is done), else 0."""
    ap = argparse.ArgumentParser(prog="python -m course_utils.hosted", description=__doc__.split("\n")[0])
    ap.add_argument("--update-cells", action="store_true", help="write SETUP_CELL into every notebook")
    ap.add_argument("--check-cells", action="store_true", help="exit 1 if a notebook's setup cell is missing or stale")
    ap.add_argument("--tiers", action="store_true", help=f"rewrite the tiers block of {DOC.relative_to(ROOT)}")
    ap.add_argument("--dist", nargs="?", const=str(ROOT / "dist"), metavar="DIR", help="build the wheel and the zip")
    args = ap.parse_args(argv)
    if not (args.update_cells or args.check_cells or args.tiers or args.dist is not None):
        ap.error("nothing to do: give --update-cells, --check-cells, --tiers or --dist")
    try:
        return _run(args)
    except CourseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _dist_folder(dist: str) -> Path:
    """``--dist DIR`` made before anything is done, or ``ScaffoldError`` naming why it cannot be."""
    try:
        return make_folder(dist)
    except RecordError as why:
        raise ScaffoldError(f"--dist {dist!r}: {why.problem}", f"{why.fix.rstrip('.')}, e.g. --dist dist.") from None


def _run(args: argparse.Namespace) -> int:
    dist_out = _dist_folder(args.dist) if args.dist is not None else None  # before any other action
    if args.update_cells:
        changed = update_cells()
        print(f"setup cell written into {len(changed)} notebook(s)" + (f": {', '.join(changed)}" if changed else ""))
    if args.check_cells:
        problems = cell_problems()
        print("\n".join(problems) or "every notebook has the current setup cell")
        if problems:
            return 1
    if args.tiers:
        print(f"{DOC.relative_to(ROOT)}: " + ("tiers table rewritten" if update_tiers() else "tiers table up to date"))
    if dist_out is not None:
        wheel, zpath = dist(dist_out)
        print(f"wheel: {wheel}\nzip:   {zpath} (notebooks, exercises, docs, its own README, course_setup.py and the wheel)")
    return 0


guard(globals(), ScaffoldError)


if __name__ == "__main__":
    sys.exit(main())
