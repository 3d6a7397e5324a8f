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
    assert [r["technique"] for r in report["benchmark"]["rows"]] == ["baseline fp32", "autocast fp16"]
    assert len(report["limit"]) == 3
    assert [r["case"].split(",")[0] for r in report["peaks"]] == ["seed 003 net", "seed 000 small net",
                                                                   "seed 000 large net"]
    assert "what is live at the measured peaks" in summary and (tmp_path / "peaks.json").exists()
    with tarfile.open(tmp_path / "gpu-report.tar.gz") as tar:
        names = tar.getnames()
    assert "notebooks/00_gpu_memory_basics.ipynb" in names and "summary.md" in names
    assert any(n.startswith("repo/benchmarks/results/") for n in names)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_without_a_gpu_and_without_dry_run_it_says_so(tmp_path, capsys):
    assert gpu_report.main([str(tmp_path)]) == 2
    assert "--dry-run" in capsys.readouterr().err
