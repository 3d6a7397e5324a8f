"""course_utils.recorded: GPU figures recorded by the kit, shown on CPU with their origin."""

import contextlib
import errno
import json
import os
import resource
import signal

import pandas as pd
import pytest

from course_utils import recorded
from course_utils.checks import RecordError
from course_utils.files import SkippedFile


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
    assert recorded.file_stem("../../x\x00y") == "_.._x_y" and recorded.file_stem("..") == "unnamed"  # stays in its folder


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
    with pytest.raises(RecordError, match="Fix: convert it"):
        recorded.record("x", object())
    for key in ("bad key", "", "/x", "x/", "a//b", "k" * 151, "a\nb"):
        with pytest.raises(RecordError, match="record key .*Fix: use letters"):
            recorded.record(key, 1)
    assert not list(tmp_path.iterdir())


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


def test_a_hosted_notebook_finds_the_zip_where_the_kernel_does_not_start(tmp_path, monkeypatch):
    """Colab's kernel runs in /content and Kaggle's in /kaggle/working, not in the unzipped course:
    the reader looked only in the working folder and one up, so notebook 00 said "No GPU run has
    been recorded" there. It now searches where the notebooks' first cell finds course_setup.py."""
    monkeypatch.delenv(recorded.SHOW_ENV_VAR, raising=False)
    monkeypatch.setattr(recorded, "RECORDED", tmp_path / "site-packages" / "recorded")
    content = tmp_path / "content"
    (content / "sample_data").mkdir(parents=True)  # what Colab puts there
    (content / "gpu-memory-course" / "recorded").mkdir(parents=True)
    recorded.write({"meta": {"gpu": "T", "torch": "2.11", "cuda": "13.0", "date": "2026-11-27"},
                    "figures": {"00/context": {"kind": "json", "data": {"MiB": 1}}}},
                   content / "gpu-memory-course" / "recorded" / "T.json")
    monkeypatch.chdir(content)
    assert recorded.recorded_folder() == content / "gpu-memory-course" / "recorded"
    assert recorded.lookup("00/context").value == {"MiB": 1}
    kaggle = tmp_path / "kaggle"
    (kaggle / "input" / "ds" / "gpu-memory-course" / "recorded").mkdir(parents=True)
    (kaggle / "working").mkdir()
    (content / "gpu-memory-course" / "recorded" / "T.json").rename(
        kaggle / "input" / "ds" / "gpu-memory-course" / "recorded" / "T.json")
    monkeypatch.chdir(kaggle / "working")
    monkeypatch.setattr(recorded, "PLACES", ("", "../", "*/", f"{kaggle}/input/*/*/"))  # /kaggle/input/*/*/
    assert recorded.recorded_folder() == kaggle / "input" / "ds" / "gpu-memory-course" / "recorded"


def _benchmark(gpu, measured=True):
    row = {"net": "large", "technique": "baseline fp32", "predicted peak MiB": 9710}
    if measured:
        row.update({"measured peak MiB": 9735, "measured reserved MiB": 14118, "driver used MiB": 14757})
    return {"meta": {"device": gpu, "date": "2026-11-24", "torch": "2.11.0+cu130", "cuda": "13.0",
                     "model": "seed 000 U-Nets, 26x150x320, batch 2, Adam"},
            "rows": [{"net": "small", "technique": "baseline fp32", "measured peak MiB": 1}, row]}


def _runs(tmp_path):
    """A docs/gpu-runs/ as the repository has it: the first run's files (no kit.json), a kit run
    with its benchmark under details/ and a continuation call of it, a folder that records nothing."""
    runs = tmp_path / "docs" / "gpu-runs"
    first = runs / "2026-11-24-h100"
    first.mkdir(parents=True)
    (first / "benchmark-large.json").write_text(json.dumps(_benchmark("H100")))
    machine = {"gpu": "H100", "torch": "2.11.0+cu130", "cuda": "13.0", "date": "2026-11-24"}
    (first / "limit.json").write_text(json.dumps({"machine": machine, "overheads": {"context MiB": 628.8}}))
    kit_machine = {**machine, "gpu": "H200", "date": "2026-11-27", "context MiB": 630.0}
    for name in ("2026-11-27-h200", "2026-11-27-h200-2"):
        (runs / name).mkdir()
        (runs / name / "kit.json").write_text(json.dumps({"machine": kit_machine}))
    (runs / "2026-11-27-h200-2" / "details").mkdir()
    bench = _benchmark("H200")
    bench["rows"][1]["measured peak MiB"] = 9800
    (runs / "2026-11-27-h200-2" / "details" / "benchmark-large-H200.json").write_text(json.dumps(bench))
    (runs / "notes").mkdir()
    (runs / "notes" / "benchmark-large.json").write_text(json.dumps(_benchmark("X", measured=False)))
    return runs


def test_gpu_runs_reads_each_runs_context_and_large_step(tmp_path):
    runs = recorded.gpu_runs(_runs(tmp_path))
    assert [(r.meta["gpu"], r.context_mib, r.step["measured peak MiB"]) for r in runs] == [
        ("H100", 628.8, 9735), ("H200", 630.0, 9800)]
    assert runs[1].folders == ["2026-11-27-h200", "2026-11-27-h200-2"]  # one run over two calls
    assert runs[0].label == "H100, 2026-11-24, torch 2.11.0+cu130"
    table = recorded.runs_table(runs)
    assert list(table.index) == [r.label for r in runs]
    assert table.loc[runs[0].label, "outside the allocator MiB"] == 14757 - 14118
    assert len(table.columns) <= 6


def test_show_runs_labels_the_method_and_limits_or_says_none(tmp_path, capsys):
    table = recorded.show_runs(_runs(tmp_path))
    out = capsys.readouterr().out
    assert table is not None and "not measured on this machine" in out and "limits:" in out
    assert "max_memory_allocated" in out and "batch 2, Adam" in out  # the method, from the run's own record
    assert recorded.show_runs(tmp_path / "empty") is None
    assert "No GPU run has been recorded" in capsys.readouterr().out


def test_the_repositorys_gpu_runs_are_read(monkeypatch):
    """Notebook 00 printed "No GPU run has been recorded" beside docs/gpu-runs/'s H100 run: the
    runs' own records (context, the large net's step) are read from there, and make dist's zip
    ships the files read (recorded.RUN_FILES)."""
    monkeypatch.delenv(recorded.SHOW_ENV_VAR, raising=False)
    runs = recorded.gpu_runs()
    gpus = [r.meta["gpu"] for r in runs]
    assert "NVIDIA H100 80GB HBM3" in gpus and "NVIDIA H200" in gpus
    for r in runs:
        assert r.context_mib and r.step and r.step["measured peak MiB"] <= r.step["measured reserved MiB"]
    read = {p for g in recorded.RUN_FILES for p in recorded.ROOT.glob(g)}
    assert {f for r in runs for f in r.folders} <= {p.relative_to(recorded.ROOT / "docs" / "gpu-runs").parts[0]
                                                      for p in read}


def _executed_run(runs, name, date, table, cell_id="c27", notebook="04_mixed_precision.ipynb"):
    """A kit run's folder with its machine (kit.json) and one executed notebook whose cell shows ``table``
    as Jupyter stores a displayed DataFrame (its HTML repr beside a plain-text one)."""
    folder = runs / name
    (folder / "notebooks").mkdir(parents=True)
    (folder / "kit.json").write_text(json.dumps({"machine": {"gpu": "H200", "date": date, "torch": "2.11.0+cu130",
                                                             "cuda": "13.0"}}))
    cell = {"cell_type": "code", "id": cell_id, "source": "measured", "metadata": {}, "outputs": [
        {"output_type": "stream", "name": "stdout", "text": "a line first\n"},
        {"output_type": "execute_result", "metadata": {}, "execution_count": 1,
         "data": {"text/plain": table.to_string(), "text/html": table._repr_html_()}}]}
    (folder / "notebooks" / notebook).write_text(json.dumps({"cells": [cell], "metadata": {}}))
    return folder


def test_a_figure_measured_before_its_cell_recorded_it_is_read_from_the_executed_notebook(tmp_path, capsys):
    """Notebook 04's section 7 printed "No GPU run has been recorded" on a CPU while the H200 run's
    executed notebook showed the cell's very table (its text then displayed it without ``record``):
    ``lookup`` reads a ``FROM_OUTPUTS`` key from that output, labelled with the run's machine and
    the file, numbers as numbers; an output with other columns is not the figure."""
    cols = recorded.FROM_OUTPUTS["04/measured"][2]
    table = pd.DataFrame([["seed 000 large net", "fp32", 9735.1, 0.0, 8008.0, "measured"],
                          ["seed 000 large net", "autocast float16", 6791.2, -30.2, 4187.3, "measured"]], columns=cols)
    runs = tmp_path / "docs" / "gpu-runs"
    _executed_run(runs, "2026-11-27-h200", "2026-11-27", table)
    (tmp_path / "recorded").mkdir()
    rec = recorded.lookup("04/measured", tmp_path / "recorded")
    pd.testing.assert_frame_equal(rec.value, table, check_dtype=False)
    assert rec.value["peak MiB"].tolist() == [9735.1, 6791.2]
    assert "H200, 2026-11-27" in rec.label and "cell c27" in rec.label and "04_mixed_precision.ipynb" in rec.label
    assert recorded.show("04/measured", folder=tmp_path / "recorded", drop=("method",)) is not None
    assert "method: measured" in capsys.readouterr().out  # a dropped column is printed below the table
    # a figure recorded under recorded/ on a later date wins; on the same date too
    for date in ("2026-11-28", "2026-11-27"):
        recorded.write({"meta": {"gpu": "H200", "torch": "2.12", "cuda": "13.0", "date": date},
                        "figures": {"04/measured": {"kind": "json", "data": {"newer": 1}}}}, tmp_path / "recorded" / "H.json")
        assert recorded.lookup("04/measured", tmp_path / "recorded").value == {"newer": 1}
    # the same cell id showing another table (the cell's text changed): not the figure
    other = tmp_path / "other"
    _executed_run(other / "docs" / "gpu-runs", "run", "2026-11-27", table.drop(columns="method"))
    (other / "recorded").mkdir()
    assert recorded.lookup("04/measured", other / "recorded") is None
    assert recorded.lookup("99/unknown", tmp_path / "recorded") is None


def test_the_repositorys_executed_notebooks_give_the_figures_their_cells_did_not_record(monkeypatch):
    """Notebooks 02 and 04 said "No GPU run has been recorded" on a CPU for two tables the H200 run
    had measured (02's comparison of the two loggers, 04's seed nets at full size)."""
    monkeypatch.delenv(recorded.SHOW_ENV_VAR, raising=False)
    measured = recorded.lookup("04/measured")
    assert measured.meta["gpu"] == "NVIDIA H200" and measured.meta["date"] == "2026-11-27"
    peaks = measured.value.set_index(["net", "variant"])["peak MiB"]
    assert peaks[("seed 000 large net", "fp32")] == 9735.1 and peaks[("seed 000 small net", "fp32")] == 11732.5
    hooks = recorded.lookup("02/hooks_vs_memtracker").value.iloc[0]
    assert (hooks["forward rows"], hooks["rows equal"], hooks["largest difference B"]) == (74, 0, 2860032)


def test_gpu_runs_read_any_benchmark_step_and_skip_rows_a_run_disowns(tmp_path, monkeypatch):
    """Notebook 02 shows seed 000's fp16 step on both nets as the H200 run's benchmark measured it.
    The H100 run's record says that only its benchmark's first row is a figure of its technique
    (a failed attempt stayed allocated): its fp16 row (9,503 MiB measured for 4,963 predicted) must
    not be read as one."""
    runs = _runs(tmp_path)
    bench = _benchmark("H200")
    bench["rows"] = [{"net": "small", "technique": "fp16 model (seed 000)", "predicted peak MiB": 5637,
                      "measured peak MiB": 6049, "measured reserved MiB": 9162, "driver used MiB": 10015}]
    (runs / "2026-11-27-h200-2" / "details" / "benchmark-small-H200.json").write_text(json.dumps(bench))
    small = recorded.gpu_runs(runs, ("small", "fp16 model (seed 000)"))
    assert [r.step and r.step["measured peak MiB"] for r in small] == [None, 6049]
    assert recorded.latest_step("small", "fp16 model (seed 000)", runs).step["driver used MiB"] == 10015
    assert recorded.latest_step("small", "autocast fp16", runs) is None
    monkeypatch.delenv(recorded.SHOW_ENV_VAR, raising=False)
    fp16 = recorded.gpu_runs(step=("large", "fp16 model (seed 000)"))
    assert {r.meta["gpu"]: r.step and r.step["measured peak MiB"] for r in fp16} == {
        "NVIDIA H100 80GB HBM3": None, "NVIDIA H200": 5101}
    assert recorded.latest_step("small", "fp16 model (seed 000)").step["measured reserved MiB"] == 9162


# --------------------------------------------------------------------------------------------
# Bad files (issue 43): a truncated or hostile recording is skipped, named, and the rest serve;
# a write that fails leaves the old file whole; each figure keeps the GPU it was recorded on
# --------------------------------------------------------------------------------------------
_META = {"gpu": "NVIDIA Good GPU", "torch": "2.11", "cuda": "13.0", "date": "2026-11-27"}


def _recording_folder(tmp_path, monkeypatch, bad: bytes) -> tuple:
    """A recorded/ folder of one good recording (the CUDA context: 777 MiB) and one bad file,
    where ``show`` and ``lookup`` read by default ($COURSE_RECORDED)."""
    folder = tmp_path / "recorded"
    folder.mkdir()
    recorded.write({"meta": _META, "figures": {"00/cuda_context": {"kind": "json", "data": {"context_MiB": 777.0}}}},
                   folder / "NVIDIA_Good_GPU.json")
    (folder / "NVIDIA_Cut_GPU.json").write_bytes(bad)
    monkeypatch.setenv(recorded.SHOW_ENV_VAR, str(folder))
    return folder, folder / "NVIDIA_Cut_GPU.json"


def test_one_truncated_recording_no_longer_breaks_fit_explorer_and_show(tmp_path, monkeypatch, capsys):
    """Issue 43: one truncated recording (what a full disk during the old, in-place
    ``recorded.collect`` left) broke ``fit``, ``explorer.estimate`` (both read the CUDA context
    through ``budget.overheads``) and every ``show()`` with a JSONDecodeError naming no file. Now
    the file is skipped with a warning naming it and the fix, and the good recording serves."""
    from course_utils import budget, explorer

    good = (tmp_path / "good.json")
    recorded.write({"meta": _META, "figures": {"00/cuda_context": {"kind": "json", "data": {"context_MiB": 777.0}}}}, good)
    _, bad = _recording_folder(tmp_path, monkeypatch, good.read_bytes()[:150])
    with pytest.warns(SkippedFile, match=f"{bad}.*cut short.*Fix: restore"):
        assert budget.overheads().context_mib == 777.0  # what fit and explorer.estimate read
    with pytest.warns(SkippedFile, match=str(bad)):
        assert recorded.show("00/cuda_context") == {"context_MiB": 777.0}
    assert "recorded on NVIDIA Good GPU" in capsys.readouterr().out
    cfg = explorer.Config(levels=3, base_channels=8, volume=(16, 32, 32), batch=2, precision="fp32", seed000=False)
    with pytest.warns(SkippedFile, match=str(bad)):
        assert explorer.estimate(cfg).overheads.context_mib == 777.0


@pytest.mark.parametrize("bad", [b"", b"\x00\xff\x80garbage", b"[1, 2]", b"null", b'{"meta": 5, "figures": {}}',
                                 b'{"meta": {"gpu": "G"}, "figures": {}}',
                                 b'{"meta": {"gpu": "G", "torch": "t", "cuda": "c", "date": "d"}, "figures": []}',
                                 b'{"meta": {"gpu": "G", "torch": "t", "cuda": "c", "date": "d"}, '
                                 b'"figures": {"00/cuda_context": {"kind": "table", "data": 3, "columns": []}}}'])
def test_a_hostile_recording_is_skipped_and_named(tmp_path, monkeypatch, bad):
    _, path = _recording_folder(tmp_path, monkeypatch, bad)
    with pytest.warns(SkippedFile) as seen:
        rec = recorded.lookup("00/cuda_context")
    assert rec.value == {"context_MiB": 777.0} and rec.meta["gpu"] == "NVIDIA Good GPU"
    assert len(seen) == 1 and str(path) in str(seen[0].message) and "Fix: restore" in str(seen[0].message)


def test_a_figure_whose_table_pandas_cannot_build_is_skipped_and_named(tmp_path, monkeypatch):
    bad = json.dumps({"meta": {**_META, "date": "2030-01-01"}, "figures": {"00/cuda_context": {
        "kind": "table", "columns": ["a", "b"], "data": [[1, 2, 3]]}}}).encode()
    _, path = _recording_folder(tmp_path, monkeypatch, bad)
    with pytest.warns(SkippedFile, match=f"{path}: figure '00/cuda_context' is not a table"):
        assert recorded.lookup("00/cuda_context").value == {"context_MiB": 777.0}


def test_collect_under_a_full_disk_leaves_the_old_recording_whole(tmp_path, monkeypatch):
    """Issue 43: ``collect`` wrote in place, so a full disk left half a file (which then broke
    every reader) and raised a raw OSError. The disk fills here during the rename."""
    raw, dest = tmp_path / "raw", tmp_path / "recorded" / "G.json"
    recorded.record("00/cuda_context", {"context_MiB": 1.0}, folder=raw)
    recorded.collect(raw, dest)
    before = dest.read_bytes()
    recorded.record("02/new", {"x": list(range(1000))}, folder=raw)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(RecordError, match=f"Could not write {dest}: the disk is full.*Fix: free space"):
        recorded.collect(raw, dest)
    assert dest.read_bytes() == before and sorted(p.name for p in dest.parent.iterdir()) == ["G.json"]


def test_a_failed_record_leaves_no_half_figure(tmp_path):
    """``record`` wrote in place too: a write cut short (here at a file size limit, as a full
    disk cuts it) left half a figure, which ``merged`` then failed on, naming no file."""
    recorded.record("00/t", "old", folder=tmp_path)
    with _file_size_limit(600), pytest.raises(RecordError, match=f"Could not write {tmp_path / '00__t.json'}"):
        recorded.record("00/t", "x" * 5000, folder=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["00__t.json"]
    assert recorded.merged(tmp_path)["figures"]["00/t"]["data"] == "old"


@contextlib.contextmanager
def _file_size_limit(n: int):
    """Writes past ``n`` bytes fail (EFBIG), as they do on a full disk, in this process only."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def test_figures_collected_from_two_gpus_each_keep_their_own_gpu(tmp_path, monkeypatch):
    """Issue 43: ``merged`` labelled every figure with the first file's machine, so figures
    collected from two GPUs (a record folder used on two machines) all got one GPU's label. Each
    figure now keeps the machine it was recorded on; the recording's meta is that of most."""
    raw = tmp_path / "raw"
    for key, gpu in (("00/a", "NVIDIA H100"), ("00/b", "NVIDIA H200"), ("00/c", "NVIDIA H200")):
        monkeypatch.setattr(recorded, "machine", lambda gpu=gpu: {**_META, "gpu": gpu})
        recorded.record(key, {"on": gpu}, folder=raw)
    path = recorded.collect(raw, tmp_path / "recorded" / "NVIDIA_H200.json")
    assert json.loads(path.read_text())["meta"]["gpu"] == "NVIDIA H200"
    for key, gpu in (("00/a", "NVIDIA H100"), ("00/b", "NVIDIA H200"), ("00/c", "NVIDIA H200")):
        rec = recorded.lookup(key, path.parent)
        assert rec.value == {"on": gpu} and rec.label.startswith(f"recorded on {gpu},"), rec.label


def test_merging_a_new_recording_keeps_each_old_figures_machine():
    """The importer merges a run's figures into what that GPU recorded before: a figure not
    recorded again keeps its own date and torch (the old code relabelled it with the new run's)."""
    old = {"meta": {**_META, "date": "2026-11-20", "torch": "2.10"}, "figures": {"a": {"kind": "json", "data": 1}}}
    new = {"meta": _META, "figures": {"b": {"kind": "json", "data": 2}}}
    both = recorded.merge_recordings(old, new)
    assert both["meta"] == _META and "meta" not in both["figures"]["b"]
    assert both["figures"]["a"]["meta"]["torch"] == "2.10" and both["figures"]["a"]["meta"]["date"] == "2026-11-20"


def test_merged_skips_a_figure_file_cut_short_and_refuses_a_folder_of_none(tmp_path):
    recorded.record("00/a", 1, folder=tmp_path)
    (tmp_path / "00__b.json").write_text('{"key": "00/b", "gpu": "G", "torch')
    with pytest.warns(SkippedFile, match="00__b.json .*cut short"):
        assert list(recorded.merged(tmp_path)["figures"]) == ["00/a"]
    (tmp_path / "00__a.json").unlink()
    with pytest.warns(SkippedFile), pytest.raises(RecordError, match="no readable recorded figures.*Fix:"):
        recorded.merged(tmp_path)


def _kit(folder, name, gpu, date, tasks):
    (folder / name).mkdir(parents=True)
    machine = {"gpu": gpu, "date": date, "torch": "2.13", "cuda": "13"}
    (folder / name / "kit.json").write_text(json.dumps({"machine": machine, "tasks": tasks}))


def test_a_damaged_kit_record_is_skipped_by_every_reader_of_kit_tasks(tmp_path):
    """A kit.json cut short (a full disk, a bad merge) used to stop densenet.recorded_kit_rows,
    limit_test.recorded_backward_excess and recorded_diagnosis with a JSONDecodeError naming no
    file; the two readers of "the newest run that finished a task" also disagreed on "finished"
    (status "done" for one, any result for the other). recorded.kit_results is now the one
    reader: a damaged record is skipped with a warning naming it, the others still serve."""
    from course_utils import densenet, limit_test

    row = {"case": "naive fp32", "predicted peak MiB": 100.0, "measured peak MiB": 101.0}
    seed003 = {"N": 128, "predicted peak MiB": 248.0, "predicted after forward MiB": 120.0,
               "measured peak MiB": 361.0, "measured after forward MiB": 185.0}
    _kit(tmp_path, "2026-01-01-g", "G", "2026-01-01",
         [{"name": densenet.KIT_TASK, "status": "done", "result": {"rows": [row]}},
          {"name": "examples/seed003", "status": "done", "result": {"rows": [seed003]}}])
    _kit(tmp_path, "2026-01-02-h", "H", "2026-01-02",
         [{"name": "examples/seed003", "status": "timeout", "result": {"rows": [seed003]}}])  # not finished
    (tmp_path / "2026-01-03-x").mkdir()
    (tmp_path / "2026-01-03-x" / "kit.json").write_text('{"machine": {"gpu": "X"')  # cut short
    with pytest.warns(SkippedFile, match="2026-01-03-x/kit.json"):
        table = densenet.recorded_kit_rows(folder=tmp_path)
    assert table.attrs["run"] == "G, 2026-01-01, torch 2.13" and list(table.index) == ["naive fp32"]
    with pytest.warns(SkippedFile, match="2026-01-03-x/kit.json"):
        excess = limit_test.recorded_backward_excess(tmp_path)
    assert list(excess["GPU run"]) == ["G, 2026-01-01, torch 2.13"]  # H's task timed out


def test_a_damaged_diagnosis_names_its_file_and_the_fix(tmp_path):
    from course_utils import limit_test

    details = tmp_path / "2026-01-01-g" / "details"
    details.mkdir(parents=True)
    (details / "diagnose-seed003.json").write_text('{"cuDNN default": [{"op": "aten.conv')
    with pytest.raises(RecordError, match=r"diagnose-seed003\.json.*Fix: restore it"):
        limit_test.recorded_diagnosis(tmp_path)
    (details / "diagnose-seed003.json").write_text(json.dumps({"cuDNN default": [{"op": "x", "transient": 1}]}))
    with pytest.raises(RecordError, match="'cuDNN default' are not a non-empty list of objects, each with before") as e:
        limit_test.recorded_diagnosis(tmp_path)
    # the fix names the file once and leaves the importer's FILES_AT whole (it read "...jsonS_AT" before)
    assert e.value.fix.count(str(details / "diagnose-seed003.json")) == 1 and "--import FILES_AT`" in e.value.fix


def test_a_finished_task_whose_rows_lack_their_figures_names_the_file_and_the_fix(tmp_path):
    """Before this issue: a KeyError (or pandas' own) naming no file, from densenet.recorded_kit_rows
    and limit_test.recorded_backward_excess alike; now recorded.checked_rows, for both."""
    from course_utils import densenet, limit_test

    _kit(tmp_path, "2026-01-01-g", "G", "2026-01-01",
         [{"name": densenet.KIT_TASK, "status": "done", "result": {"rows": [{"case": "naive fp32"}]}},
          {"name": "examples/seed003", "status": "done", "result": {"rows": [{"N": 128}]}}])
    with pytest.raises(RecordError, match=r"2026-01-01-g/kit\.json: task .*'s rows are not a non-empty list.*Fix: "):
        densenet.recorded_kit_rows(folder=tmp_path)
    with pytest.raises(RecordError, match=r"kit\.json: seed 003's limit rows .*measured after forward MiB.*Fix: "):
        limit_test.recorded_backward_excess(tmp_path)
