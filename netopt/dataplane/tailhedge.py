"""The tail's hedge: a chunk arriving slowly on one stream, fetched again in parts.

At the end of a sync the streams do not end together. Streams of one sync over a lossy
long link run at different rates: on the lab's 80 Mbit/s, 140 ms, 1% loss link the
8 streams of a 100 MB sync carried 4.5 to 18 Mbit/s each. A chunk a slow stream has
started receiving when the queue empties cannot be taken over whole (the tail's steal,
`netopt.dataplane.streamwork`, moves only chunks not started), and a 1.2 MiB chunk at
5 Mbit/s arrived 1.9 s later, 1.1-1.4 s after the other streams had ended.

So a helper left idle at the tail fetches such a chunk again, cut into parts (the
server's part route), over the pool's idle connections, as a small sync does
(`HttpChunkSource.fetch_chunk_parts`): whichever copy is in first is used and the
other is cut. A chunk is hedged once, only when the stream's own copy is expected
later than `hedge_after_s` from now, and only while the stream reads it so that it can
be cut (`racing`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from netopt.dataplane import trace
from netopt.dataplane.chunkio import RawChunk
from netopt.errors import NetoptError

if TYPE_CHECKING:
    from netopt.dataplane.asked import Asked
    from netopt.dataplane.syncrun import SyncRun

log = logging.getLogger(__name__)

__all__ = [
    "HEDGE_AFTER_RTTS",
    "MAX_HEDGE_PARTS",
    "TAIL_POLL_S",
    "can_hedge",
    "hedge_after_s",
    "hedge_candidate",
    "hedge_chunk",
    "hedge_pending",
    "racing",
    "unless_arrived",
]

T = TypeVar("T")

HEDGE_AFTER_RTTS = 3.0
"""A stream's copy is hedged only when expected later than this many round trips from
now (and `SyncOptions.steal_after_s`): parts over idle connections take one round trip
to ask and one or two for their slow start."""

MAX_HEDGE_PARTS = 32
"""At most this many parts per hedged chunk: one per warm connection of the set-up
(`netopt.dataplane.prefetch.WARM_CONNECTIONS`), as a small sync's chunk; a second hedge
at once opens more (the source may hold 64). Three interleaved runs each on the lab
link: 32 parts took the random file 12.39 s on average, 8 parts 12.58 s."""

MIN_HEDGE_PART_BYTES = 32 * 1024
"""A hedged chunk is cut into parts of at least this many bytes."""

TAIL_POLL_S = 0.01
"""How often a stream's worker idle at the tail looks for a chunk to fetch again in parts:
the stream it would help may end at any time, and the sync waits for the worker's poll."""


def racing(run: SyncRun, length_bytes: int) -> bool:
    """Whether a frame of ``length_bytes`` is read so that it can be cut: where the
    source cuts chunks into parts and this one is worth cutting. Any such chunk may end
    up the tail's last, also one asked well before the queue emptied: on the lab, a
    2.9 MB chunk on a stream that had slowed arrived 1.4 s after every other chunk."""
    return can_hedge(run) and hedge_parts(run, length_bytes) >= 2


def can_hedge(run: SyncRun) -> bool:
    """Whether the source cuts chunks into parts (the server's part route)."""
    offered = getattr(run.source, "chunk_parts", 0)
    return callable(getattr(run.source, "fetch_chunk_parts", None)) and (
        isinstance(offered, int) and offered > 1
    )


def hedge_parts(run: SyncRun, length_bytes: int) -> int:
    """Into how many parts a hedged chunk of ``length_bytes`` is cut (1: not worth it)."""
    offered = getattr(run.source, "chunk_parts", 0)
    if not isinstance(offered, int):
        return 1
    return max(1, min(offered, MAX_HEDGE_PARTS, length_bytes // MIN_HEDGE_PART_BYTES))


def hedge_after_s(run: SyncRun) -> float:
    """How late a stream's copy must be expected before it is hedged (s)."""
    measured = getattr(run.source, "round_trip", None)
    found = measured() if callable(measured) else None
    rtt_s = found[0] if isinstance(found, tuple) else 0.0
    return max(run.options.steal_after_s, HEDGE_AFTER_RTTS * rtt_s)


def _last_to_hedge(run: SyncRun, stream: Asked) -> tuple[int, str] | None:
    """The position and name of ``stream``'s last chunk that is neither in nor hedged
    already, when it may be fetched again in parts: worth cutting in parts (checked
    first: a tree's streams hold thousands of small chunks, and idle workers look
    every `TAIL_POLL_S`), for the chunk the stream is receiving (position 0) read so
    that it can be cut (in `SyncRun.stolen`), and asked on no other stream. None if
    that chunk may not be, or there is none."""
    position = len(stream) - 1
    while position >= 0 and (stream[position] in run.claimed or stream[position] in run.hedged):
        position -= 1  # covered: in already, or fetched again already
    if position < 0:
        return None
    chunk_id = stream[position]
    if hedge_parts(run, run.lengths[chunk_id]) < 2:
        return None
    if position == 0 and chunk_id not in run.stolen:
        return None
    if any(other is not stream and chunk_id in other for other in run.asking):
        return None  # stolen already: a copy is on its way on another stream
    return position, chunk_id


def hedge_candidate(run: SyncRun, now_s: float, after_s: float) -> tuple[str, Asked] | None:
    """Of each stream, the last chunk it was asked for that is neither in nor hedged,
    where it may be hedged (`_last_to_hedge`), and when it is expected there at the
    stream's pace (before the stream has one: each frame up to it as long as the one
    arriving has taken so far); the one expected latest, when later than ``after_s``
    from ``now_s``, and its stream. None if there is none.

    Only the last such chunk: a hedge that comes first cuts the stream, and what the
    stream still had to deliver behind it would go back to the queue, to be asked again
    on a fresh request (on the lab's tree of installed packages, small files behind a
    large chunk: the sync's tail grew from 0.5 to 2.5 s)."""
    best: tuple[float, str, Asked] | None = None
    for other in run.asking:
        found = _last_to_hedge(run, other)
        if found is None:
            continue
        position, chunk_id = found
        left_s = other.expected_in_s(position, run.lengths, now_s)
        if left_s >= after_s and (best is None or left_s > best[0]):
            best = (left_s, chunk_id, other)
    return (best[1], best[2]) if best is not None else None


def hedge_pending(run: SyncRun) -> bool:
    """True while a stream's last chunk still to come may be hedged (`_last_to_hedge`)."""
    return any(_last_to_hedge(run, other) is not None for other in run.asking)


async def unless_arrived(arrived: asyncio.Event, work: Awaitable[T]) -> asyncio.Future[T]:
    """Run ``work`` (a copy of a chunk being fetched) until it ends or ``arrived`` is set
    (another copy came first), whichever is first; in the second case it is cancelled, in
    the middle of its frame if need be, and its end awaited. The future of ``work``: done,
    with its result or failure, or cancelled. The one rule of racing two copies: a stolen
    chunk's read on its stream (`netopt.dataplane.streamwork`) and a hedge's parts."""
    doing = asyncio.ensure_future(work)
    waiting = asyncio.ensure_future(arrived.wait())
    try:
        await asyncio.wait((doing, waiting), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        if not doing.done():
            doing.cancel()
            await asyncio.gather(doing, return_exceptions=True)
    return doing


async def hedge_chunk(
    run: SyncRun, chunk_id: str, stream: Asked, on_stored: Callable[[str], None]
) -> None:
    """Fetch ``chunk_id`` (which ``stream`` is receiving) again in parts; if this copy is
    in first, claim it (the stream's copy is cut) and store it, else cut this one. A
    failed hedge leaves the chunk to its stream. Every byte it read counts in the
    sync's wire bytes; those of a copy not used, as duplicates."""
    length = run.lengths[chunk_id]
    parts = hedge_parts(run, length)
    run.hedged.add(chunk_id)
    trace.count("tail_hedges")
    if stream.cut_hook is not None:
        stream.cut_hook()  # the stream may be cut: its version is asked for now
    arrived = run.stolen.setdefault(chunk_id, asyncio.Event())
    read_bytes = 0

    def read(n_bytes: int) -> None:
        nonlocal read_bytes
        read_bytes += n_bytes

    fetch = run.source.fetch_chunk_parts  # type: ignore[attr-defined]
    fetching: asyncio.Future[RawChunk] = await unless_arrived(
        arrived, fetch(chunk_id, length, parts, on_read=read)
    )
    raw: RawChunk | None = None
    if not fetching.cancelled():
        try:
            raw = fetching.result()
        except NetoptError as exc:  # a bad or failed copy: the stream's is still coming
            log.debug("tail hedge of chunk %s failed: %s", chunk_id[:16], exc)
            trace.count("tail_hedge_failures")
    run.wire_bytes += read_bytes
    if raw is None or chunk_id in run.claimed:
        run.duplicate_wire_bytes += read_bytes
        trace.count("duplicate_wire_bytes", read_bytes)
        return
    trace.count("tail_hedges_won")
    run.claimed.add(chunk_id)
    arrived.set()  # the stream stops receiving its copy
    await run.process(chunk_id, raw, on_stored)
