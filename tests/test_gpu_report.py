"""The GPU kit's dry run: every step of `python -m course_utils.gpu_report` but the CUDA
measurements, on the CPU, so the kit cannot rot between GPU runs."""

import json
import tarfile

import pytest
import torch

from course_utils import gpu_report


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU path")
def test_dry_run_writes_the_whole_report(tmp_path, capsys):
    rc = gpu_report.main([str(tmp_path), "--dry-run", "--notebooks", "00", "--nets", "large",
                          "--techniques", "baseline fp32", "autocast fp16"])
    assert rc == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "DRY RUN on CPU" in summary and "00_gpu_memory_basics.ipynb" in summary
    report = json.loads((tmp_path / "summary.json").read_text())
    assert report["tests"]["ok"] and report["notebooks"]["00_gpu_memory_basics.ipynb"]["errors"] == []
    assert report["tests"]["summary"].startswith("dry run") and "-m gpu" in report["tests"]["command"]
    assert [r["technique"] for r in report["benchmark"]["rows"]] == ["baseline fp32", "autocast fp16"]
    assert len(report["limit"]) == 3
    assert [r["case"].split(",")[0] for r in report["peaks"]] == ["seed 003 net", "seed 000 small net",
                                                                   "seed 000 large net"]
    assert "what is live at the measured peaks" in summary and (tmp_path / "peaks.json").exists()
    with tarfile.open(tmp_path / "gpu-report.tar.gz") as tar:
        names = tar.getnames()
    assert "notebooks/00_gpu_memory_basics.ipynb" in names and "summary.md" in names
    assert any(n.startswith("repo/benchmarks/results/") for n in names)


def test_the_tests_step_on_a_gpu_runs_the_gpu_marked_tests(tmp_path, monkeypatch):
    """The ``tests`` step's GPU branch without a nested pytest (the dry run spawns none): the
    command it runs, its log, and how a failure reads."""
    import subprocess

    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, fake_run.rc, stdout=fake_run.stdout, stderr="")

    monkeypatch.setattr(gpu_report.subprocess, "run", fake_run)
    fake_run.rc, fake_run.stdout = 0, "....\n27 passed in 35.0s\n"
    got = gpu_report.run_tests(tmp_path)
    cmd = calls[0]
    assert cmd[cmd.index("-m", 3) + 1] == "gpu" and "-rP" in cmd and "no:xdist" in cmd
    assert any(c.startswith("--junitxml=") for c in cmd)
    assert got["ok"] and got["summary"] == "27 passed in 35.0s"
    assert (tmp_path / "gpu-tests.log").read_text().startswith("....")
    fake_run.rc, fake_run.stdout = 1, "F...\n1 failed, 26 passed in 35.0s\n"
    assert not gpu_report.run_tests(tmp_path)["ok"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_without_a_gpu_and_without_dry_run_it_says_so(tmp_path, capsys):
    assert gpu_report.main([str(tmp_path)]) == 2
    assert "--dry-run" in capsys.readouterr().err


def test_the_peaks_step_on_a_gpu_path(tmp_path, monkeypatch):
    """The GPU branch of the ``peaks`` step, with the two CUDA calls stood in for (it has not run
    on a GPU yet, and a GPU's minutes are too rare to find a typo with): the autotuner is off for
    the recorded step and on for the other, and restored; the blocks land in peaks.json."""
    from course_utils import allocator, memory

    seen = []

    def fake_measure(build, shape, **kw):
        seen.append(torch.backends.cudnn.benchmark)
        return memory.CudaPeak(peak_allocated=(300 + 10 * len(seen)) * memory.MiB, peak_reserved=0,
                               allocated_after=0, reserved_after=0)

    def fake_peak_blocks(fn):
        fn()
        return 320 * memory.MiB, [allocator.PeakBlock(48 * memory.MiB, ["at::native::cudnn_convolution (x.cpp:1)"])]

    monkeypatch.setattr(memory, "measure_step", fake_measure)
    monkeypatch.setattr(allocator, "peak_blocks", fake_peak_blocks)
    before = torch.backends.cudnn.benchmark
    rows = gpu_report.run_peaks(tmp_path, dry_run=False)
    assert torch.backends.cudnn.benchmark == before
    assert seen == [False, True] * len(rows)
    first = rows[0]
    assert first["measured MiB, cudnn.benchmark=False"] == 310 and first["measured MiB, cudnn.benchmark=True"] == 320
    assert first["miss %"] == pytest.approx(100 * (first["predicted peak MiB"] - 310) / 310, abs=0.1)
    assert "cudnn_convolution" in first["largest at the peak"]
    detail = json.loads((tmp_path / "peaks.json").read_text())["blocks at the measured peak"]
    assert detail[first["case"]]["blocks"][0]["MiB"] == 48
