"""Small filesystem helpers: files are never half-written."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from netopt.errors import StorageError

__all__ = ["atomic_write_bytes", "fsync_dir"]


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename inside it survives a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path``: temp name in the same directory, fsync, rename.

    Raises StorageError (with the path and the OS reason) on any failure; the
    destination is then untouched and no temporary file is left behind.
    """
    target = Path(path)
    tmp_name: str | None = None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
        tmp_name = None
        fsync_dir(target.parent)
    except OSError as exc:
        raise StorageError(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
