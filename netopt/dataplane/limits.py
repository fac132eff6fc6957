"""Bounds on what a data-plane peer may send, and the checks that apply them.

Every size a server or a client learns from the other side is checked against one of
these before anything of that size is allocated: a body's declared length before it is
read, its actual length while it is read (a lying or absent Content-Length changes
nothing), a manifest's entries before it is parsed into objects, each chunk's length
against the dataset's own chunking parameters, and the chunk names a stream may queue.

The hard caps are generous for real datasets: a manifest of `MAX_MANIFEST_ENTRIES`
entries (files plus chunk references: 500,000 small files, or a 1 TiB dataset at the
default 1 MiB chunks) parses in about a gigabyte. Stdlib only: `netopt.dataplane.prefetch`
imports this before the interpreter has loaded aiohttp.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from netopt.errors import ProtocolError

if TYPE_CHECKING:
    from netopt.transfer.manifest import Manifest

__all__ = [
    "CDC_MAX_OVER_AVG",
    "MANIFEST_BYTES_PER_ENTRY",
    "MAX_AVG_CHUNK_BYTES",
    "MAX_CHUNK_PARTS",
    "MAX_INFO_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_ENTRIES",
    "MAX_STREAM_NAMES_QUEUED",
    "STREAM_NAME_LINE_BYTES",
    "BodyTooLarge",
    "check_manifest_bounds",
    "check_manifest_shape",
    "max_chunk_bytes",
    "read_up_to",
]

MAX_INFO_BYTES = 1024 * 1024
"""A dataset's info document (a few hundred bytes in practice)."""

MAX_MANIFEST_ENTRIES = 1_000_000
"""Files plus chunk references one manifest may list."""

MANIFEST_BYTES_PER_ENTRY = 128
"""JSON bytes allowed per entry: a chunk reference takes ~80, a file ~90 plus its path."""

MAX_MANIFEST_BYTES = MAX_MANIFEST_ENTRIES * MANIFEST_BYTES_PER_ENTRY
"""128 MB: the largest manifest body a client reads."""

_TOKENS_PER_ENTRY = 12
"""JSON structure characters (``{ [ : ,``) per entry: 12 for a file, 3 per chunk."""

MAX_CHUNK_PARTS = 32
"""The most parts the chunk route cuts one chunk into (``?part=I&parts=N``): a small sync
spreads its one large chunk over that many warm connections at most. A server says its
own in its info (``chunk_parts``); a client asks an older server (16) for that many."""

MAX_AVG_CHUNK_BYTES = 4 * 1024 * 1024
"""The largest average chunk size FastCDC accepts (`netopt.chunking`)."""

CDC_MAX_OVER_AVG = 4
"""FastCDC cuts a chunk at 4 x the average size at the latest (its ``max_size``)."""

MAX_STREAM_NAMES_QUEUED = 256
"""Chunk names a stream request may have read ahead of the chunk being sent; the server
stops reading the body (TCP pushes back) while that many wait."""

STREAM_NAME_LINE_BYTES = 66
"""One line of a stream request body: 64 hex digits and CRLF at most."""


class BodyTooLarge(ProtocolError):
    """A peer's answer is larger than the bound for what it should hold."""


def max_chunk_bytes(avg_chunk_bytes: int) -> int:
    """The longest chunk a dataset chunked at ``avg_chunk_bytes`` average can hold."""
    return min(avg_chunk_bytes, MAX_AVG_CHUNK_BYTES) * CDC_MAX_OVER_AVG


def check_manifest_shape(raw: bytes | bytearray, max_entries: int = MAX_MANIFEST_ENTRIES) -> None:
    """Refuse a manifest body that cannot fit ``max_entries`` entries, before parsing it.

    Parsing makes an object of every JSON value, up to ~20x the bytes for a body of
    tiny values; each value but the first follows one of ``{ [ : ,`` (the count of
    those over-counts only by the ones inside strings), so that count bounds what
    parsing allocates. Raises BodyTooLarge.
    """
    brackets = raw.count(b"[")
    tokens = raw.count(b",") + raw.count(b":") + brackets + raw.count(b"{")
    if tokens > _TOKENS_PER_ENTRY * max_entries + 64:
        raise BodyTooLarge(
            f"manifest: {tokens} JSON values is more than {max_entries} entries can hold"
        )
    # Each file opens one list (its chunks) and each chunk reference one more, past the
    # one list of files: the entries, counted without parsing (a '[' inside a name only
    # over-counts), so a manifest over the cap costs its bytes, not a parse.
    if brackets - 1 > max_entries:
        raise BodyTooLarge(
            f"manifest: about {brackets - 1} files and chunks, over the {max_entries} "
            "entries a client accepts"
        )


def check_manifest_bounds(manifest: Manifest, max_entries: int = MAX_MANIFEST_ENTRIES) -> None:
    """Refuse a parsed manifest with more than ``max_entries`` entries, an average chunk
    size over `MAX_AVG_CHUNK_BYTES`, or a chunk longer than its chunking allows.

    Raises BodyTooLarge (a ProtocolError).
    """
    refs = sum(len(entry.chunks) for entry in manifest.files)
    if len(manifest.files) + refs > max_entries:
        raise BodyTooLarge(
            f"manifest: {len(manifest.files)} files and {refs} chunks, "
            f"over the {max_entries} entries a client accepts"
        )
    if manifest.avg_chunk_bytes > MAX_AVG_CHUNK_BYTES:
        raise BodyTooLarge(
            f"manifest: average chunk size {manifest.avg_chunk_bytes} is over "
            f"{MAX_AVG_CHUNK_BYTES} bytes"
        )
    longest_bytes = max_chunk_bytes(manifest.avg_chunk_bytes)
    for entry in manifest.files:
        for ref in entry.chunks:
            if ref.length_bytes > longest_bytes:
                raise BodyTooLarge(
                    f"manifest: {entry.path}: a chunk of {ref.length_bytes} bytes, over the "
                    f"{longest_bytes} its chunking ({manifest.avg_chunk_bytes} average) allows"
                )


async def read_up_to(read: Callable[[int], Awaitable[bytes]], limit_bytes: int) -> bytes:
    """The first ``limit_bytes`` of a body read by ``read(n)`` (up to ``n`` bytes a call,
    b"" at its end), or all of it when shorter. The rest is not read: a peer that sends
    more than asked (a whole file for a range, an endless body) costs no memory past the
    bound. A caller that refuses more than N bytes reads N + 1."""
    pieces: list[bytes] = []
    left = limit_bytes
    while left > 0:
        piece = await read(min(left, 1 << 20))
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)
