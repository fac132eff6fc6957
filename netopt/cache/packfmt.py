"""The on-disk form of the cache's packs, and reading them (the cache and the agent both).

A tree of many small files is mostly small chunks; one file per chunk costs a create,
a rename and a directory entry each, more than writing its bytes. So chunks under
`PACK_MAX_CHUNK_BYTES` go into append-only pack files instead (as restic, borg and git
pack objects)::

    packs/00000001.pack    records: magic (4) | BLAKE3 digest (32) | length u32 | data
    packs/00000001.idx     entries: digest (32) | data offset u64 | length u32 | crc32 u32

A record is appended once its chunk was verified; its index entry is appended only
after the pack's bytes were made durable, so whoever reads the index (the agent
serving peers) finds only durable chunks. A removal appends a *tombstone* entry
(length `TOMBSTONE`) naming the record's offset. Entries of one pack follow its
records' order, tombstones aside. Each entry carries a CRC-32 of itself, so an index
cut or scrambled by a crash is read up to its last good entry; the records after that
are found again by walking the pack and checking each one's BLAKE3
(`netopt.cache.packs`). Every read is verified against the chunk's name and length by
the caller, so a stale location reads as a missing or corrupt chunk, never as wrong data.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ENTRY_BYTES",
    "PACK_MAX_CHUNK_BYTES",
    "RECORD_HEADER_BYTES",
    "TOMBSTONE",
    "Entry",
    "Location",
    "PackReader",
    "apply_entries",
    "decode_entries",
    "encode_entry",
    "encode_record_header",
    "pack_number",
    "parse_record_header",
]

PACK_MAX_CHUNK_BYTES = 128 * 1024
"""Chunks shorter than this are packed; longer ones keep a file each."""
MAGIC = b"NPK1"
_RECORD = struct.Struct("<4s32sI")
RECORD_HEADER_BYTES = _RECORD.size
_ENTRY_BODY = struct.Struct("<32sQI")
_ENTRY = struct.Struct("<32sQII")
ENTRY_BYTES = _ENTRY.size
TOMBSTONE = 0xFFFFFFFF
_PACK_NAME = re.compile(r"^(\d{8})\.pack$")
_REFRESH_EVERY_S = 0.2


@dataclass(frozen=True, slots=True)
class Location:
    """Where a packed chunk's bytes are."""

    pack: int
    offset: int
    """Of the data (past the record header)."""
    length: int


@dataclass(frozen=True, slots=True)
class Entry:
    digest: bytes
    offset: int
    length: int
    """`TOMBSTONE` for a removal of the record at ``offset``."""

    @property
    def removal(self) -> bool:
        return self.length == TOMBSTONE


def pack_number(name: str) -> int | None:
    """The number of a pack file's name (``00000012.pack``), None for any other name."""
    match = _PACK_NAME.match(name)
    return int(match[1]) if match else None


def pack_name(number: int, suffix: str) -> str:
    return f"{number:08d}.{suffix}"


def encode_record_header(digest: bytes, length: int) -> bytes:
    return _RECORD.pack(MAGIC, digest, length)


def parse_record_header(header: bytes) -> tuple[bytes, int] | None:
    """(digest, length) of a record header, None when it is not one."""
    if len(header) != RECORD_HEADER_BYTES:
        return None
    magic, digest, length = _RECORD.unpack(header)
    if magic != MAGIC or not 0 < length < PACK_MAX_CHUNK_BYTES:
        return None
    return digest, length


def encode_entry(digest: bytes, offset: int, length: int) -> bytes:
    body = _ENTRY_BODY.pack(digest, offset, length)
    return body + struct.pack("<I", zlib.crc32(body))


def decode_entries(data: bytes, pack_bytes: int) -> tuple[list[Entry], int]:
    """The good entries at the start of an index, and the bytes they take.

    Stops at the first entry that is cut, fails its CRC, or names bytes outside a pack
    of ``pack_bytes``: what follows it cannot be trusted."""
    entries: list[Entry] = []
    good = 0
    for start in range(0, len(data) - ENTRY_BYTES + 1, ENTRY_BYTES):
        digest, offset, length, crc = _ENTRY.unpack_from(data, start)
        if zlib.crc32(data[start : start + ENTRY_BYTES - 4]) != crc:
            break
        size = 0 if length == TOMBSTONE else length
        if offset < RECORD_HEADER_BYTES or offset + size > pack_bytes:
            break
        if length != TOMBSTONE and not 0 < length < PACK_MAX_CHUNK_BYTES:
            break
        entries.append(Entry(digest, offset, length))
        good = start + ENTRY_BYTES
    return entries, good


def apply_entries(live: dict[str, Location], pack: int, entries: Iterable[Entry]) -> None:
    """Fold one pack's entries into ``live`` (chunk name -> location): later wins, and a
    tombstone removes only the record it names."""
    for entry in entries:
        chunk_id = entry.digest.hex()
        if entry.removal:
            at = live.get(chunk_id)
            if at is not None and at.pack == pack and at.offset == entry.offset:
                del live[chunk_id]
        else:
            live[chunk_id] = Location(pack, entry.offset, entry.length)


def read_at(path: Path, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


class PackReader:
    """The packed chunks of a cache directory, for a reader without the cache lock (the
    agent): follows the index files as they grow. Thread-safe."""

    def __init__(self, packs_dir: Path) -> None:
        self.packs_dir = packs_dir
        self._lock = threading.Lock()
        self._live: dict[str, Location] = {}
        self._read_bytes: dict[int, int] = {}
        """pack -> index bytes folded in so far."""
        self._refreshed_s = -1e9

    def read(self, chunk_id: str) -> bytes | None:
        """The bytes stored for ``chunk_id`` (unverified: the caller checks them), None
        when no pack holds it."""
        at = self._locate(chunk_id)
        if at is None:
            return None
        try:
            return read_at(self.packs_dir / pack_name(at.pack, "pack"), at.offset, at.length)
        except FileNotFoundError:  # compacted away: the index names its new place
            at = self._locate(chunk_id, force=True)
            if at is None:
                return None
            with contextlib.suppress(FileNotFoundError):
                return read_at(self.packs_dir / pack_name(at.pack, "pack"), at.offset, at.length)
            return None

    def locate(self, chunk_id: str) -> Location | None:
        """Where the index files now place ``chunk_id`` (read afresh)."""
        return self._locate(chunk_id, force=True)

    def chunk_ids(self) -> set[str]:
        """The chunks the index files now name (read afresh)."""
        with self._lock:
            self._refresh(time.monotonic(), force=True)
            return set(self._live)

    def _locate(self, chunk_id: str, force: bool = False) -> Location | None:
        with self._lock:
            at = self._live.get(chunk_id)
            if at is None or force:
                self._refresh(time.monotonic(), force)
                at = self._live.get(chunk_id)
            return at

    def _refresh(self, now_s: float, force: bool) -> None:
        """Fold in what the index files gained. New entries go to the newest packs (the
        active one, and the one before it while its last batch commits), so those and any
        new pack are followed on every miss: a chunk announced to peers is found at once.
        The rest are swept at most every `_REFRESH_EVERY_S` (a peer asking for absent
        chunks costs a directory listing, not a read of every index)."""
        sweep = force or now_s - self._refreshed_s >= _REFRESH_EVERY_S
        if sweep:
            self._refreshed_s = now_s
        try:
            names = os.listdir(self.packs_dir)
        except OSError:
            names = []
        numbers = sorted(n for n in map(pack_number, names) if n is not None)
        if sweep:
            follow = numbers
        else:
            follow = [n for n in numbers if n not in self._read_bytes] + numbers[-2:]
        for number in dict.fromkeys(follow):
            self._follow(number)
        for gone in set(self._read_bytes) - set(numbers):
            del self._read_bytes[gone]
            for chunk_id in [c for c, at in self._live.items() if at.pack == gone]:
                del self._live[chunk_id]

    def _follow(self, number: int) -> None:
        done = self._read_bytes.get(number, 0)
        try:
            pack_bytes = os.stat(self.packs_dir / pack_name(number, "pack")).st_size
            with open(self.packs_dir / pack_name(number, "idx"), "rb") as f:
                if os.fstat(f.fileno()).st_size < done:  # cut back by the cache's recovery
                    done = 0
                    for chunk_id in [c for c, at in self._live.items() if at.pack == number]:
                        del self._live[chunk_id]
                f.seek(done)
                data = f.read()
        except OSError:
            return
        entries, good = decode_entries(data, pack_bytes)
        apply_entries(self._live, number, entries)
        self._read_bytes[number] = done + good
