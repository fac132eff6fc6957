"""One zstd context per stream: the chunks of a stream compress as one stream of data.

Compressed one by one, each chunk starts from an empty zstd window, so the small files
of a tree (a package's ``.py`` files, 1-4 KB records) cannot refer to each other: a
5,600-file tree of installed packages reached zstd ratio 2.53 chunk by chunk against
2.94 compressed as one stream (level 3; 2.60 against 3.08 at level 5). A stream
response with a context (the stream route's ``ctx=1``) keeps one compressor per
response: each chunk's frame is what the compressor emits for it followed by a block
flush (``ZSTD_e_flush``), so the frame ends on a block boundary and the client decodes
it as soon as it has arrived, with the history of every earlier chunk of the stream
(rsync's ``-z`` keeps its compression stream across files the same way).

Only chunks under `CONTEXT_MAX_CHUNK_BYTES` go through the context: a larger chunk is
most of its own history and compresses faster alone (a ``zstd`` frame, as without a
context).

Frame codecs (`netopt.dataplane.chunkio`): ``zstd-stream-new`` starts a context (its
payload begins with a zstd frame header; sent first and after a level change),
``zstd-stream`` continues the stream's current one. Raw (``identity``) and stored
(``zstd``) frames may come between them and do not touch the context.

A stream asked for bundles (the stream route's ``bundle=1``) sends consecutive small chunks
that were ready together as one ``zstd-bundle`` frame, flushed once (see
`netopt.transfer.sampling.BUNDLE_MAX_BYTES` for what a flush per chunk costs): its payload
is `BUNDLE_HEAD` (how many chunks, whether it starts a context) and the blocks of their
bytes joined. The client knows the names and lengths of what it asked for, in order: the
bundle decodes to exactly the sum of its chunks' lengths, and each is checked on its own.

The decoder trusts nothing: it walks the payload block by block (3-byte block headers,
at most `BLOCK_MAX_BYTES` out of each), feeds one block at a time and stops as soon as
more than the chunk's length came out, so a lying frame never makes it hold more than
the chunk plus one block; the window a frame may declare is capped at
`WINDOW_MAX_BYTES`; a frame-ending block, a reserved block type or a payload that ends
inside a block is refused. The decoded chunk is checked against its BLAKE3 name here: a
stream whose context went wrong is cut (`ContextError`) before it spoils later chunks.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import blake3
import zstandard

from netopt.errors import IntegrityError
from netopt.transfer.sampling import (
    BUNDLE_MAX_BYTES,
    BUNDLE_MAX_CHUNKS,
    CONTEXT_MAX_CHUNK_BYTES,
    STREAM_WINDOW_LOG,
    fits_bundle,
    stream_compressor,
)

__all__ = [
    "BLOCK_MAX_BYTES",
    "BUNDLE_HEAD",
    "BUNDLE_MAX_BYTES",
    "BUNDLE_MAX_CHUNKS",
    "CONTEXT_MAX_CHUNK_BYTES",
    "WINDOW_LOG",
    "WINDOW_MAX_BYTES",
    "ContextDecoder",
    "ContextEncoder",
    "ContextError",
    "fits_bundle",
]

WINDOW_LOG = STREAM_WINDOW_LOG
"""The encoder's window (4 MiB, `netopt.transfer.sampling.STREAM_WINDOW_LOG`: the plan's
sample is compressed the same way)."""
WINDOW_MAX_BYTES = 1 << WINDOW_LOG
"""The largest window a peer's frame may declare."""
BLOCK_MAX_BYTES = 128 * 1024
"""zstd's largest block (what one block decodes to at most)."""
BUNDLE_HEAD = struct.Struct(">HB")
"""A ``zstd-bundle`` payload's start: its chunks (2..`BUNDLE_MAX_CHUNKS`), and 1 when it
starts a context (else 0)."""
_BLOCK_HEADER_BYTES = 3
_RAW, _RLE, _COMPRESSED = 0, 1, 2


class ContextError(IntegrityError):
    """A stream's compressed frame that does not decode to its chunk: a bad copy of that
    chunk (charged as one), and the end of the stream, whose context is now unusable: its
    chunks are asked for again on a fresh stream, with a fresh context."""

    def __init__(self, message: str, chunk_id: str | None = None) -> None:
        super().__init__(message)
        self.chunk_id = chunk_id
        """The chunk of a bundle that came out wrong (None: the frame's first)."""


@dataclass
class ContextEncoder:
    """The server's side: one compressor per stream response, at one level at a time."""

    level: int = 0
    _compressor: zstandard.ZstdCompressionObj | None = field(default=None, repr=False)

    def encode(self, data: bytes, level: int) -> tuple[bytes, bool]:
        """``data`` through the stream's compressor at ``level`` (> 0), ending on a block
        boundary; (payload, True when it starts a new context). A new level starts one."""
        new = self._compressor is None or level != self.level
        if new:
            self._compressor = stream_compressor(level)
            self.level = level
        assert self._compressor is not None
        payload = self._compressor.compress(data) + self._compressor.flush(
            zstandard.COMPRESSOBJ_FLUSH_BLOCK
        )
        return payload, new

    def encode_bundle(self, pieces: Sequence[bytes], level: int) -> bytes:
        """A ``zstd-bundle`` payload: ``pieces`` (2..`BUNDLE_MAX_CHUNKS` chunks) through the
        stream's compressor at ``level`` as one piece, flushed once."""
        if not 2 <= len(pieces) <= BUNDLE_MAX_CHUNKS:
            raise ValueError(f"a bundle of {len(pieces)} chunks")
        payload, new = self.encode(b"".join(pieces), level)
        return BUNDLE_HEAD.pack(len(pieces), int(new)) + payload


@dataclass
class ContextDecoder:
    """The client's side: the stream's decompressor, fed one bounded block at a time."""

    _decompressor: zstandard.ZstdDecompressionObj | None = field(default=None, repr=False)

    def decode(self, payload: bytes, new: bool, chunk_id: str, length_bytes: int) -> bytes:
        """Chunk ``chunk_id`` (``length_bytes`` long) from its frame's ``payload``; ``new``:
        the frame starts a context. Raises ContextError for anything but exactly that
        chunk (the context is then unusable: the caller cuts the stream)."""
        return self.decode_bundle(memoryview(payload), new, ((chunk_id, length_bytes),))[0]

    def decode_bundle(
        self, payload: memoryview, new: bool, chunks: Sequence[tuple[str, int]]
    ) -> list[bytes]:
        """``chunks`` (names and lengths, in order) from one payload of their bytes joined
        (a bundle's, after its `BUNDLE_HEAD`); ContextError unless it decodes to exactly
        them, each checked against its name."""
        where = f"chunk {chunks[0][0][:16]}"
        length_bytes = sum(length for _, length in chunks)
        view = payload
        pos = 0
        try:
            if new:
                pos = zstandard.frame_header_size(payload)
                params = zstandard.get_frame_parameters(payload)
                if params.window_size > WINDOW_MAX_BYTES or params.has_checksum:
                    raise ContextError(f"{where}: a stream context with an unexpected frame")
                self._decompressor = zstandard.ZstdDecompressor(
                    max_window_size=WINDOW_MAX_BYTES
                ).decompressobj()
                self._decompressor.decompress(view[:pos])
            if self._decompressor is None:
                raise ContextError(f"{where}: a stream frame before its context started")
            parts: list[bytes] = []
            out_bytes = 0
            while pos < len(view):
                end = pos + _block_bytes(view, pos, where)
                if end > len(view):
                    raise ContextError(f"{where}: the frame ends inside a block")
                piece = self._decompressor.decompress(view[pos:end])
                out_bytes += len(piece)
                if out_bytes > length_bytes:
                    raise ContextError(f"{where}: decodes to more than {length_bytes} bytes")
                parts.append(piece)
                pos = end
        except zstandard.ZstdError as exc:
            self._decompressor = None
            raise ContextError(f"{where}: bad stream frame: {exc}") from exc
        except ContextError:
            self._decompressor = None
            raise
        data = b"".join(parts)
        if len(data) != length_bytes:
            self._decompressor = None
            raise ContextError(f"{where}: the stream frame does not decode to its chunks")
        if len(chunks) == 1:
            pieces = [data]
        else:
            whole = memoryview(data)
            pieces, at = [], 0
            for _, length in chunks:
                pieces.append(bytes(whole[at : at + length]))
                at += length
        for (chunk_id, _), piece in zip(chunks, pieces, strict=True):
            if blake3.blake3(piece).hexdigest() != chunk_id:
                self._decompressor = None
                raise ContextError(
                    f"chunk {chunk_id[:16]}: the stream frame does not decode to the chunk",
                    chunk_id,
                )
        return pieces


def _block_bytes(view: memoryview, pos: int, where: str) -> int:
    """The bytes of the block whose header starts at ``pos`` (header included)."""
    if pos + _BLOCK_HEADER_BYTES > len(view):
        raise ContextError(f"{where}: the frame ends inside a block header")
    header = int.from_bytes(view[pos : pos + _BLOCK_HEADER_BYTES], "little")
    last, kind, size = header & 1, (header >> 1) & 3, header >> 3
    if last:
        raise ContextError(f"{where}: a stream frame must not end its zstd frame")
    if kind not in (_RAW, _RLE, _COMPRESSED) or size > BLOCK_MAX_BYTES:
        raise ContextError(f"{where}: a bad zstd block header")
    return _BLOCK_HEADER_BYTES + (1 if kind == _RLE else size)
