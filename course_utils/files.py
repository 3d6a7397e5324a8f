"""Files the course writes and reads, named in every error with the fix.

* ``atomic_write(path, data)`` -- a file written whole or not at all: a temporary file beside the
  target, then a rename, so that a reader, or a process stopped half-way, never sees half a file.
* ``replacing(path)`` -- the same for a library that writes a file itself (``savefig``,
  ``torch.save``): it writes the temporary path the block is given, renamed over ``path`` at its end.
* ``read_json(path, what, fix)`` -- a JSON file's data, or a ``RecordError`` that names the file,
  what is wrong with it (missing, a folder, unreadable, empty, not text, cut short, not JSON, the
  wrong kind of data) and ``fix``; ``skipped(err)`` warns (``SkippedFile``) that a reader left
  such a file out where the others still serve (one bad recording among several).

* ``read_notebook(path)`` -- a notebook's JSON, its cells checked, or the same ``RecordError``.
* ``cannot_make(path, folder)`` -- why no folder (or file) can be made at ``path``, asked before
  any work, nothing written; ``make_folder(path)`` makes one or says why not; ``shown_path`` puts
  a path on one line of a message.

A write that fails (a full disk, a read-only folder, a folder where the file goes) raises
``RecordError`` naming the file and the fix, and leaves the old file as it was and no temporary
file beside it; ``write_error`` turns such an ``OSError`` into that error for a caller's own writes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .checks import RecordError, guard

__all__ = ["atomic_write", "replacing", "read_json", "parse_json", "write_error", "skipped", "SkippedFile", "JSON_KINDS"]

#: the names ``read_json`` gives the top-level kinds of JSON data, in its messages
JSON_KINDS = {dict: "an object ({...})", list: "a list ([...])", str: "a string", int: "a number",
              float: "a number", bool: "true or false", type(None): "null"}


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def write_error(path: str | Path, err: OSError) -> RecordError:
    """The ``RecordError`` for a write of ``path`` that failed with ``err``: the file, what went
    wrong, and the fix (free space, a writable folder, another name)."""
    path = Path(path)
    folder = path.parent
    code = getattr(err, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        what, fix = ("the disk is full", f"free space on the disk that holds {folder} (`df -h {folder}` "
                                         "shows it), or write to a folder on another disk")
    elif code == errno.EFBIG:
        what, fix = ("the file grew past the largest this process may write", "raise the limit (`ulimit -f "
                     f"unlimited`), or free space on the disk that holds {folder} and write again")
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        what, fix = ("its folder cannot be written", f"make {folder} writable (`chmod u+w {folder}`), "
                                                    "or write to a folder you can write")
    elif code == errno.EISDIR or _is_dir(path):
        what, fix = "a folder stands where the file goes", f"remove or rename the folder {path}, or write another file"
    elif code == errno.ENOTDIR or code == errno.EEXIST:
        what, fix = ("a file stands where a folder of its path goes",
                     f"remove or rename the file among {path}'s parent folders, or write elsewhere")
    elif code == errno.ENAMETOOLONG:
        what, fix = "its name is too long", "give the file a shorter name (255 bytes at most on most disks)"
    else:
        what, fix = "the write failed", f"check that {folder} is a writable folder on a disk with free space"
    return RecordError(f"Could not write {path}: {what} ({type(err).__name__}: {err.strerror or err}); "
                       "nothing was written, an older file is as it was.", fix)


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so a library picks the same format) for the
    block to write; at its end, renamed over ``path``. If the block or the rename fails, the
    temporary file is removed and ``path`` is left as it was; an ``OSError`` becomes
    ``write_error``'s ``RecordError``."""
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:80]}.", suffix=f".tmp{path.suffix[:16]}")
        os.close(fd)
        tmp = Path(name)
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a committed file from other users
        os.replace(tmp, path)
        tmp = None
    except OSError as err:
        raise write_error(path, err) from err
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then a rename (``replacing``).
    A failed write raises ``RecordError`` naming the file and the fix, and leaves no partial file."""
    try:
        payload = data.encode() if isinstance(data, str) else bytes(data)
    except UnicodeEncodeError as err:
        raise RecordError(f"Could not write {path}: its text holds {err.object[err.start:err.end]!r} (character "
                          f"{err.start}), which UTF-8 cannot encode; nothing was written.",
                          "remove that character (a lone surrogate: text decoded with errors='surrogateescape', "
                          "or a JSON \\ud800 escape) from what is written") from None
    with replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(payload)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(dict.fromkeys(JSON_KINDS.get(k, k.__name__) for k in kinds))


def _json_problem(text: str, err: ValueError) -> str:
    if isinstance(err, json.JSONDecodeError):
        if err.pos >= len(text.rstrip()) or err.msg.startswith("Unterminated string"):
            return "it stops before its JSON ends: it was cut short (a write stopped half-way, a full disk)"
        return f"it is not JSON ({err.msg} at line {err.lineno}, column {err.colno})"
    return f"it holds JSON that Python cannot read ({str(err)[:120]})"


def parse_json(raw: bytes, where: str, what: str = "a JSON file",
               fix: str = "write it again", kind: type | tuple[type, ...] | None = dict) -> Any:
    """The JSON data in ``raw`` (the bytes of ``where``: a file, an archive's member); RecordError
    naming ``where``, saying it should be ``what`` and what is wrong (empty, not text, cut short,
    not JSON, nested too deeply, its top level not of ``kind``: None takes any), then ``fix``."""

    def bad(problem: str) -> RecordError:
        return RecordError(f"{where} should be {what}, but {problem}.", fix)

    if not raw.strip():
        raise bad("it is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad("it is not text (not UTF-8: binary data, or damaged)") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise bad("its JSON nests too deeply to read") from None
    except ValueError as err:  # JSONDecodeError, and an integer too long for int()
        raise bad(_json_problem(text, err)) from None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if kind is not None and (not isinstance(data, kinds) or (isinstance(data, bool) and bool not in kinds)):
        raise bad(f"its JSON is {JSON_KINDS.get(type(data), type(data).__name__)}, not {_kind_name(kind)}")
    return data


def read_json(path: str | Path, what: str = "a JSON file", fix: str = "restore it (for a committed file: "
              "`git checkout -- FILE`) or write it again", kind: type | tuple[type, ...] | None = dict) -> Any:
    """The JSON data in ``path``; ``RecordError`` if there is none to read: the message names the
    file, says it should be ``what`` and what is wrong (missing, a folder, a link to nothing, a
    pipe or a device, unreadable, and ``parse_json``'s: empty, not text, cut short, not JSON, the wrong kind), then
    ``fix`` (``FILE`` in it becomes the path)."""
    path = Path(path)
    fix = fix.replace("FILE", str(path))

    def bad(problem: str) -> RecordError:
        return RecordError(f"{path} should be {what}, but {problem}.", fix)

    try:
        if not stat.S_ISREG(os.stat(path).st_mode) and not path.is_dir():  # a FIFO or a device: reading could hang
            raise bad("it is not a regular file (a pipe, a socket or a device)")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise bad("it is a link to a file that does not exist" if path.is_symlink()
                  else "it does not exist") from None
    except IsADirectoryError:
        raise bad("it is a folder") from None
    except OSError as err:
        raise bad(f"it cannot be read ({type(err).__name__}: {err.strerror or err})") from None
    return parse_json(raw, str(path), what, fix, kind)


NAME_MAX = 255  # bytes in one file name (Linux, macOS)


def shown_path(path: str | Path) -> str:
    """``path`` for a one-line message: quoted when empty or holding a control character, cut
    when long."""
    text = str(path)
    if not text or not text.isprintable():
        text = repr(text)
    return text if len(text) <= 80 else text[:60] + "[...]" + text[-15:]


def cannot_make(path: str | Path, folder: bool) -> str | None:
    """Why no folder (``folder``) or file can be made at ``path`` -- empty, a NUL in it, a name
    too long, a file where a folder must be, no permission -- or None if it can. Nothing is
    written: the command lines ask before any work."""
    text = str(path)
    if not text.strip():
        return "an empty path" if not text else "a blank path"
    if "\0" in text:
        return "a NUL character in the path"
    try:
        encoded = os.fsencode(text)
    except UnicodeError:
        return "a character the file system cannot store"
    if any(len(name) > NAME_MAX for name in encoded.split(b"/")):
        return f"a name in it longer than {NAME_MAX} bytes"
    given = here = text.rstrip("/") or "/"
    while True:  # up to the nearest thing that exists ("." or "/" at the latest)
        try:
            st = os.stat(here or ".")
            break
        except (FileNotFoundError, NotADirectoryError):
            if not here:
                return "the current folder no longer exists"
            if os.path.islink(here):
                return f"{shown_path(here)} is a link to nothing"
            here = os.path.dirname(here)
        except OSError as err:
            return f"{shown_path(here)} cannot be reached ({err.strerror})"
    here, is_dir = here or ".", stat.S_ISDIR(st.st_mode)
    if here == given and not folder:
        return "a folder, not a file" if is_dir else (None if os.access(here, os.W_OK) else "not writable")
    if not is_dir:
        return f"{shown_path(here)} is a file, not a folder"
    return None if os.access(here, os.W_OK | os.X_OK) else f"{shown_path(here)} is not writable"


def make_folder(path: str | Path) -> Path:
    """``path`` as a folder, made if it is not there (its parents too); RecordError naming why it
    cannot be (``cannot_make``, or the failed ``mkdir``: ``write_error``) and the fix."""
    problem = cannot_make(path, folder=True)
    if problem:
        raise RecordError(f"{shown_path(path)} cannot be a folder: {problem}.",
                          "give a folder that exists or can be made, in a place you can write.")
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise write_error(path, err) from None
    return Path(path)


NOTEBOOK_FIX = "restore it (`git checkout -- FILE`), or open and save it again in JupyterLab"


def read_notebook(path: str | Path, fix: str = NOTEBOOK_FIX) -> dict[str, Any]:
    """A notebook's JSON, its ``cells`` a list of cells, each with its ``cell_type`` (a str) and
    ``source`` (a str or a list); ``RecordError`` naming the file, what is wrong and ``fix``
    (``FILE`` in it becomes the path) otherwise. The one reader of a notebook the course checks."""
    nb = read_json(path, "a notebook (JSON)", fix)
    cells = nb.get("cells")
    if not isinstance(cells, list) or not all(isinstance(c, dict) and isinstance(c.get("cell_type"), str)
                                              and isinstance(c.get("source"), (str, list)) for c in cells):
        raise RecordError(f"{path} should be a notebook, but its cells are not a list of cells, each with its "
                          "type and source.", fix.replace("FILE", str(path)))
    return nb


class SkippedFile(UserWarning):
    """A file a reader left out because it cannot be read; the message names it and the fix."""


def skipped(err: RecordError) -> None:
    """Warn that the file ``err`` names was left out (``SkippedFile``): the others still serve."""
    warnings.warn(f"Skipped a file that cannot be read (the others still serve): {err}", SkippedFile, stacklevel=3)


guard(globals(), RecordError)
