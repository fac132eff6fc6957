"""Create a small file whole under its temporary name: the system calls shared by the
sync's own writes (`netopt.dataplane.assemble`) and its file writer process
(`netopt.dataplane.writerproc`, which imports nothing heavier than this)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

__all__ = ["create_whole"]


def create_whole(
    tmp: str, parts: Iterable[bytes], mode: int, mtime_ns: int, umask: int | None
) -> tuple[int | None, int | None]:
    """Create ``tmp`` (it must not exist) holding ``parts``; the mode and mtime still to
    apply once it is written (to hand to the flusher), or (None, None) when set here.

    Plain descriptor calls (no file object), and the mode and mtime are set on the open
    descriptor rather than by path in the flusher: a tree of small files pays a few
    system calls per file fewer. A mode without read and write for the owner is left
    to the flusher (it must still open the file to fsync it). The file is created with
    its mode, so no ``fchmod`` follows unless ``umask`` (the process's, None: unknown)
    took bits of it. On failure ``tmp`` is gone and the OSError raised."""
    early = mode & 0o600 == 0o600
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode if early else 0o666)
        try:
            for data in parts:
                written = os.write(fd, data)
                if written < len(data):
                    view = memoryview(data)[written:]
                    while view:
                        view = view[os.write(fd, view) :]
            if early:
                if umask is None or mode & umask:
                    os.fchmod(fd, mode)
                os.utime(fd, ns=(mtime_ns, mtime_ns))
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return (None, None) if early else (mode, mtime_ns)
