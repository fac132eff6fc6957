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

from netopt.dataplane import trace
from netopt.dataplane.assemble import FileAssembler, scan_destination
from netopt.dataplane.chunkio import ChunkSink, ChunkSource, RawChunk, decode_chunk
from netopt.dataplane.held import HeldSink
from netopt.dataplane.streaming import ChunkStream
from netopt.errors import (
    IntegrityError,
    NetoptError,
    NetworkError,
    ProtocolError,
    ValidationError,
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
    stream_ahead_bytes: int = 3 * 1024 * 1024 // 2
    """Over a streaming source: bytes on the wire (estimated from the compression ratio so
    far) each stream keeps asked for, and at least two chunks, so the server always has
    the next chunk ready to send; the last chunks still go to whichever stream is free."""
    steal_after_s: float = 0.25
    """Over a streaming source, an idle stream asks again for a chunk another stream has
    queued only when that chunk is expected there later than this (s)."""
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


class _Asked(deque[str]):
    """One stream's chunks asked for and not yet arrived, and the pace its frames arrive at."""

    def __init__(self) -> None:
        super().__init__()
        self.last_frame_s = time.monotonic()
        self.frame_interval_s = 0.0
        """Smoothed seconds between frames (0 until two have arrived)."""

    def arrived(self) -> None:
        now_s = time.monotonic()
        gap_s = now_s - self.last_frame_s
        self.frame_interval_s = (
            gap_s if not self.frame_interval_s else 0.7 * self.frame_interval_s + 0.3 * gap_s
        )
        self.last_frame_s = now_s

    def wait_s(self, position: int) -> float:
        """Estimated seconds until the chunk at ``position`` arrives (0: the one arriving).

        A frame is taken to need the smoothed interval, or as long as the current one has
        already been pending when that is longer (a stalled stream counts as slow).
        """
        now_s = time.monotonic()
        per_frame_s = max(self.frame_interval_s, now_s - self.last_frame_s)
        current_left_s = max(0.0, self.last_frame_s + per_frame_s - now_s)
        return current_left_s + position * per_frame_s


async def _bounded(inflight: set[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
    """Wait for one verify-and-store task when ``_IN_FLIGHT`` run (re-raising its error);
    the ones still running."""
    if len(inflight) < _IN_FLIGHT:
        return inflight
    waited_s = time.monotonic()
    done, pending = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
    trace.add_seconds("worker_blocked_inflight", time.monotonic() - waited_s)
    for task in done:
        task.result()
    return pending


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
        self.claimed: set[str] = set()
        """Chunks whose frame arrived over a stream (verifying, stored, or failed and requeued
        after `unclaim`): another stream's copy of one is dropped unread where possible."""
        self.asking: list[_Asked] = []
        """Each live stream's chunks asked for and not yet arrived, oldest first."""
        self.duplicate_wire_bytes = 0
        opener = getattr(source, "open_stream", None)
        self.open_stream: Callable[[], ChunkStream] | None = opener if callable(opener) else None

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
            with trace.timed("decode_await"):
                data = await self.in_thread(decode_chunk, raw, chunk_id, self.lengths[chunk_id])
        except IntegrityError as exc:
            self.claimed.discard(chunk_id)
            self.count_failure(chunk_id, exc)
            self.requeue([chunk_id])
            return
        self.fetched_logical_bytes += len(data)
        with trace.timed("put_await"):
            await self.sink.put(chunk_id, data)
        self.chunks_done += 1
        self.logical_done_bytes += len(data)
        on_stored(chunk_id)
        self._progress()
        if self.chunks_done == self.chunks_total:
            trace.mark("chunks_stored")
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
                    inflight = await _bounded(inflight)
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

    def _top_up(self, stream: ChunkStream, asked: deque[str]) -> None:
        """Name chunks on ``stream`` until it has asked for `stream_ahead_bytes` of wire (and
        for at least two chunks: one arriving, one the server prepares).

        With the queue empty, an idle stream takes over the tail: it asks for a chunk that
        another stream has asked for but not started receiving, and whichever copy arrives
        first is used (see `_steal`).
        """
        asked_bytes = sum(self.lengths[cid] for cid in asked)
        ratio = self.fetched_logical_bytes / self.wire_bytes if self.wire_bytes else 1.0
        ahead_bytes = self.options.stream_ahead_bytes * max(1.0, ratio)
        while self.queue and (len(asked) < 2 or asked_bytes < ahead_bytes):
            chunk_id = self.queue.popleft()
            length = self.lengths[chunk_id]
            self.queued_bytes -= length
            if chunk_id in self.claimed:
                continue  # another stream's copy arrived meanwhile
            asked.append(chunk_id)
            asked_bytes += length
            stream.ask(chunk_id)
        if not asked and not self.queue:
            stolen = self._steal(asked)
            if stolen is not None:
                asked.append(stolen)
                stream.ask(stolen)
                trace.count("tail_steals")

    def _lagging(self, mine: deque[str]) -> bool:
        """True while the queue is empty and another stream has a chunk queued behind the
        one it is receiving, not yet arrived anywhere (one this stream might take over)."""
        if self.queue:
            return False
        return any(
            other is not mine and any(cid not in self.claimed for cid in list(other)[1:])
            for other in self.asking
        )

    def _steal(self, mine: deque[str]) -> str | None:
        """The last-queued chunk of the most loaded other stream that has not started
        arriving there, that no other stream has asked for too, and that is expected there
        later than `SyncOptions.steal_after_s` from now; None if there is none."""
        asked_anywhere: dict[str, int] = {}
        for other in self.asking:
            for cid in other:
                asked_anywhere[cid] = asked_anywhere.get(cid, 0) + 1
        best: tuple[int, str] | None = None
        for other in self.asking:
            if other is mine or len(other) < 2:
                continue
            load_bytes = sum(self.lengths[cid] for cid in other)
            candidate = other[-1]
            if candidate in self.claimed or asked_anywhere[candidate] > 1:
                continue
            if other.wait_s(len(other) - 1) < self.options.steal_after_s:
                continue
            if best is None or load_bytes > best[0]:
                best = (load_bytes, candidate)
        return best[1] if best is not None else None

    async def _run_stream(
        self, stream: ChunkStream, asked: _Asked, on_stored: Callable[[str], None]
    ) -> int:
        """Read frames off ``stream`` until nothing is left to ask; the frames received.

        Stops early, dropping the connection, once every chunk still expected on it has
        arrived over another stream.
        """
        received = 0
        inflight: set[asyncio.Task[None]] = set()
        try:
            self._top_up(stream, asked)
            while asked or self._lagging(asked):
                if not asked:
                    # Idle at the tail: stay while another stream may still need help.
                    await asyncio.sleep(self.options.steal_after_s / 5)
                    self._top_up(stream, asked)
                    continue
                if all(cid in self.claimed for cid in asked):
                    trace.count("streams_cut_in_tail")
                    break
                chunk_id = asked[0]
                raw = await stream.next(chunk_id, self.lengths[chunk_id])
                asked.popleft()
                asked.arrived()
                received += 1
                self.wire_bytes += raw.wire_bytes
                if chunk_id in self.claimed:
                    self.duplicate_wire_bytes += raw.wire_bytes
                    trace.count("duplicate_wire_bytes", raw.wire_bytes)
                else:
                    self.claimed.add(chunk_id)
                    inflight.add(asyncio.create_task(self.process(chunk_id, raw, on_stored)))
                self._top_up(stream, asked)
                inflight = await _bounded(inflight)
        finally:
            results = await asyncio.gather(*inflight, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return received

    async def stream_worker(self, on_stored: Callable[[str], None]) -> None:
        """Like `worker`, over one chunk stream per connection: the next chunk is named as
        soon as one arrives, so the connection never idles and work spreads to the end.

        Falls back to batches when the server has no stream route.
        """
        while self.queue and self.open_stream is not None:
            stream = self.open_stream()
            asked = _Asked()
            self.asking.append(asked)
            failure: NetworkError | None = None
            try:
                await self._run_stream(stream, asked, on_stored)
            except ValidationError:
                if self.chunks_done or self.retries:
                    raise
                # A server without the stream route: use batches from now on.
                log.debug("the source has no stream route; fetching in batches")
                self.open_stream = None
            except NetworkError as exc:
                failure = exc
            finally:
                self.asking.remove(asked)
                self.requeue([cid for cid in asked if cid not in self.claimed])
                await stream.aclose(complete=not asked)
            if failure is not None and self.queue:
                await asyncio.sleep(self.count_failure(self.queue[0], failure))
        if self.queue:
            await self.worker(on_stored)
        trace.count("streams_ended")
        trace.mark("first_stream_done")
        trace.mark_last("last_stream_done")

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
    trace.mark("sync_start")
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
                work = run.worker if run.open_stream is None else run.stream_worker
                for _ in range(max(1, min(opts.streams, len(missing)))):
                    tg.create_task(work(on_stored))
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        finally:
            for assembler in assemblers:
                assembler.abandon()
    trace.mark("sync_done")
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
