"""Where chunks come from and where they go: the `ChunkSource` / `ChunkSink` protocols.

A source hands out a dataset's manifest and its chunks as they travel (maybe
zstd-compressed); a sink keeps verified chunks until the files that use them are
written. The sync engine (`netopt.dataplane.sync`) works against these two
protocols only, so the HTTP client, the on-disk resume store and, later, the
node's chunk cache plug in behind it; `MemoryChunkSource` / `MemoryChunkSink`
serve unit tests.

`encode_chunk` and `decode_chunk` are the wire format: a zstd frame, or the raw
bytes when compression is off or does not pay.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import struct
import threading
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import blake3
import zstandard

from netopt.errors import IntegrityError, StorageError
from netopt.transfer.manifest import Manifest, validate_chunk_id

__all__ = [
    "FRAME_HEADER",
    "STREAM_CODECS",
    "ChunkSink",
    "ChunkSource",
    "Codec",
    "DirChunkSink",
    "MemoryChunkSink",
    "MemoryChunkSource",
    "RawChunk",
    "decode_chunk",
    "decode_part",
    "encode_chunk",
    "frame_header",
    "max_frame_bytes",
    "parse_frame_header",
    "part_bounds",
]

Codec = Literal["zstd", "identity", "zstd-stream", "zstd-stream-new", "zstd-bundle"]
"""How a frame's payload is encoded. ``zstd-stream``/``zstd-stream-new``: through the
stream's own zstd context (`netopt.dataplane.streamctx`), decodable only in the stream's
order; the stream decodes them and hands on ``identity`` chunks it has verified.
``zstd-bundle``: several consecutive chunks of a stream through its context as one piece
(`netopt.dataplane.streamctx.BUNDLE_HEAD`)."""
STREAM_CODECS: frozenset[Codec] = frozenset({"zstd-stream", "zstd-stream-new", "zstd-bundle"})

FRAME_HEADER = struct.Struct(">32sBI")
"""A batch response frame: BLAKE3 digest (32 bytes), codec (0 raw, 1 zstd, 2 zstd-stream,
3 zstd-stream-new, 4 zstd-bundle), payload length. A bundle's digest is its first chunk's."""

_CODEC_BYTES: dict[Codec, int] = {
    "identity": 0,
    "zstd": 1,
    "zstd-stream": 2,
    "zstd-stream-new": 3,
    "zstd-bundle": 4,
}
_CODEC_NAMES: dict[int, Codec] = {v: k for k, v in _CODEC_BYTES.items()}


def frame_header(chunk_id: str, codec: Codec, payload_bytes: int) -> bytes:
    """The header that precedes one chunk in a batch response."""
    return FRAME_HEADER.pack(bytes.fromhex(chunk_id), _CODEC_BYTES[codec], payload_bytes)


def parse_frame_header(header: bytes) -> tuple[str, Codec, int]:
    """(chunk name, codec, payload length) from a frame header; ValueError if malformed."""
    digest, codec, length = FRAME_HEADER.unpack(header)
    if codec not in _CODEC_NAMES:
        raise ValueError(f"unknown codec byte {codec}")
    return digest.hex(), _CODEC_NAMES[codec], length


def max_frame_bytes(length_bytes: int) -> int:
    """The largest payload a chunk of ``length_bytes`` may arrive as (zstd's worst case)."""
    return length_bytes + length_bytes // 128 + 1024


@dataclass(frozen=True)
class RawChunk:
    """A chunk as it arrived: its payload, how it is encoded, and the bytes it took."""

    payload: bytes
    codec: Codec
    wire_bytes: int
    verified: bool = False
    """True when ``payload`` (``identity``) was already checked against its name (a stream
    decoded it through its context and verified it there)."""


class ChunkSource(Protocol):
    """Something that serves one dataset: its manifest and its chunks.

    A source may also have ``chunks_done()``: `netopt.dataplane.sync.sync_manifest`
    calls it once the sync has every chunk, before the files are made durable (a
    source that spooled its files lets them go then: `netopt.cache.remotefiles.
    SpooledChunkSource`). Optional, found with ``getattr``, as a stream's
    ``next_buffered`` and ``may_be_cut`` are.
    """

    async def fetch_manifest(self) -> Manifest:
        """The dataset's manifest (validated)."""
        ...

    async def fetch_chunk(self, chunk_id: str, length_bytes: int) -> RawChunk:
        """One chunk, encoded as the source chose. Unverified: the caller checks it."""
        ...

    def fetch_chunks(self, wanted: Sequence[tuple[str, int]]) -> AsyncIterator[RawChunk]:
        """Several chunks (name, length) in one request, yielded in order as they arrive.

        Unverified. Stops early with NetworkError when the stream breaks; the
        chunks yielded before that are whole.
        """
        ...


class ChunkSink(Protocol):
    """Something that keeps verified chunks."""

    async def has(self, chunk_id: str) -> bool:
        """True when the chunk is stored and complete."""
        ...

    async def put(self, chunk_id: str, data: bytes) -> None:
        """Store a chunk whose hash the caller has verified; readable when this returns,
        durable once the sink's owner flushes it (the cache: `Cache.flush`, before a sync
        reports success) or, for sinks without a flush, when this returns."""
        ...

    async def get(self, chunk_id: str) -> bytes:
        """A stored chunk; KeyError if absent, IntegrityError if it no longer verifies."""
        ...


_local = threading.local()


def _compressor(zstd_level: int) -> zstandard.ZstdCompressor:
    # One context per thread and level: building one costs more than a small chunk's work.
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    cctx = cache.get(zstd_level)
    if cctx is None:
        cctx = cache[zstd_level] = zstandard.ZstdCompressor(level=zstd_level)
    return cctx


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx: zstandard.ZstdDecompressor | None = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def encode_chunk(data: bytes, zstd_level: int | None) -> tuple[bytes, Codec]:
    """Compress ``data`` at ``zstd_level``; raw bytes when off or when zstd does not shrink it."""
    if zstd_level is None or zstd_level <= 0:
        return data, "identity"
    frame: bytes = _compressor(zstd_level).compress(data)
    return (frame, "zstd") if len(frame) < len(data) else (data, "identity")


def _decompress_bounded(payload: bytes, length_bytes: int) -> bytes:
    """Decompress one frame into at most ``length_bytes + 1`` bytes."""
    dctx = _decompressor()
    if zstandard.frame_content_size(payload) == length_bytes:
        # The frame states the expected size: one-shot decompression into exactly that
        # buffer (2-3x faster than streaming); a frame whose content differs fails.
        out: bytes = dctx.decompress(payload)
        return out
    # Unknown or different stated size: stream, never holding more than length + 1 bytes.
    reader = dctx.stream_reader(payload)
    data = reader.read(length_bytes + 1)
    while len(data) <= length_bytes:
        more = reader.read(length_bytes + 1 - len(data))
        if not more:
            break
        data += more
    return bytes(data)


def part_bounds(length_bytes: int, part: int, parts: int) -> tuple[int, int]:
    """Where part ``part`` of ``parts`` (nearly equal slices) of a chunk of ``length_bytes``
    starts and ends: the server's part route and the client cut a chunk the same way."""
    return length_bytes * part // parts, length_bytes * (part + 1) // parts


def decode_part(raw: RawChunk, chunk_id: str, part_bytes: int) -> bytes:
    """Decode one part of a chunk (bounded by ``part_bytes``, its length); IntegrityError for
    a bad frame or a wrong length. The whole chunk is verified once its parts are joined."""
    return _decode_bounded(raw, chunk_id, part_bytes)


def _decode_bounded(raw: RawChunk, chunk_id: str, length_bytes: int) -> bytes:
    """``raw`` decoded: at most ``length_bytes`` are ever allocated, and exactly that many
    must come out; IntegrityError otherwise."""
    if raw.codec in STREAM_CODECS:
        raise IntegrityError(f"chunk {chunk_id[:16]}: a stream-context frame outside its stream")
    if raw.codec == "zstd":
        try:
            data = _decompress_bounded(raw.payload, length_bytes)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"chunk {chunk_id[:16]}: bad zstd frame: {exc}") from exc
    else:
        data = raw.payload
    if len(data) != length_bytes:
        raise IntegrityError(
            f"chunk {chunk_id[:16]}: {len(data)} bytes where {length_bytes} were expected"
        )
    return bytes(data)


def decode_chunk(raw: RawChunk, chunk_id: str, length_bytes: int) -> bytes:
    """Decode and verify a chunk against its BLAKE3 name and length.

    Decompression is bounded by ``length_bytes`` (a lying frame cannot make it
    allocate more). Raises IntegrityError for a bad frame, a wrong length or a
    hash mismatch.
    """
    data = _decode_bounded(raw, chunk_id, length_bytes)
    if raw.verified and raw.codec == "identity":
        return data
    if blake3.blake3(data).hexdigest() != chunk_id:
        raise IntegrityError(f"chunk {chunk_id[:16]}: BLAKE3 mismatch")
    return data


class MemoryChunkSource:
    """A source over an in-memory manifest and chunk table, for tests.

    ``corrupt_first`` names chunks whose first fetch returns flipped bytes;
    ``fetches`` counts fetches per chunk.
    """

    def __init__(
        self,
        manifest: Manifest,
        chunks: Mapping[str, bytes],
        *,
        zstd_level: int | None = None,
        corrupt_first: frozenset[str] = frozenset(),
    ) -> None:
        self.manifest = manifest
        self.chunks = dict(chunks)
        self.zstd_level = zstd_level
        self.corrupt_first = set(corrupt_first)
        self.fetches: Counter[str] = Counter()

    async def fetch_manifest(self) -> Manifest:
        return self.manifest

    async def fetch_chunk(self, chunk_id: str, length_bytes: int) -> RawChunk:
        self.fetches[chunk_id] += 1
        data = self.chunks[chunk_id]
        if chunk_id in self.corrupt_first:
            self.corrupt_first.discard(chunk_id)
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        payload, codec = encode_chunk(data, self.zstd_level)
        return RawChunk(payload, codec, len(payload))

    async def fetch_chunks(self, wanted: Sequence[tuple[str, int]]) -> AsyncIterator[RawChunk]:
        for chunk_id, length in wanted:
            yield await self.fetch_chunk(chunk_id, length)


class MemoryChunkSink:
    """A sink in a dict, for tests."""

    def __init__(self) -> None:
        self.chunks: dict[str, bytes] = {}

    async def has(self, chunk_id: str) -> bool:
        return chunk_id in self.chunks

    async def put(self, chunk_id: str, data: bytes) -> None:
        self.chunks[chunk_id] = data

    async def get(self, chunk_id: str) -> bytes:
        return self.chunks[chunk_id]


class DirChunkSink:
    """Verified chunks as files named by their hash in one directory (the resume store).

    Each chunk is written to a temporary name, fsynced and renamed, so a chunk
    file that exists is complete; `get` verifies again and drops a chunk that
    no longer matches.

    ``fsync=False`` skips the per-chunk fsync (a resume store does not need it): a
    stored chunk then survives a crash of the process but maybe not of the machine,
    and one torn by a power loss fails `get`'s check and is fetched again, never used.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.glob(".tmp-*"):
                stale.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot use chunk directory {self.root}: {exc}") from exc

    def _path(self, chunk_id: str) -> Path:
        return self.root / validate_chunk_id(chunk_id)

    async def has(self, chunk_id: str) -> bool:
        return await asyncio.to_thread(self._path(chunk_id).is_file)

    def stored_ids(self) -> set[str]:
        """Every complete chunk in the store."""
        return {p.name for p in self.root.iterdir() if not p.name.startswith(".")}

    def _put(self, chunk_id: str, data: bytes) -> None:
        final = self._path(chunk_id)
        tmp = self.root / f".tmp-{chunk_id[:16]}-{secrets.token_hex(4)}"
        try:
            with tmp.open("wb") as f:
                f.write(data)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, final)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StorageError(f"cannot store chunk {chunk_id[:16]}: {exc}") from exc

    async def put(self, chunk_id: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, chunk_id, data)

    def _get(self, chunk_id: str) -> bytes:
        path = self._path(chunk_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise KeyError(chunk_id) from None
        except OSError as exc:
            raise StorageError(f"cannot read chunk {chunk_id[:16]}: {exc}") from exc
        if blake3.blake3(data).hexdigest() != chunk_id:
            path.unlink(missing_ok=True)
            raise IntegrityError(f"stored chunk {chunk_id[:16]} no longer verifies; dropped it")
        return data

    async def get(self, chunk_id: str) -> bytes:
        return await asyncio.to_thread(self._get, chunk_id)
