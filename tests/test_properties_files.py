"""The files the course reads and writes, under hostile contents, file kinds and failing writes.

Generated: file contents (random bytes; JSON cut short at any point; JSON of the wrong shape --
a list, a number, null, nested wrong types, a field replaced by anything; huge numbers, NaN,
deep nesting), file kinds (a folder, an empty file, a link to nothing, a pipe where a file is
expected) and writes that fail (a full disk, a read-only folder, a write cut short at a size
limit, a folder where the file goes). The properties:

* a reader (``files.read_json``, ``recorded.read_recording``/``lookup``/``merged``/``gpu_runs``,
  the GPU kit's ``recordings`` and timings, README's figures and timings, the importer) gives a
  valid result, or skips the bad file with a ``files.SkippedFile`` warning that names it and the
  fix (where the others still serve), or raises ``RecordError`` with the file and ``Fix:`` --
  never another exception;
* a writer (``files.atomic_write``, ``files.replacing``, ``recorded.record``/``collect``, the
  importer) leaves the new file whole or the old one as it was: never a partial file, never a
  temporary file beside it.

The issue's named examples are plain tests in tests/test_recorded.py and tests/test_gpu_report.py.
Each example costs milliseconds (files in a temporary folder, no model): the file stays within
6 CPU-s in the ci profile.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import resource
import signal
import tempfile
import warnings
from pathlib import Path
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from course_utils import files, recorded
from course_utils.checks import RecordError
from course_utils.files import SkippedFile
from course_utils.gpu_kit import importer, plan, record
from course_utils import readme

# -- generated contents -----------------------------------------------------------------------
_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
            | st.text(max_size=8))
_json = st.recursive(_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                     max_leaves=8)
_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_meta = st.fixed_dictionaries({"gpu": _text, "torch": _text, "cuda": _text, "date": _text})
_figure = st.one_of(
    st.fixed_dictionaries({"kind": st.just("json"), "data": _json}),
    st.fixed_dictionaries({"kind": st.just("text"), "data": st.text(max_size=20)}),
    st.integers(1, 3).flatmap(lambda n: st.fixed_dictionaries({
        "kind": st.just("table"), "columns": st.just([f"c{i}" for i in range(n)]),
        "data": st.lists(st.lists(st.integers(0, 9), min_size=n, max_size=n), max_size=3)})))
_recording = st.fixed_dictionaries({"meta": _meta, "figures": st.dictionaries(
    st.sampled_from(["00/k", "02/x", "gpu/y"]), _figure, max_size=3)})


def _mutated(draw, value):
    """``value`` with one field, at any depth, replaced by anything JSON holds (or removed)."""
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        out = dict(value)
        if draw(st.booleans()):
            out[key] = _mutated(draw, value[key])
        elif draw(st.booleans()):
            del out[key]
        else:
            out[key] = draw(_json)
        return out
    if isinstance(value, list) and value and draw(st.booleans()):
        i = draw(st.integers(0, len(value) - 1))
        return value[:i] + [_mutated(draw, value[i])] + value[i + 1:]
    return draw(_json)


@st.composite
def hostile_bytes(draw, valid=_recording):
    """Bytes a file of the course may hold after a crash, a full disk, or a hand's mistake."""
    good = draw(valid)
    text = json.dumps(good, indent=1).encode()
    kind = draw(st.sampled_from(["cut", "mutated", "shape", "random", "huge", "nan", "deep", "valid"]))
    if kind == "cut":
        return text[:draw(st.integers(0, max(0, len(text) - 1)))]
    if kind == "mutated":
        return json.dumps(_mutated(draw, good)).encode()
    if kind == "shape":
        return json.dumps(draw(_json)).encode()
    if kind == "random":
        return draw(st.binary(max_size=64))
    if kind == "huge":
        return text.replace(b"{", b'{"n": ' + b"9" * 5000 + b", ", 1)
    if kind == "nan":
        return json.dumps(_mutated(draw, good)).replace("{", '{"x": NaN, "y": -Infinity, ', 1).encode()
    if kind == "deep":
        return b"[" * draw(st.integers(1000, 50_000))
    return text


FILE_KINDS = ("contents", "contents", "contents", "folder", "empty", "dangling link", "pipe")


def _plant(path: Path, kind: str, data: bytes) -> None:
    """Put at ``path`` a file of ``kind`` (its bytes ``data`` where it has any)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "contents":
        path.write_bytes(data)
    elif kind == "folder":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "dangling link":
        path.symlink_to(path.parent / "no-such-file")
    else:
        os.mkfifo(path)


@contextlib.contextmanager
def _folder():
    with tempfile.TemporaryDirectory(prefix="course-props-") as d:
        yield Path(d)


@contextlib.contextmanager
def _warnings():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen


def _refused(err: Exception, *paths: Path) -> None:
    """A reader's refusal: RecordError naming one of ``paths`` (or, for a folder, a file in it), with its fix."""
    assert isinstance(err, RecordError), f"{type(err).__name__}: {err}"
    assert "Fix: " in str(err) and any(str(p) in str(err) for p in paths), str(err)


def _skips_named(seen: list, *paths: Path) -> None:
    """Every warning is a SkippedFile naming one of ``paths`` and its fix."""
    for w in seen:
        assert issubclass(w.category, SkippedFile), f"{w.category.__name__}: {w.message}"
        assert "Fix: " in str(w.message) and any(str(p) in str(w.message) for p in paths), str(w.message)


def _valid_machine(meta: dict) -> None:
    assert set(meta) >= set(recorded.MACHINE_KEYS) and all(isinstance(meta[k], str) for k in recorded.MACHINE_KEYS)


# -- readers ------------------------------------------------------------------------------------
def _read_planted(reader, name: str, kind: str, data: bytes):
    """``reader`` on a file ``name`` planted as ``kind`` holding ``data``: what it read, or None
    once its refusal is checked (``_refused``: the family's error, naming the file and the fix)."""
    with _folder() as d:
        path = d / name
        _plant(path, kind, data)
        try:
            return reader(path)
        except Exception as err:  # noqa: BLE001 - the property is about which
            _refused(err, path)
            return None


@given(kind=st.sampled_from(FILE_KINDS), data=hostile_bytes())
def test_read_json_gives_an_object_or_names_the_file_and_the_fix(kind, data):
    got = _read_planted(files.read_json, "x.json", kind, data)
    assert got is None or isinstance(got, dict)


@given(kind=st.sampled_from(FILE_KINDS), data=hostile_bytes())
def test_a_recording_is_read_whole_and_checked_or_refused(kind, data):
    rec = _read_planted(recorded.read_recording, "G.json", kind, data)
    if rec is not None:
        _valid_machine(rec["meta"])
        for fig in rec["figures"].values():
            assert fig["kind"] in ("json", "text", "table") and "data" in fig
            if "meta" in fig:
                _valid_machine(fig["meta"])


@given(kind=st.sampled_from(FILE_KINDS), data=hostile_bytes(), good=_recording)
def test_lookup_and_show_serve_the_good_recording_beside_a_hostile_one(kind, data, good):
    """One bad file among the recordings: skipped with a warning naming it, the others serve."""
    good = {"meta": good["meta"], "figures": {**good["figures"], "00/k": {"kind": "json", "data": 7}}}
    with _folder() as d, _warnings() as seen:
        recorded.write(good, d / "A_good.json")
        bad = d / "B_bad.json"
        _plant(bad, kind, data)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            shown = recorded.show("00/k", folder=d)
        rec = recorded.lookup("00/k", d)
        for key in ("02/x", "gpu/y"):
            other = recorded.lookup(key, d)
            assert other is None or isinstance(other.label, str)
        _skips_named(seen, bad)
        _valid_machine(rec.meta)
        good_won = type(rec.value) is int and rec.value == 7
        assert "recorded on" in out.getvalue() and (not good_won or shown == 7)
        if not good_won:  # only a readable recording of the key, as new or newer, wins
            assert "00/k" in recorded.read_recording(bad)["figures"] and rec.meta["date"] >= good["meta"]["date"]


@given(kind=st.sampled_from(FILE_KINDS), data=hostile_bytes(
    st.fixed_dictionaries({"key": st.just("02/x"), "gpu": _text, "torch": _text, "cuda": _text, "date": _text,
                           "kind": st.just("json"), "data": _json})))
def test_collect_skips_a_hostile_figure_file_and_writes_the_others_whole(kind, data):
    with _folder() as d, _warnings() as seen:
        raw = d / "raw"
        recorded.record("00/k", {"v": 1}, folder=raw)
        _plant(raw / "02__x.json", kind, data)
        path = recorded.collect(raw, d / "out" / "G.json")
        _skips_named(seen, raw / "02__x.json")
        rec = recorded.read_recording(path)
        assert rec["figures"]["00/k"]["data"] == {"v": 1} and set(rec["figures"]) <= {"00/k", "02/x"}
        assert [p.name for p in path.parent.iterdir()] == ["G.json"]


_BENCH = st.fixed_dictionaries({
    "meta": st.fixed_dictionaries({"device": _text, "date": _text, "torch": _text, "cuda": _text, "model": _text}),
    "rows": st.lists(st.fixed_dictionaries({
        "net": st.just("large"), "technique": st.just("baseline fp32"),
        "predicted peak MiB": st.floats(0, 1e6), "measured peak MiB": st.floats(0, 1e6),
        "measured reserved MiB": st.floats(0, 1e6), "driver used MiB": st.floats(0, 1e6)}), max_size=2)})
_KIT = st.fixed_dictionaries({"machine": st.fixed_dictionaries({
    "gpu": _text, "date": _text, "torch": _text, "cuda": _text, "context MiB": st.floats(0, 1e4)}),
    "tasks": st.lists(st.fixed_dictionaries({"name": _text, "status": st.sampled_from(["done", "failed", "cut"]),
                                             "seconds": st.floats(0, 1e4)}), max_size=3),
    "dry_run": st.booleans()})


@given(which=st.sampled_from(["kit.json", "limit.json", "benchmark-large.json", "details/benchmark-large-G.json",
                              "notebooks/04_mixed_precision.ipynb"]),
       kind=st.sampled_from(FILE_KINDS), data=st.data())
def test_gpu_runs_read_the_runs_a_hostile_file_leaves_readable(which, kind, data):
    valid = _BENCH if "benchmark" in which else _KIT if which.endswith("json") else st.fixed_dictionaries(
        {"cells": st.lists(st.fixed_dictionaries({"id": st.just("c27"), "outputs": _json}), max_size=2)})
    with _folder() as d, _warnings() as seen:
        runs_at, run = d / "docs" / "gpu-runs", d / "docs" / "gpu-runs" / "2026-01-01-g"
        recorded.write({"meta": {"gpu": "G", "torch": "t", "cuda": "c", "date": "2026-01-01"}, "figures": {}},
                       d / "recorded" / "G.json")
        run.mkdir(parents=True)
        (run / "kit.json").write_text(json.dumps({"machine": {"gpu": "G", "date": "d", "torch": "t", "cuda": "c",
                                                              "context MiB": 500.0}, "tasks": []}))
        (run / which).unlink(missing_ok=True)
        _plant(run / which, kind, data.draw(hostile_bytes(valid)))
        runs = recorded.gpu_runs(runs_at) + recorded.gpu_runs(runs_at, ("small", "fp16"))
        for r in runs:
            _valid_machine(r.meta)
            assert r.context_mib is None or (math.isfinite(r.context_mib) and r.context_mib >= 0)
        recorded.runs_table(runs)
        rec = recorded.lookup("04/measured", d / "recorded")  # read from the run's executed notebook
        assert rec is None or (_valid_machine(rec.meta) is None and list(rec.value.columns) == list(
            recorded.FROM_OUTPUTS["04/measured"][2]))
        _skips_named(seen, run / which)


@given(kind=st.sampled_from(FILE_KINDS), data=hostile_bytes(_KIT))
def test_the_kit_resumes_from_the_recordings_it_can_read(kind, data):
    with _folder() as d, _warnings() as seen:
        (d / "good" / "kit.json").parent.mkdir()
        (d / "good" / "kit.json").write_text(json.dumps({"machine": {}, "tasks": [{"name": "a", "status": "done",
                                                                                   "seconds": 2}]}))
        _plant(d / "bad" / "kit.json", kind, data)
        runs = record.recordings(d)
        _skips_named(seen, d / "bad" / "kit.json")
        assert "good" in [name for name, _ in runs]
        for dry in (False, True):
            record.completed(runs, dry)
            record.failed_before(runs, dry)
            assert all(math.isfinite(s) and s >= 0 for s in record.measured_seconds(runs, dry).values())


_TIMINGS = st.fixed_dictionaries({
    "meta": st.fixed_dictionaries({"date": _text, "torch": _text, "cores": st.integers(1, 64),
                                   "load average before": st.floats(0, 50), "load average after": st.floats(0, 50)}),
    "rows": st.dictionaries(st.sampled_from(["00", "01"]), st.fixed_dictionaries(
        {"name": _text, "notebooks": st.integers(0, 999), "solutions": st.integers(0, 999)}), max_size=2)})


@given(kind=st.sampled_from(FILE_KINDS), data=hostile_bytes(_TIMINGS))
def test_timings_give_estimates_or_guesses_and_readme_names_the_file(kind, data):
    with _folder() as d, _warnings() as seen:
        path = d / "results" / "timings.json"
        _plant(path, kind, data)
        timings = plan.read_timings(d)
        _skips_named(seen, path)
        for nn in ("00", "01", "02"):
            secs, source = plan.notebook_estimate(nn, 3, timings)
            assert math.isfinite(secs) and secs > 0 and isinstance(source, str)
        try:
            assert json.dumps(readme.read_timings(path)) == json.dumps(timings)
        except Exception as err:  # noqa: BLE001
            _refused(err, path)
            assert timings == {}


@given(kind=st.sampled_from(FILE_KINDS), data=hostile_bytes(st.fixed_dictionaries({
    "meta": st.fixed_dictionaries({"date": _text, "torch": _text}),
    "rows": st.lists(st.fixed_dictionaries({k: _text for k in ("key", "question", "seed", "course", "method")}),
                     max_size=2)})))
def test_readme_figures_are_read_whole_or_refused(kind, data):
    figures = _read_planted(readme.read_figures, "figures.json", kind, data)
    if figures is not None:
        readme.render_figures(figures)


_BENCH_ROW = st.fixed_dictionaries({"net": st.sampled_from(["large", "small"]),
                                   "technique": st.text("ab $\\^_{}", min_size=1, max_size=8),
                                   "predicted peak MiB": st.integers(0, 10**6)})
_ascii = st.text("abxyz019 -._", min_size=1, max_size=8)  # drawn by matplotlib: no glyph it lacks
_BENCH_FILE = st.fixed_dictionaries({"meta": st.fixed_dictionaries({
    "device": st.just("G"), "date": _ascii, "torch": _ascii, "model": _ascii, "predicted": _ascii, "measured": _ascii,
    "budget_gib": st.integers(1, 80)}), "rows": st.lists(_BENCH_ROW, min_size=1, max_size=2)})


@given(which=st.sampled_from([record.STATE, record.RECORDED, "old", "details"]), kind=st.sampled_from(FILE_KINDS),
       data=st.data(), state=_KIT)
def test_an_import_writes_everything_or_nothing(which, kind, data, state):
    """The importer reads every file first: a bad one is refused, naming it, and the repository is as it was."""
    with _folder() as d:
        src, root = d / "files", d / "repo"
        src.mkdir()
        meta = {"gpu": "G", "torch": "t", "cuda": "c", "date": state["machine"]["date"]}  # any text: "../..", say
        (src / record.STATE).write_text(json.dumps({**state, "dry_run": False, "machine": {**state["machine"], **meta}}))
        recorded.write({"meta": meta, "figures": {"00/k": {"kind": "json", "data": 1}}}, src / record.RECORDED)
        old = root / "recorded" / "G.json"
        recorded.write({"meta": meta, "figures": {"02/old": {"kind": "json", "data": 0}}}, old)
        target = old if which == "old" else src / which
        if which == "details":  # a benchmark in the kit's archive, hostile (its file kind does not apply)
            target = src / record.DETAILS
            record.pack(target, {"benchmark-large-G.json": data.draw(hostile_bytes(_BENCH_FILE))})
        else:
            if target.exists():
                target.unlink()
            _plant(target, kind, data.draw(hostile_bytes()))
        before = _tree(root)
        try:
            dest = importer.import_run(src, root=root)
        except Exception as err:  # noqa: BLE001
            _refused(err, target, src, root)
            assert _tree(root) == before
            return
        assert dest.is_dir() and dest.parent == root / "docs" / "gpu-runs"
        assert all(recorded.read_recording(p) for p in (root / "recorded").glob("*.json"))
        assert sorted(p.name for p in d.iterdir()) == ["files", "repo"]  # nothing written outside the repository


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() and not p.is_symlink() else None
            for p in sorted(root.rglob("*"))}


# -- writers --------------------------------------------------------------------------------------
FAILURES = ("none", "full disk", "read-only folder", "no permission", "cut at a size limit", "a folder there")


@contextlib.contextmanager
def _failing(how: str, target: Path):
    """Writes fail as ``how`` says while the block runs."""
    codes = {"full disk": errno.ENOSPC, "read-only folder": errno.EROFS, "no permission": errno.EACCES}
    if how in codes:
        def fail(*args):
            raise OSError(codes[how], os.strerror(codes[how]))
        with mock.patch.object(os, "replace", fail):
            yield
    elif how == "cut at a size limit":  # a real write cut short, as a full disk cuts it
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, old)
    else:
        if how == "a folder there":
            if target.exists():
                target.unlink()
            target.mkdir(parents=True)
        yield


def _whole_or_as_before(folder: Path, target: Path, old: bytes | None, new: bytes, err: Exception | None) -> None:
    """The property of every write: the new file whole, or (with RecordError naming it and the
    fix) the old one as it was; nothing else in the folder."""
    if err is None:
        assert target.read_bytes() == new
    else:
        assert isinstance(err, RecordError) and "Fix: " in str(err) and str(target) in str(err), repr(err)
        assert (target.read_bytes() == old) if old is not None else (not target.is_file())
    leftovers = [p.name for p in folder.iterdir() if p.name != target.name]
    assert not leftovers, leftovers


@given(how=st.sampled_from(FAILURES), old=st.none() | st.binary(max_size=100),
       data=st.binary(max_size=400) | st.text(st.characters(blacklist_categories=()), max_size=60))
def test_atomic_write_leaves_the_new_file_whole_or_the_old_one(how, old, data):
    """Bytes or text (a lone surrogate in it too, which UTF-8 cannot encode: refused, nothing written)."""
    with _folder() as d:
        target = d / "out.json"
        if old is not None:
            target.write_bytes(old)
        try:
            new = data.encode() if isinstance(data, str) else data
        except UnicodeEncodeError:
            new = None
        err = None
        with _failing(how, target):
            try:
                files.atomic_write(target, data)
            except Exception as e:  # noqa: BLE001
                err = e
        if how == "a folder there":
            assert isinstance(err, RecordError) and "Fix: " in str(err) and target.is_dir()
            assert [p.name for p in d.iterdir()] == ["out.json"]
            return
        if new is None:
            assert isinstance(err, RecordError) and "UTF-8 cannot encode" in str(err) and "Fix: " in str(err)
        _whole_or_as_before(d, target, old, new, err)


@given(how=st.sampled_from(FAILURES), partial=st.binary(max_size=200), fails=st.booleans())
def test_a_library_writing_through_replacing_leaves_no_partial_file(how, partial, fails):
    """savefig, torch.save: the library writes the temporary path; failing half-way, nothing changes."""
    with _folder() as d:
        target = d / "plot.png"
        target.write_bytes(b"old")
        err = None
        with _failing(how, target):
            try:
                with files.replacing(target) as tmp:
                    tmp.write_bytes(partial)
                    if fails:
                        raise OSError(errno.ENOSPC, "No space left on device")
            except Exception as e:  # noqa: BLE001
                err = e
        if how == "a folder there":
            assert isinstance(err, RecordError) and target.is_dir() and [p.name for p in d.iterdir()] == ["plot.png"]
            return
        _whole_or_as_before(d, target, b"old", partial, err)


@given(how=st.sampled_from(FAILURES), value=_json)
def test_record_and_collect_write_whole_or_leave_the_old_recording(how, value):
    with _folder() as d:
        raw, dest = d / "raw", d / "recorded" / "G.json"
        recorded.record("00/k", "old", folder=raw)
        recorded.collect(raw, dest)
        old_figure, old_recording = (raw / "00__k.json").read_bytes(), dest.read_bytes()
        with _failing(how, raw / "02__x.json"):
            try:
                recorded.record("02/x", value, folder=raw)
                err = None
            except Exception as e:  # noqa: BLE001
                err = e
        if how == "a folder there":
            assert isinstance(err, RecordError) and "Fix: " in str(err)
            (raw / "02__x.json").rmdir()
        else:
            assert err is None or (isinstance(err, RecordError) and "Fix: " in str(err)), repr(err)
            assert sorted(p.name for p in raw.iterdir()) == (["00__k.json"] if err else ["00__k.json", "02__x.json"])
        assert (raw / "00__k.json").read_bytes() == old_figure
        with _failing(how, dest):
            try:
                recorded.collect(raw, dest)
                err = None
            except Exception as e:  # noqa: BLE001
                err = e
        if how == "a folder there":
            assert isinstance(err, RecordError) and "Fix: " in str(err) and dest.is_dir()
            return
        if err is None:
            assert recorded.read_recording(dest)["figures"]["00/k"]["data"] == "old"
        _whole_or_as_before(dest.parent, dest, old_recording, dest.read_bytes() if err is None else b"", err)
