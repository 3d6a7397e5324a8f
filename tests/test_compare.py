"""technique_table and step_time: one training step per variant, named methods, the baseline."""

import pandas as pd
import pytest
import torch

from course_utils import UNet3D
from course_utils.compare import COLUMNS, PARTS, relative_to, step_time, technique_table


def test_table_rows_parts_and_baseline():
    builds = {"plain": lambda: UNet3D(levels=3, channels=4),
              "checkpointed": lambda: UNet3D(levels=3, channels=4, checkpoint="level")}
    t = technique_table(builds, (2, 1, 8, 8, 8))
    assert list(t.columns) == COLUMNS and list(t.variant) == ["plain", "checkpointed"]
    assert t["peak vs baseline %"].iloc[0] == 0 and t["peak vs baseline %"].iloc[1] < 0
    # what checkpointing hides from saved_tensors_hooks, "kept after forward" still sees
    assert t["kept after forward MiB"].iloc[1] > 0
    # the parts add up to the peak (to the table's rounding)
    for _, row in t.iterrows():
        assert sum(row[p] for p in PARTS) == pytest.approx(row["peak MiB"], abs=0.3)
    assert t["method"].str.contains("predicted for a CUDA GPU").all()


def test_dtypes_and_autocast_name_variants_that_exist():
    with pytest.raises(ValueError, match="not in builds"):
        technique_table({"a": lambda: UNet3D(3, 4)}, (2, 1, 8, 8, 8), autocast={"b": torch.float16})


def test_fp16_model_halves_parameters_and_autocast_does_not():
    build = lambda: UNet3D(levels=3, channels=32)
    t = technique_table({"fp32": build, "fp16 model": build, "autocast": build}, (2, 1, 8, 8, 8),
                        dtypes={"fp16 model": torch.float16}, autocast={"autocast": torch.bfloat16})
    params = dict(zip(t.variant, t["params MiB"], strict=True))
    assert params["fp16 model"] == pytest.approx(params["fp32"] / 2, abs=0.1)
    assert params["fp32"] == params["autocast"]  # the fp32 master weights stay


def test_step_time_runs_in_the_model_dtype():
    build = lambda: UNet3D(levels=3, channels=4)
    assert step_time(build, (2, 1, 8, 8, 8), reps=1) > 0
    assert step_time(build, (2, 1, 8, 8, 8), reps=1, dtype=torch.bfloat16) > 0  # bf16 model, bf16 input
    with pytest.raises(ValueError, match="reps"):
        step_time(build, (2, 1, 8, 8, 8), reps=0)


def test_a_cuda_row_that_runs_out_of_memory_is_reported_not_fatal(monkeypatch):
    """The full preset on a GPU smaller than it assumes: that row says so, the others stay."""
    from types import SimpleNamespace

    from course_utils import compare

    def measure(build, *args, **kwargs):
        if build is builds["big"]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return SimpleNamespace(peak_allocated=2**20, kept_after_forward=2**19, saved_peak=2**19,
                               method="measured (fake)")

    builds = {"small": lambda: UNet3D(3, 4), "big": lambda: UNet3D(3, 8)}
    monkeypatch.setattr(compare, "measure_step", measure)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=8 * 2**30))
    t = technique_table(builds, (2, 1, 8, 8, 8), device="cuda")
    assert t["peak MiB"].tolist()[0] == 1.0
    assert t["method"].iloc[1].startswith("out of memory on this 8 GiB GPU")


def test_relative_to_compares_with_the_named_row_not_the_first():
    t = pd.DataFrame({"variant": ["a", "b", "c"], "peak MiB": [30.0, 20.0, 10.0], "saved MiB": [8.0, 4.0, 2.0]})
    r = relative_to(t, "b", "B")
    assert list(r.index) == ["a", "b", "c"]
    assert r["saved vs B %"].tolist() == [100.0, 0.0, -50.0]
    assert r["peak vs B %"].tolist() == [50.0, 0.0, -50.0]
    assert "peak vs b %" in relative_to(t, "b").columns and "variant" in t.columns   # the input is left as it was
