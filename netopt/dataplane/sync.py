"""The sync engine: bring a directory up to a manifest from a `ChunkSource` via a `ChunkSink`.

Chunks missing from the sink are fetched by ``streams`` workers in file order,
decoded and verified (BLAKE3 and length) in a thread pool sized to the cores,
retried with exponential backoff when the network or the check fails, and
stored in the sink; a bad chunk is never stored. As soon as every chunk of a
file is in the sink the file is written under a temporary name, fsynced and
renamed into place with its mode and mtime, so files appear whole or not at
all. Chunks already in the sink are not fetched again, which is how an
interrupted sync resumes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netopt.dataplane.assemble import FileAssembler, scan_destination
from netopt.dataplane.chunkio import ChunkSink, ChunkSource, RawChunk, decode_chunk
from netopt.dataplane.held import HeldSink
from netopt.errors import (
    IntegrityError,
    NetoptError,
    NetworkError,
    ProtocolError,
)
from netopt.transfer.manifest import FileEntry, Manifest

log = logging.getLogger(__name__)

__all__ = ["SyncOptions", "SyncProgress", "SyncSummary", "first_error", "sync_manifest"]

_IN_FLIGHT = 4
"""Received chunks per stream that may be verifying or storing while the next arrives."""


@dataclass(frozen=True)
class SyncOptions:
    """How hard to try: parallel fetches and the retry schedule."""

    streams: int = 8
    max_attempts: int = 6
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    worker_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    batch_bytes: int = 8 * 1024 * 1024
    """At most this many logical bytes per request; less near the end, to keep streams even."""
    hold_bytes: int = 128 * 1024 * 1024
    """Verified chunks kept in memory until their files are written (no read-back, no re-hash)."""
    start_fraction: float = 0.0
    """Where in the chunk order to start (0..1), wrapping around: nodes syncing the same
    dataset at once start at different places, so they fetch different chunks first."""


@dataclass(frozen=True)
class SyncProgress:
    """A snapshot for progress bars: logical bytes done of total, bytes on the wire."""

    logical_total_bytes: int
    logical_done_bytes: int
    wire_bytes: int
    fetched_logical_bytes: int
    chunks_total: int
    chunks_done: int


@dataclass(frozen=True)
class SyncSummary:
    """What a sync did. ``logical_bytes`` counts the files written by this run."""

    dataset: str
    files: int
    files_written: int
    files_skipped: int
    chunks_fetched: int
    chunks_reused: int
    chunk_retries: int
    wire_bytes: int
    fetched_logical_bytes: int
    logical_bytes: int
    seconds: float

    @property
    def throughput_bps(self) -> float:
        """Effective throughput: logical bits written per second."""
        return self.logical_bytes * 8 / self.seconds if self.seconds > 0 else 0.0

    @property
    def goodput_bps(self) -> float:
        """Bits on the wire (chunk payloads) per second."""
        return self.wire_bytes * 8 / self.seconds if self.seconds > 0 else 0.0

    @property
    def compression_ratio(self) -> float:
        """Logical bytes fetched per byte on the wire."""
        return self.fetched_logical_bytes / self.wire_bytes if self.wire_bytes else 1.0

    def to_dict(self) -> dict[str, object]:
        """The summary as JSON-able data."""
        return {
            "dataset": self.dataset,
            "files": self.files,
            "files_written": self.files_written,
            "files_skipped": self.files_skipped,
            "chunks_fetched": self.chunks_fetched,
            "chunks_reused": self.chunks_reused,
            "chunk_retries": self.chunk_retries,
            "wire_bytes": self.wire_bytes,
            "logical_bytes": self.logical_bytes,
            "fetched_logical_bytes": self.fetched_logical_bytes,
            "compression_ratio": round(self.compression_ratio, 3),
            "seconds": round(self.seconds, 3),
            "throughput_mbps": round(self.throughput_bps / 1e6, 2),
            "goodput_mbps": round(self.goodput_bps / 1e6, 2),
        }


ProgressCallback = Callable[[SyncProgress], None]


class _Run:
    """One sync in progress: counters, the work queue and the file bookkeeping."""

    def __init__(
        self,
        manifest: Manifest,
        source: ChunkSource,
        sink: ChunkSink,
        dest: Path,
        options: SyncOptions,
        on_progress: ProgressCallback | None,
        executor: ThreadPoolExecutor,
    ) -> None:
        self.manifest = manifest
        self.source = source
        self.sink = sink
        self.dest = dest
        self.options = options
        self.on_progress = on_progress
        self.executor = executor
        self.lengths = manifest.unique_chunks()
        self.started_s = time.monotonic()
        self.queue: deque[str] = deque()
        self.queued_bytes = 0
        self.attempts: Counter[str] = Counter()
        self.wire_bytes = 0
        self.fetched_logical_bytes = 0
        self.logical_done_bytes = 0
        self.logical_total_bytes = 0
        self.chunks_total = 0
        self.chunks_done = 0
        self.retries = 0
        self.files_written = 0
        self.written_bytes = 0

    async def in_thread(self, func: Callable[..., Any], *args: Any) -> Any:
        """Run ``func(*args)`` in the sync's thread pool (sized to the cores)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, func, *args)

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(
                SyncProgress(
                    self.logical_total_bytes,
                    self.logical_done_bytes,
                    self.wire_bytes,
                    self.fetched_logical_bytes,
                    self.chunks_total,
                    self.chunks_done,
                )
            )

    async def fetch_verified(self, chunk_id: str) -> bytes:
        """Fetch and verify one chunk, retrying network and integrity failures."""
        length = self.lengths[chunk_id]
        delay_s = self.options.backoff_initial_s
        for attempt in range(1, self.options.max_attempts + 1):
            try:
                raw = await self.source.fetch_chunk(chunk_id, length)
                self.wire_bytes += raw.wire_bytes
                data: bytes = await self.in_thread(decode_chunk, raw, chunk_id, length)
                self.fetched_logical_bytes += length
                return data
            except ProtocolError:
                raise
            except (NetworkError, IntegrityError):
                if attempt == self.options.max_attempts:
                    raise
                self.retries += 1
                await asyncio.sleep(
                    min(delay_s, self.options.backoff_max_s) * random.uniform(0.5, 1)
                )
                delay_s *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def take_batch(self) -> list[str]:
        """The next chunks for one request: a fair share of what is left, at most batch_bytes."""
        share_bytes = self.queued_bytes // max(1, self.options.streams)
        budget_bytes = max(1, min(self.options.batch_bytes, share_bytes))
        batch: list[str] = []
        taken_bytes = 0
        while self.queue and (
            not batch or taken_bytes + self.lengths[self.queue[0]] <= budget_bytes
        ):
            chunk_id = self.queue.popleft()
            batch.append(chunk_id)
            taken_bytes += self.lengths[chunk_id]
        self.queued_bytes -= taken_bytes
        return batch

    def requeue(self, chunk_ids: list[str]) -> None:
        """Put chunks back at the front of the queue (they were asked for first)."""
        for chunk_id in reversed(chunk_ids):
            self.queue.appendleft(chunk_id)
            self.queued_bytes += self.lengths[chunk_id]

    def count_failure(self, chunk_id: str, exc: NetoptError) -> float:
        """Record a failed try; re-raise ``exc`` when out of tries, else the backoff in s."""
        self.attempts[chunk_id] += 1
        if self.attempts[chunk_id] >= self.options.max_attempts:
            raise exc
        self.retries += 1
        delay_s = self.options.backoff_initial_s * 2.0 ** (self.attempts[chunk_id] - 1)
        return min(delay_s, self.options.backoff_max_s) * random.uniform(0.5, 1)

    async def process(self, chunk_id: str, raw: RawChunk, on_stored: Callable[[str], None]) -> None:
        """Verify one received chunk and store it; a bad one goes back in the queue."""
        try:
            data = await self.in_thread(decode_chunk, raw, chunk_id, self.lengths[chunk_id])
        except IntegrityError as exc:
            self.count_failure(chunk_id, exc)
            self.requeue([chunk_id])
            return
        self.fetched_logical_bytes += len(data)
        await self.sink.put(chunk_id, data)
        self.chunks_done += 1
        self.logical_done_bytes += len(data)
        on_stored(chunk_id)
        self._progress()
        if self.chunks_done == self.chunks_total:
            log.debug("all %d chunks stored at %.3f s", self.chunks_done, self._elapsed_s())

    def _elapsed_s(self) -> float:
        return time.monotonic() - self.started_s

    async def worker(self, on_stored: Callable[[str], None]) -> None:
        """Fetch batches until the queue is empty; verify each chunk, store the good ones.

        Verifying and storing run beside the download (up to `_IN_FLIGHT` chunks per
        stream), so the connection keeps reading while a chunk is hashed and fsynced.
        """
        while self.queue:
            batch = self.take_batch()
            received = 0
            inflight: set[asyncio.Task[None]] = set()
            failure: NetworkError | None = None
            try:
                wanted = [(cid, self.lengths[cid]) for cid in batch]
                async for raw in self.source.fetch_chunks(wanted):
                    chunk_id = batch[received]
                    received += 1
                    self.wire_bytes += raw.wire_bytes
                    inflight.add(asyncio.create_task(self.process(chunk_id, raw, on_stored)))
                    if len(inflight) >= _IN_FLIGHT:
                        done, inflight = await asyncio.wait(
                            inflight, return_when=asyncio.FIRST_COMPLETED
                        )
                        for task in done:
                            task.result()
                if received < len(batch):
                    raise NetworkError(f"the source sent {received} of {len(batch)} chunks")
            except ProtocolError:
                raise
            except NetworkError as exc:
                failure = exc
            finally:
                results = await asyncio.gather(*inflight, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            if failure is not None:
                rest = batch[received:]
                self.requeue(rest)
                await asyncio.sleep(self.count_failure(rest[0], failure))

    def file_done(self, entry: FileEntry) -> None:
        self.files_written += 1
        self.written_bytes += entry.size_bytes
        log.debug("%s written at %.3f s", entry.path, self._elapsed_s())


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first netopt error inside a (nested) exception group, else its first leaf."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    return next((e for e in leaves if isinstance(e, NetoptError)), leaves[0])


async def sync_manifest(
    manifest: Manifest,
    source: ChunkSource,
    sink: ChunkSink,
    dest: str | os.PathLike[str],
    options: SyncOptions | None = None,
    *,
    on_progress: ProgressCallback | None = None,
) -> SyncSummary:
    """Make ``dest`` hold ``manifest``'s files; return what it took.

    Files already present with the manifest's size and mtime are skipped. Raises
    NetworkError / PeerUnreachableError when a chunk cannot be fetched after
    ``options.max_attempts``, IntegrityError when it never verifies,
    PathTraversalError when a path would leave ``dest``, StorageError on disk
    failures. Whatever was verified stays in ``sink`` for the next run.
    """
    opts = options or SyncOptions()
    started_s = time.monotonic()
    dest_real, pending, skipped = await asyncio.to_thread(scan_destination, Path(dest), manifest)
    uses: Counter[str] = Counter(ref.chunk_id for entry, _ in pending for ref in entry.chunks)
    held = HeldSink(sink, uses, opts.hold_bytes)
    with ThreadPoolExecutor(max_workers=max(1, opts.worker_threads)) as executor:
        run = _Run(manifest, source, held, dest_real, opts, on_progress, executor)
        missing: dict[str, None] = {}
        reused: set[str] = set()
        for entry, _ in pending:
            run.logical_total_bytes += entry.size_bytes
            for ref in entry.chunks:
                if ref.chunk_id in missing or ref.chunk_id in reused:
                    continue
                if await sink.has(ref.chunk_id):
                    reused.add(ref.chunk_id)
                    run.logical_done_bytes += ref.length_bytes
                else:
                    missing[ref.chunk_id] = None
        run.chunks_total = len(missing)
        order = list(missing)
        start = int(len(order) * min(max(opts.start_fraction, 0.0), 1.0)) % max(1, len(order))
        run.queue.extend(order[start:] + order[:start])
        run.queued_bytes = sum(run.lengths[cid] for cid in missing)
        available = set(reused)
        assemblers = [
            FileAssembler(
                entry, target, held, available, run.in_thread, run.fetch_verified, run.file_done
            )
            for entry, target in pending
        ]
        users: dict[str, list[FileAssembler]] = {}
        for assembler in assemblers:
            for cid in assembler.needs():
                users.setdefault(cid, []).append(assembler)
        try:
            async with asyncio.TaskGroup() as tg:

                def poke(assembler: FileAssembler) -> None:
                    coro = assembler.poke()
                    if coro is None:
                        return
                    try:
                        tg.create_task(coro)
                    except RuntimeError:
                        # The group is shutting down (a worker failed or the sync was
                        # cancelled): the file is abandoned below, never written.
                        coro.close()

                def on_stored(chunk_id: str) -> None:
                    available.add(chunk_id)
                    for assembler in users.get(chunk_id, ()):
                        poke(assembler)

                for assembler in assemblers:
                    poke(assembler)
                for _ in range(max(1, min(opts.streams, len(missing)))):
                    tg.create_task(run.worker(on_stored))
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        finally:
            for assembler in assemblers:
                assembler.abandon()
    return SyncSummary(
        dataset=manifest.name,
        files=len(manifest.files),
        files_written=run.files_written,
        files_skipped=skipped,
        chunks_fetched=run.chunks_done,
        chunks_reused=len(reused),
        chunk_retries=run.retries,
        wire_bytes=run.wire_bytes,
        fetched_logical_bytes=run.fetched_logical_bytes,
        logical_bytes=run.written_bytes,
        seconds=time.monotonic() - started_s,
    )
