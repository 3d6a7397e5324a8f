"""The generated blocks of README and docs/ match the committed results, and the fast headline
figures still compute to what is committed: the documents cannot drift from the code. README
stays short enough to read: no line over 300 characters, the detail in docs/ pages it links."""

import json

from course_utils import readme


def test_readme_blocks_are_rendered_from_the_committed_results():
    """README's figures, docs/benchmark.md's benchmark, docs/gpu-kit.md's and docs/teaching.md's
    plan: each file holds its blocks (a block moved without its entry in GENERATED fails here),
    rendered from the committed JSON."""
    figures = json.loads(readme.FIGURES.read_text())
    timings = json.loads(readme.TIMINGS.read_text())
    assert set(readme.GENERATED) == {readme.README, readme.BENCHMARK_DOC, readme.GPU_KIT_DOC, readme.TEACHING}
    for path, text in readme.rendered(figures, timings).items():
        name = path.relative_to(readme.ROOT)
        assert text == path.read_text(), (
            f"{name}'s generated blocks are stale: run `python -m course_utils.readme --render` "
            "(or without --render, to recompute the figures too)")
        for block in readme.GENERATED[path]:
            assert text.count(f"<!-- BEGIN {block} -->") == 1 and text.count(f"<!-- END {block} -->") == 1, (name, block)
    assert "<!-- BEGIN benchmark -->" in readme.BENCHMARK_DOC.read_text()
    assert "| baseline fp32 |" in readme.BENCHMARK_DOC.read_text()  # the tables, not an empty block


def test_readme_has_no_line_over_300_characters():
    """A newcomer reads README first: its long tables and measurements live in docs/ pages."""
    long = [(n, len(line)) for n, line in enumerate(readme.README.read_text().splitlines(), 1) if len(line) > 300]
    assert long == [], f"README.md lines over 300 characters (line, length): {long}; wrap the prose, move detail to docs/"


def test_readme_points_to_every_page_its_detail_moved_to():
    """Each section moved out of README (the benchmark, the GPU kit, tests with CI and the PyTorch
    versions, the website) keeps a link from README to where it now is (tests/test_lab_links.py:
    the links and their anchors resolve)."""
    import re

    text = readme.README.read_text()
    targets = set(re.findall(r"\]\(([^)\s]+)\)", text))
    for page in ("docs/benchmark.md", "docs/gpu-kit.md", "docs/testing.md", "docs/website.md"):
        assert page in targets, f"README.md has no link to {page}"
    assert "docs/testing.md#pytorch-versions" in targets
    for moved in ("<!-- BEGIN benchmark -->", "<!-- BEGIN gpu-plan -->", "## PyTorch versions", "| `make test-sweep` |"):
        assert moved not in text, f"README.md holds {moved!r} again: it lives in docs/"


def test_readme_figures_wrap_without_starting_a_list_or_heading():
    """README's figures are wrapped to README_WIDTH; a word markdown would read as a list item,
    heading, quote or table row ('+ the CUDA context', '8.') never starts a continuation line."""
    words = "allocated 4,963 MiB (+ the CUDA context) at batch 8. - # > | = x"
    for width in range(10, 40):
        lines = readme.wrap("- **q.** " + words * 3, width=width)
        assert lines[0].startswith("- **q.**")
        for line in lines[1:]:
            first = line.split()[0]
            assert line.startswith("  ") and not readme._NOT_FIRST.fullmatch(first), (width, line)
        for line in lines:  # longer only by a word that could not start the next line, or one long word
            assert len(line) <= width or readme._NOT_FIRST.fullmatch(line.split()[-1]) or len(line.split()) == 1, \
                (width, line)
    data = json.loads(readme.FIGURES.read_text())
    block = readme.render_figures(data)
    assert all(len(line) <= readme.README_WIDTH + 10 for line in block.splitlines()[2:]), block
    for row in data["rows"]:  # every figure is there, whole
        assert " ".join(row["course"].split()) in " ".join(block.split())
        assert " ".join(row["method"].split()) in " ".join(block.split())


def test_every_headline_is_committed():
    data = json.loads(readme.FIGURES.read_text())
    assert [r["key"] for r in data["rows"]] == [k for k, *_ in readme.HEADLINES]


def test_the_fast_headlines_recompute_to_the_committed_figures():
    committed = {r["key"]: r for r in json.loads(readme.FIGURES.read_text())["rows"]}
    fresh = readme.headlines(only=readme.fast_keys())["rows"]
    assert fresh, "no fast headline"
    for row in fresh:
        assert row == committed[row["key"]], (
            f"{row['key']}: the code now computes {row['course']!r}, README says "
            f"{committed[row['key']]['course']!r}. Run `python -m course_utils.readme`.")


def test_benchmark_block_names_a_gpu_run_or_its_absence(tmp_path):
    """No GPU table: the block says so, above the CPU prediction. A GPU table: it comes first and
    the "not recorded" line is gone. The committed block is the one its folder implies."""
    absent = "No GPU run has been recorded yet"
    (tmp_path / "cpu-large.md").write_text("CPU PREDICTION\n")
    block = readme.render_benchmarks(tmp_path)
    assert block.startswith("**" + absent) and block.endswith("CPU PREDICTION")
    (tmp_path / "cuda-h100-large.md").write_text("GPU MEASURED\n")
    block = readme.render_benchmarks(tmp_path)
    assert absent not in block and block.index("GPU MEASURED") < block.index("CPU PREDICTION")
    committed_gpu = [p for p in readme.BENCHMARKS.glob("*.md") if not p.name.startswith("cpu-")]
    assert (absent in readme.render_benchmarks()) == (not committed_gpu)


def test_teaching_timings_are_rendered_from_the_committed_measurement():
    text = readme.TEACHING.read_text()
    data = json.loads(readme.TIMINGS.read_text())
    assert readme.replace_block(text, "timings", readme.render_timings(data)) == text, (
        "docs/teaching.md's timings table is stale: run `python -m course_utils.readme --render` "
        "(a row per notebook: tests/test_course_layout.py)")


def test_every_notebook_keeps_the_run_time_readme_states():
    """README promised "about a minute or less" a notebook while notebook 07 took 723 s (issue 41):
    the promise is now README's "at most 2 minutes", and the committed measurement must keep it."""
    rows = json.loads(readme.TIMINGS.read_text())["rows"]
    slow = {nn: r["notebooks"] for nn, r in rows.items() if r["notebooks"] > readme.NOTEBOOK_LIMIT_S}
    assert slow == {}, f"over {readme.NOTEBOOK_LIMIT_S} s at the tiny preset: {slow}"
    assert f"at most {readme.NOTEBOOK_LIMIT_S // 60} minutes on an idle 2-core machine" in (readme.ROOT / "README.md").read_text()


def test_the_gpu_kits_plan_is_rendered_in_the_gpu_kit_page_and_teaching_notes():
    """docs/gpu-kit.md's and docs/teaching.md's GPU sections show the kit's order and estimates as
    the kit's own plan computes them (a task added, reordered or re-estimated shows in both)."""
    from course_utils.gpu_kit import plan

    table = plan.plan_table()
    for path in (readme.GPU_KIT_DOC, readme.TEACHING):
        text = path.read_text()
        assert readme.replace_block(text, "gpu-plan", table) == text, (
            f"{path.name}'s gpu-plan block is stale: run `python -m course_utils.readme --render`")
        assert "`diagnose/seed003`" in text and "`notebook/" in text


def test_the_declared_torch_range_is_the_tested_one():
    """pyproject's torch range runs from the oldest to the newest version docs/testing.md's
    "PyTorch versions" table says passed, and constraints.txt's pin (what make install uses) is
    inside."""
    import re
    import tomllib

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    root = readme.README.parent
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = SpecifierSet(next(d for d in deps if d.startswith("torch"))[len("torch"):])
    section = (root / "docs" / "testing.md").read_text().split("## PyTorch versions", 1)[1].split("\n## ", 1)[0]
    passed = [Version(v) for v, result in re.findall(r"^\| (\d+\.\d+\.\d+)\b[^|]*\|[^|]*\|[^|]*\| (\w+)", section, re.M)
              if result == "passed"]
    assert len(passed) >= 3, "docs/testing.md's PyTorch versions table lists no passed runs"
    lo, hi = min(passed), max(passed)
    assert str(spec) == f"<{hi.major}.{hi.minor + 1},>={lo.major}.{lo.minor}" or \
        str(spec) == f">={lo.major}.{lo.minor},<{hi.major}.{hi.minor + 1}", (spec, lo, hi)
    pin = re.search(r"^torch==(\S+)", (root / "constraints.txt").read_text(), re.M).group(1)
    assert Version(pin) in spec and Version(pin) in passed


def test_make_test_emulated_runs_the_solution_on_tf32_ranks():
    """README: `make test-emulated` runs exercise 08's solution with COURSE_EMULATE_TF32=1. Each
    pytest command of its recipe is read as make runs it, and its `-m` expression evaluated as
    pytest does for the items it names: a notebook cell has no mark, so the old recipe (one run with
    `-m emulated`) deselected every notebook and none ran; the `emulated` tests must be selected too.
    (Reading the recipe, not collecting it: a collection of tests/ costs a minute of CPU.)"""
    import itertools
    import shlex
    import subprocess

    from _pytest.mark.expression import Expression

    root = readme.README.parent
    recipe = subprocess.run(["make", "-n", "-W", "install", "test-emulated"], cwd=root, capture_output=True,
                            text=True, check=True).stdout.replace("\\\n", " ")
    runs = []  # (environment, paths, is a notebook cell selected, is an `emulated` test selected)
    for line in (ln for ln in recipe.splitlines() if " pytest " in ln):
        words = shlex.split(line)
        env = dict(w.split("=", 1) for w in itertools.takewhile(lambda w: "=" in w, words))
        args = words[words.index("pytest") + 1:]  # after `python -m pytest`
        expr = Expression.compile(args[args.index("-m") + 1]) if "-m" in args else None
        paths = [a for a in args if not a.startswith("-") and (root / a).exists()]

        def selected(marks, expr=expr):
            return expr is None or expr.evaluate(lambda name: name in marks)
        runs.append((env, paths, selected(set()), selected({"emulated"})))
    assert runs, recipe
    assert any(env.get("COURSE_EMULATE_TF32") == "1" and "solutions/08_data_parallel.ipynb" in paths and cell
               for env, paths, cell, _ in runs), ("make test-emulated does not run solutions/08 under "
                                                  f"COURSE_EMULATE_TF32=1: {runs}")
    assert any("tests" in paths and emulated for _, paths, _, emulated in runs), runs


def test_the_recipe_reader_rejects_the_old_recipe():
    """The check above can fail: `-m emulated` selects no notebook cell, `-m "not grader"` does."""
    from _pytest.mark.expression import Expression

    assert not Expression.compile("emulated").evaluate(lambda name: False)
    assert Expression.compile("not grader").evaluate(lambda name: False)


KERNEL_SEES = "import os\nassert os.environ.get('COURSE_EMULATE_TF32') == {!r}, os.environ.get('COURSE_EMULATE_TF32')"


def test_the_suite_runs_notebooks_08_and_09_on_tf32_ranks(tmp_path):
    """make test runs notebooks 08 and 09 once, their kernels (and the ranks they launch) under
    COURSE_EMULATE_TF32=1 (conftest.py's setup hook): a notebook of either name sees it in its
    kernel, another notebook does not. Without the hook (the old suite ran them plain here and
    again in make test-emulated) the first two notebooks' asserts fail. One pytest run, three
    kernels, as make test runs them."""
    import os
    import subprocess
    import sys

    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from course_utils.tf32 import ENV_VAR

    root = readme.README.parent
    paths = []
    for name, expected in (("08_data_parallel.ipynb", "1"), ("09_model_parallel.ipynb", "1"),
                           ("07_checkpointing.ipynb", None)):
        folder = tmp_path / name[:2]
        folder.mkdir()
        nbformat.write(new_notebook(cells=[new_code_cell(KERNEL_SEES.format(expected))]), folder / name)
        paths.append(str(folder / name))
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:xdist",
                        "-p", "no:cacheprovider", "--nbval-lax", "--rootdir", str(tmp_path), "-c", os.devnull,
                        *paths], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-2000:])
    assert "3 passed" in r.stdout, r.stdout[-2000:]


def test_ranks_on_tf32_for_keeps_an_explicit_setting(monkeypatch):
    """An explicit COURSE_EMULATE_TF32=0 (exact ranks, asked for) is kept, and the variable is
    removed again after a notebook it was set for."""
    import os

    from course_utils.tf32 import ENV_VAR, ranks_on_tf32_for

    monkeypatch.delenv(ENV_VAR, raising=False)
    with ranks_on_tf32_for("notebooks/09_model_parallel.ipynb") as set_it:
        assert set_it and os.environ[ENV_VAR] == "1"
    assert ENV_VAR not in os.environ
    with ranks_on_tf32_for("notebooks/07_checkpointing.ipynb") as set_it:
        assert not set_it and ENV_VAR not in os.environ
    monkeypatch.setenv(ENV_VAR, "0")
    with ranks_on_tf32_for("solutions/08_data_parallel.ipynb") as set_it:
        assert not set_it and os.environ[ENV_VAR] == "0"
    assert os.environ[ENV_VAR] == "0"


def test_timing_one_notebook_merges_into_the_committed_rows():
    """`--timings 03` replaces row 03 only (with its own date and load), keeps the others, drops
    the rows of notebooks no longer present, and the table says which rows were timed apart."""
    old = json.loads(readme.TIMINGS.read_text())
    for row in old["rows"].values():  # as if every committed row were timed together (a freshly
        row.pop("measured", None)     # scaffolded notebook's row is timed on its own)
    old["rows"]["99"] = {"name": "gone", "notebooks": 1, "solutions": 1}
    meta = {"date": "2030-01-01", "torch": "9.9", "cores": 3, "load average before": 0.1, "load average after": 0.2}
    new = {"meta": meta, "rows": {"03": {"name": "memory limit test", "notebooks": 77, "solutions": 7}}}
    merged = readme.merge_timings(old, new)
    assert merged["meta"] == old["meta"] and "99" not in merged["rows"]
    assert merged["rows"]["03"] == {**new["rows"]["03"], "measured": meta}
    assert {k: v for k, v in merged["rows"].items() if k != "03"} == \
        {k: v for k, v in old["rows"].items() if k not in ("03", "99")}
    table = readme.render_timings(merged)
    assert "| 03 | The memory-limit test (seed 003) | 77 s | 7 s |" in table
    assert table.endswith("Measured on their own (`--timings NN`): 03 on 2030-01-01 (torch 9.9, 3 cores, "
                          "load average 0.1 before and 0.2 after).")


def test_timings_of_an_unknown_notebook_are_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        readme.main(["--render", "--timings", "99"])
    assert "no notebook 99 in notebooks/" in capsys.readouterr().err


def test_a_cut_or_hostile_timings_or_figures_file_is_named_with_the_fix(tmp_path, monkeypatch):
    """Issue 43: results/timings.json or results/figures.json cut short (or of the wrong shape)
    broke `python -m course_utils.readme --render` with a JSONDecodeError (or a KeyError) naming
    no file; `--timings NN` found it only after timing the notebooks."""
    import pytest

    from course_utils.checks import RecordError

    timings, figures = tmp_path / "timings.json", tmp_path / "figures.json"
    monkeypatch.setattr(readme, "TIMINGS", timings)
    monkeypatch.setattr(readme, "FIGURES", figures)
    monkeypatch.setattr(readme, "notebook_timings", lambda only: pytest.fail("timed before reading the old file"))
    good = json.loads(readme.__dict__["ROOT"].joinpath("results", "timings.json").read_text())
    for text, problem in (('{"meta": {"date": "2026', "cut short"),
                          (json.dumps({**good, "rows": {"00": {"notebooks": -3}}}), "row 00: its seconds"),
                          (json.dumps({"rows": {}}), "its meta needs")):
        timings.write_text(text)
        with pytest.raises(RecordError, match=f"{timings}.*{problem}.*Fix: restore it"):
            readme.write_timings(["00"])
        assert timings.read_text() == text
    timings.write_text(json.dumps(good))
    for text, problem in (("", "it is empty"), ('{"meta": {"date": "d", "torch": "t"}, "rows": [{"key": 1}]}',
                                                "its rows are not a list of headlines")):
        figures.write_text(text)
        with pytest.raises(RecordError, match=f"{figures}.*{problem}.*Fix: restore it"):
            readme.main(["--render"])
