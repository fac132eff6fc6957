"""Shared machinery of sources that hold plain files but no manifest (web dirs, S3 buckets).

Such a file is chunked here after one full download; what it was cut into is
remembered in a state file keyed by the file's remote name, with a validator
(size, ETag, Last-Modified), so a re-sync downloads only files whose validator
changed and asks for the chunks it lacks with ranged reads. Downloads wait in a
spool directory until the sync has taken their chunks (`netopt.cache.spool`: kept
for the next try when a sync fails, and resumed).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from netopt.chunking import chunk_file
from netopt.dataplane import trace
from netopt.dataplane.chunkio import RawChunk
from netopt.dataplane.onloop import blocking
from netopt.fsutil import atomic_write_bytes
from netopt.transfer.manifest import FileEntry, Manifest, manifest_from_dict

__all__ = [
    "CONNECTIONS_AT_ONCE",
    "DOWNLOADS_AT_ONCE",
    "MAX_FILES",
    "BuiltEntries",
    "Download",
    "ReadRange",
    "RemoteDataset",
    "RemoteFile",
    "SpooledChunkSource",
    "at_most",
    "build_entries",
    "file_mtime_ns",
    "load_state",
    "merged",
    "save_state",
]

MAX_FILES = 100_000
"""The most files a source without a manifest may list (a web directory, a bucket prefix)."""

CONNECTIONS_AT_ONCE = 128
"""The most connections such a source opens at once: its downloads, and the parts of
its large files (`netopt.cache.spool`), share them."""

DOWNLOADS_AT_ONCE = CONNECTIONS_AT_ONCE
"""Files such a source downloads at once, one a connection. A tree of small files
from an origin without a manifest costs a round trip or more per file, whatever the
link's rate, so its time falls with the files in flight: the benchmark's 4,800 images
from a web origin over the lab's 140 ms link took 44.3 s at 32 at once, 25.0 s at 64,
19.3-21.1 s at 128 (25.6-25.9 s at 64 the same day) and 22.5 s at 256, where the
client's CPU held it (one at a time it waited a round trip per file; rclone copies 4
files at once by default, aria2c 5, S3 clients such as s5cmd 256)."""

T = TypeVar("T")


@dataclass(frozen=True)
class RemoteFile:
    """One remote file: ``key`` names it in the state file, ``path`` in the manifest."""

    key: str
    path: str
    size_bytes: int
    validator: str
    mtime_ns: int
    ranges: bool = False
    """The origin serves byte ranges of it (``Accept-Ranges: bytes``, S3): a large file
    is downloaded in parts (`netopt.cache.spool`)."""


def file_mtime_ns(modified_s: int | None, validator: str) -> int:
    """The mtime a remote file is written with: its whole-second timestamp (S3's
    LastModified, HTTP's Last-Modified; 0 when there is none) plus a sub-second part
    taken from ``validator``. DEST's quick check compares (size, mtime): two versions of a
    file stored within one second, with one size, would look the same with whole seconds
    alone and the second would never be written; with different ETags they differ here."""
    digest = hashlib.blake2b(validator.encode("utf-8", "surrogateescape"), digest_size=8)
    sub_second_ns = int.from_bytes(digest.digest(), "big") % 10**9
    return (modified_s or 0) * 10**9 + sub_second_ns


Download = Callable[[RemoteFile], Awaitable[tuple[Path, int]]]
"""Download a whole file into the spool (`netopt.cache.spool`): (its path there, bytes
on the wire)."""

ReadRange = Callable[[RemoteFile, int, int], Awaitable[RawChunk]]
"""Read ``length`` bytes at ``offset`` of a file (RawChunk.wire_bytes counts the wire)."""


@dataclass
class BuiltEntries:
    """A manifest's file entries, the remote file behind each path, the spooled downloads."""

    entries: list[FileEntry] = field(default_factory=list)
    remotes: dict[str, RemoteFile] = field(default_factory=dict)
    spooled: dict[str, Path] = field(default_factory=dict)
    wire_bytes: int = 0


class SpooledChunkSource:
    """`ChunkSource` over remote files: spooled downloads first, else ranged reads."""

    def __init__(
        self,
        manifest: Manifest,
        built: BuiltEntries,
        read_range: ReadRange,
        release: Callable[[], None] | None = None,
    ) -> None:
        self.manifest = manifest
        self.remotes = built.remotes
        self.spooled = built.spooled
        self.read_range = read_range
        self._release = release
        self.where: dict[str, tuple[str, int, int]] = {}
        for entry in manifest.files:
            for ref in entry.chunks:
                self.where.setdefault(
                    ref.chunk_id, (entry.path, ref.offset_bytes, ref.length_bytes)
                )

    async def fetch_manifest(self) -> Manifest:
        return self.manifest

    @staticmethod
    def _read_spool(path: Path, offset: int, length: int) -> bytes:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(length)

    async def fetch_chunk(self, chunk_id: str, length_bytes: int) -> RawChunk:
        rel, offset, length = self.where[chunk_id]
        if rel in self.spooled:  # already paid for while building the manifest
            data = await blocking(length, self._read_spool, self.spooled[rel], offset, length)
            return RawChunk(data, "identity", 0)
        return await self.read_range(self.remotes[rel], offset, length)

    async def fetch_chunks(self, wanted: Sequence[tuple[str, int]]) -> AsyncIterator[RawChunk]:
        for chunk_id, length in wanted:
            yield await self.fetch_chunk(chunk_id, length)

    def chunks_done(self) -> None:
        """The sync has every chunk (`netopt.dataplane.sync.sync_manifest` says so): the
        spooled downloads are let go (``release``); a chunk asked for after this is read
        by range."""
        self.spooled = {}
        if self._release is not None:
            self._release()


@dataclass(frozen=True)
class RemoteDataset:
    """Remote files opened as a dataset: the manifest built here, the `ChunkSource`
    over the files, and the bytes listing and downloading took on the wire."""

    manifest: Manifest
    source: SpooledChunkSource
    wire_bytes: int


def _chunk(path: Path, remote: RemoteFile, avg_chunk_bytes: int) -> FileEntry:
    chunks = tuple(chunk_file(path, avg_chunk_bytes))
    return FileEntry(remote.path, path.stat().st_size, 0o644, remote.mtime_ns, chunks)


def _entry_to_state(remote: RemoteFile, entry: FileEntry) -> dict[str, Any]:
    return {
        "validator": remote.validator,
        "size_bytes": entry.size_bytes,
        "chunks": [[c.chunk_id, c.length_bytes] for c in entry.chunks],
    }


def _entry_from_state(remote: RemoteFile, memo: dict[str, Any]) -> FileEntry:
    raw = {"path": remote.path, "size_bytes": memo["size_bytes"], "mode": 0o644}
    raw |= {"mtime_ns": remote.mtime_ns, "chunks": memo["chunks"]}
    return manifest_from_dict({"name": "x", "files": [raw]}).files[0]


async def at_most(limit: int, count: int, call: Callable[[int], Awaitable[T]]) -> list[T]:
    """``call(0) .. call(count - 1)``, at most ``limit`` running at once (one task per
    slot, not per call: a listing of 100,000 files makes ``limit`` tasks); their results
    in order. The first failure cancels the others and is raised as it is."""
    results: list[T | None] = [None] * count
    indices = iter(range(count))

    async def slot() -> None:
        for index in indices:
            results[index] = await call(index)

    slots = [asyncio.ensure_future(slot()) for _ in range(min(limit, count))]
    try:
        await asyncio.gather(*slots)
    finally:
        for task in slots:
            task.cancel()
        await asyncio.gather(*slots, return_exceptions=True)
    return cast(list[T], results)


async def build_entries(
    remotes: Sequence[RemoteFile],
    known: dict[str, Any],
    avg_chunk_bytes: int,
    download: Download,
) -> BuiltEntries:
    """Entries for ``remotes``: from ``known`` when the validator matches, else downloaded,
    `DOWNLOADS_AT_ONCE` at a time, and chunked as each arrives.

    Updates ``known`` in place (save it with `save_state` once the manifest is
    built). Raises what ``download`` raises; OSError when the spool is unwritable.
    """
    built = BuiltEntries()
    fresh: list[RemoteFile] = []
    for remote in remotes:
        memo = known.get(remote.key)
        if memo is None or memo.get("validator") != remote.validator:
            fresh.append(remote)

    async def fetch(index: int) -> tuple[Path, int, FileEntry]:
        remote = fresh[index]
        path, got = await download(remote)
        trace.mark("download_first_file_in")
        trace.mark_last("download_last_file_in")
        entry = await blocking(remote.size_bytes, _chunk, path, remote, avg_chunk_bytes)
        trace.mark_last("download_last_file_chunked")
        return path, got, entry

    fetched = await at_most(DOWNLOADS_AT_ONCE, len(fresh), fetch)
    downloaded = {remote.key: one for remote, one in zip(fresh, fetched, strict=True)}
    for remote in remotes:
        if remote.key in downloaded:
            path, wire_bytes, entry = downloaded[remote.key]
            built.wire_bytes += wire_bytes
            built.spooled[remote.path] = path
        else:
            entry = _entry_from_state(remote, known[remote.key])
        built.entries.append(entry)
        built.remotes[remote.path] = remote
        known[remote.key] = _entry_to_state(remote, entry)
    return built


def merged(parts: Sequence[BuiltEntries]) -> BuiltEntries:
    """One `BuiltEntries` of ``parts`` (a source's files, each built as it was listed)."""
    built = BuiltEntries()
    for part in parts:
        built.entries += part.entries
        built.remotes |= part.remotes
        built.spooled |= part.spooled
        built.wire_bytes += part.wire_bytes
    return built


def _load(state_path: Path | None) -> dict[str, Any]:
    if state_path is None or not state_path.is_file():
        return {}
    try:
        return dict(json.loads(state_path.read_text()))
    except (OSError, ValueError):
        return {}


async def load_state(state_path: Path | None) -> dict[str, Any]:
    """The remembered chunking per remote key; empty when absent or unreadable."""
    return await asyncio.to_thread(_load, state_path)


def _save(state_path: Path, known: dict[str, Any]) -> None:
    state_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(state_path, json.dumps(known).encode())


async def save_state(state_path: Path | None, known: dict[str, Any]) -> None:
    """Write ``known`` atomically (no-op without a path); OSError when the disk refuses."""
    if state_path is not None:
        await asyncio.to_thread(_save, state_path, known)
