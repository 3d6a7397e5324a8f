"""README's generated tables match the committed results, and the fast headline figures still
compute to what is committed: the README cannot drift from the code."""

import json

from course_utils import readme


def test_readme_blocks_are_rendered_from_the_committed_results():
    text = readme.README.read_text()
    data = json.loads(readme.FIGURES.read_text())
    assert readme.render_readme(text, data) == text, (
        "README's generated blocks are stale: run `python -m course_utils.readme --render` "
        "(or without --render, to recompute the figures too)")


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


def test_benchmark_block_names_a_gpu_run_or_its_absence():
    block = readme.render_benchmarks()
    assert "No GPU run has been recorded yet" in block or "Measured: cuda" in block


def test_teaching_timings_are_rendered_from_the_committed_measurement():
    text = readme.TEACHING.read_text()
    data = json.loads(readme.TIMINGS.read_text())
    assert readme.replace_block(text, "timings", readme.render_timings(data)) == text
    assert set(data["rows"]) == {p.name[:2] for p in (readme.ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
