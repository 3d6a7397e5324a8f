"""course_utils.config: the checks that kill the mutants (tools/mutants.py) the other tests let
through -- an empty COURSE_SIZE and the default preset on a GPU."""

import torch

from course_utils.config import PRESETS, resolve_preset


def test_an_empty_course_size_means_unset(monkeypatch):
    """``COURSE_SIZE= make test`` (set but empty) picks the default, not an unknown preset ''."""
    monkeypatch.setenv("COURSE_SIZE", "")
    preset, reason = resolve_preset(None, torch.device("cpu"))
    assert preset is PRESETS["tiny"] and "default for cpu" in reason


def test_the_default_preset_follows_the_device(monkeypatch):
    """full on a GPU, tiny on a CPU (a device object is enough: no GPU is needed to ask)."""
    monkeypatch.delenv("COURSE_SIZE", raising=False)
    assert resolve_preset(None, torch.device("cuda"))[0] is PRESETS["full"]
    assert resolve_preset(None, torch.device("cpu"))[0] is PRESETS["tiny"]
    monkeypatch.setenv("COURSE_SIZE", "TINY")
    assert resolve_preset(None, torch.device("cuda"))[0] is PRESETS["tiny"]  # the variable wins
