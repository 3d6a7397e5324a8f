"""The course's drawing of a memory snapshot (``allocator.active_timeline`` / ``plot_snapshot`` /
``show_snapshot``): no viewer script and no network, the same totals as the events."""
from __future__ import annotations

import io

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course_utils import allocator  # noqa: E402
from course_utils.memory import MiB  # noqa: E402

TORCH_FRAME = {"filename": "/x/site-packages/torch/nn/modules/conv.py", "line": 720, "name": "_conv_forward"}
UNET_FRAME = {"filename": "/repo/course_utils/unet.py", "line": 10, "name": "forward"}


def _ev(action, addr, size, frames=()):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames)}


def fixture_snapshot() -> dict:
    """A small snapshot in torch.cuda.memory._snapshot()'s format: a block allocated before the
    trace and still live (only in ``segments``), one freed in the trace but never allocated in it
    (the ring buffer dropped its alloc), an address reused, a free_completed with no
    free_requested, and events that do not change what is live."""
    trace = [
        _ev("alloc", 5000, 1 * MiB, [TORCH_FRAME, UNET_FRAME]),
        _ev("alloc", 6000, 3 * MiB, [UNET_FRAME]),
        _ev("free_requested", 5000, 1 * MiB),
        _ev("free_completed", 5000, 1 * MiB),
        _ev("free_requested", 7000, 2 * MiB),
        _ev("free_completed", 7000, 2 * MiB),
        _ev("alloc", 8000, 512 * 1024, [{"filename": "/repo/train.py", "line": 74, "name": "training_step"}]),
        _ev("segment_alloc", 9000, 20 * MiB),
        _ev("alloc", 5000, 4 * MiB, [TORCH_FRAME, {"filename": "/repo/course_utils/train.py", "line": 66, "name": "training_step"}]),
        _ev("free_completed", 6000, 3 * MiB),
        _ev("snapshot", 0, 0),
    ]
    segments = [{"device": 0, "address": 1000, "total_size": 20 * MiB, "stream": 0, "blocks": [
        {"size": 1536, "requested_size": 1536, "state": "active_allocated", "frames": []},  # before the trace
        {"size": 8000 - 1000 - 1536, "state": "inactive"},
        {"size": 512 * 1024, "requested_size": 512 * 1024, "state": "active_allocated", "frames": []},  # C, in the trace
    ]}]
    return {"segments": segments, "device_traces": [trace]}


def recompute(snapshot) -> list[int]:
    """Live bytes before the first event and after each alloc / free_completed, written out."""
    trace = snapshot["device_traces"][0]
    allocated = {e["addr"] for e in trace if e["action"] == "alloc"}
    before = sum(e["size"] for e in trace if e["action"] == "free_completed" and e["addr"] not in allocated)
    before += 1536  # the block the segments hold and the trace never allocated
    totals, live = [before], before
    for e in trace:
        if e["action"] == "alloc":
            live += e["size"]
        elif e["action"] == "free_completed":
            live -= e["size"]
        else:
            continue
        totals.append(live)
    return totals


def test_plot_total_equals_the_live_bytes_recomputed_from_the_events():
    snap = fixture_snapshot()
    expected = recompute(snap)
    assert expected == [1536 + 2 * MiB, 1536 + 3 * MiB, 1536 + 6 * MiB, 1536 + 5 * MiB, 1536 + 3 * MiB,
                        1536 + 3.5 * MiB, 1536 + 7.5 * MiB, 1536 + 4.5 * MiB]
    ax = allocator.plot_snapshot(snap)
    assert ax.timeline.total == expected
    (line,) = [ln for ln in ax.lines if ln.get_gid() == "total"]
    assert list(line.get_ydata()) == pytest.approx([t / MiB for t in expected])
    plt.close(ax.figure)


def test_bands_tile_the_total_in_the_order_allocations_were_made():
    tl = allocator.active_timeline(fixture_snapshot())
    assert len(tl.allocations) == 6 and sum(a.preexisting for a in tl.allocations) == 2
    for x, total in enumerate(tl.total):
        live = [i for i, a in enumerate(tl.allocations) if a.start <= x < a.end]
        spans = sorted((tl.offset(i, x), tl.offset(i, x) + tl.allocations[i].size, i) for i in live)
        top = 0
        for lo, hi, _ in spans:
            assert lo == top, f"x={x}: a gap or an overlap at {lo} (expected {top})"
            top = hi
        assert top == total
        assert [i for *_, i in spans] == sorted(live), f"x={x}: not stacked in the order made"


def test_largest_are_labelled_by_their_frame_outside_torch_and_nothing_points_to_the_network(tmp_path):
    ax = allocator.show_snapshot(fixture_snapshot(), largest=2)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("4.0 MiB" in t and "train.py:66 training_step" in t for t in labels), labels
    assert any("3.0 MiB" in t and "unet.py:10 forward" in t for t in labels), labels
    assert not any("conv.py" in t for t in labels)
    assert isinstance(ax, matplotlib.axes.Axes)  # a figure, not an iframe loading a script
    texts = [t.get_text() for t in ax.figure.findobj(matplotlib.text.Text)]
    assert texts and not any("http" in t or "://" in t for t in texts)
    png = io.BytesIO()
    ax.figure.savefig(png, format="png")  # drawn here, by matplotlib: nothing to fetch
    assert png.getvalue()[:4] == b"\x89PNG"
    plt.close(ax.figure)
    page = tmp_path / "viewer.html"  # the option: PyTorch's own viewer page, written on request
    plt.close(allocator.show_snapshot(fixture_snapshot(), html=page).figure)
    assert "MemoryViz" in page.read_text()


def test_snapshot_from_a_pickle_and_bad_input(tmp_path):
    import pickle

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(fixture_snapshot()))
    assert allocator.active_timeline(path).total == recompute(fixture_snapshot())
    with pytest.raises(ValueError, match=r"torch.cuda.memory._snapshot\(\)"):
        allocator.active_timeline({"blocks": []})
    with pytest.raises(ValueError, match="devices 0 to 0"):
        allocator.active_timeline(fixture_snapshot(), device=3)


def test_cpu_snapshot_holds_the_steps_live_bytes():
    """A CPU snapshot of a tiny net's step: its timeline starts with the weights and the batch and
    peaks where trace_step's live bytes peak (the same step, counted by another path)."""
    from course_utils.unet import UNet3D

    def build():
        return UNet3D(levels=2, channels=4, n_classes=3)

    shape = (1, 1, 8, 16, 16)
    snap = allocator.cpu_snapshot(build, shape, n_classes=3)
    tl = allocator.active_timeline(snap)
    resident, events, _ = allocator.trace_step(build, shape, n_classes=3, steps=1)
    live = peak = sum(size for size, _ in resident)
    for size, _ in events:
        live += size
        peak = max(peak, live)
    assert tl.total[0] == sum(size for size, _ in resident)
    assert max(tl.total) == peak
    names = {a.where() for a in tl.allocations if a.preexisting}
    assert "input batch" in names and any(n.startswith("parameter ") for n in names)
    assert any("unet.py" in a.where() for a in tl.allocations if not a.preexisting)
    assert "FakeTensorMode" in snap["origin"]
    assert torch.cuda.is_available() or all(a.size > 0 for a in tl.allocations)


@pytest.mark.gpu
def test_a_recorded_cuda_snapshot_ends_at_memory_allocated(tmp_path):
    """The real format: a snapshot recorded around a few allocations, with a tensor made before
    the recording; the timeline's last total is what memory_allocated() reports at the dump."""
    keep = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")  # before the trace  # noqa: F841

    def work():
        a = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(7 * MiB, dtype=torch.uint8, device="cuda")
        del a
        work.kept = b

    path = allocator.record_snapshot(work, tmp_path / "s.pickle")
    allocated = torch.cuda.memory_allocated()
    tl = allocator.active_timeline(path, device=torch.cuda.current_device())
    assert tl.total[-1] == allocated
    assert max(tl.total) >= allocated + 5 * MiB
    del work.kept


def test_the_viewer_page_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """Issue 43: ``show_snapshot(html=...)`` wrote the page in place: a full disk left half a page
    and raised a raw OSError. Now the old page stays whole and RecordError names the fix."""
    import errno
    import os

    from course_utils.checks import RecordError

    page = tmp_path / "viewer.html"
    page.write_text("old page")

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(RecordError, match=f"Could not write {page}: the disk is full.*Fix: free space"):
        allocator.show_snapshot(fixture_snapshot(), html=page)
    plt.close("all")
    assert page.read_text() == "old page" and [p.name for p in tmp_path.iterdir()] == ["viewer.html"]
