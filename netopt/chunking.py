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


def chunk_file(
    path: str | os.PathLike[str], avg_chunk_bytes: int = DEFAULT_AVG_CHUNK_BYTES
) -> Iterator[ChunkRef]:
    """Cut the file at ``path`` into chunks, streaming (the file is not read whole).

    Raises OSError from opening or reading the file.
    """
    if os.path.getsize(path) == 0:
        return
    for c in _chunker(avg_chunk_bytes).cut_file(os.fspath(path)):
        yield ChunkRef(c.offset, c.length, chunk_id(c.data))
