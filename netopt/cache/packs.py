"""The cache's packs of small chunks: appending, durability, recovery, compaction.

The format is `netopt.cache.packfmt`'s. `PackStore.append` writes a record at the end
of the active pack and returns at once (the chunk is readable from then on); a thread
lets appends gather for `netopt.durable.GATHER_S`, makes each pack written to durable
(one ``fdatasync`` per pack per batch) and only then appends the batch's index entries
and runs the appenders' callbacks: so what the index names is on disk, as a chunk file
is only renamed into place once durable. `PackStore.flush` waits for that.

On open each pack is read back: its index up to the last good entry, then every record
after the last indexed one, each kept only if it hashes to its name; the pack is cut
after the last good record and the index completed. A kill at any moment therefore
loses no chunk that was durable and keeps no torn one. A removal appends a tombstone;
removed records are dead bytes, and a sealed pack that is at least half dead is
compacted (its live records copied to the active pack, then the pack deleted), so
dead bytes stay under about half of the packs' size.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import blake3

from netopt.cache.packfmt import (
    ENTRY_BYTES,
    RECORD_HEADER_BYTES,
    TOMBSTONE,
    Entry,
    Location,
    apply_entries,
    decode_entries,
    encode_entry,
    encode_record_header,
    pack_name,
    pack_number,
    parse_record_header,
    read_at,
)
from netopt.durable import commit_failure, gather, run_callbacks
from netopt.errors import StorageError
from netopt.fsutil import fsync_dirs

__all__ = ["PACK_TARGET_BYTES", "PackItem", "PackStore"]

log = logging.getLogger(__name__)

PACK_TARGET_BYTES = 64 * 1024 * 1024
"""A pack this large is sealed and a new one started."""
MAX_PENDING_RECORDS = 16384
"""Records appended and not yet durable beyond which `PackStore.append` waits."""
COMPACT_LIVE_SHARE = 0.5
"""A sealed pack whose live records are less than this share of it is compacted."""
COMPACT_MAX_BYTES = 256 * 1024 * 1024
"""Live bytes copied by one `PackStore.compact` at most (the rest waits for the next)."""


PackItem = tuple[str, bytes, "Callable[[bool], None] | None"]
"""A chunk to append: its name, its bytes and its ``on_commit(placed)`` (or None)."""


@dataclass(frozen=True, slots=True)
class _Pending:
    chunk_id: str
    at: Location
    on_commit: Callable[[bool], None] | None


class PackStore:
    """The packs of one cache directory (the cache lock held). Thread-safe."""

    def __init__(self, packs_dir: Path, name: str) -> None:
        self.dir = packs_dir
        self.name = name
        self._cond = threading.Condition()
        self.live: dict[str, Location] = {}
        self._pack_bytes: dict[int, int] = {}
        self._live_bytes: dict[int, int] = {}
        self._active = 1
        self._fds: dict[int, int] = {}
        """Write descriptors of the active pack and of sealed packs with pending records."""
        self._pending: list[_Pending] = []
        self._unplaced: set[Location] = set()
        """Records appended and not yet committed (pending, or in the batch being committed)."""
        self._added = 0
        self._done = 0
        self._urgent = 0
        self._closing = False
        self._error: StorageError | None = None
        self._thread: threading.Thread | None = None
        self._dirty_indexes: set[int] = set()

    # -- opening ---------------------------------------------------------------------------

    def open(self) -> dict[str, int]:
        """Recover every pack (module doc); chunk name -> length of the packed chunks."""
        self.dir.mkdir(exist_ok=True)
        numbers = sorted(n for n in map(pack_number, os.listdir(self.dir)) if n is not None)
        for number in numbers:
            self._recover(number)
        for name in os.listdir(self.dir):  # an index whose pack is gone (compacted)
            if name.endswith(".idx") and pack_number(name[:-4] + ".pack") not in numbers:
                (self.dir / name).unlink(missing_ok=True)
        for at in self.live.values():
            self._live_bytes[at.pack] = self._live_bytes.get(at.pack, 0) + _record_bytes(at)
        if numbers:
            last = numbers[-1]
            self._active = last if self._pack_bytes[last] < PACK_TARGET_BYTES else last + 1
        return {chunk_id: at.length for chunk_id, at in self.live.items()}

    def _recover(self, number: int) -> None:
        pack_path = self.dir / pack_name(number, "pack")
        index_path = self.dir / pack_name(number, "idx")
        pack_bytes = pack_path.stat().st_size
        try:
            index = index_path.read_bytes()
        except FileNotFoundError:
            index = b""
        entries, good_bytes = decode_entries(index, pack_bytes)
        covered = max((e.offset + e.length for e in entries if not e.removal), default=0)
        found, end = _walk(pack_path, covered, pack_bytes)
        if end < pack_bytes:
            log.warning("cache pack %s: dropping %d bytes after its last good record",
                        pack_path, pack_bytes - end)  # fmt: skip
            os.truncate(pack_path, end)
        if good_bytes < len(index) or found:
            with open(index_path, "r+b" if index_path.exists() else "wb") as f:
                f.truncate(good_bytes)
                f.seek(good_bytes)
                f.write(b"".join(encode_entry(e.digest, e.offset, e.length) for e in found))
                f.flush()
                os.fsync(f.fileno())
        apply_entries(self.live, number, [*entries, *found])
        self._pack_bytes[number] = end

    # -- writing ---------------------------------------------------------------------------

    def append(
        self, chunk_id: str, data: bytes, on_commit: Callable[[bool], None] | None = None
    ) -> None:
        """Append a verified chunk; readable at once, durable after the next batch, when
        ``on_commit(placed)`` runs on the store's thread. StorageError when the disk
        refuses (the pack is then cut back: nothing torn is left in it)."""
        self.append_many([(chunk_id, data, on_commit)])

    def append_many(self, items: Sequence[PackItem]) -> None:
        """`append` for several chunks (name, bytes, ``on_commit``) with one write: a
        tree's small files arrive as groups of small frames, and a write per chunk was
        half the cost of storing them. All are appended, or none (the pack is cut back)."""
        if not items:
            return
        records = [encode_record_header(bytes.fromhex(cid), len(data)) for cid, data, _ in items]
        blob = b"".join(part for header, (_, data, _) in zip(records, items, strict=True)
                        for part in (header, data))  # fmt: skip
        with self._cond:
            while self._error is None and len(self._pending) >= MAX_PENDING_RECORDS:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            if self._closing:
                raise StorageError(f"{self.name}: the pack store is closed")
            number, fd = self._writer(len(blob))
            start = self._pack_bytes.get(number, 0)
            try:
                view = memoryview(blob)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                    os.lseek(fd, start, os.SEEK_SET)
                raise
            self._pack_bytes[number] = start + len(blob)
            offset = start
            for chunk_id, data, on_commit in items:
                at = Location(number, offset + RECORD_HEADER_BYTES, len(data))
                offset += RECORD_HEADER_BYTES + len(data)
                moved = self.live.pop(chunk_id, None)
                if moved is not None:  # compaction: the newer pack wins on open, no tombstone
                    self._live_bytes[moved.pack] -= _record_bytes(moved)
                self.live[chunk_id] = at
                self._unplaced.add(at)
                self._pending.append(_Pending(chunk_id, at, on_commit))
            self._live_bytes[number] = self._live_bytes.get(number, 0) + len(blob)
            self._added += len(items)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            if len(self._pending) == len(items):
                self._cond.notify_all()

    def _writer(self, record_bytes: int) -> tuple[int, int]:
        """The active pack's number and write descriptor (sealing a full one)."""
        size = self._pack_bytes.get(self._active, 0)
        if size and size + record_bytes > PACK_TARGET_BYTES:
            if not any(at.pack == self._active for at in self._unplaced):
                self._close_fd(self._active)
            self._active += 1
        fd = self._fds.get(self._active)
        if fd is None:
            path = self.dir / pack_name(self._active, "pack")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            os.lseek(fd, self._pack_bytes.setdefault(self._active, 0), os.SEEK_SET)
            self._fds[self._active] = fd
        return self._active, fd

    def _close_fd(self, number: int) -> None:
        fd = self._fds.pop(number, None)
        if fd is not None:
            os.close(fd)

    def read(self, chunk_id: str) -> bytes | None:
        """A packed chunk's stored bytes (unverified), None when it is not packed."""
        for _ in range(2):
            with self._cond:
                at = self.live.get(chunk_id)
            if at is None:
                return None
            with contextlib.suppress(FileNotFoundError):  # compacted meanwhile: look again
                return read_at(self.dir / pack_name(at.pack, "pack"), at.offset, at.length)
        return None

    def holds(self, chunk_id: str) -> bool:
        with self._cond:
            return chunk_id in self.live

    def remove(self, chunk_ids: Iterable[str]) -> None:
        """Drop packed chunks (their records become dead bytes; a tombstone each, written
        once per pack)."""
        tombstones: dict[int, list[bytes]] = {}
        with self._cond:
            for chunk_id in chunk_ids:
                at = self.live.pop(chunk_id, None)
                if at is None:
                    continue
                self._live_bytes[at.pack] -= _record_bytes(at)
                if at not in self._unplaced:  # not yet committed: its commit writes one
                    entry = encode_entry(bytes.fromhex(chunk_id), at.offset, TOMBSTONE)
                    tombstones.setdefault(at.pack, []).append(entry)
            for number, entries in tombstones.items():
                try:
                    self._append_index(number, entries)
                except OSError as exc:  # a full disk: the chunks come back on open, verified
                    log.debug("%s: cannot record %d removals: %s", self.name, len(entries), exc)

    def _append_index(self, number: int, entries: list[bytes]) -> None:
        if not entries:
            return
        path = self.dir / pack_name(number, "idx")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            data = memoryview(b"".join(entries))
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        self._dirty_indexes.add(number)

    # -- durability ------------------------------------------------------------------------

    def _take(self) -> list[_Pending] | None:
        with self._cond:
            started = gather(
                self._cond,
                has_work=lambda: bool(self._pending),
                closing=lambda: self._closing,
                enough=lambda: bool(self._urgent) or len(self._pending) >= MAX_PENDING_RECORDS // 2,
            )
            if not started:
                return None
            batch, self._pending = self._pending, []
            self._cond.notify_all()  # room for waiting appenders
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            placed = [False] * len(batch)
            try:
                if self._error is None:
                    placed = self._commit(batch)
            except Exception as exc:  # a disk failure, or a bug: never a flush waiting forever
                with self._cond:
                    self._error = commit_failure(
                        self.name, f"packed chunks durable in {self.dir}", exc
                    )
            with self._cond:
                self._unplaced.difference_update(item.at for item in batch)
                for item, ok in zip(batch, placed, strict=True):
                    if not ok and self.live.get(item.chunk_id) == item.at:
                        del self.live[item.chunk_id]
                        self._live_bytes[item.at.pack] -= _record_bytes(item.at)
            run_callbacks(self.name, zip([item.on_commit for item in batch], placed, strict=True))
            with self._cond:
                self._done += len(batch)
                self._cond.notify_all()

    def _commit(self, batch: list[_Pending]) -> list[bool]:
        numbers = sorted({item.at.pack for item in batch})
        with self._cond:
            fds = {n: self._fds[n] for n in numbers}
        for number in numbers:
            os.fdatasync(fds[number])
        placed: list[bool] = []
        with self._cond:
            by_pack: dict[int, list[bytes]] = {}
            for item in batch:
                digest = bytes.fromhex(item.chunk_id)
                entries = by_pack.setdefault(item.at.pack, [])
                entries.append(encode_entry(digest, item.at.offset, item.at.length))
                ok = self.live.get(item.chunk_id) == item.at
                if not ok:  # removed while pending: a crash must not bring it back
                    entries.append(encode_entry(digest, item.at.offset, TOMBSTONE))
                placed.append(ok)
            for number, entries in by_pack.items():
                self._append_index(number, entries)
            still = {at.pack for at in self._unplaced.difference(item.at for item in batch)}
            for number in numbers:
                if number != self._active and number not in still:
                    self._close_fd(number)
        return placed

    def flush(self) -> None:
        """Wait until every chunk appended so far is durable and indexed."""
        with self._cond:
            target = self._added
            self._urgent += 1
            self._cond.notify_all()
            try:
                # Even after a failure: its batch's callbacks (the books) run first.
                while self._done < target:
                    self._cond.wait()
            finally:
                self._urgent -= 1
            if self._error is not None:
                raise self._error

    def sync_indexes(self) -> None:
        """Make the index files written to since the last call durable (a faster open)."""
        with self._cond:
            dirty, self._dirty_indexes = self._dirty_indexes, set()
        for number in sorted(dirty):
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(self.dir / pack_name(number, "idx"), os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def close(self) -> None:
        """`flush`, then stop the thread and close the packs."""
        try:
            self.flush()
            self.sync_indexes()
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
                thread = self._thread
            if thread is not None:
                thread.join()
            with self._cond:
                for number in list(self._fds):
                    self._close_fd(number)

    # -- compaction ------------------------------------------------------------------------

    def dead_bytes(self) -> int:
        """Bytes of removed records still in the packs."""
        with self._cond:
            return sum(size - self._live_bytes.get(n, 0) for n, size in self._pack_bytes.items())

    def compact(self, max_bytes: int = COMPACT_MAX_BYTES) -> list[str]:
        """Rewrite mostly dead sealed packs (module doc); the chunks found corrupt on the
        way, which are dropped. Call it with no other writer busy (the cache does, after
        a flush)."""
        with self._cond:
            victims = [
                n for n, size in sorted(self._pack_bytes.items())
                if n != self._active and n not in self._fds
                and self._live_bytes.get(n, 0) < COMPACT_LIVE_SHARE * size
            ]  # fmt: skip
        lost: list[str] = []
        budget = max_bytes
        for number in victims:
            with self._cond:
                moving = [(c, at) for c, at in self.live.items() if at.pack == number]
            if sum(at.length for _, at in moving) > budget:
                break
            path = self.dir / pack_name(number, "pack")
            for chunk_id, at in moving:
                data = read_at(path, at.offset, at.length)
                if len(data) != at.length or blake3.blake3(data).hexdigest() != chunk_id:
                    lost.append(chunk_id)
                    self.remove([chunk_id])
                    continue
                self.append(chunk_id, data)
                budget -= at.length
            self.flush()
            with self._cond:
                if any(at.pack == number for at in self.live.values()):
                    continue  # re-added meanwhile: keep the pack
                self._pack_bytes.pop(number, None)
                self._live_bytes.pop(number, None)
                self._dirty_indexes.discard(number)
            path.unlink(missing_ok=True)
            (self.dir / pack_name(number, "idx")).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                fsync_dirs([self.dir])
        return lost


def _record_bytes(at: Location) -> int:
    return RECORD_HEADER_BYTES + at.length


def _walk(path: Path, start: int, size: int) -> tuple[list[Entry], int]:
    """The good records from ``start``: each entry, and where the good ones end."""
    found: list[Entry] = []
    pos = start
    with open(path, "rb") as f:
        f.seek(start)
        while pos + RECORD_HEADER_BYTES <= size:
            parsed = parse_record_header(f.read(RECORD_HEADER_BYTES))
            if parsed is None:
                break
            digest, length = parsed
            data = f.read(length)
            if len(data) != length or blake3.blake3(data).digest() != digest:
                break
            found.append(Entry(digest, pos + RECORD_HEADER_BYTES, length))
            pos += RECORD_HEADER_BYTES + length
    return found, pos


assert ENTRY_BYTES == 48
