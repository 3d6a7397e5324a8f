"""docs/teaching.md's grading-benchmark table is the one tools/grading_benchmark.py renders from the
recorded runs (benchmarks/results/grading-*.json): no figure typed in by hand."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_table_is_rendered_from_the_recorded_runs():
    spec = importlib.util.spec_from_file_location("grading_benchmark", ROOT / "tools" / "grading_benchmark.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = (ROOT / "docs" / "teaching.md").read_text()
    block = doc[doc.index(mod.BEGIN):doc.index(mod.END) + len(mod.END)]
    assert block == mod.render(), "run: python tools/grading_benchmark.py --render"
    assert list((ROOT / "benchmarks" / "results").glob("grading-*.json")), "no recorded grading benchmark"
