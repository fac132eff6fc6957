"""The node's chunk cache on disk: BLAKE3-named chunks, a manifest per dataset version, an index.

Layout under the cache directory::

    lock                          flock: one process changes the cache at a time
    index.json                    pins, current version per dataset, capacity, read counts
    chunks/ab/abcdef...           one file per verified chunk of PACK_MAX_CHUNK_BYTES or more
                                  (fan-out by the first two hex digits)
    packs/00000001.pack, .idx     the smaller chunks, appended to packs (`netopt.cache.packs`)
    manifests/NAME/MANIFEST_ID.json
    tmp/CHUNK_ID.N                chunks written, not yet durable and in place

The chunk files are the truth: a chunk file exists only once its bytes were
written under a temporary name, made durable and renamed, so it is complete.
`Cache.put` does not wait for the disk: it writes ``tmp/CHUNK_ID.N`` and hands it
to a `netopt.durable.BatchFlusher`, which makes the chunks written meanwhile
durable together (one ``syncfs`` for many) and then renames them into
``chunks/``; until then the chunk is read from its temporary file. A small chunk
is appended to the active pack instead, and is indexed once the pack is durable
(`netopt.cache.packs`: no create or rename per chunk). `Cache.flush` waits for both;
the index is saved, and a sync reports success, only after it.
The index only holds what cannot be rebuilt from the chunks (pins, read counts)
and is replaced atomically; on open it is checked against the chunk files (read
counts of vanished chunks are dropped, versions whose manifest file is missing
are forgotten), and each file left in ``tmp/`` by a killed process is kept (made
durable and put in place) if it hashes to its name, else removed; so a SIGKILL at
any moment leaves a usable, consistent cache that has lost no verified chunk.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import blake3

from netopt.cache.packfmt import PACK_MAX_CHUNK_BYTES
from netopt.cache.packs import PackStore
from netopt.cache.policy import ChunkAccess, age_access, evict, needs_aging, record_access
from netopt.cache.storedmanifests import stored_manifest_bytes
from netopt.cachepaths import MANIFESTS_DIR, manifest_file
from netopt.dataplane import trace
from netopt.durable import BatchFlusher
from netopt.errors import IntegrityError, StorageError, ValidationError
from netopt.fsutil import atomic_write_bytes, fsync_dirs
from netopt.names import is_dataset_name, is_hash_id, validate_dataset_name
from netopt.transfer.manifest import (
    Manifest,
    manifest_from_dict,
    validate_chunk_id,
)

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_CAPACITY_BYTES", "Cache"]

DEFAULT_CAPACITY_BYTES = 100 * 1024**3
_INDEX_VERSION = 1
_LOCK_WAIT_S = 30.0


def _no_space(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data`` (plain descriptor calls: a tree stores thousands
    of small chunks, and a file object costs more than the write)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class Cache:
    """An open cache directory; holds its lock until `close`. Thread-safe.

    Use `Cache.open(root)` as a context manager. ``in_use`` holds chunks the
    current operation needs (a sync's manifest): eviction never takes them.
    """

    def __init__(self, root: Path, capacity_bytes: int | None) -> None:
        self.root = root
        self.chunks_dir = root / "chunks"
        self.manifests_dir = root / MANIFESTS_DIR
        self.tmp_dir = root / "tmp"
        self._lock = threading.RLock()
        self._lock_fd = -1
        self.sizes_bytes: dict[str, int] = {}
        self.access: dict[str, ChunkAccess] = {}
        self.pins: set[str] = set()
        self.datasets: dict[str, str] = {}
        self.in_use: set[str] = set()
        self._dirty_dirs: set[Path] = set()
        """Chunk directories with entries removed since the last `save_index`."""
        self._used_bytes = 0
        self._pending: dict[str, Path] = {}
        """Chunks written to ``tmp/`` and not yet durable in ``chunks/``: their temporary files."""
        self._flusher = BatchFlusher("netopt-cache-flush")
        self.packs = PackStore(root / "packs", "netopt-cache-packs")
        self._tmp_names = itertools.count()
        self._chunk_dirs: set[Path] = set()
        self._dev = 0
        self.tick = 0
        self._pinned_memo: tuple[frozenset[tuple[str, str]], frozenset[str]] | None = None
        self.capacity_bytes = capacity_bytes or DEFAULT_CAPACITY_BYTES
        self._capacity_given = capacity_bytes is not None

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    def open(cls, root: str | os.PathLike[str], capacity_bytes: int | None = None) -> Cache:
        """Open (creating) the cache at ``root``; waits up to 30 s for another user.

        ``capacity_bytes`` None keeps the capacity stored in the index (default
        100 GiB). Raises StorageError when the directory cannot be used or stays locked.
        """
        cache = cls(Path(root), capacity_bytes)
        try:
            for d in (cache.root, cache.chunks_dir, cache.manifests_dir, cache.tmp_dir):
                d.mkdir(parents=True, exist_ok=True)
            cache._take_lock()
            cache._dev = os.stat(cache.tmp_dir).st_dev
            cache._adopt_leftovers()
            cache.sizes_bytes.update(cache.packs.open())
            cache._scan_chunks()
            cache._load_index()
        except OSError as exc:
            cache._release_lock()
            raise StorageError(f"cannot use cache directory {root}: {exc}") from exc
        except BaseException:
            cache._release_lock()
            raise
        return cache

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Make the chunks durable, save the index and release the lock (StorageError when
        the disk refuses either; the cache stays consistent)."""
        if self._lock_fd < 0:
            return
        try:
            self.save_index()
        finally:
            with contextlib.suppress(StorageError):
                self._flusher.close()
            with contextlib.suppress(StorageError):
                self.packs.close()
            self._release_lock()

    def _take_lock(self) -> None:
        self._lock_fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline_s = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline_s:
                    raise StorageError(f"cache {self.root} is locked by another process") from None
                time.sleep(0.1)

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _adopt_leftovers(self) -> None:
        """Put in place (durably) each chunk a killed process left in ``tmp/`` that hashes
        to its name; remove everything else there."""
        for stale in self.tmp_dir.iterdir():
            chunk_id = stale.name.split(".", 1)[0]
            data = b""
            if is_hash_id(chunk_id) and stale.is_file() and not stale.is_symlink():
                with contextlib.suppress(OSError):
                    data = stale.read_bytes()
            if not data or blake3.blake3(data).hexdigest() != chunk_id:
                stale.unlink(missing_ok=True)
                continue
            final = self.chunk_path(chunk_id)
            final.parent.mkdir(exist_ok=True)
            self._flusher.add(stale, final, len(data), self._dev)
        self._flusher.flush()

    def _scan_chunks(self) -> None:
        for sub in self.chunks_dir.iterdir():
            if not sub.is_dir():
                continue
            self._chunk_dirs.add(sub)
            for entry in os.scandir(sub):
                if is_hash_id(entry.name) and entry.name.startswith(sub.name):
                    self.sizes_bytes[entry.name] = entry.stat().st_size
                    self.packs.remove([entry.name])  # a file and a record: keep one
        self._used_bytes = sum(self.sizes_bytes.values())

    def _load_index(self) -> None:
        path = self.root / "index.json"
        data: Any = {}
        if path.exists():
            try:
                data = json.loads(path.read_text())
                if not isinstance(data, dict) or data.get("version") != _INDEX_VERSION:
                    raise ValueError("unknown index version")
            except ValueError as exc:
                log.warning("cache index %s is unreadable (%s); rebuilding it", path, exc)
                data = {}
        if not self._capacity_given and isinstance(data.get("capacity_bytes"), int):
            self.capacity_bytes = data["capacity_bytes"]
        self.tick = int(data.get("tick", 0))
        self.pins = {str(p) for p in data.get("pins", [])}
        for name, mid in dict(data.get("datasets", {})).items():
            # An index written before names were checked may hold a path: forget it.
            if not (is_dataset_name(name) and is_hash_id(mid)):
                log.warning("cache index %s: ignoring dataset %r (not a dataset name)", path, name)
            elif self._manifest_path(name, mid).is_file():
                self.datasets[name] = mid
        for name_dir in self.manifests_dir.iterdir():
            name = name_dir.name
            if name in self.datasets or not is_dataset_name(name) or not name_dir.is_dir():
                continue
            versions = sorted(
                (p for p in name_dir.glob("*.json") if is_hash_id(p.stem)),
                key=lambda p: p.stat().st_mtime_ns,
            )
            if versions:
                self.datasets[name] = versions[-1].stem
        for cid, (count, tick) in dict(data.get("access", {})).items():
            if cid in self.sizes_bytes:
                self.access[cid] = ChunkAccess(int(count), int(tick))

    def flush(self) -> None:
        """Wait until every chunk stored so far is durable in ``chunks/``.

        StorageError when the disk refused (the chunks not placed are then lost, the
        cache stays consistent)."""
        with trace.timed("cache_flush"):
            self._flusher.flush()
            self.packs.flush()

    def save_index(self) -> None:
        """Write the index atomically, once the chunks stored so far are durable."""
        trace.mark("cache_save_index")
        self.flush()
        lost = self.packs.compact()
        self.packs.sync_indexes()
        with self._lock:
            for chunk_id in lost:
                self._forget(chunk_id)
            if needs_aging(self.access):
                self.access = age_access(self.access)
            data = {
                "version": _INDEX_VERSION,
                "capacity_bytes": self.capacity_bytes,
                "tick": self.tick,
                "pins": sorted(self.pins),
                "datasets": dict(sorted(self.datasets.items())),
                "access": {c: [a.count, a.last_tick] for c, a in sorted(self.access.items())},
            }
            dirty, self._dirty_dirs = self._dirty_dirs, set()
        # Removals (eviction, gc): a removal lost to a crash only brings back a valid chunk.
        try:
            fsync_dirs(dirty)
        except OSError as exc:
            log.debug("cannot fsync the chunk directories: %s", exc)
        atomic_write_bytes(self.root / "index.json", json.dumps(data).encode())
        trace.mark("cache_index_saved")

    # -- chunks --------------------------------------------------------------------------

    def chunk_path(self, chunk_id: str) -> Path:
        """Where a chunk lives (validated name)."""
        validate_chunk_id(chunk_id)
        return self.chunks_dir / chunk_id[:2] / chunk_id

    def has(self, chunk_id: str) -> bool:
        """True when the chunk is stored (complete; not re-verified)."""
        with self._lock:
            return chunk_id in self.sizes_bytes

    @property
    def used_bytes(self) -> int:
        """Bytes of stored chunks."""
        with self._lock:
            return self._used_bytes

    def put(self, chunk_id: str, data: bytes, on_placed: Callable[[], None] | None = None) -> None:
        """Store a verified chunk, evicting unprotected chunks to stay in capacity.

        Returns once the chunk is written (readable, `has` true); it is durable in
        ``chunks/`` after the next `flush` (which `save_index` and `close` do), and
        ``on_placed()`` runs then, on the flusher's thread (where peers can read it).
        Raises StorageError when the disk is full or the capacity cannot hold the
        pinned and in-use chunks; the cache is then unchanged apart from evictions.
        """
        validate_chunk_id(chunk_id)
        with self._lock:
            if chunk_id in self.sizes_bytes:
                return
            self._make_room(len(data))
        if len(data) < PACK_MAX_CHUNK_BYTES:
            self._put_packed([(chunk_id, data, on_placed)])
            return
        final = self.chunk_path(chunk_id)
        tmp = self.tmp_dir / f"{chunk_id}.{next(self._tmp_names)}"
        try:
            if final.parent not in self._chunk_dirs:
                final.parent.mkdir(exist_ok=True)
                self._chunk_dirs.add(final.parent)
            with trace.timed("cache_put_write"):
                _write_new(tmp, data)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self._store_error(chunk_id, exc) from exc
        with self._lock:
            if chunk_id in self.sizes_bytes:  # another thread stored it meanwhile
                tmp.unlink(missing_ok=True)
                return
            self.sizes_bytes[chunk_id] = len(data)
            self._used_bytes += len(data)
            self._pending[chunk_id] = tmp
        try:
            self._flusher.add(
                tmp, final, len(data), self._dev,
                on_commit=lambda placed: self._placed(chunk_id, tmp, placed, on_placed),
            )  # fmt: skip
        except StorageError as exc:
            with self._lock:
                self._pending.pop(chunk_id, None)
                self._forget(chunk_id)
            tmp.unlink(missing_ok=True)
            raise self._store_error(chunk_id, exc) from exc

    def put_many(self, items: Sequence[tuple[str, bytes, Callable[[], None] | None]]) -> None:
        """`put` for several verified chunks (name, bytes, ``on_placed``): the small ones
        (under `PACK_MAX_CHUNK_BYTES`) are appended to the active pack with one write
        (`PackStore.append_many`), the others stored one by one. StorageError as `put`:
        then none of the small ones is stored."""
        small: list[tuple[str, bytes, Callable[[], None] | None]] = []
        for chunk_id, data, on_placed in items:
            validate_chunk_id(chunk_id)
            if len(data) >= PACK_MAX_CHUNK_BYTES:
                self.put(chunk_id, data, on_placed)
            else:
                small.append((chunk_id, data, on_placed))
        with self._lock:
            self._make_room(sum(len(d) for c, d, _ in small if c not in self.sizes_bytes))
        self._put_packed(small)

    def _put_packed(self, items: Sequence[tuple[str, bytes, Callable[[], None] | None]]) -> None:
        """Book and append small chunks to the pack, with one write; the ones already
        stored (or twice in ``items``) are skipped. On a failure none is kept."""
        fresh: dict[str, tuple[bytes, Callable[[], None] | None]] = {}
        with self._lock:
            for chunk_id, data, on_placed in items:
                if chunk_id in self.sizes_bytes:  # another thread stored it meanwhile
                    continue
                fresh[chunk_id] = (data, on_placed)
                self.sizes_bytes[chunk_id] = len(data)
                self._used_bytes += len(data)
        if not fresh:
            return
        try:
            with trace.timed("cache_put_pack"):
                self.packs.append_many([
                    (chunk_id, data, self._on_packed(chunk_id, on_placed))
                    for chunk_id, (data, on_placed) in fresh.items()
                ])  # fmt: skip
        except (OSError, StorageError) as exc:
            with self._lock:
                for chunk_id in fresh:
                    if not self.packs.holds(chunk_id):
                        self._forget(chunk_id)
            raise self._store_error(next(iter(fresh)), exc) from exc

    def _on_packed(
        self, chunk_id: str, on_placed: Callable[[], None] | None
    ) -> Callable[[bool], None]:
        """The pack's ``on_commit`` for ``chunk_id``: `_placed_packed`."""
        return lambda placed: self._placed_packed(chunk_id, placed, on_placed)

    def _placed_packed(
        self, chunk_id: str, placed: bool, on_placed: Callable[[], None] | None
    ) -> None:
        if not placed:
            with self._lock:
                if not self.packs.holds(chunk_id) and chunk_id not in self._pending:
                    self._forget(chunk_id)
            return
        if on_placed is not None:
            on_placed()

    def _store_error(self, chunk_id: str, exc: Exception) -> StorageError:
        what = "the disk is full" if isinstance(exc, OSError) and _no_space(exc) else str(exc)
        return StorageError(
            f"cannot store chunk {chunk_id[:16]} in cache {self.root}: {what}; "
            "the cache is consistent (free space or lower the capacity and retry)"
        )

    def _placed(
        self, chunk_id: str, tmp: Path, placed: bool, on_placed: Callable[[], None] | None
    ) -> None:
        """The flusher is done with ``tmp``: durable in place, or (``placed`` False) gone."""
        with self._lock:
            if self._pending.get(chunk_id) != tmp:
                return  # removed meanwhile
            del self._pending[chunk_id]
            if not placed:
                self._forget(chunk_id)
                return
        if on_placed is not None:
            on_placed()

    def _forget(self, chunk_id: str) -> int:
        """Drop a chunk from the books (the caller holds the lock); its size."""
        size_bytes = self.sizes_bytes.pop(chunk_id, 0)
        self._used_bytes -= size_bytes
        self.access.pop(chunk_id, None)
        return size_bytes

    def _make_room(self, incoming_bytes: int) -> None:
        if self._used_bytes + incoming_bytes <= self.capacity_bytes:
            return
        # Evict down to a low-water mark so a full cache does not sort on every put.
        slack_bytes = max(incoming_bytes, self.capacity_bytes // 20)
        target_bytes = max(0, self.capacity_bytes - slack_bytes)
        self.remove(evict(self.sizes_bytes, target_bytes, self.protected(), self.access))
        if self._used_bytes + incoming_bytes > self.capacity_bytes:
            raise StorageError(
                f"cache {self.root}: capacity {self.capacity_bytes} bytes cannot hold the "
                "pinned and in-use data; raise cache.capacity_bytes or unpin a dataset"
            )

    def read(self, chunk_id: str, *, record: bool = True) -> bytes:
        """A stored chunk, verified; a read counts toward its access statistics.

        Raises KeyError when absent, IntegrityError when it no longer verifies (it
        is then removed), StorageError when it cannot be read.
        """
        try:
            data = self._read_file(chunk_id)
        except FileNotFoundError:
            with self._lock:
                if chunk_id not in self._pending:
                    self._forget(chunk_id)
            raise KeyError(chunk_id) from None
        except OSError as exc:
            raise StorageError(f"cannot read cached chunk {chunk_id[:16]}: {exc}") from exc
        if blake3.blake3(data).hexdigest() != chunk_id:
            self.remove([chunk_id])
            raise IntegrityError(f"cached chunk {chunk_id[:16]} no longer verifies; removed it")
        if record:
            self.record_reads([chunk_id])
        return data

    def _read_file(self, chunk_id: str) -> bytes:
        final = self.chunk_path(chunk_id)
        packed = self.packs.read(chunk_id)
        if packed is not None:
            return packed
        with self._lock:
            tmp = self._pending.get(chunk_id)
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):  # placed meanwhile
                return tmp.read_bytes()
        return final.read_bytes()

    def record_reads(self, chunk_ids: Iterable[str]) -> None:
        """Feed reads (from syncs, the torch dataset, ...) into the access statistics."""
        with self._lock:
            for cid in chunk_ids:
                self.tick += 1
                self.access[cid] = record_access(self.access.get(cid), self.tick)

    def remove(self, chunk_ids: Iterable[str]) -> int:
        """Delete chunks; the bytes freed."""
        freed = 0
        with self._lock:
            for cid in list(chunk_ids):
                path = self.chunk_path(cid)
                self.packs.remove([cid])
                tmp = self._pending.pop(cid, None)
                if tmp is not None:  # the flusher finds it gone (or has just placed it)
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    self._dirty_dirs.add(path.parent)
                freed += self._forget(cid)
        return freed

    def iter_chunk_ids(self) -> Iterator[str]:
        """A snapshot of the stored chunk names."""
        with self._lock:
            return iter(sorted(self.sizes_bytes))

    # -- manifests and pins ----------------------------------------------------------------

    def _manifest_path(self, name: str, manifest_id: str) -> Path:
        """``manifests/NAME/ID.json``; PathTraversalError unless both are checked names."""
        return manifest_file(self.root, name, manifest_id)

    def add_manifest(self, manifest: Manifest) -> str:
        """Store a dataset version and make it the dataset's current one; its id."""
        mid = manifest.manifest_id
        path = self._manifest_path(manifest.name, mid)
        if stored_manifest_bytes(self.root, manifest.name, mid) is None:  # missing or damaged
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageError(f"cannot create {path.parent}: {exc}") from exc
            atomic_write_bytes(path, manifest.canonical_json)
        with self._lock:
            self.datasets[manifest.name] = mid
        return mid

    def manifest(self, name: str, manifest_id: str | None = None) -> Manifest:
        """A stored version (default: the current one). ValidationError if unknown."""
        mid = manifest_id or self.datasets.get(name)
        if mid is None:
            raise ValidationError(f"cache {self.root} holds no dataset {name!r}")
        try:
            return manifest_from_dict(json.loads(self._manifest_path(name, mid).read_bytes()))
        except (OSError, ValueError) as exc:
            raise StorageError(f"cannot read manifest {name}/{mid[:16]}: {exc}") from exc

    def versions(self, name: str) -> list[str]:
        """The stored manifest ids of a dataset (PathTraversalError for a bad name)."""
        found = (self.manifests_dir / validate_dataset_name(name)).glob("*.json")
        return sorted(p.stem for p in found if is_hash_id(p.stem))

    def pin(self, name: str) -> None:
        """Keep a dataset's current version from eviction. ValidationError if unknown."""
        if name not in self.datasets:
            raise ValidationError(f"cache {self.root} holds no dataset {name!r}")
        with self._lock:
            self.pins.add(name)

    def unpin(self, name: str) -> None:
        """Let a dataset be evicted again (no-op when it was not pinned)."""
        with self._lock:
            self.pins.discard(name)

    def protected(self) -> set[str]:
        """Chunks eviction must not take: those of pinned datasets and those in use."""
        key = frozenset((n, self.datasets[n]) for n in self.pins if n in self.datasets)
        if self._pinned_memo is None or self._pinned_memo[0] != key:
            chunks: set[str] = set()
            for name, mid in key:
                chunks.update(self.manifest(name, mid).unique_chunks())
            self._pinned_memo = (key, frozenset(chunks))
        return set(self.in_use) | self._pinned_memo[1]

    def evict_to(self, capacity_bytes: int | None = None) -> tuple[str, ...]:
        """Run the eviction policy down to ``capacity_bytes`` (default: the capacity)."""
        target = self.capacity_bytes if capacity_bytes is None else capacity_bytes
        with self._lock:
            victims = evict(self.sizes_bytes, target, self.protected(), self.access)
            self.remove(victims)
        return victims

    def referenced(self, all_versions: bool = False) -> dict[str, int]:
        """Chunk name -> length over the current (or every stored) dataset version."""
        out: dict[str, int] = {}
        for name, current in list(self.datasets.items()):
            for mid in self.versions(name) if all_versions else [current]:
                out.update(self.manifest(name, mid).unique_chunks())
        return out

    def gc(self) -> tuple[int, int]:
        """Drop old dataset versions and the chunks no current version uses.

        Returns (chunks removed, bytes freed).
        """
        for name, current in list(self.datasets.items()):
            for mid in self.versions(name):
                if mid != current:
                    self._manifest_path(name, mid).unlink(missing_ok=True)
        keep = self.referenced() | dict.fromkeys(self.in_use, 0)
        with self._lock:
            orphans = [c for c in self.sizes_bytes if c not in keep]
        return len(orphans), self.remove(orphans)
