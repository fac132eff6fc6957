"""The stream worker: fetch a sync's chunks over full-duplex stream requests.

One long request per connection for the whole sync (the server's stream route): the
worker names chunks ahead on the request body, enough to keep about
`SyncOptions.stream_ahead_bytes` on the wire, and names the next one as soon as a frame
arrives, so the connection never idles between batches. Once the queue is empty a
stream names nothing more and ends its request body at once: the server's end frame
(the version check) then follows the last frame instead of waiting a round trip for the
client's end. What is left is shared between the streams by the rate each one's
frames arrive at (`_share_bytes`), so a slow stream stops taking chunks first. At the
tail a worker whose stream ended fetches again, in parts over idle connections, the
chunk another stream is expected to deliver last (`netopt.dataplane.tailhedge`); from
a server without the part route it opens a fresh stream to take over ("steal") a chunk
another stream has queued but not started receiving. Whichever copy arrives first is
used, and a stream whose remaining chunks all arrived elsewhere is cut, also in the
middle of a frame: on the lab's 100 MB JSON-lines sync a stealing stream's copy (a
fresh request, its window small again) still took 0.28 s to arrive after the original
had been stored, and the sync waited for it. A stream that breaks or stalls is
replaced by a fresh one (see `stream_worker`). Without a stream route on the server
the worker falls back to `SyncRun.worker` (batches).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from netopt.dataplane import trace
from netopt.dataplane.asked import Asked
from netopt.dataplane.chunkio import RawChunk
from netopt.dataplane.streamctx import ContextError
from netopt.dataplane.streaming import ChunkStream
from netopt.dataplane.syncrun import BACKOFF_POLL_S, SyncRun, bounded_inflight
from netopt.dataplane.tailhedge import (
    TAIL_POLL_S,
    can_hedge,
    hedge_after_s,
    hedge_candidate,
    hedge_chunk,
    hedge_pending,
    racing,
    unless_arrived,
)
from netopt.errors import IntegrityError, NetworkError, ValidationError

# Logs under the sync engine's name, as it did before this module was split from it.
log = logging.getLogger(__name__)

__all__ = ["MIN_PART_BYTES", "part_worker", "parts_per_chunk", "stream_worker"]


MIN_PART_BYTES = 32 * 1024
"""A chunk is cut into parts of at least this many bytes (see `parts_per_chunk`): a 1 MiB
chunk into 32, one per warm connection (`prefetch.WARM_CONNECTIONS`)."""


def _top_up(run: SyncRun, stream: ChunkStream, asked: Asked) -> bool:
    """Name chunks on ``stream`` until it has asked for `stream_ahead_bytes` of wire (and
    for at least two chunks: one arriving, one the server prepares), but never past its
    fair share (`_share_bytes`) once it has one; once the queue is empty, end its names
    (`ChunkStream.end`) and return True: nothing more is named on it.

    A fresh stream (nothing asked) finding the queue empty takes over the tail: it asks
    for a chunk that another stream has asked for but not started receiving, and
    whichever copy arrives first is used (see `_steal`).

    The stream that empties the queue ends every live stream's names (`_end_all`), not
    only its own: one whose last frame is on its way would otherwise name its end only
    when that frame arrived, and its end frame (the version) would come a round trip
    after it.
    """
    if asked.ended:
        return True
    ratio = run.fetched_logical_bytes / run.wire_bytes if run.wire_bytes else 1.0
    ahead_bytes = run.options.stream_ahead_bytes * max(1.0, ratio)
    share_bytes = _share_bytes(run, asked)
    while run.queue and (len(asked) < 2 or asked.asked_bytes < ahead_bytes):
        if asked and asked.asked_bytes + run.lengths[run.queue[0]] > share_bytes:
            break
        chunk_id = run.queue.popleft()
        length = run.lengths[chunk_id]
        run.queued_bytes -= length
        if chunk_id in run.claimed:
            continue  # another stream's copy arrived meanwhile
        asked.ask(chunk_id, length)
        stream.ask(chunk_id, length)
    if not asked and not run.queue:
        stolen = _steal(run, asked)
        if stolen is not None:
            run.stolen.setdefault(stolen, asyncio.Event())
            asked.ask(stolen, run.lengths[stolen])
            stream.ask(stolen, run.lengths[stolen])
            trace.count("tail_steals")
    if run.queue:
        return False
    asked.ended = True
    stream.end()
    _end_all(run)
    return True


def _end_all(run: SyncRun) -> None:
    """The queue is empty: every live stream names its end now (each asked for what it
    will receive; a chunk put back later goes to a fresh stream)."""
    for other in run.asking:
        if not other.ended and other.end_names is not None:
            other.ended = True
            other.end_names()


def _share_bytes(run: SyncRun, mine: Asked) -> float:
    """Logical bytes the stream of ``mine`` may have asked for: what is queued or asked
    anywhere, split over the sync's streams in proportion to the rates their frames
    arrive at (evenly while they are unknown). A small sync's chunks then go out over
    all of its connections at once, each with its own initial congestion window (a
    fresh connection carries ~14 KB in its first round trip and doubles from there),
    instead of queueing on the first one; a large sync's shares are far above
    `SyncOptions.stream_ahead_bytes` until its tail, where a slow stream stops taking
    chunks first: the streams of one sync over a lossy long link ran at 4.5 to 18
    Mbit/s each, and with even shares the slowest ended 1-2 s after the others."""
    streams = max(1, min(run.options.streams, run.chunks_total))
    outstanding_bytes = run.queued_bytes + sum(other.asked_bytes for other in run.asking)
    return outstanding_bytes * _rate_share(run, mine, streams)


def _rate_share(run: SyncRun, mine: Asked, streams: int) -> float:
    """The part of the sync's rate that the stream of ``mine`` carries: its rate over
    the sum of the live streams' (a stream without one counts at their mean), the
    streams not open yet counted at the mean too; 1 / ``streams`` while no rate is
    known."""
    rates = [other.rate_bytes_per_s for other in run.asking if other.rate_bytes_per_s > 0]
    if not rates or not mine.rate_bytes_per_s:
        return 1 / streams
    mean = sum(rates) / len(rates)
    total = sum(rates) + mean * max(0, streams - len(rates))
    return mine.rate_bytes_per_s / total


def _lagging(run: SyncRun, mine: Asked | None) -> bool:
    """True while the queue is empty and another stream has a chunk queued behind the
    one it is receiving, not yet arrived anywhere (one this stream might take over)."""
    if run.queue:
        return False
    return any(
        other is not mine and any(cid not in run.claimed for cid in list(other)[1:])
        for other in run.asking
    )


def _steal(run: SyncRun, mine: Asked | None) -> str | None:
    """The last-queued chunk of the most loaded other stream that has not started
    arriving there, that no other stream has asked for too, and that is expected there
    later than `SyncOptions.steal_after_s` from now; None if there is none."""
    asked_anywhere: dict[str, int] = {}
    for other in run.asking:
        for cid in other:
            asked_anywhere[cid] = asked_anywhere.get(cid, 0) + 1
    best: tuple[int, str] | None = None
    now_s = time.monotonic()
    for other in run.asking:
        if other is mine or len(other) < 2:
            continue
        load_bytes = other.asked_bytes
        candidate = other[-1]
        if candidate in run.claimed or asked_anywhere[candidate] > 1:
            continue
        if other.expected_in_s(len(other) - 1, run.lengths, now_s) < run.options.steal_after_s:
            continue
        if best is None or load_bytes > best[0]:
            best = (load_bytes, candidate)
    return best[1] if best is not None else None


async def _run_stream(
    run: SyncRun, stream: ChunkStream, asked: Asked, on_stored: Callable[[str], None]
) -> bool:
    """Read frames off ``stream`` until what it asked for has arrived; True when it ended
    with the queue empty (its worker may then help a stream that lags, on a fresh one).

    The frames that arrived together (small chunks: ``next_buffered``, where the stream
    has it) go to `SyncRun.process_group` as one group, at most half the stream's
    in-flight chunks (`SyncRun.inflight_limit`), so one group is verified and stored
    while the next is read. Stops early, dropping the connection, once every chunk
    still expected on it has arrived over another stream.
    """
    buffered: Callable[[str, int], RawChunk | None] | None = getattr(stream, "next_buffered", None)
    # The source's hook for a stream that may be cut (the tail's steal), where it has one.
    may_be_cut: Callable[[], None] | None = getattr(stream, "may_be_cut", None)
    group_max = max(1, run.inflight_limit // 2)
    inflight: dict[asyncio.Task[None], int] = {}
    try:
        ended = _top_up(run, stream, asked)
        while asked:
            if all(cid in run.claimed for cid in asked):
                trace.count("streams_cut_in_tail")
                break
            chunk_id = asked[0]
            raw: RawChunk | None
            if chunk_id in run.stolen or racing(run, run.lengths[chunk_id]):
                # Here already (a bundle's chunk read with the first): taken, not cut off.
                raw = buffered(chunk_id, run.lengths[chunk_id]) if buffered is not None else None
                if raw is None:
                    if chunk_id in run.stolen and may_be_cut is not None:
                        may_be_cut()
                    # Read so that it can be cut: another stream may steal it, or a
                    # helper fetch it again in parts (`netopt.dataplane.tailhedge`).
                    run.stolen.setdefault(chunk_id, asyncio.Event())
                    raw = await _unless_arrived_elsewhere(run, stream, chunk_id)
                if raw is None:
                    trace.count("streams_cut_in_tail")
                    break
            else:
                raw = await stream.next(chunk_id, run.lengths[chunk_id])
            group: list[tuple[str, RawChunk]] = []
            try:
                while raw is not None:
                    _arrived(run, asked, chunk_id, raw, group)
                    if buffered is None or not asked or len(group) >= group_max:
                        break
                    chunk_id = asked[0]
                    raw = buffered(chunk_id, run.lengths[chunk_id])
                    if raw is not None:
                        trace.count("frames_read_buffered")
            finally:
                if group:  # dispatched even when a later frame failed: they are claimed
                    task = asyncio.create_task(run.process_group(group, on_stored))
                    inflight[task] = len(group)
            if not ended:
                ended = _top_up(run, stream, asked)
            inflight = await bounded_inflight(inflight, run.inflight_limit)
    finally:
        results = await asyncio.gather(*inflight, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return not run.queue


async def _unless_arrived_elsewhere(
    run: SyncRun, stream: ChunkStream, chunk_id: str
) -> RawChunk | None:
    """The frame of ``chunk_id`` (asked for on two streams) from ``stream``, or None as
    soon as the other stream's copy arrived first: the read is then cancelled in the
    middle of its frame, and the stream can only be dropped. The tail's stolen chunks
    come here, and, from a source that cuts chunks into parts, every chunk worth cutting
    (`netopt.dataplane.tailhedge.racing`: a task each, for chunks of 64 KiB or more);
    every other frame is awaited directly."""
    arrived = run.stolen[chunk_id]
    if arrived.is_set():
        return None
    reading = await unless_arrived(arrived, stream.next(chunk_id, run.lengths[chunk_id]))
    if not reading.cancelled() and (reading.exception() is None or not arrived.is_set()):
        return reading.result()  # the frame, or the stream's failure
    return None  # the other copy won; a failure of this one no longer matters


def _arrived(
    run: SyncRun, asked: Asked, chunk_id: str, raw: RawChunk, group: list[tuple[str, RawChunk]]
) -> None:
    """``chunk_id``'s frame arrived on the stream of ``asked``: counted, and added to
    ``group`` unless another stream's copy came first."""
    asked.arrived(run.lengths[chunk_id])
    run.wire_bytes += raw.wire_bytes
    if chunk_id in run.claimed:
        run.duplicate_wire_bytes += raw.wire_bytes
        trace.count("duplicate_wire_bytes", raw.wire_bytes)
    else:
        run.claimed.add(chunk_id)
        group.append((chunk_id, raw))
        stolen = run.stolen.get(chunk_id)
        if stolen is not None:
            stolen.set()  # the other stream stops receiving its copy


async def stream_worker(run: SyncRun, on_stored: Callable[[str], None]) -> None:
    """Like `SyncRun.worker`, over one chunk stream per connection: the next chunk is named as
    soon as one arrives, so the connection never idles and work spreads to the end.

    A stream that breaks (a server restarting, a link cut, a connection the source
    found stalled) charges the chunk it was receiving (`SyncRun.charge`), puts its
    chunks back in the queue, waits (`SyncRun.back_off`) and opens a fresh stream, on
    a fresh connection: while the server or the link is down, that probes it about
    every `SyncOptions.backoff_max_s`, and the source's link watch about every 0.25 s;
    once the watch sees the server answer, the wait ends. A stream that ended with the
    queue empty leaves its worker at the tail, where it fetches again in parts a chunk
    that another stream lags on (`netopt.dataplane.tailhedge`), or, where the source
    cannot cut chunks, opens a fresh stream to take one over (`_steal`). Falls back to
    batches when the server has no stream route.
    """
    failures = 0
    helping = False
    hedging = can_hedge(run)
    while run.open_stream is not None and (
        run.leads
        or run.queue
        or (helping and (hedge_pending(run) if hedging else _lagging(run, None)))
    ):
        if not run.leads and not run.queue and hedging:
            # Idle at the tail: fetch in parts what a stream lags on, while one may.
            target = hedge_candidate(run, time.monotonic(), hedge_after_s(run))
            if target is not None:
                await hedge_chunk(run, *target, on_stored)
            else:
                await asyncio.sleep(TAIL_POLL_S)
            continue
        if not run.leads and not run.queue and _steal(run, None) is None:
            # Idle at the tail: stay while another stream may still need help.
            await asyncio.sleep(min(run.options.steal_after_s / 5, BACKOFF_POLL_S))
            continue
        returns_at_open = run.link_returns()
        asked = Asked()
        if run.leads:
            # A lead's stream, its chunks asked for already (`netopt.dataplane.lead`).
            stream, names = run.leads.pop()
            for chunk_id in names:
                asked.ask(chunk_id, run.lengths[chunk_id])
        else:
            stream = run.open_stream()
        asked.end_names = stream.end
        asked.cut_hook = getattr(stream, "may_be_cut", None)
        run.asking.append(asked)
        failure: NetworkError | ContextError | None = None
        helping = False
        try:
            helping = await _run_stream(run, stream, asked, on_stored)
        except ValidationError:
            if run.chunks_done or run.retries:
                raise
            # A server without the stream route: use batches from now on.
            log.debug("the source has no stream route; fetching in batches")
            run.open_stream = None
        except (NetworkError, ContextError) as exc:
            # A stream context that went wrong is a bad copy of the chunk being received
            # (charged as one) and the end of that stream, as a break is.
            failure = exc
            if asked:  # the chunk being received (or a bundle's that came out wrong)
                hit = exc.chunk_id if isinstance(exc, ContextError) else None
                run.charge(hit if hit is not None and hit in asked else asked[0], exc)
        finally:
            # By identity: deques compare by content, and two streams' may be equal (empty).
            run.asking[:] = [other for other in run.asking if other is not asked]
            run.requeue([cid for cid in asked if cid not in run.claimed])
            await stream.aclose(complete=not asked)
        if failure is not None:
            trace.count("stream_failures")
            failures = 1 if asked.frames else failures + 1
            failures = await run.back_off(failure, failures, returns_at_open)
    if run.queue:
        await run.worker(on_stored)
    trace.count("streams_ended")
    trace.mark("first_stream_done")
    trace.mark_last("last_stream_done")


def parts_per_chunk(run: SyncRun, streams: int, missing: int) -> int:
    """Into how many parts each chunk of a sync of ``missing`` chunks is fetched: 1 (whole,
    over streams) unless the sync has fewer chunks than ``streams`` and the source cuts
    chunks (``chunk_parts``, the server's part route). A small sync of one large chunk
    then fills every warm connection, each in its slow start, instead of one; a part
    is at least `MIN_PART_BYTES` of the smallest chunk."""
    fetch = getattr(run.source, "fetch_chunk_parts", None)
    offered = getattr(run.source, "chunk_parts", 0)
    if not callable(fetch) or not isinstance(offered, int) or not 0 < missing < streams:
        return 1
    smallest = min((run.lengths[cid] for cid in run.queue), default=0)
    return max(1, min(streams // missing, offered, smallest // MIN_PART_BYTES))


async def part_worker(run: SyncRun, parts: int, on_stored: Callable[[str], None]) -> None:
    """Fetch chunks off the queue, each as ``parts`` parts in parallel
    (``source.fetch_chunk_parts``); verify each joined chunk and store it. A failed or bad
    copy goes back in the queue, charged to its chunk (see `SyncRun.charge`)."""
    fetch = run.source.fetch_chunk_parts  # type: ignore[attr-defined]
    failures = 0
    while run.queue:
        chunk_id = run.queue.popleft()
        length = run.lengths[chunk_id]
        run.queued_bytes -= length
        returns_at_start = run.link_returns()
        try:
            raw = await fetch(chunk_id, length, parts)
        except (NetworkError, IntegrityError) as exc:
            run.requeue([chunk_id])
            run.charge(chunk_id, exc)
            failures = await run.back_off(exc, failures + 1, returns_at_start)
            continue
        failures = 0
        trace.count("chunk_parts", parts)
        run.wire_bytes += raw.wire_bytes
        await run.process(chunk_id, raw, on_stored)
