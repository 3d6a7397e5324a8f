"""Files written whole or not at all: ``atomic_write`` (a temporary file beside the target, then a
rename), so that a reader, or a process stopped half-way, never sees half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .checks import RecordError, guard

__all__ = ["atomic_write"]


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a committed file from other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


guard(globals(), RecordError)
