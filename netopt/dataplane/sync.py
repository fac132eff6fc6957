"""The sync engine: bring a directory up to a manifest from a `ChunkSource` via a `ChunkSink`.

Chunks missing from the sink are fetched by ``streams`` workers in file order,
decoded and verified (BLAKE3 and length) in a thread pool sized to the cores,
retried with exponential backoff and jitter when the network or the check fails
(a network failure for up to ``retry_window_s`` per chunk, so a sync rides out a
server restart or a link cut; a stalled connection is abandoned for a fresh one), and
stored in the sink; a bad chunk is never stored. As soon as every chunk of a
file is in the sink the file is written under a temporary name and handed to a
`netopt.durable.BatchFlusher`, which makes the files finished meanwhile durable
together (one ``syncfs`` for many, no fsync per file on the way) and then renames
them into place with their modes and mtimes, so files appear whole and on disk
or not at all; the sync returns only once every file is in place and durable.
Chunks already in the sink are not fetched again, which is how an interrupted
sync resumes.

The pieces: `netopt.dataplane.synctypes` (options, progress, summary),
`netopt.dataplane.syncrun` (the shared state and the batch worker),
`netopt.dataplane.streamwork` (the stream-route worker) and `netopt.dataplane.assemble`
(writing files as their chunks arrive).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from netopt.dataplane import trace
from netopt.dataplane.assemble import (
    FileAssembler,
    OpenFiles,
    Placement,
    files_to_write,
    place_files,
    scan_destination,
    written_whole,
)
from netopt.dataplane.chunkio import ChunkSink, ChunkSource
from netopt.dataplane.fetchorder import fetch_order, tail_window_bytes
from netopt.dataplane.held import HeldSink
from netopt.dataplane.streamwork import part_worker, parts_per_chunk, stream_worker
from netopt.dataplane.syncrun import SyncRun
from netopt.dataplane.synctypes import ProgressCallback, SyncOptions, SyncProgress, SyncSummary
from netopt.dataplane.writerproc import WriterProcess
from netopt.durable import BatchFlusher
from netopt.errors import NetoptError, StorageError
from netopt.transfer.manifest import FileEntry, Manifest

__all__ = [
    "ProgressCallback",
    "SyncOptions",
    "SyncProgress",
    "SyncSummary",
    "first_error",
    "gc_batch_thresholds",
    "sync_manifest",
]

Worker = Callable[[Callable[[str], None]], Coroutine[Any, Any, None]]
"""A fetch loop of one stream: takes the stored-chunk callback, runs until the queue is empty."""


@contextlib.contextmanager
def gc_frozen() -> Iterator[None]:
    """Keep the objects alive now out of Python's full garbage collections meanwhile.

    A full collection walks every tracked object; a tree's manifest, targets and file
    writers are millions of them, alive for the whole sync, and the chunks' tasks and
    buffers trigger collections all along: 10% of a 20,000-file sync's CPU went to them.
    `gc.freeze` leaves them out (objects made later are collected as before);
    `gc.unfreeze` at the end."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off meanwhile (back on after, unless it was off
    before): for building a large manifest (`manifest_from_dict`), a few objects per
    file and no cycles, whose allocations trigger collections that walk them again and
    again: a 100,000-file manifest's entries took 0.49 s with them (a sync's threshold,
    `SYNC_GC_THRESHOLD0`), 0.42 s without."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


SYNC_GC_THRESHOLD0 = 50_000
"""Allocations between young collections while a sync command runs (Python's default: 700).

A tree's manifest is millions of objects made at once, and each small chunk makes a few
more: at 700 the collector ran ~140 times a second of parsing a 100,000-file manifest
(0.35 s of its 1.75 s) and all along the transfer. Garbage in cycles (asyncio tasks,
exceptions) is still collected, a little later."""


@contextlib.contextmanager
def gc_batch_thresholds() -> Iterator[None]:
    """Python's collector tuned for one sync process (`SYNC_GC_THRESHOLD0`), then restored:
    for a command that runs one sync and exits, not a long-running service."""
    before = gc.get_threshold()
    gc.set_threshold(SYNC_GC_THRESHOLD0, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


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
    present: Mapping[str, tuple[int, int]] | None = None,
) -> SyncSummary:
    """Make ``dest`` hold ``manifest``'s files; return what it took.

    Files already present with the manifest's size and mtime are skipped (``present``:
    what a listing of ``dest`` just found, see `files_to_write`: the fetch then begins
    while the files' directories are made; None: each file is stat'ed first); the files
    written are durable when this returns (the sink's chunks are durable once its owner
    flushes it, e.g. `netopt.cache.store.Cache.flush`). Raises
    NetworkError / PeerUnreachableError when a chunk has kept failing for
    ``options.retry_window_s``, IntegrityError when ``options.max_attempts`` copies of
    a chunk fail their check,
    PathTraversalError when a path would leave ``dest``, StorageError on disk
    failures. Whatever was verified stays in ``sink`` for the next run.
    """
    opts = options or SyncOptions()
    started_s = time.monotonic()
    trace.mark("sync_start")
    # Started now, ready by the time the first chunk arrives (it takes ~50 ms).
    writer = WriterProcess.start() if _wants_writer_process(opts, manifest) else None
    flusher = BatchFlusher("netopt-dest-flush")
    try:
        if present is None:
            _, placed, skipped = await asyncio.to_thread(scan_destination, Path(dest), manifest)
            trace.mark("dest_scanned")
            entries = [entry for entry, _, _ in placed]

            async def place() -> list[tuple[FileEntry, str, Placement]]:
                return placed

        else:
            # The fetch begins while the directories are made (the packages tree's 1,540
            # took 0.4-1.3 s of its start); the files are written once they are.
            entries, skipped = files_to_write(manifest, present)

            async def place() -> list[tuple[FileEntry, str, Placement]]:
                _, placed = await asyncio.to_thread(place_files, Path(dest), entries)
                trace.mark("dest_scanned")
                return placed

        uses = Counter(ref.chunk_id for entry in entries for ref in entry.chunks)
        held = HeldSink(sink, uses, opts.hold_bytes)
        run, reused, refetched = await _fetch_and_write(
            manifest, source, held, Path(dest), entries, place, opts, flusher, on_progress,
            writer,
        )  # fmt: skip
        # The source's optional hook (see `ChunkSource`): no chunk is asked of it now.
        chunks_done: Callable[[], None] | None = getattr(source, "chunks_done", None)
        if chunks_done is not None:
            chunks_done()
        with trace.timed("dest_flush"):
            if run.writer is not None:
                await asyncio.to_thread(run.writer.close)
            await asyncio.to_thread(flusher.flush)
    finally:
        # After a failure: the files already complete still go into place (durably);
        # the first error is the one raised.
        if writer is not None:
            with contextlib.suppress(StorageError):
                await asyncio.to_thread(writer.close)
        with contextlib.suppress(StorageError):
            await asyncio.to_thread(flusher.close)
    trace.mark("sync_done")
    return SyncSummary(
        dataset=manifest.name,
        files=len(manifest.files),
        files_written=run.files_written,
        files_skipped=skipped,
        chunks_fetched=run.chunks_done + refetched,
        chunks_reused=reused,
        chunk_retries=run.retries,
        link_returns=run.link_returns(),
        wire_bytes=run.wire_bytes,
        fetched_logical_bytes=run.fetched_logical_bytes,
        logical_bytes=run.written_bytes,
        seconds=time.monotonic() - started_s,
    )


Placing = Callable[[], Coroutine[Any, Any, list[tuple[FileEntry, str, Placement]]]]
"""Makes the directories of the files to write; each file with its target and `Placement`
(`netopt.dataplane.assemble.place_files`)."""


async def _fetch_and_write(
    manifest: Manifest,
    source: ChunkSource,
    held: HeldSink,
    dest: Path,
    entries: list[FileEntry],
    place: Placing,
    opts: SyncOptions,
    flusher: BatchFlusher,
    on_progress: ProgressCallback | None,
    writer: WriterProcess | None = None,
) -> tuple[SyncRun, int, int]:
    """Fetch what ``held``'s sink lacks for ``entries`` and hand each finished file to
    ``flusher`` (the small ones written whole to ``writer``, once it is ready), the files
    placed by ``place`` while the fetch begins; the run, the chunks reused from the sink
    and the chunks fetched again."""
    sink = held.sink
    with ThreadPoolExecutor(max_workers=max(1, opts.worker_threads)) as executor:
        run = SyncRun(manifest, source, held, dest, opts, on_progress, executor)
        missing: dict[str, None] = {}
        reused: set[str] = set()
        for entry in entries:
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
        led = await _carry_on_leads(run, source, manifest, missing)
        tail_bytes = tail_window_bytes(
            opts.streams, opts.stream_ahead_bytes, streamed=run.open_stream is not None
        )
        queued = [cid for cid in missing if cid not in led]
        run.queue.extend(fetch_order(queued, run.lengths, opts.start_fraction, tail_bytes))
        run.queued_bytes = sum(run.lengths[cid] for cid in queued)
        available = set(reused)
        open_files = OpenFiles()
        refetched: list[str] = []

        async def refetch(chunk_id: str) -> bytes:
            # The sink lost the chunk or it no longer verifies: this fetch counts too.
            data = await run.fetch_verified(chunk_id)
            refetched.append(chunk_id)
            return data

        async def assemblers() -> list[FileAssembler]:
            made = [
                FileAssembler(
                    entry,
                    target,
                    where,
                    held,
                    available,
                    run.in_thread,
                    refetch,
                    run.file_done,
                    flusher,
                    open_files,
                )
                # Shielded: a worker's failure cancels this wait, not the directories.
                for entry, target, where in await asyncio.shield(placing)
            ]
            users: dict[str, list[FileAssembler]] = {}
            for assembler in made:
                for cid in assembler.needs():
                    users.setdefault(cid, []).append(assembler)
            run.writers = users
            return made

        made: list[FileAssembler] = []
        placing = asyncio.ensure_future(place())
        try:
            # The first small files go to the helper process (started with the sync,
            # ready in ~50 ms): before the fetch begins.
            if writer is not None and await asyncio.to_thread(writer.ready):
                run.writer = writer
            trace.mark("writers_ready")
            with gc_frozen():
                await _run_workers(run, opts, missing, assemblers, made, available)
        except BaseExceptionGroup as group:
            raise await _dest_error(placing) or first_error(group) from None
        finally:
            # Retrieved however it ends (a sync cancelled meanwhile leaves it running on
            # its thread).
            placing.add_done_callback(_retrieved)
            for assembler in made:
                assembler.abandon()
            for stream, _ in run.leads:  # a sync that ended before a worker took them
                with contextlib.suppress(NetoptError, OSError):
                    await stream.aclose(complete=False)
            run.leads.clear()
    return run, len(reused), len(refetched)


async def _carry_on_leads(
    run: SyncRun,
    source: ChunkSource,
    manifest: Manifest,
    missing: Mapping[str, None],
) -> set[str]:
    """The chunks asked for by the source's lead streams (see `netopt.dataplane.lead`)
    that the sync's stream workers carry on (`SyncRun.leads`): one stream each, at most
    `SyncOptions.streams`, and only where streams fetch the sync's chunks whole (not
    batches, nor a small sync's parts: `streamwork.parts_per_chunk` cuts chunks only for
    fewer than ``part_connections or streams`` of them). The other streams are closed,
    and their chunks fetched as any others. A chunk a lead asked for that the sync does
    not need (in the sink already, or only in files DEST holds) is claimed: its frame is
    dropped."""
    take: Callable[..., Coroutine[Any, Any, list[tuple[Any, list[str]]]]] | None
    take = getattr(source, "take_leads", None)
    if take is None:
        return set()
    leads = await take(manifest, run.lengths)
    whole = len(missing) >= (run.options.part_connections or run.options.streams)
    keep = run.open_stream is not None and whole
    carried = leads[: run.options.streams] if keep else []
    for stream, _ in leads[len(carried) :]:
        with contextlib.suppress(NetoptError, OSError):
            await stream.aclose(complete=False)
    led: set[str] = set()
    for _, names in carried:
        for chunk_id in names:
            if chunk_id in missing:
                led.add(chunk_id)
            else:
                run.claimed.add(chunk_id)
    run.leads = list(carried)
    if carried:
        trace.count("lead_streams_carried", len(carried))
        trace.count("lead_chunks", len(led))
    return led


async def _dest_error(placing: asyncio.Future[Any]) -> BaseException | None:
    """The error making the destination's directories raised, once that is done: it goes
    before a fetch's that came first (a symlink out of DEST is refused as it was when the
    directories were made before the first request, whatever the server answers)."""
    await asyncio.wait({placing})
    if placing.cancelled():
        return None
    error = placing.exception()
    return error if isinstance(error, NetoptError) else None


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _wants_writer_process(opts: SyncOptions, manifest: Manifest) -> bool:
    """Whether the manifest has enough small files written whole from one chunk for a
    helper process to pay off (`SyncOptions.writer_process_min_files`; counted before the
    destination is scanned, so a sync that finds them up to date starts one for nothing,
    which costs it ~50 ms of another core)."""
    least = opts.writer_process_min_files
    if least is None:
        return False
    count = 0
    for entry in manifest.files:
        if written_whole(entry):
            count += 1
            if count >= least:
                return True
    return False


async def _run_workers(
    run: SyncRun,
    opts: SyncOptions,
    missing: dict[str, None],
    assemblers: Callable[[], Coroutine[Any, Any, list[FileAssembler]]],
    made: list[FileAssembler],
    available: set[str],
) -> None:
    """The fetch workers, and the file writers once ``assemblers`` has placed the files
    (each one also put in ``made``), until every file is handed over. A chunk stored before
    then is in ``available`` and the sink (held, within its budget) for its files, which take
    it when first poked."""
    async with asyncio.TaskGroup() as tg:

        def poke(assembler: FileAssembler) -> None:
            coro = assembler.poke()
            if coro is None:
                return
            try:
                tg.create_task(coro)
            except RuntimeError:
                # The group is shutting down (a worker failed or the sync was
                # cancelled): the caller abandons the file, never written.
                coro.close()

        def on_stored(chunk_id: str) -> None:
            available.add(chunk_id)
            for assembler in run.writers.get(chunk_id, ()):
                poke(assembler)

        work: Worker = run.worker if run.open_stream is None else partial(stream_worker, run)
        parts = parts_per_chunk(run, opts.part_connections or opts.streams, len(missing))
        if parts > 1:
            work = partial(part_worker, run, parts)
        for _ in range(max(1, min(opts.streams, len(missing)))):
            tg.create_task(work(on_stored))
        made.extend(await assemblers())
        for assembler in made:
            poke(assembler)
