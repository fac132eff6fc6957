"""Content-defined chunking (FastCDC) with BLAKE3 chunk names.

pyfastcdc ships a compiled Cython chunker and silently falls back to a pure
Python one (about 100x slower) when the extension does not import. netopt
refuses the fallback: importing this module raises DependencyError unless the
compiled extension is in use.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import blake3

from netopt.errors import DependencyError

try:
    from pyfastcdc.cy import FastCDC
except ImportError as exc:  # pragma: no cover - depends on the installed wheel
    raise DependencyError(
        "pyfastcdc's compiled extension (pyfastcdc.cy) does not import; netopt will not use "
        f"the slow pure-Python chunker. Reinstall pyfastcdc from a wheel: {exc}"
    ) from exc

__all__ = [
    "DEFAULT_AVG_CHUNK_BYTES",
    "ChunkRef",
    "chunk_bytes",
    "chunk_file",
    "chunk_id",
]

DEFAULT_AVG_CHUNK_BYTES = 1024 * 1024
"""1 MiB average: big enough for cheap per-chunk overhead, small enough for delta sync."""


@dataclass(frozen=True)
class ChunkRef:
    """One chunk of a file: where it lies and its BLAKE3 name (hex)."""

    offset_bytes: int
    length_bytes: int
    chunk_id: str


def chunk_id(data: bytes | bytearray | memoryview) -> str:
    """The BLAKE3 hex digest that names a chunk."""
    return blake3.blake3(data).hexdigest()


def _chunker(avg_chunk_bytes: int) -> FastCDC:
    return FastCDC(avg_size=avg_chunk_bytes, normalized_chunking=1)


def chunk_bytes(
    data: bytes | bytearray | memoryview, avg_chunk_bytes: int = DEFAULT_AVG_CHUNK_BYTES
) -> list[ChunkRef]:
    """Cut ``data`` into content-defined chunks. Empty data gives no chunks."""
    if not data:
        return []
    return [
        ChunkRef(c.offset, c.length, chunk_id(c.data))
        for c in _chunker(avg_chunk_bytes).cut_buf(data)
    ]


WHOLE_READ_MAX_BYTES = 4 * 1024 * 1024
"""Files up to this size are read whole and cut in memory; larger ones are streamed."""


def chunk_file(
    path: str | os.PathLike[str], avg_chunk_bytes: int = DEFAULT_AVG_CHUNK_BYTES
) -> Iterator[ChunkRef]:
    """Cut the file at ``path`` into chunks, streaming (the file is not read whole).

    The file is read with plain reads, never mapped: a file another process
    truncates while it is cut yields a short read here (and a changed stamp on the
    next walk), where a mapping would kill the whole process with SIGBUS.

    Raises OSError from opening or reading the file.
    """
    chunker = _chunker(avg_chunk_bytes)
    with open(path, "rb", buffering=0) as f:
        size_bytes = os.fstat(f.fileno()).st_size
        if size_bytes <= WHOLE_READ_MAX_BYTES:
            data = f.read(WHOLE_READ_MAX_BYTES + 1)
            if len(data) <= WHOLE_READ_MAX_BYTES:
                for c in chunker.cut_buf(data) if data else ():
                    yield ChunkRef(c.offset, c.length, chunk_id(c.data))
                return
            f.seek(0)  # it grew past the whole-read size since the fstat: stream it
        for c in chunker.cut_stream(f):
            yield ChunkRef(c.offset, c.length, chunk_id(c.data))
