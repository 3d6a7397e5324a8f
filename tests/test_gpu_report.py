"""The GPU kit without a GPU: its budget (a task past it is "not run (budget)", a task that
overruns is cut and its command's whole process tree ends), its resume (a recorded task is
skipped, a dry run never stands for a GPU run), its output within a GPU call's return limits,
the executed notebook nbval keeps, and the dry run of real tasks, so the kit cannot rot between
GPU runs."""

import errno
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

from course_utils import files, gpu_report, memory, recorded
from course_utils.checks import RecordError
from course_utils.files import SkippedFile
from course_utils.gpu_kit import budget, diagnose, importer, plan, record, tasks
from course_utils.gpu_kit.budget import CUT, DONE, ERROR, FAILED, NOT_RUN, RECORDED, Clock, Task

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU path")


def _task(name, est, seconds=0.0, result=None, fail=False):
    def run(clock):
        if fail:
            raise RuntimeError(f"{name} broke")
        time.sleep(seconds)
        return dict(result or {})
    return Task(name, est, "test", run)


# -- the budget ---------------------------------------------------------------------------------
def test_a_task_past_the_budget_is_not_run_a_shorter_one_after_it_is_and_an_overrun_is_cut():
    seen = []
    clock = Clock(2.0)
    t0 = time.monotonic()
    recs = budget.run_tasks([_task("a", 0.1, 0.05), _task("big", 100), _task("b", 0.1, 0.05, {"x": 1}),
                             _task("slow", 0.5, 30), _task("after", 0.1)], clock,
                            on_record=lambda r: seen.append((r.name, r.status)), log=lambda m: None)
    assert [(r.name, r.status) for r in recs] == [("a", DONE), ("big", NOT_RUN), ("b", DONE), ("slow", CUT),
                                                  ("after", NOT_RUN)]
    assert seen == [(r.name, r.status) for r in recs]  # each record handed on as the task ended
    assert recs[2].result == {"x": 1} and "expected 100 s" in recs[1].error
    assert time.monotonic() - t0 < 3.5  # the slow task was stopped at the budget, not after its 30 s


def test_a_broken_task_is_an_error_and_the_plan_goes_on():
    recs = budget.run_tasks([_task("broken", 0.1, fail=True), _task("next", 0.1, result={"status": FAILED})],
                            Clock(10), on_record=lambda r: None, log=lambda m: None)
    assert recs[0].status == ERROR and "RuntimeError: broken broke" in recs[0].error
    assert recs[1].status == FAILED  # a task's own verdict (a failed notebook) is kept


def test_the_deadline_gives_an_earlier_timer_back():
    """pytest-timeout arms the same timer: the kit's deadline must hand it back, not cancel it."""
    import signal

    signal.setitimer(signal.ITIMER_REAL, 50)
    try:
        with budget.deadline(5):
            time.sleep(0.05)
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 49 < left < 50
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_a_bounded_command_and_everything_it_started_end_at_its_deadline(tmp_path):
    """A command that starts a process in a session of its own (as nbval starts a kernel) and
    outlives its deadline: the command and that process are both gone."""
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(120)\n")
    done = budget.run_bounded([sys.executable, "-c", code], 3, tmp_path / "cmd.log")
    assert done.timed_out and done.returncode is None and done.seconds < 20
    assert "started" in (tmp_path / "cmd.log").read_text()
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        try:  # gone, or a zombie waiting for its parent (it may vanish between two reads)
            if Path(f"/proc/{grandchild}/stat").read_text().split(")")[1].split()[0] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        os.kill(grandchild, 9)
        pytest.fail("the command's grandchild outlived the deadline")


# -- the plan -----------------------------------------------------------------------------------
def test_the_plan_runs_the_diagnosis_first_and_the_notebooks_with_most_gpu_cells_first():
    tasks_ = plan.planned()
    names = [t.name for t in tasks_]
    assert names[:7] == [n for n in plan.TASKS if n.startswith("diagnose/")]
    assert names.index("tests") < names.index("benchmark/large") < names.index("examples/seed003")
    nbs = [t for t in tasks_ if t.group == "notebook"]
    assert len(nbs) == len(list((plan.ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    cells = [plan.gpu_cells(next((plan.ROOT / "notebooks").glob(f"{t.name[-2:]}_*.ipynb"))) for t in nbs]
    assert cells == sorted(cells, reverse=True) and cells[0] > 0
    assert all("need 2 GPUs" in t.note for t in nbs if t.name[-2:] in plan.MULTI_GPU)


def test_a_notebook_estimate_scales_its_cpu_time_to_one_idle_core():
    timings = {"meta": {"cores": 2, "load average before": 1.0, "load average after": 1.0},
               "rows": {"07": {"notebooks": 800, "measured": {"cores": 2, "load average before": 8.0,
                                                             "load average after": 8.0}},
                        "01": {"notebooks": 10}}}
    assert plan.notebook_estimate("07", 3, timings)[0] == plan.KERNEL_S + 200 + 3 * plan.GPU_CELL_S
    assert plan.notebook_estimate("01", 0, timings)[0] == plan.KERNEL_S + 10
    secs, source = plan.notebook_estimate("99", 2, timings)
    assert secs == plan.UNKNOWN_NOTEBOOK_S + 2 * plan.GPU_CELL_S and source.startswith("guess")


def test_calls_start_every_task_that_still_fits_and_flag_one_that_never_does():
    t = [plan.Planned(n, s, "") for n, s in (("a", 300), ("b", 300), ("c", 200), ("d", 900), ("e", 100))]
    assert plan.calls(t, 540) == [1, 2, 1, 0, 2]
    assert plan.calls(t, [540, 120]) == [1, 3, 1, 0, 2]  # a window's short second call takes what fits it


def test_selecting_by_group_and_an_unknown_name_names_the_known_ones():
    tasks_ = plan.planned()
    assert {t.name for t in plan.select(tasks_, ["diagnose"], ["diagnose/cublas"])} == {
        n for n in plan.TASKS if n.startswith("diagnose/") and n != "diagnose/cublas"}
    with pytest.raises(ValueError, match="notebook/00"):
        plan.select(tasks_, ["notebook/99"])


def test_recorded_seconds_replace_the_estimates():
    got = {t.name: t for t in plan.planned(recorded_seconds={"tests": 12.34})}
    assert got["tests"].estimate_s == 12.3 and got["tests"].source == "measured by a recorded run"


# -- what comes back ----------------------------------------------------------------------------
def test_the_return_limits_are_checked(tmp_path):
    small = record.Limits(files=3, file_bytes=100, total_bytes=150, depth=1)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").mkdir()
    (tmp_path / "ok.json").write_text("x" * 90)
    (tmp_path / "a" / "big.bin").write_text("x" * 120)
    (tmp_path / "a" / "b" / "deep.txt").write_text("x")
    (tmp_path / "bad name.txt").write_text("x")
    os.symlink(tmp_path / "ok.json", tmp_path / "link")
    problems = "\n".join(record.check_limits(tmp_path, small))
    for want in ("5 files", "a/big.bin: 0.0 MiB", "a/b/deep.txt: 2 folders deep", "bad name.txt: a name",
                 "link: not a plain file", "MiB in all"):
        assert want in problems
    assert record.check_limits(tmp_path / "a" / "b", small) == []


def test_an_archive_too_large_loses_images_first_then_whole_members(tmp_path):
    import base64

    image = base64.b64encode(os.urandom(60_000)).decode()  # incompressible, like a PNG
    nb = {"cells": [{"cell_type": "code", "source": "", "outputs": [
        {"output_type": "display_data", "data": {"image/png": image, "text/plain": "<Figure>"}, "metadata": {}}]}]}
    members = {"nb.ipynb": json.dumps(nb).encode(), "small.txt": b"kept"}
    dropped = record.pack(tmp_path / "n.tar.gz", members, limit=30_000)
    assert dropped == ["nb.ipynb: images left out"]
    with tarfile.open(tmp_path / "n.tar.gz") as tar:
        kept = json.loads(tar.extractfile("nb.ipynb").read())
        assert tar.extractfile("small.txt").read() == b"kept"
    assert "image/png" not in kept["cells"][0]["outputs"][0]["data"]
    assert (tmp_path / "n.tar.gz").stat().st_size <= 30_000
    dropped = record.pack(tmp_path / "m.tar.gz", {"noise.bin": os.urandom(40_000), "small.txt": b"kept"}, limit=30_000)
    assert dropped[0].startswith("noise.bin: left out")


def test_the_log_stops_at_its_limit(tmp_path):
    log = record.Log(tmp_path / "kit.log", limit=1000, echo=False)
    for i in range(100):
        log(f"line {i}")
    text = (tmp_path / "kit.log").read_text()
    assert len(text.encode()) <= 1000 and text.endswith("[kit.log cut here: its size limit]\n")


# -- a dry run, resumed ---------------------------------------------------------------------------
@CPU_ONLY
def test_a_dry_run_records_as_it_goes_within_the_limits_and_a_second_run_resumes(tmp_path, capsys, monkeypatch):
    for name in plan.TASKS:  # a plan with known estimates: the large net's diagnosis never fits 30 s
        monkeypatch.setitem(plan.TASKS, name, (1000 if name == "diagnose/large-fp32" else 1, "test"))
    out, runs_root = tmp_path / "out", tmp_path / "repo"
    (tmp_path / "no_runs").mkdir()  # no recorded run (a --runs that is no folder is refused)
    rc = gpu_report.main([str(out), "--dry-run", "--work", str(tmp_path / "w"), "--runs", str(tmp_path / "no_runs"),
                          "--only", "diagnose/seed003", "diagnose/cublas", "tests", "diagnose/large-fp32",
                          "--budget", "30"])
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(set(record.OUTPUTS) - {record.RECORDED})
    assert record.check_limits(out) == []
    state = json.loads((out / record.STATE).read_text())
    status = {t["name"]: t["status"] for t in state["tasks"]}
    # the large net's diagnosis (expected 1000 s) did not fit a 30-s budget; the task after it ran
    assert status == {"diagnose/seed003": DONE, "diagnose/large-fp32": NOT_RUN, "diagnose/cublas": DONE,
                      "tests": budget.DRY}
    seed003 = next(t for t in state["tasks"] if t["name"] == "diagnose/seed003")["result"]
    assert set(seed003["settings"]) == set(diagnose.SETTINGS)
    for s in seed003["settings"].values():  # a CPU's stand-in sees outputs only: no transient, nothing kept
        assert s["largest transients"] == [] and s["kept beyond outputs by op"] == [] and s["ops"] > 10
    assert state["finished"] and state["dry_run"]
    text = (out / record.SUMMARY).read_text()
    assert "DRY RUN" in text and "not run (budget)" in text and "`diagnose/large-fp32`" in text
    with tarfile.open(out / record.DETAILS) as tar:
        assert "diagnose-seed003.json" in tar.getnames()

    dest = importer.import_run(out, root=runs_root)
    assert dest.parent == runs_root / "docs" / "gpu-runs" and dest.name.endswith("-dry-run")
    assert (dest / record.STATE).exists() and (dest / "details" / "diagnose-seed003.json").exists()
    assert not (runs_root / "recorded").exists()  # a CPU's dry run records no GPU figures

    out2 = tmp_path / "out2"
    rc = gpu_report.main([str(out2), "--dry-run", "--work", str(tmp_path / "w2"), "--runs", str(dest.parent),
                          "--only", "diagnose/seed003", "diagnose/allocator"])
    assert rc == 0
    status = {t["name"]: t for t in json.loads((out2 / record.STATE).read_text())["tasks"]}
    assert status["diagnose/seed003"]["status"] == RECORDED and dest.name in status["diagnose/seed003"]["note"]
    assert status["diagnose/allocator"]["status"] == DONE
    runs = record.recordings(dest.parent)
    assert record.completed(runs, dry_run=False) == {}  # a dry run never stands for a GPU run
    assert record.measured_seconds(runs, dry_run=True)["diagnose/seed003"] > 0
    capsys.readouterr()
    assert gpu_report.main(["--plan", "--dry-run", "--runs", str(dest.parent), "--only", "diagnose"]) == 0
    assert f"recorded in {dest.name}" in capsys.readouterr().out


def test_an_unreadable_recording_is_skipped_and_named(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / record.STATE).write_text("{not json")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / record.STATE).write_text('{"machine": {}, "tasks": [{"name": "a", "seconds": "3"}]}')
    with pytest.warns(SkippedFile) as seen:
        assert record.recordings(tmp_path) == []
    assert [str(w.message).count("Fix: restore") for w in seen] == [1, 1]
    assert f"{tmp_path / 'bad' / record.STATE} should be a kit recording (kit.json), but it is not JSON" in str(seen[0].message)
    assert f"{tmp_path / 'tasks' / record.STATE} is not a readable kit recording" in str(seen[1].message)


def test_a_recorded_notebook_is_skipped_and_failed_tasks_run_after_the_others(tmp_path, capsys):
    run = tmp_path / "2026-11-28-h100"
    run.mkdir()
    (run / record.STATE).write_text(json.dumps({"dry_run": False, "machine": {}, "started": "1", "tasks": [
        {"name": "diagnose/cublas", "status": FAILED, "seconds": 3.0},
        {"name": "notebook/02", "status": budget.PASSED, "seconds": 61.5}]}))
    args = gpu_report._parser().parse_args(["--runs", str(tmp_path), "--only", "diagnose", "notebook/02"])
    chosen, done = gpu_report.resolve(args)
    assert [t.name for t in chosen][-1] == "diagnose/cublas" and done == {"notebook/02": run.name}
    assert next(t for t in chosen if t.name == "notebook/02").estimate_s == 61.5  # its measured time
    args = gpu_report._parser().parse_args(["--runs", str(tmp_path), "--only", "notebook/02", "--redo", "notebook"])
    assert gpu_report.resolve(args)[1] == {}
    assert gpu_report.main(["--plan", "--runs", str(tmp_path), "--only", "notebook/02", "diagnose/seed003"]) == 0
    printed = capsys.readouterr().out
    assert f"recorded in {run.name}" in printed and "1 tasks left" in printed


@CPU_ONLY
def test_without_a_gpu_and_without_dry_run_it_says_so(tmp_path, capsys):
    assert gpu_report.main([str(tmp_path)]) == 2
    assert "--dry-run" in capsys.readouterr().err


# -- notebooks under nbval, kept ------------------------------------------------------------------
def test_a_notebook_runs_under_nbval_with_its_cells_outputs_and_figures_kept(tmp_path):
    import nbformat

    root = tmp_path / "course"
    (root / "notebooks").mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from course_utils import recorded\n"
                                          "recorded.record('99/figure', {'MiB': 1.5})\nprint('hello from cell 0')"),
                nbformat.v4.new_markdown_cell("prose"),
                nbformat.v4.new_code_cell("1 / 0"),
                nbformat.v4.new_code_cell("print('cell 2 runs after a failure')")]
    nbformat.write(nb, root / "notebooks" / "99_test.ipynb")
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    state = {"tasks": [], "machine": {}, "options": {}}
    kit = tasks.Kit(out, work, True, record.Log(out / record.LOG, echo=False), state, root=root)
    res = tasks.notebook(kit, "99", Clock(300))
    assert res["status"] == FAILED and res["cells run"] == 3
    assert [c["code cell"] for c in res["failed cells"]] == [1] and "ZeroDivisionError" in res["failed cells"][0]["error"]
    kit.save()
    with tarfile.open(out / record.NOTEBOOKS) as tar:
        executed = nbformat.reads(tar.extractfile("99_test.ipynb").read().decode(), as_version=4)
        assert {"99_test.cells.json", "99_test.log"} <= set(tar.getnames())
    nbformat.validate(executed)
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert code[0].outputs[0]["text"] == "hello from cell 0\n"
    assert code[1].outputs[0]["ename"] == "ZeroDivisionError"
    assert "runs after a failure" in code[2].outputs[0]["text"]
    figures = json.loads((out / record.RECORDED).read_text())
    assert figures["figures"]["99/figure"]["data"] == {"MiB": 1.5}


# -- the GPU branches, with CUDA stood in for -------------------------------------------------------
def test_the_tests_task_on_a_gpu_runs_the_gpu_marked_tests(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, timeout_s, log_path, **kw):
        calls.append((cmd, timeout_s))
        log_path.write_text(fake_run.text)
        return budget.Finished(fake_run.rc, 1.0, False)

    monkeypatch.setattr(tasks, "run_bounded", fake_run)
    kit = tasks.Kit(tmp_path, tmp_path / "w", False, record.Log(tmp_path / "l", echo=False), {"options": {}})
    fake_run.rc, fake_run.text = 0, "....\n27 passed in 35.0s\n"
    got = tasks.gpu_tests(kit, Clock(100))
    cmd, timeout = calls[0]
    assert cmd[cmd.index("-m", 3) + 1] == "gpu" and "-rP" in cmd and "no:xdist" in cmd and timeout < 100
    assert got["status"] == budget.PASSED and got["summary"] == "27 passed in 35.0s"
    fake_run.rc, fake_run.text = 1, "F\nFAILED tests/test_memory.py::test_x[large fp32] - AssertionError\n1 failed\n"
    got = tasks.gpu_tests(kit, Clock(100))
    assert got["status"] == FAILED and got["failed"] == ["tests/test_memory.py::test_x[large fp32]"]


def test_a_diagnosed_case_on_a_gpu_path(monkeypatch):
    """``step_case``'s GPU branch (a GPU's minutes are too rare to find a typo with): the plain
    step's blocks at the peak, every setting's op-by-op step with its switches set, and the
    switches restored afterwards."""
    from course_utils import allocator, memory

    seen = []

    def fake_op_step(build, shape, device="cuda", **kw):
        seen.append((device, torch.backends.cudnn.benchmark, torch.backends.cudnn.enabled))
        if not torch.backends.cudnn.enabled:  # PyTorch's own 3D convolution's column buffers, say
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 17.00 GiB")
        return memory.op_memory_step(build, shape, device="cpu", **kw)

    def fake_measure(build, shape, **kw):
        return memory.CudaPeak(peak_allocated=300 * memory.MiB, peak_reserved=400 * memory.MiB,
                               allocated_after=0, reserved_after=0)

    def fake_blocks(fn, stacks="all"):
        fn()
        return 300 * memory.MiB, [allocator.PeakBlock(48 * memory.MiB, ["x (unet.py:1)", "at::native::conv (c.cpp:2)"])]

    monkeypatch.setattr(diagnose, "op_memory_step", fake_op_step)
    monkeypatch.setattr(diagnose, "measure_step", fake_measure)
    monkeypatch.setattr(diagnose.allocator, "peak_blocks", fake_blocks)
    tiny = diagnose.cases(True)
    monkeypatch.setattr(diagnose, "cases", lambda dry_run: tiny)
    flags = ("benchmark", "enabled", "allow_tf32")
    for flag, value in zip(flags, (True, True, False), strict=True):  # not PyTorch's defaults, nor any setting's
        monkeypatch.setattr(torch.backends.cudnn, flag, value)
    result, detail = diagnose.step_case("seed003", dry_run=False, log=lambda m: None)
    assert tuple(getattr(torch.backends.cudnn, f) for f in flags) == (True, True, False)  # restored
    assert [c for c in seen if c[0] == "cuda"] == [("cuda", False, True), ("cuda", True, True), ("cuda", False, True),
                                                 ("cuda", False, False)]
    assert [c[0] for c in seen].count("cpu") == 1  # the prediction's step op by op, beside cuDNN's default
    assert result["outputs against the prediction"]["ops matched"] > 10
    assert result["measured peak MiB"] == 300 and result["measured reserved MiB"] == 400
    assert result["miss %"] == pytest.approx(100 * (result["predicted peak MiB"] - 300) / 300, abs=0.1)
    assert result["largest at the peak"][0].startswith("48.0 MiB at::native::conv")
    assert "op-by-op peak - plain peak MiB" in result
    assert set(detail) == {"blocks at the peak", "predicted, op by op", *diagnose.SETTINGS} - {"cuDNN off"}
    assert result["settings"]["TF32 off"]["switches"]["cudnn.allow_tf32"] is False
    # one setting failing (an OOM) is recorded as such; the others stand
    assert result["settings"]["cuDNN off"] == {"error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 17.00 GiB"}
    from course_utils.gpu_kit import summary

    assert "OutOfMemoryError" in "\n".join(summary._diagnosis("diagnose/seed003", result))


def test_importing_a_gpu_run_merges_its_figures_and_benchmark_rows(tmp_path):
    gpu = "NVIDIA Test GPU"
    stem = recorded.file_stem(gpu)
    root, src = tmp_path / "repo", tmp_path / "files"
    src.mkdir()
    meta = {"gpu": gpu, "torch": "2.11", "cuda": "13.0", "date": "2026-11-28"}
    (src / record.STATE).write_text(json.dumps({"dry_run": False, "machine": meta, "tasks": [
        {"name": "benchmark/large", "status": DONE, "seconds": 90.0}]}))
    (src / record.RECORDED).write_text(json.dumps({"meta": meta, "figures": {
        "02/new": {"kind": "json", "data": 2},
        "gpu/notebook_seconds": {"kind": "json", "data": {"02_b.ipynb": 40.0}},
        "gpu/reserved_over_allocated": {"kind": "json", "data": record.ratio_figure({"large": {"max": 1.45, "median": 1.2}})}}}))
    row = {"technique": "baseline fp32", "predicted peak MiB": 9710, "measured peak MiB": 9735}
    bench = {"meta": {"device": gpu, "date": "2026-11-28", "torch": "2.11", "budget_gib": 8, "model": "m",
                      "predicted": "p", "measured": "m"}, "rows": [{"net": "large", **row}]}
    record.pack(src / record.DETAILS, {f"benchmark-large-{stem}.json": json.dumps(bench).encode()})
    (root / "recorded").mkdir(parents=True)
    (root / "recorded" / f"{stem}.json").write_text(json.dumps({"meta": {**meta, "date": "2026-11-20"}, "figures": {
        "02/old": {"kind": "json", "data": 1}, "02/new": {"kind": "json", "data": 0},
        "gpu/notebook_seconds": {"kind": "json", "data": {"00_a.ipynb": 30.0}},
        "gpu/reserved_over_allocated": {"kind": "json", "data": record.ratio_figure({"small": {"max": 1.6, "median": 1.3}})}}}))
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "benchmarks" / "results" / f"{stem}.json").write_text(json.dumps(
        {"meta": bench["meta"], "rows": [{"net": "small", **row}, {"net": "large", **row, "measured peak MiB": 1}]}))
    dest = importer.import_run(src, root=root)
    assert dest == root / "docs" / "gpu-runs" / "2026-11-28-nvidia-test-gpu"
    figs = json.loads((root / "recorded" / f"{stem}.json").read_text())["figures"]
    assert figs["02/old"]["data"] == 1 and figs["02/new"]["data"] == 2
    # figures two windows each measured a part of are merged: every notebook's time, both nets' ratio
    assert figs["gpu/notebook_seconds"]["data"] == {"00_a.ipynb": 30.0, "02_b.ipynb": 40.0}
    assert figs["gpu/reserved_over_allocated"]["data"]["max"] == 1.6
    assert set(figs["gpu/reserved_over_allocated"]["data"]["by net"]) == {"large", "small"}
    rows = json.loads((root / "benchmarks" / "results" / f"{stem}.json").read_text())["rows"]
    assert [(r["net"], r["measured peak MiB"]) for r in rows] == [("small", 9735), ("large", 9735)]
    assert (root / "benchmarks" / "results" / f"{stem}.md").exists()
    assert importer.import_run(src, root=root).name == dest.name + "-2"  # a second import keeps the first
    with pytest.raises(importer.NotARun, match="Fix: pass the folder"):
        importer.import_run(tmp_path / "nothing", root=root)


def test_the_wrapper_script_names_what_is_missing(tmp_path):
    """tools/gpu_kit.sh on a machine where the Jupyter wheels were not carried: it says which
    packages are missing and how to bring them, and runs nothing."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")  # -S: no site-packages
    (fake / "python3").chmod(0o755)
    (tmp_path / "tools").mkdir()  # a copy of the script in a checkout without .whl/
    script = tmp_path / "tools" / "gpu_kit.sh"
    script.write_text((plan.ROOT / "tools" / "gpu_kit.sh").read_text())
    proc = subprocess.run(["bash", str(script), "--plan"], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OUT": str(tmp_path / "o")},
                          timeout=120)
    assert proc.returncode == 2 and "missing" in proc.stderr and "tools/gpu_wheels.sh" in proc.stderr


@CPU_ONLY
def test_the_prediction_op_by_op_names_the_op_a_real_kernel_allocates_more_for():
    """The diagnosis lines the measured step's ops up with the prediction's own (fake tensors):
    on this CPU, seed 003's step differs from its prediction in one op, ``mse_loss``, whose scalar
    keeps the input-sized buffer it was reduced from (N^3 x 4 bytes, where the fake kernel
    allocates one 512-byte block); the U-Net's step matches op for op."""
    result, detail = diagnose.step_case("seed003", dry_run=True, log=lambda m: None)
    cmp = result["outputs against the prediction"]
    n = diagnose.cases(True)["seed003"][1][-1]
    assert cmp["ops only measured"] == cmp["ops only predicted"] == []
    assert [(r["op"], r["phase"], r["bytes more"]) for r in cmp["ops whose outputs are larger"]] == [
        ("mse_loss", "forward", 4 * n**3 - 512)]
    assert cmp["ops whose outputs are smaller"] == [] and "predicted, op by op" in detail
    measured, _ = diagnose.op_memory_step(*diagnose.cases(True)["large-fp32"][:2], device="cpu", n_classes=5)
    build, shape, kw = diagnose.cases(True)["large-fp32"]
    fake, _ = diagnose.op_memory_step(build, shape, device="cpu", within=memory.cuda_rules(None), **kw)
    same = diagnose.compare_ops(measured, fake)
    assert same["ops whose outputs are larger"] == same["ops whose outputs are smaller"] == []
    assert same["ops matched"] > 300


# -- files: writes whole or not at all, reads that name the file (issue 43) -------------------------
@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "the disk is full.*Fix: free space"),
                                         (errno.EROFS, "its folder cannot be written.*Fix: make .* writable"),
                                         (errno.EACCES, "its folder cannot be written.*Fix: make .* writable")])
def test_a_failed_write_names_the_file_and_the_fix_and_leaves_the_old_file(tmp_path, monkeypatch, code, words):
    """Issue 43: a full disk or a read-only folder gave a raw OSError. Now RecordError names the
    file and the fix, the old file is whole and no temporary file is left."""
    path = tmp_path / "kit.json"
    files.atomic_write(path, "old")

    def fail(*args):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(RecordError, match=f"Could not write {path}: {words}"):
        files.atomic_write(path, "new" * 1000)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["kit.json"]


def test_a_folder_where_the_file_goes_and_a_library_write_that_fails(tmp_path):
    (tmp_path / "x.json").mkdir()
    with pytest.raises(RecordError, match="a folder stands where the file goes.*Fix: remove or rename"):
        files.atomic_write(tmp_path / "x.json", "{}")
    (tmp_path / "f").write_text("")
    with pytest.raises(RecordError, match="a file stands where a folder of its path goes"):
        files.atomic_write(tmp_path / "f" / "x.json", "{}")
    with pytest.raises(RecordError, match="disk is full"), files.replacing(tmp_path / "p.png") as tmp:
        assert tmp.suffix == ".png" and tmp.parent == tmp_path  # savefig picks the format from it
        tmp.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "x.json"]


@pytest.mark.parametrize("content, problem", [
    (b"", "it is empty"), (b'{"tasks": [1, ', "it stops before its JSON ends: it was cut short"),
    (b"\xff\xfe\x00", "it is not text"), (b"{'a': 1}", "it is not JSON"), (b"[1]", r"its JSON is a list \(\[...\]\), not an object"),
    (b"1" * 5000, "JSON that Python cannot read"), (b"[" * 100_000, "nests too deeply")])
def test_read_json_names_the_file_what_is_wrong_and_the_fix(tmp_path, content, problem):
    path = tmp_path / "kit.json"
    path.write_bytes(content)
    with pytest.raises(RecordError, match=f"{path} should be a kit's state, but .*{problem}.*Fix: run it again"):
        files.read_json(path, "a kit's state", "run it again")


def test_read_json_of_a_folder_a_missing_file_and_a_link_to_nothing(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "nothing")
    for name, problem in (("d", "it is a folder"), ("none", "it does not exist"),
                          ("l", "it is a link to a file that does not exist")):
        with pytest.raises(RecordError, match=f"{tmp_path / name} should be .*, but {problem}.*Fix: restore"):
            files.read_json(tmp_path / name)


def test_an_import_with_a_cut_recording_writes_nothing_and_names_it(tmp_path):
    """Issue 43: the import wrote the run's folder, then failed on recorded/<gpu>.json cut short
    with a JSONDecodeError naming no file. Every file is read before the first write now."""
    gpu = "NVIDIA Test GPU"
    root, src = tmp_path / "repo", tmp_path / "files"
    src.mkdir()
    meta = {"gpu": gpu, "torch": "2.11", "cuda": "13.0", "date": "2026-11-28"}
    (src / record.STATE).write_text(json.dumps({"dry_run": False, "machine": meta, "tasks": []}))
    (src / record.RECORDED).write_text(json.dumps({"meta": meta, "figures": {"02/new": {"kind": "json", "data": 2}}}))
    cut = root / "recorded" / f"{recorded.file_stem(gpu)}.json"
    cut.parent.mkdir(parents=True)
    cut.write_text('{"meta": {"gpu": "NVIDIA Test GPU", "tor')
    with pytest.raises(RecordError, match=f"{cut} should be a recording .*cut short.*Fix: restore"):
        importer.import_run(src, root=root)
    assert not (root / "docs").exists() and cut.read_text().endswith('"tor')
    (src / record.DETAILS).write_bytes(b"\x1f\x8b not an archive")
    cut.unlink()
    with pytest.raises(importer.NotARun, match=f"{src / record.DETAILS}: not a readable archive.*Fix:"):
        importer.import_run(src, root=root)
    assert not (root / "docs").exists() and not cut.exists()


def test_the_plan_reads_a_bad_timings_file_as_none_with_a_warning(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "notebooks").mkdir()
    for text in ('{"meta": {"date": "d", "torch": "t", "cores": 2, "load average before": 1, "load',
                 '{"meta": {"date": "d", "torch": "t", "cores": 2, "load average before": 1, '
                 '"load average after": 1}, "rows": {"00": {"notebooks": "12"}}}'):
        (tmp_path / "results" / "timings.json").write_text(text)
        with pytest.warns(SkippedFile, match="timings.json.*Fix: restore"):
            assert plan.read_timings(tmp_path) == {}


def test_the_import_command_names_a_bad_file_and_exits_2(tmp_path, capsys, monkeypatch):
    """``gpu_report --import`` on a folder whose recorded figures are cut short: one line naming
    the file and the fix, exit status 2 (a traceback, before)."""
    monkeypatch.setattr(gpu_report, "import_run", lambda src: importer.import_run(src, root=tmp_path / "repo"))
    (tmp_path / record.STATE).write_text(json.dumps({"machine": {"gpu": "G", "date": "d"}, "tasks": []}))
    (tmp_path / record.RECORDED).write_text('{"meta": {"gpu": "G", "tor')
    assert gpu_report.main(["--import", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path / record.RECORDED} should be a recording" in err and "Fix: restore" in err
    assert not (tmp_path / "repo").exists()


def test_a_kit_json_whose_date_climbs_out_stays_in_docs_gpu_runs(tmp_path):
    """A run's folder is named from its kit.json's date and GPU: a date of '../..' put the old
    import's files outside docs/gpu-runs (found by tests/test_properties_files.py)."""
    src, root = tmp_path / "files", tmp_path / "repo"
    src.mkdir()
    (src / record.STATE).write_text(json.dumps({"dry_run": True, "tasks": [],
                                                "machine": {"gpu": "G/../../x", "date": "../../../escaped"}}))
    dest = importer.import_run(src, root=root)
    assert dest.parent == root / "docs" / "gpu-runs" and sorted(p.name for p in tmp_path.iterdir()) == ["files", "repo"]


def test_the_kits_log_on_a_full_disk_says_so_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    log = record.Log(tmp_path / record.LOG)
    log("first")
    real_open = open

    def full(path, *args, **kwargs):
        if str(path) == str(tmp_path / record.LOG):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr("builtins.open", full)
    log("second")
    log("third")
    out = capsys.readouterr().out
    assert "second" in out and "third" in out and f"Could not write {tmp_path / record.LOG}: the disk is full" in out
    assert out.count("Fix: free space") == 1 and "first" in (tmp_path / record.LOG).read_text()


# -- the command line refuses bad arguments before any work (issue 43) ---------------------------
@pytest.fixture
def no_kit(monkeypatch):
    """The kit never starts: a refusal must come before ``run``."""
    def started(*args, **kwargs):  # noqa: ARG001 - stands in for gpu_report.run
        raise AssertionError("the kit started before its arguments were refused")
    monkeypatch.setattr(gpu_report, "run", started)


def _refused(argv, capsys, *words):
    """``main(argv)`` exits 2 with one line on stderr naming the fix and ``words``."""
    capsys.readouterr()
    assert gpu_report.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix: " in lines[0], captured.err
    for w in words:
        assert w in lines[0], lines[0]
    assert captured.out == ""  # no plan printed
    return lines[0]


def test_an_output_folder_that_cannot_be_made_is_refused_before_the_kit_starts(tmp_path, capsys, no_kit):
    """OUT a file, under a file, a name too long, with a NUL, under /dev/null: the kit started (a
    minute of its machine's time, a CUDA context), then failed at its first write."""
    (tmp_path / "a_file").write_text("x")
    for out, why in ((tmp_path / "a_file", "is a file, not a folder"), (tmp_path / "a_file" / "sub", "is a file"),
                     (tmp_path / ("n" * 300), "longer than 255 bytes"), (f"{tmp_path}/bad\0path", "NUL"),
                     ("/dev/null/x", "/dev/null is a file")):
        _refused([str(out), "--dry-run", "--fresh"], capsys, "OUT ", why, "exists or can be made")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_work_folder_that_cannot_be_made_is_refused(tmp_path, capsys, no_kit):
    (tmp_path / "a_file").write_text("x")
    for work in (tmp_path / "a_file", tmp_path / "a_file" / "sub", tmp_path / ("n" * 300)):
        _refused([str(tmp_path / "out"), "--dry-run", "--fresh", "--work", str(work)], capsys, "--work ",
                 "leave --work out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.parametrize("budget", ["nan", "inf", "1e400", "-inf", "0", "-5", "1e10"])
def test_a_budget_that_is_not_a_number_of_seconds_is_refused_for_the_plan_and_the_run(tmp_path, capsys, no_kit,
                                                                                      budget):
    """NaN and inf passed the check of <= 0: the kit ran with no deadline, and ``--plan`` ended
    in print_plan's RecordError (a traceback); 1e10 s overflows the kit's timers."""
    for argv in (["--plan"], [str(tmp_path / "out"), "--dry-run", "--fresh"]):
        _refused([*argv, f"--budget={budget}"], capsys, "--budget", "Fix: give the seconds")
    assert not (tmp_path / "out").exists()


def test_a_runs_folder_that_is_no_folder_is_refused_not_read_as_no_recorded_run(tmp_path, capsys, no_kit,
                                                                                monkeypatch):
    """``--plan --runs=missing`` printed a plan that skipped nothing and exited 0; a run would have
    redone everything the runs it was meant to read had done."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("x")
    for runs in ("missing_runs", "a_file", "", "n" * 300, "bad\0path"):
        for argv in (["--plan"], ["out", "--dry-run"]):
            _refused([*argv, f"--runs={runs}"], capsys, "--runs", "is not a folder", "--fresh")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_mistyped_technique_is_refused_naming_the_benchmarks(tmp_path, capsys, no_kit):
    """``--techniques 'baselin fp32'``: the kit ran every task before its benchmark refused it."""
    line = _refused([str(tmp_path / "out"), "--dry-run", "--fresh", "--techniques", "baseline fp32", "baselin fp32"],
                    capsys, "'baselin fp32'", "'in-place ReLU'")
    assert "'baseline fp32'" not in line.split("Fix:")[0]  # the valid one is not called unknown
    assert not (tmp_path / "out").exists()


def test_good_arguments_reach_the_kit(tmp_path, capsys, monkeypatch):
    """What is refused above is only what is wrong: a folder to make (under one that exists), an
    existing one, a week's budget, the benchmark's techniques, the default runs."""
    seen = []
    monkeypatch.setattr(gpu_report, "run", lambda args, chosen, done: seen.append(args) or 0)
    (tmp_path / "runs").mkdir()
    for argv in ([str(tmp_path / "new" / "out"), "--work", str(tmp_path / "w"), "--runs", str(tmp_path / "runs")],
                 [str(tmp_path), "--budget", str(gpu_report.MAX_BUDGET_S), "--techniques", "baseline fp32",
                  "autocast fp16", "--only", "diagnose/seed003"]):
        assert gpu_report.main([*argv, "--dry-run"]) == 0, capsys.readouterr().err
    assert [a.budget for a in seen] == [plan.DEFAULT_BUDGET_S, gpu_report.MAX_BUDGET_S]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing made before the kit
    assert gpu_report.main(["--plan", "--only", "diagnose/seed003"]) == 0  # docs/gpu-runs, the default


def test_one_owner_says_whether_a_folder_can_be_made(tmp_path):
    """files.cannot_make / make_folder: the one answer release, grade, gpu_report, benchmark and
    hosted give (each had its own, with its own rules for a NUL, a long name, a link to nothing)."""
    from course_utils.files import cannot_make, make_folder

    (tmp_path / "a_file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for path, why in (("", "an empty path"), (f"{tmp_path}/bad\0path", "a NUL"), (tmp_path / ("n" * 300), "255 bytes"),
                      (tmp_path / "a_file" / "sub", "is a file, not a folder"), (tmp_path / "dangling", "a link to nothing")):
        assert why in cannot_make(path, folder=True)
        with pytest.raises(RecordError, match="Fix:"):
            make_folder(path)
    assert make_folder(tmp_path / "new" / "deeper").is_dir() and cannot_make(tmp_path / "x" / "y", folder=True) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "dangling", "new"]
