"""The teacher's command lines refuse a wrong argument before any work (issue 43).

``python -m course_utils.grading.grade PATH...`` and ``python -m course_utils.grading.release OUT``
are called in this process through their ``main(argv)`` with each argument the issue found them
taking badly: the refusal is exit 2 and one line on stderr naming the fix (``Fix:``), and comes
before any work -- no probe process (``default_jobs``), no grading, no file written, no folder
removed. The work is replaced by functions that raise ``Worked``: nothing here grades a notebook
or builds a release.

``release --force`` replaced whatever OUT named (``shutil.rmtree``): OUT ``""`` or ``"."`` removed
the current folder. The rule now (release.py, ``_fresh_folder``): OUT is never the current folder,
the repository or a folder that holds either, nor inside a folder the release reads; an existing
OUT is replaced only with ``--force``, and only if it is a folder (not a link) that a release made
(it holds ``.course-release``, the first file a release writes) or an empty one.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_utils.checks import CourseError
from course_utils.grading import grade, release
from course_utils.grading.grader import LIMITS, Options

LONG = "n" * 300  # a name longer than a file system takes
NOTEBOOK = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
SUBMISSION = "subs/00_gpu_memory_basics_exercise.ipynb"


class Worked(BaseException):
    """The command began its work for an argument it should have refused (a BaseException: no
    ``except Exception`` in the command can swallow it)."""


def _worked(what: str):
    def work(*args, **kwargs):  # noqa: ARG001
        raise Worked(f"{what} ran: the work began before the arguments were refused")
    return work


def _tree(top: Path) -> dict[str, str]:
    """Every path under ``top`` (``top`` itself included) with its kind or text."""
    out = {".": "dir" if top.is_dir() else "gone"}
    for p in sorted(top.rglob("*")) if top.is_dir() else ():
        out[p.relative_to(top).as_posix()] = (f"link to {os.readlink(p)}" if p.is_symlink() else
                                              "dir" if p.is_dir() else p.read_text())
    return out


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """The calls' cwd, ``tmp_path/outer/work``: a file, a folder with a file, an empty folder, a
    class folder with a notebook, a release's folder (its marker) and an empty one; the work of
    both commands replaced by ``Worked``."""
    work = tmp_path / "outer" / "work"
    (work / "existing_dir").mkdir(parents=True)
    (tmp_path / "outer" / "beside").write_text("the parent's file\n")
    (work / "a_file").write_text("a file, not a folder\n")
    (work / "existing_dir" / "kept").write_text("someone's work\n")
    (work / "empty_dir").mkdir()
    (work / "subs").mkdir()
    (work / SUBMISSION).write_text(NOTEBOOK)
    (work / "old_release" / "notebooks").mkdir(parents=True)
    (work / "old_release" / release.MARKER).write_text(release.MARKER_TEXT)
    monkeypatch.chdir(work)
    for module, name in ((grade, "default_jobs"), (grade, "grade_many"), (grade.limits, "landlock_abi"),
                         (release, "clean_notebook"), (release, "release_course_utils"), (release, "recording")):
        monkeypatch.setattr(module, name, _worked(f"{module.__name__}.{name}"))
    return work


def _refused(main, argv: list[str], top: Path) -> str:
    """``main(argv)`` refused: exit 2, one line on stderr naming the fix, ``top`` untouched; its
    stderr."""
    before, err = _tree(top), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except Worked as w:
            pytest.fail(f"{argv!r} was not refused before the work: {w}")
        except SystemExit as e:
            code = e.code
    lines = err.getvalue().strip().splitlines()
    assert code == 2, (argv, code, err.getvalue()[-800:])
    assert len(lines) == 1 and "Fix:" in lines[0], (argv, err.getvalue()[-800:])
    assert _tree(top) == before, f"{argv!r} changed the files before refusing"
    return lines[0]


# --------------------------------------------------------------------------------------------
# grade
# --------------------------------------------------------------------------------------------
LIMIT_FLAGS = ("--timeout", "--total-timeout", "--check-timeout", "--memory", "--max-output", "--disk")


@pytest.mark.parametrize("argv, said", [
    (["subs", "--timeout", "0"], "cell-timeout must be > 0, got 0.0"),
    (["subs", "--memory=-1"], "memory-gib must be > 0"),
    (["subs", "--disk", "nan"], "disk-gib must be > 0, got nan"),
    (["subs", "--jobs", "0"], "jobs must be >= 1, got 0"),
    (["subs", "--jobs=-2"], "jobs must be >= 1, got -2"),
    (["missing"], "missing: no such file or folder"),
    (["a_file/sub"], "no such file or folder"),
    ([LONG], "cannot be read (File name too long)"),
    ([""], "PATH '' is empty"),
    (["empty_dir"], "no notebooks (*.ipynb) in empty_dir: nothing to grade"),
    (["a_file"], "no notebooks (*.ipynb) in a_file"),
    (["subs", "--json", "existing_dir"], "--json existing_dir: cannot write there (a folder, not a file)"),
    (["subs", "--json", ""], "--json '': cannot write there (an empty path)"),
    (["subs", "--json", "/dev/null/x"], "cannot write there (/dev/null is a file, not a folder)"),
    (["subs", "--csv", "a_file/sub"], "--csv a_file/sub: cannot write there (a_file is a file, not a folder)"),
    (["subs", "--csv", SUBMISSION], "is a submission: the report would replace it"),
    (["subs", "--csv", "class.txt", "--json", "class.txt"], "--csv and --json are the same file"),
    (["subs", "--keep", "a_file"], "--keep a_file: cannot keep the scratch folders there"),
    (["subs", "--keep", "a_file/sub"], "(a_file is a file, not a folder)"),
], ids=lambda v: " ".join(v)[:40] if isinstance(v, list) else None)
def test_grade_refuses_each_wrong_argument_with_the_fix_before_any_work(sandbox, argv, said):
    """Each was found by the issue (or the property suite): a message without a fix ('error:
    cell-timeout must be > 0, got 0.0', 'jobs must be >= 1', 'missing: no such file or folder',
    'no notebooks (*.ipynb) in ...', '--json ... is a folder'), a traceback (a name too long),
    the current folder graded for '', or the work begun -- ``default_jobs``' probe process --
    for a file that is not a notebook, a --keep that cannot be made, a report over a submission."""
    line = _refused(grade.main, argv, sandbox)
    assert said in line, line


@pytest.mark.parametrize("flag", LIMIT_FLAGS)
@pytest.mark.parametrize("value", ["inf", "1e400", "-inf", "1e9"])
def test_grade_refuses_an_infinite_or_huge_limit_before_the_probe_process(sandbox, flag, value):
    """An infinite limit was taken (``default_jobs`` started its probe process, then a run that
    could never end or fill the disk); one beyond what the system takes is refused too."""
    line = _refused(grade.main, ["subs", f"{flag}={value}"], sandbox)
    assert ("must be finite" in line or "must be > 0" in line) and f"Fix: give {flag} " in line, line


def test_grade_takes_a_good_class_to_its_work(sandbox):
    """The checks refuse only what is wrong: a class folder, a notebook, limits and reports that
    can be written reach the work (``default_jobs``, here ``Worked``), the reports' folders made."""
    argv = ["subs", SUBMISSION, "--timeout", "30", "--total-timeout=1e3", "--memory", "0.5", "--jobs", "3",
            "--csv", "out/class.csv", "--json", "out/class.json", "--keep", "scratch/new"]
    with pytest.raises(Worked, match="grade_many"):
        grade.main(argv)  # --jobs given: default_jobs is not asked
    assert (sandbox / "out" / "class.csv").is_file() and not (sandbox / "scratch").exists()
    with pytest.raises(Worked, match="default_jobs"):
        grade.main(["subs"])


@pytest.mark.parametrize("field", sorted(LIMITS))
@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, -math.inf, 1e300, True, "5"])
def test_options_refuse_a_limit_no_run_can_keep(field, value):
    with pytest.raises(CourseError, match=r"must be .* Fix: give --"):
        Options(**{field: value})


@given(field=st.sampled_from(sorted(LIMITS)),
       value=st.one_of(st.floats(), st.integers(-10, 2**70), st.booleans(), st.none(), st.text(max_size=3)))
def test_options_hold_a_limit_in_its_domain_or_refuse_it_with_the_fix(field, value):
    """The property: whatever a limit is given, Options holds a finite number above 0 and within
    its bound, or raises CourseError naming the flag that fixes it."""
    if value is None and field == "total_timeout":
        value = 600.0  # None is total_timeout's default (10 x the cell's, at least 600)
    try:
        opts = Options(**{field: value})
    except CourseError as err:
        assert f"Fix: give {LIMITS[field][0]} " in str(err)
        return
    got = getattr(opts, field)
    assert not isinstance(got, bool) and 0 < got <= LIMITS[field][2] and math.isfinite(got)
    assert 0 < opts.total_timeout <= LIMITS["total_timeout"][2]


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True, "2"])
def test_options_refuse_jobs_that_are_not_a_count(jobs):
    with pytest.raises(CourseError, match="jobs must be >= 1.* Fix: give --jobs a whole number"):
        Options(jobs=jobs)


# --------------------------------------------------------------------------------------------
# release
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, said", [
    (["", "--force"], "OUT '': no release can be written there (an empty path)"),
    ([".", "--force"], "OUT . is the current folder or holds it"),
    (["..", "--force"], "OUT .. is the current folder or holds it"),
    (["../..", "--nbgrader-course", "--force"], "is the current folder or holds it"),
    (["."], "OUT . is the current folder or holds it"),
    (["existing_dir", "--force"], "exists and is a folder no release made (no .course-release in it)"),
    (["existing_dir", "--force", "--nbgrader-course"], "a folder no release made"),
    (["existing_dir"], "exists and is a folder no release made"),
    (["a_file"], "OUT a_file: no release can be written there (a_file is a file, not a folder)"),
    (["a_file", "--force"], "(a_file is a file, not a folder)"),
    (["a_file/sub", "--force"], "(a_file is a file, not a folder)"),
    ([LONG], "(a name in it longer than 255 bytes)"),
    (["bad\0path", "--nbgrader-course"], "(a NUL character in the path)"),
    (["/dev/null/x"], "(/dev/null is a file, not a folder)"),
    (["old_release"], "OUT old_release exists. Fix: choose a new folder, or add --force to replace it"),
], ids=lambda v: " ".join(v)[:40] if isinstance(v, list) else None)
def test_release_refuses_an_out_it_must_not_write_or_replace(sandbox, argv, said):
    """``release --force`` with OUT '' or '.' removed the current folder, '..' its parent, an
    existing folder of someone's work went whatever it held, a file as OUT was a traceback
    (NotADirectoryError, a name too long, a NUL), and 'exists: choose a new folder, or --force'
    named no fix. ``_tree`` runs from the parent of the cwd: nothing in it may change."""
    line = _refused(release.main, argv, sandbox.parent)
    assert said in line, line


def test_release_never_replaces_the_repository_or_writes_into_what_it_reads(sandbox):
    """OUT the repository (a copy: ``root``), a folder that holds it, or a folder inside one the
    release copies from: refused even when a release made it."""
    root = sandbox / "repo"
    (root / "course_utils").mkdir(parents=True)
    (root / release.MARKER).write_text(release.MARKER_TEXT)  # even "made by a release"
    before = _tree(sandbox)
    for out, said in ((root, "is the repository or holds it"), (sandbox, "is the current folder or holds it"),
                      (root / "course_utils" / "rel", "inside the repository's course_utils/")):
        with pytest.raises(CourseError, match=f"{said}.* Fix: give a new folder"):
            release.release(out, root=root, force=True)
        with pytest.raises(CourseError, match=said):
            release.nbgrader_course(out, root=root, force=True)
    assert _tree(sandbox) == before


@pytest.mark.parametrize("nbgrader", [False, True])
def test_release_force_replaces_its_own_folder_or_an_empty_one_and_marks_it_first(sandbox, nbgrader):
    """What --force still replaces: a folder with the release's marker, or an empty one; the new
    folder's first file is the marker (the work, here ``Worked``, comes after it), so a release
    that fails half-way is replaced by the next --force."""
    for name in ("old_release", "empty_dir"):
        with pytest.raises(Worked):
            release.main([name, "--force", *(["--nbgrader-course"] if nbgrader else [])])
        assert release.made_by_release(sandbox / name)
        assert (sandbox / name / release.MARKER).read_text() == release.MARKER_TEXT
        assert not (sandbox / name / "course_utils").exists()
    assert (sandbox / "existing_dir" / "kept").is_file()


def test_release_force_refuses_a_link_and_a_forged_marker(sandbox):
    """A link to a release's folder (``rmtree`` would fail on it, or follow it), and a folder
    whose marker is a link or another file, are not a release's folder."""
    (sandbox / "link").symlink_to(sandbox / "old_release")
    (sandbox / "forged").mkdir()
    (sandbox / "forged" / release.MARKER).symlink_to(sandbox / "old_release" / release.MARKER)
    (sandbox / "other").mkdir()
    (sandbox / "other" / release.MARKER).write_text("a file of the same name\n")
    for name, kind in (("link", "a link"), ("forged", "a folder no release made"), ("other", "a folder no release")):
        line = _refused(release.main, [name, "--force"], sandbox.parent)
        assert f"exists and is {kind}" in line, line


@given(out=st.one_of(st.sampled_from(["", ".", "..", "./", "../work", "a_file", "a_file/x", "dir", "dir/",
                                      "rel", "rel/notebooks", "empty", "link", "new", "new/deeper", "/", "//"]),
                     st.text(max_size=12)),
       force=st.booleans())
def test_fresh_folder_removes_nothing_but_a_release_or_an_empty_folder(out, force):
    """The property: for any OUT, ``_fresh_folder`` refuses it (CourseError with the fix, nothing
    changed), or returns a path where nothing is now -- and the only thing gone is a release's
    folder or an empty one, when ``force``."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "outer" / "work"
        for folder in ("dir/sub", "rel/notebooks", "empty"):
            (work / folder).mkdir(parents=True)
        (work / "a_file").write_text("x")
        (work / "dir" / "sub" / "f").write_text("x")
        (work / "rel" / release.MARKER).write_text(release.MARKER_TEXT)
        (work / "link").symlink_to(work / "rel")
        before = _tree(Path(tmp))
        cwd = os.getcwd()
        os.chdir(work)
        try:
            got = release._fresh_folder(out, force)
        except CourseError as err:
            assert "Fix:" in str(err)
            assert _tree(Path(tmp)) == before
            return
        finally:
            os.chdir(cwd)
        full = (work / got).resolve() if not os.path.isabs(got) else Path(got)
        assert not os.path.lexists(work / got)
        gone = {k for k in before if k not in _tree(Path(tmp))}
        assert gone <= ({"outer/work/rel", "outer/work/rel/notebooks", f"outer/work/rel/{release.MARKER}"}
                        | {"outer/work/empty"}), gone
        assert not gone or force
        assert full.is_relative_to(Path(tmp).resolve()) or not gone


def test_release_force_never_removes_what_the_teacher_put_into_a_finished_release(sandbox):
    """A finished release lists what it made in its marker (``_seal``). The nbgrader course folder
    is where a teacher keeps submitted/, autograded/ and gradebook.db (docs/teaching.md), and a
    student release is often a git repository: before, --force removed a marked folder whole."""
    course = sandbox / "nbcourse"
    (course / "source").mkdir(parents=True)
    (course / release.MARKER).write_text(release.MARKER_TEXT)
    release._seal(course)
    assert release.made_by_release(course) == {release.MARKER, "source"}
    (course / "submitted" / "alice").mkdir(parents=True)
    (course / "gradebook.db").write_text("the class's scores\n")
    before = _tree(sandbox)
    line = _refused(release.main, ["nbcourse", "--force", "--nbgrader-course"], sandbox.parent)
    assert "holds what no release made: gradebook.db, submitted" in line and "move those out" in line, line
    assert _tree(sandbox) == before
    (course / "gradebook.db").unlink()
    (course / "submitted" / "alice").rmdir()
    (course / "submitted").rmdir()
    with pytest.raises(Worked):  # only what the release made: replaced (a new marker, not sealed yet)
        release.main(["nbcourse", "--force", "--nbgrader-course"])
    assert (course / release.MARKER).read_text() == release.MARKER_TEXT


def test_a_stray_file_beside_the_notebooks_is_graded_as_before_not_a_refusal(sandbox):
    """``grade submissions/*`` with a CSV among the notebooks: the class is graded and the stray
    file gets its own "not graded" note, as before this issue; only when no path is a notebook
    is the command refused."""
    with pytest.raises(Worked, match="default_jobs"):
        grade.main(["subs", SUBMISSION, "a_file"])
