"""course_utils.benchmark: what ``run`` refuses before any work (issue 43, "commands that fail
after doing the work"), and its files written whole. The rows themselves are the GPU kit's
(tests/test_gpu_report.py) and docs/benchmark.md's (tests/test_readme.py)."""

from __future__ import annotations

import json

import pytest

from course_utils import benchmark
from course_utils.checks import RecordError, TechniqueError


@pytest.fixture
def no_work(monkeypatch):
    """Any prediction or measurement fails the test: a refusal must come before the work."""
    def work(*args, **kwargs):  # noqa: ARG001 - stands in for predicted_row / measured_row
        raise AssertionError("benchmark.run started the work before refusing its arguments")
    monkeypatch.setattr(benchmark, "predicted_row", work)
    monkeypatch.setattr(benchmark, "measured_row", work)
    monkeypatch.setattr(benchmark, "cuda_context_bytes", work)


def test_a_mistyped_technique_is_refused_before_any_work_naming_the_valid_ones(tmp_path, no_work):
    """Issue 43: a mistyped technique ran every other step and ended in ZeroDivisionError (no row
    to plot), after writing the JSON and markdown of an empty benchmark."""
    with pytest.raises(TechniqueError) as e:
        benchmark.run(tmp_path / "out", techniques=["baseline fp32", "baselin fp32"], progress=False)
    msg = str(e.value)
    assert "'baselin fp32'" in msg and "Fix:" in msg and "'in-place ReLU'" in msg, msg
    assert "'baseline fp32'," not in msg.split("Fix:")[0], msg  # the valid one is not called unknown
    assert not (tmp_path / "out").exists()


def test_an_unknown_net_is_refused_before_any_work(tmp_path, no_work):
    """A net that NETS does not have raised a bare KeyError('huge') from configs()."""
    with pytest.raises(TechniqueError, match=r"'huge'.*Fix:.*'large', 'small'"):
        benchmark.run(tmp_path / "out", nets=("large", "huge"), progress=False)
    assert not (tmp_path / "out").exists()


def test_no_technique_and_no_net_are_refused(tmp_path, no_work):
    for kw in ({"techniques": []}, {"nets": ()}):
        with pytest.raises(TechniqueError, match="Fix:"):
            benchmark.run(tmp_path / "out", progress=False, **kw)
    assert not (tmp_path / "out").exists()


def test_measuring_without_a_cuda_gpu_is_refused_at_once_with_the_fix(tmp_path, no_work, monkeypatch):
    """Issue 43: ``run(measure=True)`` on a CPU failed in torch with 'Torch not compiled with CUDA
    enabled' (an AssertionError)."""
    monkeypatch.setattr(benchmark.torch.cuda, "is_available", lambda: False)
    with pytest.raises(TechniqueError, match=r"measure=True.*no CUDA GPU.*Fix: .*measure=None"):
        benchmark.run(tmp_path / "out", measure=True, progress=False)
    assert not (tmp_path / "out").exists()


def test_an_output_folder_that_cannot_be_made_is_refused_before_the_work(tmp_path, no_work):
    """A file where the folder goes, or a folder under a file: refused before minutes of
    predictions, not at the first write after them."""
    (tmp_path / "a_file").write_text("x")
    for out in (tmp_path / "a_file", tmp_path / "a_file" / "sub", ""):
        with pytest.raises(TechniqueError, match="out=.*Fix:"):
            benchmark.run(out, techniques=["baseline fp32"], progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_budget_no_card_has_is_refused(tmp_path, no_work):
    """explorer's largest-batch search does not return for a budget of 10**30 GiB; 0 GiB and a
    fractional budget are the guard's (an int >= 1)."""
    for bad in (10**30, 0, 2.5, -8):
        with pytest.raises(TechniqueError, match="budget_gib.*Fix:"):
            benchmark.run(tmp_path / "out", budget_gib=bad, progress=False)


def test_run_writes_its_three_files_whole(tmp_path, monkeypatch):
    """One cheap row (the prediction stubbed): the JSON, markdown and plot are written, and a
    failure while plotting leaves none of the three."""
    row = {"predicted peak MiB": 100, "card needs MiB": 200, "largest batch in 8 GiB (predicted)": 3,
           "kept after forward MiB": 50, "peak in": "x (backward)", "GFLOP per step": 1, "est. step s": 0.1}
    monkeypatch.setattr(benchmark, "predicted_row", lambda cfg: dict(row))
    res = benchmark.run(tmp_path / "out", techniques=["baseline fp32"], progress=False, measure=False)
    stem = res["meta"]["device"]
    assert json.loads((tmp_path / "out" / f"{stem}.json").read_text())["rows"][0]["technique"] == "baseline fp32"
    assert (tmp_path / "out" / f"{stem}.md").read_text().startswith("Device **")
    assert (tmp_path / "out" / f"{stem}.png").stat().st_size > 0

    def broken(results, path):  # noqa: ARG001 - plot's signature
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(benchmark, "plot", broken)
    with pytest.raises(RecordError):
        benchmark.run(tmp_path / "again", techniques=["baseline fp32"], progress=False, measure=False)
    assert not (tmp_path / "again").exists() or not list((tmp_path / "again").iterdir())


def _run_py():
    """``benchmarks/run.py``'s main (a script, not a module of the package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"
    spec = importlib.util.spec_from_file_location("benchmarks_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("argv", [["--budget", str(10**30)], ["--out", "a_file"], ["--out", "a_file/sub"],
                                  ["--out", ""], ["--out", "n" * 300], ["--out", "bad\0path"], ["--out", "/dev/null/x"]])
def test_the_script_names_what_run_refuses_in_one_line(tmp_path, no_work, capsys, monkeypatch, argv):
    """``benchmarks/run.py`` let benchmark.run's TechniqueError out as a traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("x")
    assert _run_py()(argv if argv[0] == "--out" else [*argv, "--out", "out"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: benchmark.run: ") and "Fix: " in lines[0], captured.err
    assert "wrote" not in captured.out and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
