"""One sync in progress: its counters, work queue, retry accounting and the batch worker.

`SyncRun` holds what the workers of one `netopt.dataplane.sync.sync_manifest` call
share: the queue of chunks still to fetch (in file order), the byte and chunk counters
behind progress and the summary, and per-chunk failure counts for the retry schedule.
Each received chunk is verified (BLAKE3 and length) in the run's thread pool and stored
in the sink (`SyncRun.process`); a bad one goes back in the queue. A failure is charged
to the chunk that failed, which is retried for `SyncOptions.retry_window_s` (see
`SyncRun.charge`). `SyncRun.worker` fetches over the source's batch route; the stream
route's worker, which shares this state, is `netopt.dataplane.streamwork.stream_worker`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netopt.dataplane import trace
from netopt.dataplane.assemble import ClaimedWrite, FileAssembler, write_claimed
from netopt.dataplane.batchrun import ThreadBatcher
from netopt.dataplane.chunkio import ChunkSink, ChunkSource, RawChunk, decode_chunk
from netopt.dataplane.held import HeldSink, blocking_put, blocking_put_group
from netopt.dataplane.onloop import ON_LOOP_MAX_BYTES
from netopt.dataplane.streaming import ChunkStream
from netopt.dataplane.synctypes import ProgressCallback, SyncOptions, SyncProgress
from netopt.dataplane.writerproc import WriterProcess
from netopt.errors import (
    IntegrityError,
    NetoptError,
    NetworkError,
    PeerUnreachableError,
    ProtocolError,
    StorageError,
)
from netopt.transfer.manifest import FileEntry, Manifest

if TYPE_CHECKING:
    from netopt.dataplane.asked import Asked

log = logging.getLogger(__name__)

BACKOFF_POLL_S = 0.05
"""How often a worker waiting (a backoff, idle at the tail) looks at the queue again."""

__all__ = [
    "IN_FLIGHT",
    "SyncRun",
    "backoff_delay_s",
    "bounded_inflight",
    "inflight_limit",
    "retries_exhausted",
]

IN_FLIGHT = 4
"""Received chunks per stream that may be verifying or storing while the next arrives
(at least; small chunks: see `IN_FLIGHT_BYTES`)."""
IN_FLIGHT_BYTES = 4 * 1024 * 1024
IN_FLIGHT_MAX = 64
"""Small chunks may be in flight per stream up to about `IN_FLIGHT_BYTES` (average chunk
size), at most `IN_FLIGHT_MAX` of them: enough that they go to the thread pool in
batches (`netopt.dataplane.batchrun`) instead of four at a time."""


INLINE_GROUP_BYTES = ON_LOOP_MAX_BYTES
"""A group whose verify, store and writes handle at most this many bytes runs on the loop
itself (the project's rule, `netopt.dataplane.onloop`). What such a call can wait on is
back-pressure: when the disk falls behind, the pack store's and the file flusher's
bounded backlogs make it wait for room, on the loop (a pool thread would wait the same
and the streams would stop reading the same); a wait longer than the stall timeout can
then cut a stream, which is retried, never lost."""


def inflight_limit(lengths: dict[str, int]) -> int:
    """Chunks per stream that may be verifying or storing at once, for chunks of ``lengths``."""
    if not lengths:
        return IN_FLIGHT
    average_bytes = max(1, sum(lengths.values()) // len(lengths))
    return max(IN_FLIGHT, min(IN_FLIGHT_MAX, IN_FLIGHT_BYTES // average_bytes))


async def bounded_inflight(
    inflight: dict[asyncio.Task[None], int], limit: int
) -> dict[asyncio.Task[None], int]:
    """Wait while ``limit`` chunks or more are verifying or storing (``inflight``: each
    task and the chunks it handles), re-raising a finished task's error; the ones still
    running."""
    while inflight and sum(inflight.values()) >= limit:
        waited_s = time.monotonic()
        done, _ = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        trace.add_seconds("worker_blocked_inflight", time.monotonic() - waited_s)
        for task in done:
            del inflight[task]
            task.result()
    return inflight


def backoff_delay_s(options: SyncOptions, failures_in_a_row: int) -> float:
    """The wait before the next try after ``failures_in_a_row`` failures (of a stream, a
    batch, or opening the source): exponential from `SyncOptions.backoff_initial_s`,
    capped at `backoff_max_s`, with jitter (x 0.5..1) so tries do not come in step."""
    delay_s = options.backoff_initial_s * 2.0 ** min(max(failures_in_a_row - 1, 0), 30)
    return min(delay_s, options.backoff_max_s) * random.uniform(0.5, 1)


def retries_exhausted(
    exc: NetoptError, chunk_id: str, failing_s: float, window_s: float
) -> NetworkError:
    """The error a sync ends with when ``chunk_id`` kept failing for its retry window:
    of ``exc``'s kind (PeerUnreachableError for a server that cannot be reached), saying
    how long it tried and how to allow longer."""
    kind = PeerUnreachableError if isinstance(exc, PeerUnreachableError) else NetworkError
    return kind(
        f"gave up on chunk {chunk_id[:16]} after {failing_s:.1f} s of failures (retry window "
        f"{window_s:g} s, --retry-window-s); last error: {exc}"
    )


_Received = tuple[RawChunk, str, int, "Callable[[bytes], None] | None", list[ClaimedWrite]]
"""One received chunk to verify and store: (frame, name, length, its blocking put, claimed
files)."""

_Outcome = tuple[bytes, list[OSError | None]] | Exception
"""Per chunk of a group: its verified bytes and each claimed file's error (None: handed
over), or the exception that chunk met."""


def _verify_and_store_all(
    received: list[_Received],
    put_group: Callable[[Sequence[tuple[str, bytes]]], None] | None = None,
    writer: WriterProcess | None = None,
) -> list[_Outcome]:
    """Decode and verify each received chunk of a group, store the ones that verify, then
    write the claimed one-chunk files from the verified bytes
    (`netopt.dataplane.assemble.write_claimed`), in one call (on the loop or a pool
    thread). Nothing is stored or written from a chunk that fails its check; one chunk's
    failure leaves the others' results. With ``put_group`` (the sink's
    `netopt.dataplane.held.GroupPut`) the chunks are stored together, and a failure of
    that store is every one of theirs; else each with its own put (None: verify only).
    With ``writer`` the claimed files go to that helper process (`write_claimed`)."""
    outcomes: list[bytes | Exception] = []
    for raw, chunk_id, length, _, _ in received:
        try:
            outcomes.append(decode_chunk(raw, chunk_id, length))
        except Exception as exc:  # handed back to that chunk's bookkeeping on the loop
            outcomes.append(exc)
    if put_group is not None:
        good = [(item[1], data) for item, data in zip(received, outcomes, strict=True)
                if not isinstance(data, Exception)]  # fmt: skip
        if good:
            try:
                put_group(good)
            except Exception as exc:
                outcomes = [data if isinstance(data, Exception) else exc for data in outcomes]
    results: list[_Outcome] = []
    for (_, _, _, put, claims), data in zip(received, outcomes, strict=True):
        if isinstance(data, Exception):
            results.append(data)
            continue
        try:
            if put is not None:
                put(data)
            results.append((data, write_claimed(data, claims, writer) if claims else []))
        except Exception as exc:
            results.append(exc)
    return results


class SyncRun:
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
        self.batcher = ThreadBatcher(executor, options.worker_threads)
        self._blocking_put = blocking_put(sink)
        self._put_group = blocking_put_group(sink)
        self.lengths = manifest.unique_chunks()
        self.inflight_limit = inflight_limit(self.lengths)
        self.started_s = time.monotonic()
        self.queue: deque[str] = deque()
        self.queued_bytes = 0
        self.failing_since_s: dict[str, float] = {}
        """Chunks that failed and have not arrived since: when they first failed (monotonic s)."""
        self.arrived_s = self.started_s
        """When a chunk last arrived (monotonic s): a chunk's failures before then are
        forgiven, the link worked since (`charge`)."""
        self.bad_copies: Counter[str] = Counter()
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
        self.asking: list[Asked] = []
        """Each live stream's chunks asked for and not yet arrived, oldest first."""
        self.stolen: dict[str, asyncio.Event] = {}
        """Chunks whose frame is read so that it can be cut: asked for on a second stream
        at the tail (`netopt.dataplane.streamwork`), or worth fetching again in parts
        (`netopt.dataplane.tailhedge`). Each event is set when a copy arrives, so the
        stream still receiving another copy stops at once instead of finishing a frame
        nobody needs."""
        self.hedged: set[str] = set()
        """Chunks fetched again in parts at the tail (`netopt.dataplane.tailhedge`): once each."""
        self.duplicate_wire_bytes = 0
        self.leads: list[tuple[ChunkStream, list[str]]] = []
        """Streams a lead opened before the manifest was in (`netopt.dataplane.lead`), each
        with the chunks it was asked for, not yet carried on by a stream worker."""
        opener = getattr(source, "open_stream", None)
        self.open_stream: Callable[[], ChunkStream] | None = opener if callable(opener) else None
        self.writers: dict[str, list[FileAssembler]] = {}
        """Chunk name -> the files made of it (set by the sync): a small file of one chunk is
        written on the thread that verifies the chunk (`FileAssembler.claim`)."""
        self.writer: WriterProcess | None = None
        """The helper process that writes those small files, when the sync started one."""

    async def in_thread(self, func: Callable[..., Any], *args: Any, weight_bytes: int = 0) -> Any:
        """Run ``func(*args)`` in the sync's thread pool (sized to the cores), batched with
        the other calls queued meanwhile (`netopt.dataplane.batchrun`); ``weight_bytes``:
        about how many bytes it handles."""
        return await self.batcher.run(func, *args, weight_bytes=weight_bytes)

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
        """Fetch and verify one chunk, retrying network and integrity failures (see
        `charge`)."""
        length = self.lengths[chunk_id]
        failures = 0
        while True:
            try:
                raw = await self.source.fetch_chunk(chunk_id, length)
                self.wire_bytes += raw.wire_bytes
                data: bytes = await self.in_thread(decode_chunk, raw, chunk_id, length)
            except ProtocolError:
                raise
            except (NetworkError, IntegrityError) as exc:
                self.charge(chunk_id, exc)
                failures += 1
                await asyncio.sleep(self.backoff_s(failures))
                continue
            self.fetched_logical_bytes += length
            self.failing_since_s.pop(chunk_id, None)
            self.arrived_s = time.monotonic()
            return data

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

    def charge(self, chunk_id: str, exc: NetoptError) -> None:
        """Charge a failed try to ``chunk_id``, the chunk that failed.

        Re-raises a network failure once the chunk has been failing for
        `SyncOptions.retry_window_s` since its first failure (naming the window), and an
        IntegrityError on the chunk's `SyncOptions.max_attempts`-th bad copy. Failures
        before a chunk (any) last arrived do not count: the link worked since. A chunk
        that failed once (a stalled stream) and waited behind others, still pending when
        the server then went away, used to end the sync at that failure instead of
        riding out the outage.
        """
        now_s = time.monotonic()
        first_s = self.failing_since_s.get(chunk_id)
        if first_s is None or first_s < self.arrived_s:
            first_s = self.failing_since_s[chunk_id] = now_s
        if isinstance(exc, IntegrityError):
            self.bad_copies[chunk_id] += 1
            if self.bad_copies[chunk_id] >= self.options.max_attempts:
                raise exc
        elif now_s - first_s >= self.options.retry_window_s:
            raise retries_exhausted(exc, chunk_id, now_s - first_s, self.options.retry_window_s)
        self.retries += 1

    def link_returns(self) -> int:
        """How many times the source noticed its server answer again after fetches failed
        (`netopt.dataplane.linkwatch`); 0 for a source that does not watch."""
        counted = getattr(self.source, "link_returns", None)
        return counted() if callable(counted) else 0

    async def back_off(self, failure: NetoptError, failures: int, returns_at_start: int) -> int:
        """After a worker's fetch failed (``failure``, its ``failures``-th in a row), begun
        when the source had noticed ``returns_at_start`` link returns: wait `backoff_s`,
        or less once the queue is empty (other workers took what the failure put back:
        the sync would otherwise wait out the backoff at its end) or the server answers
        again; not at all when it already has (the fetch's connection was left dead by
        the outage, and a fresh one works now). A network failure tells a source that
        watches for its server's return to watch. Returns the failures in a row to count
        on from: 0 once the server answered again."""
        if self.link_returns() != returns_at_start:
            log.debug("a fetch failed across a link return: %s", failure)
            return 0
        log.debug("a fetch failed (%d in a row): %s", failures, failure)
        watch = getattr(self.source, "fetch_failed", None)
        if isinstance(failure, NetworkError) and callable(watch):
            watch()
        deadline_s = time.monotonic() + self.backoff_s(failures)
        while True:  # polled: nothing signals "the queue emptied"
            if self.link_returns() != returns_at_start:
                return 0
            left_s = deadline_s - time.monotonic()
            if not self.queue or left_s <= 0:
                return failures
            await asyncio.sleep(min(left_s, BACKOFF_POLL_S))

    def backoff_s(self, failures_in_a_row: int) -> float:
        """The wait before a worker's next try (`backoff_delay_s`)."""
        return backoff_delay_s(self.options, failures_in_a_row)

    async def process(self, chunk_id: str, raw: RawChunk, on_stored: Callable[[str], None]) -> None:
        """Verify one received chunk and store it; a bad one goes back in the queue
        (`process_group` of one)."""
        await self.process_group([(chunk_id, raw)], on_stored)

    async def process_group(
        self, group: list[tuple[str, RawChunk]], on_stored: Callable[[str], None]
    ) -> None:
        """Verify received chunks and store them in one call (on the loop for a group of
        small chunks, `INLINE_GROUP_BYTES`, else one pool hand-off); a bad one goes back
        in the queue, the others are stored.

        The small files made of one chunk alone are written by the same call, from the
        verified bytes (`FileAssembler.claim`). A stream hands over the small frames
        that arrived together as one group (`netopt.dataplane.streamwork`): one task,
        one call and one progress report for them all instead of one each."""
        put_group = self._put_group() if self._put_group is not None else None
        put = self._blocking_put if put_group is None else None
        claims: list[list[FileAssembler]] = []
        received: list[_Received] = []
        weight_bytes = 0
        for chunk_id, raw in group:
            length = self.lengths[chunk_id]
            claimed: list[FileAssembler] = []
            writes: list[ClaimedWrite] = []
            for assembler in self.writers.get(chunk_id, ()):
                write = assembler.claim(chunk_id)
                if write is not None:
                    claimed.append(assembler)
                    writes.append(write)
            claims.append(claimed)
            received.append((raw, chunk_id, length, None if put is None else put(chunk_id), writes))
            weight_bytes += (int(put is not None or put_group is not None) + len(writes)) * length
        try:
            with trace.timed("decode_await"):
                # One call verifies, stores (when the sink stores on a thread) and writes
                # the claimed files, for every chunk of the group: on the loop for a group
                # of small chunks, else on a pool thread.
                if weight_bytes <= INLINE_GROUP_BYTES:
                    outcomes = _verify_and_store_all(received, put_group, self.writer)
                else:
                    outcomes = await self.in_thread(
                        _verify_and_store_all, received, put_group, self.writer,
                        weight_bytes=weight_bytes,
                    )  # fmt: skip
        except BaseException:
            for claimed in claims:
                for assembler in claimed:
                    assembler.claimed(False)
            raise
        failed: Exception | None = None
        for (chunk_id, _), claimed, outcome in zip(group, claims, outcomes, strict=True):
            try:
                await self._stored(chunk_id, claimed, outcome, on_stored)
            except Exception as exc:  # the others' bookkeeping first, then the first error
                failed = failed or exc
        self._progress()
        if failed is not None:
            raise failed

    async def _stored(
        self,
        chunk_id: str,
        claimed: list[FileAssembler],
        outcome: _Outcome,
        on_stored: Callable[[str], None],
    ) -> None:
        """The bookkeeping of one chunk of `process_group` once its pool call is done."""
        if isinstance(outcome, Exception):
            for assembler in claimed:
                assembler.claimed(False)
            if not isinstance(outcome, IntegrityError):
                raise outcome
            self.claimed.discard(chunk_id)
            self.stolen.pop(chunk_id, None)  # asked for afresh: a new race if stolen again
            self.charge(chunk_id, outcome)
            self.requeue([chunk_id])
            return
        data, errors = outcome
        self.fetched_logical_bytes += len(data)
        if claimed and isinstance(self.sink, HeldSink):
            self.sink.uses[chunk_id] -= len(claimed)  # those files read it already
        if self._blocking_put is None and self._put_group is None:
            with trace.timed("put_await"):
                await self.sink.put(chunk_id, data)
        elif isinstance(self.sink, HeldSink):
            self.sink.keep(chunk_id, data)
        failed: StorageError | None = None
        for assembler, error in zip(claimed, errors, strict=True):
            try:
                assembler.claimed(error is None, error)
            except StorageError as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
        self.failing_since_s.pop(chunk_id, None)
        self.arrived_s = time.monotonic()
        self.chunks_done += 1
        self.logical_done_bytes += len(data)
        on_stored(chunk_id)
        if self.chunks_done == self.chunks_total:
            trace.mark("chunks_stored")
            log.debug("all %d chunks stored at %.3f s", self.chunks_done, self._elapsed_s())

    def _elapsed_s(self) -> float:
        return time.monotonic() - self.started_s

    async def worker(self, on_stored: Callable[[str], None]) -> None:
        """Fetch batches until the queue is empty; verify each chunk, store the good ones.

        Verifying and storing run beside the download (up to `inflight_limit` chunks per
        stream), so the connection keeps reading while a chunk is hashed and fsynced.
        """
        failures = 0
        while self.queue:
            batch = self.take_batch()
            returns_at_start = self.link_returns()
            received = 0
            inflight: dict[asyncio.Task[None], int] = {}
            failure: NetworkError | None = None
            try:
                wanted = [(cid, self.lengths[cid]) for cid in batch]
                async for raw in self.source.fetch_chunks(wanted):
                    chunk_id = batch[received]
                    received += 1
                    self.wire_bytes += raw.wire_bytes
                    inflight[asyncio.create_task(self.process(chunk_id, raw, on_stored))] = 1
                    inflight = await bounded_inflight(inflight, self.inflight_limit)
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
                if rest:  # the first chunk not received is the one the failure hit
                    self.charge(rest[0], failure)
                failures = 1 if received else failures + 1
                failures = await self.back_off(failure, failures, returns_at_start)

    def file_done(self, entry: FileEntry) -> None:
        self.files_written += 1
        self.written_bytes += entry.size_bytes
        log.debug("%s written at %.3f s", entry.path, self._elapsed_s())
