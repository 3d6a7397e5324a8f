"""course_utils.fit_validation: fit's predictions of published GPU figures (fit_published) are
recomputed; the rendered page docs/fit-validation.md is what the code computes today."""

from __future__ import annotations

import pytest
import torch

from course_utils import fit_published, fit_validation
from course_utils.fit_published import PUBLISHED


def _entry(name):
    return next(e for e in PUBLISHED if e["name"] == name)


def test_every_entry_is_complete_and_its_builder_matches_the_originals_count():
    keys = {"name", "builder", "fit", "row", "figure", "published_bytes", "reading", "source", "url", "where",
            "quote", "inferred", "gpu", "torch"}
    counts = {"vit_l_16": 304_326_632, "bert_large_uncased_seq_cls": 335_143_938,
              "bert_base_uncased_lm_head": 109_514_298}
    for e in PUBLISHED:
        assert keys <= set(e), e["name"]
        assert e["figure"] in ("peak", "after_forward") and e["published_bytes"] > 0
    with torch.device("meta"):
        for builder, n in counts.items():
            assert sum(p.numel() for p in getattr(fit_published, builder)().parameters()) == n
    assert len({e["name"] for e in PUBLISHED}) == len(PUBLISHED) >= 6


def test_one_published_figure_recomputed():
    """BERT-base's LM head, eager attention, no optimizer, batch 1 x 256 (transformers PR #28802):
    max_memory_allocated within 5 %."""
    (check,) = fit_validation.validate([_entry("bert_base_lm_head_eager_b1_s256")], progress=False)
    assert abs(check.ratio - 1) <= fit_validation.AGREES and check.verdict == "within 5 %"


@pytest.mark.sweep  # every entry: ~65 CPU-s
def test_the_page_is_what_the_code_computes():
    checks = fit_validation.validate(progress=False)
    assert fit_validation.markdown(checks) == fit_validation.PAGE.read_text(), (
        "docs/fit-validation.md is stale: run python -m course_utils.fit_validation --render")
    allocator = [c for c in checks if not c.driver_level]
    # as rendered today: 4 of the 6 allocator-level figures within 5 %, and each miss with its cause
    assert sum(abs(c.ratio - 1) <= fit_validation.AGREES for c in allocator) >= 4
    assert all("miss" in c.entry for c in allocator if abs(c.ratio - 1) > fit_validation.AGREES)
    assert all(c.ratio <= 1 + fit_validation.AGREES for c in checks if c.driver_level)
