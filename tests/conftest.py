import os

import pytest
import torch
from hypothesis import HealthCheck, settings


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The property-based suites (tests/test_properties_*.py) run few, fixed examples in make test and
# CI ("ci": derandomized, so a run is repeatable, and bounded in examples) and many in make
# test-sweep ("sweep", HYPOTHESIS_PROFILE=sweep). A test that needs fewer examples says so itself.
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, database=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("sweep", max_examples=400, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
