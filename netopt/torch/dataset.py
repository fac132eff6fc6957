"""`CachedDataset`: a map-style dataset over a synced dataset's files, with prefetch and
access records that feed the node cache's eviction statistics.

Works without importing torch (a DataLoader only needs ``__len__``/``__getitem__``).

Multi-process design (DataLoader workers):

- Everything process-local (the prefetch thread pool, the in-memory LRU of
  prefetched bytes, the journal file handle) is created lazily on the first
  ``__getitem__`` in a new PID and is never pickled, so fork and spawn both work.
- Each process appends one JSON line per event to its own journal file
  ``JOURNAL_DIR/reads-PID.jsonl`` (``["r", path, hit]`` for a read, ``["p", path]``
  for a prefetch), line-buffered, so no locking between processes is needed.
- `CachedDataset.feed_cache` (call it in the main process, e.g. after an epoch)
  opens the cache, turns the journal lines not yet ingested into chunk reads
  (``Cache.record_reads``) and stores per-journal byte offsets so a line is fed
  exactly once. The cache's lock is never held by a worker.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netopt.errors import StorageError, ValidationError
from netopt.fsutil import atomic_write_bytes

__all__ = ["CachedDataset", "CachedSampler", "JournalStats"]

_OFFSETS_FILE = "ingested.json"


@dataclass(frozen=True)
class JournalStats:
    """What every process's journal says: reads and prefetches per file, prefetch hits."""

    reads: Counter[str]
    prefetches: Counter[str]
    prefetch_hits: int


class _ProcessState:
    """Per-process prefetcher, LRU and journal (never pickled)."""

    def __init__(self, journal_path: Path, threads: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="netopt-prefetch")
        self.lock = threading.Lock()
        self.lru: OrderedDict[int, bytes] = OrderedDict()
        self.lru_bytes = 0
        self.pending: dict[int, Future[bytes]] = {}
        self.journal = journal_path.open("a", buffering=1, encoding="utf-8")

    def log(self, event: list[object]) -> None:
        with self.lock:
            if not self.journal.closed:
                self.journal.write(json.dumps(event) + "\n")

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        with self.lock:
            self.journal.close()


def _remove_own_dir(path: str, owner_pid: int) -> None:
    """Remove ``path`` when called in the process ``owner_pid`` (a fork's copy of the
    object is collected in the worker, which must leave the directory alone)."""
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)


class CachedDataset:
    """Map-style dataset: sample ``i`` is ``decode(bytes of files[i])``.

    ``root`` is a DEST directory written by ``netopt sync``. With ``cache_dir`` and
    ``dataset`` the file list and chunk lists come from the cache's current
    manifest of that dataset (read once here, the lock released at once); without
    them every regular file under ``root`` is used, in path order. ``prefetch_depth``
    files ahead of the sampler order (`set_order`, default 0..n-1) are read by
    ``prefetch_threads`` background threads into an LRU of at most
    ``memory_bytes``. ``journal_dir`` defaults to a new temporary directory, removed
    with the dataset (garbage-collected, or at exit) by the process that made it.
    Raises ValidationError for an empty dataset or bad bounds, StorageError or
    ValidationError from the cache when its manifest cannot be read.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        decode: Callable[[bytes], Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        dataset: str | None = None,
        prefetch_depth: int = 8,
        prefetch_threads: int = 2,
        memory_bytes: int = 256 * 1024**2,
        journal_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if prefetch_depth < 0 or prefetch_threads < 1 or memory_bytes < 0:
            raise ValidationError(
                "prefetch_depth must be >= 0, prefetch_threads >= 1, memory_bytes >= 0"
            )
        if (cache_dir is None) != (dataset is None):
            raise ValidationError("give both cache_dir and dataset, or neither")
        self.root = Path(root)
        self.decode = decode
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.dataset = dataset
        self.prefetch_depth = prefetch_depth
        self.prefetch_threads = prefetch_threads
        self.memory_bytes = memory_bytes
        self.chunks: dict[str, tuple[str, ...]] = {}
        if self.cache_dir is not None and dataset is not None:
            from netopt.cache.store import Cache

            with Cache.open(self.cache_dir) as cache:
                manifest = cache.manifest(dataset)
            self.files = [f.path for f in manifest.files]
            self.chunks = {f.path: tuple(r.chunk_id for r in f.chunks) for f in manifest.files}
        else:
            self.files = sorted(
                p.relative_to(self.root).as_posix()
                for p in self.root.rglob("*")
                if p.is_file() and not p.is_symlink() and ".netopt" not in p.parts
            )
        if not self.files:
            raise ValidationError(f"dataset under {self.root} has no files")
        jd = journal_dir
        if not jd:
            jd = tempfile.mkdtemp(prefix="netopt-reads-")
            # Its own: gone with it, never with a worker's copy (pickled or forked).
            weakref.finalize(self, _remove_own_dir, jd, os.getpid())
        self.journal_dir = Path(jd)
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        self.order: list[int] = list(range(len(self.files)))
        self._position = {i: p for p, i in enumerate(self.order)}
        self._pid = -1
        self._state: _ProcessState | None = None

    # -- pickling: process-local state stays behind ----------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_state"] = None
        state["_pid"] = -1
        return state

    def _local(self) -> _ProcessState:
        if self._state is None or self._pid != os.getpid():
            self._pid = os.getpid()
            path = self.journal_dir / f"reads-{self._pid}.jsonl"
            self._state = _ProcessState(path, self.prefetch_threads)
        return self._state

    def close(self) -> None:
        """Stop this process's prefetch threads and close its journal (reopened on use)."""
        if self._state is not None and self._pid == os.getpid():
            self._state.close()
        self._state = None

    # -- the dataset protocol ------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.files)

    def set_order(self, order: Sequence[int]) -> None:
        """The sampler's order for the coming epoch (call before iterating the DataLoader,
        so worker processes started for the epoch see it). ValidationError if out of range."""
        if any(not 0 <= i < len(self.files) for i in order):
            raise ValidationError(f"order holds an index outside 0..{len(self.files) - 1}")
        self.order = list(order)
        self._position = {}
        for p, i in enumerate(self.order):
            self._position.setdefault(i, p)

    def _read(self, index: int) -> bytes:
        path = self.root / self.files[index]
        try:
            return path.read_bytes()
        except OSError as exc:
            raise StorageError(f"cannot read dataset file {path}: {exc}") from exc

    def _prefetch_one(self, st: _ProcessState, index: int) -> bytes:
        data = self._read(index)
        st.log(["p", self.files[index]])
        with st.lock:
            st.pending.pop(index, None)
            if len(data) <= self.memory_bytes:
                st.lru[index] = data
                st.lru_bytes += len(data)
                while st.lru_bytes > self.memory_bytes:
                    _, old = st.lru.popitem(last=False)
                    st.lru_bytes -= len(old)
        return data

    def _schedule(self, st: _ProcessState, index: int) -> None:
        pos = self._position.get(index)
        if pos is None or self.prefetch_depth == 0:
            return
        with st.lock:
            for nxt in self.order[pos + 1 : pos + 1 + self.prefetch_depth]:
                if nxt != index and nxt not in st.lru and nxt not in st.pending:
                    st.pending[nxt] = st.pool.submit(self._prefetch_one, st, nxt)

    def __getitem__(self, index: int) -> Any:
        """Sample ``index`` (decoded); reads are journaled and prefetch is scheduled.

        Raises IndexError out of range, StorageError when the file cannot be read.
        """
        if not 0 <= index < len(self.files):
            raise IndexError(index)
        st = self._local()
        with st.lock:
            data = st.lru.pop(index, None)
            if data is not None:
                st.lru_bytes -= len(data)
            fut = st.pending.get(index) if data is None else None
        hit = data is not None or fut is not None
        self._schedule(st, index)
        if data is None:
            data = fut.result() if fut is not None else self._read(index)
            if fut is not None:
                with st.lock:
                    if st.lru.pop(index, None) is not None:
                        st.lru_bytes -= len(data)
        st.log(["r", self.files[index], hit])
        return self.decode(data) if self.decode is not None else data

    # -- access records --------------------------------------------------------------------

    def _journals(self) -> list[Path]:
        return sorted(self.journal_dir.glob("reads-*.jsonl"))

    def journal_stats(self) -> JournalStats:
        """Reads and prefetches recorded so far by every process (from the journals)."""
        reads: Counter[str] = Counter()
        prefetches: Counter[str] = Counter()
        hits = 0
        for path in self._journals():
            for event in _events(path.read_bytes()):
                if event[0] == "r":
                    reads[str(event[1])] += 1
                    hits += bool(event[2])
                elif event[0] == "p":
                    prefetches[str(event[1])] += 1
        return JournalStats(reads, prefetches, hits)

    def feed_cache(self) -> int:
        """Feed the journal reads not yet fed into the cache's access statistics.

        Returns the number of file reads fed (0 without a cache). Each journal line
        is fed once (byte offsets are kept in ``JOURNAL_DIR/ingested.json``). Raises
        StorageError when the cache cannot be opened (it waits up to 30 s for a sync).
        """
        if self.cache_dir is None:
            return 0
        from netopt.cache.store import Cache

        offsets_path = self.journal_dir / _OFFSETS_FILE
        try:
            offsets: dict[str, int] = json.loads(offsets_path.read_text())
        except (OSError, ValueError):
            offsets = {}
        chunk_ids: list[str] = []
        fed = 0
        for path in self._journals():
            raw = path.read_bytes()
            start = offsets.get(path.name, 0)
            end = raw.rfind(b"\n") + 1  # complete lines only; a line being written waits
            for event in _events(raw[start:end]):
                if event[0] == "r":
                    fed += 1
                    chunk_ids.extend(self.chunks.get(str(event[1]), ()))
            offsets[path.name] = max(start, end)
        with Cache.open(self.cache_dir) as cache:
            cache.record_reads(chunk_ids)
        atomic_write_bytes(offsets_path, json.dumps(offsets).encode())
        return fed


def _events(raw: bytes) -> Iterator[list[Any]]:
    for line in raw.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a torn last line of a killed worker
        if isinstance(event, list) and event:
            yield event


class CachedSampler:
    """A sampler that tells its `CachedDataset` the order, so prefetch follows it.

    Like DistributedSampler: the order of an epoch is a seeded permutation fixed by
    `set_epoch` (call it before ``iter(loader)``, so freshly started workers see it).
    """

    def __init__(self, dataset: CachedDataset, *, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Fix the order of ``epoch`` and hand it to the dataset."""
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        self.dataset.set_order(order)

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.dataset.order))

    def __len__(self) -> int:
        return len(self.dataset)
