"""course_utils.recorded: GPU figures recorded by the kit, shown on CPU with their origin."""

import json
import os

import pandas as pd
import pytest

from course_utils import recorded


def test_record_does_nothing_without_the_kit(tmp_path, monkeypatch):
    monkeypatch.delenv(recorded.ENV_VAR, raising=False)
    assert recorded.record("00/context", {"MiB": 1}) == {"MiB": 1}
    assert not list(tmp_path.iterdir())


def test_record_into_a_folder_leaves_the_environment_alone(tmp_path, monkeypatch):
    # the GPU kit records its own figures this way, without setting $COURSE_RECORD_DIR
    monkeypatch.delenv(recorded.ENV_VAR, raising=False)
    recorded.record("gpu/ratio", {"max": 1.2}, folder=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["gpu__ratio.json"]
    assert recorded.ENV_VAR not in os.environ
    assert recorded.file_stem("NVIDIA H100 80GB/HBM3") == "NVIDIA_H100_80GB_HBM3"


def test_round_trip_table_text_and_json(tmp_path, monkeypatch, capsys):
    raw, out = tmp_path / "raw", tmp_path / "recorded"
    monkeypatch.setenv(recorded.ENV_VAR, str(raw))
    table = pd.DataFrame({"allocated_MiB": [0.0, 256.0], "reserved_MiB": [0.0, 256.0]},
                         index=["start", "a"])
    recorded.record("00/caching_demo", table)
    recorded.record("02/note", "hello")
    recorded.record("00/context", {"context_MiB": 517.2})
    path = recorded.collect(raw, out / "TestGPU.json")
    data = json.loads(path.read_text())
    assert set(data["figures"]) == {"00/caching_demo", "02/note", "00/context"}
    rec = recorded.lookup("00/caching_demo", out)
    pd.testing.assert_frame_equal(rec.value, table)
    assert recorded.lookup("02/note", out).value == "hello"
    assert recorded.show("00/context", folder=out) == {"context_MiB": 517.2}
    assert "recorded on" in capsys.readouterr().out


def test_missing_figure_says_so(tmp_path, capsys):
    assert recorded.show("99/nothing", "a figure", folder=tmp_path) is None
    assert "No GPU run has been recorded" in capsys.readouterr().out


def test_bad_values_and_keys(tmp_path, monkeypatch):
    monkeypatch.setenv(recorded.ENV_VAR, str(tmp_path))
    with pytest.raises(TypeError, match="Fix: convert it"):
        recorded.record("x", object())
    with pytest.raises(ValueError, match="record key"):
        recorded.record("bad key", 1)


def test_an_installed_wheel_reads_the_unzipped_courses_recorded_folder(tmp_path, monkeypatch):
    # course_utils installed from its wheel (a hosted notebook): no checkout's recorded/ beside the
    # package, but make dist's zip unpacked as course/{notebooks,recorded}, the kernel in notebooks/
    monkeypatch.delenv(recorded.SHOW_ENV_VAR, raising=False)
    monkeypatch.setattr(recorded, "RECORDED", tmp_path / "site-packages" / "recorded")
    raw, course = tmp_path / "raw", tmp_path / "course"
    (course / "notebooks").mkdir(parents=True)
    monkeypatch.setenv(recorded.ENV_VAR, str(raw))
    recorded.record("00/context", {"context_MiB": 517.2})
    recorded.collect(raw, course / "recorded" / "TestGPU.json")
    monkeypatch.chdir(course / "notebooks")
    assert recorded.recorded_folder() == course / "recorded"
    assert recorded.lookup("00/context").value == {"context_MiB": 517.2}
    monkeypatch.setenv(recorded.SHOW_ENV_VAR, str(tmp_path / "elsewhere"))
    assert recorded.lookup("00/context") is None
