"""A cold sync's lead streams: opened as soon as the info names the version, read into
memory while the manifest comes, handed to the sync once it is in.

The rule (which chunks, how many) is `netopt.dataplane.leadplan`'s. A `Lead` holds one
stream per range, each asking the server for its chunks by place (``lead``, ``from``,
``count``, ``every``) and reading the answer unparsed (`HttpChunkStream.pull`): at most its
share of `LEAD_EARLY_BYTES` while the manifest comes, of `LEAD_WIRE_MAX_BYTES` once it
is in and being parsed (`Lead.widen`). `Lead.take` stops the reading and, for the manifest the sync
checked, names each stream's chunks (`HttpChunkStream.adopt`): from there each stream is
one of the sync's own (`netopt.dataplane.streamwork.stream_worker`), its frames checked
against those names. A stream whose request failed, or a lead of another version than
the manifest's, is closed and its chunks are fetched as any others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from netopt.dataplane import trace
from netopt.dataplane.leadplan import LEAD_EARLY_BYTES, LEAD_WIRE_MAX_BYTES, lead_positions
from netopt.dataplane.streaming import HttpChunkStream
from netopt.errors import NetoptError
from netopt.transfer.manifest import Manifest

__all__ = ["Lead", "LeadStream"]


@dataclass
class LeadStream:
    """One stream of a lead: its request's range, and the task reading its answer."""

    stream: HttpChunkStream
    start: int
    count: int
    every: int
    reading: asyncio.Task[bool]


class Lead:
    """The lead streams of one sync, reading from the moment they are made: each up to
    its share of ``early_bytes`` while the manifest comes (`LEAD_EARLY_BYTES`), of
    ``wire_max_bytes`` once it is in (`widen`)."""

    def __init__(
        self,
        version: str,
        streams: Sequence[tuple[HttpChunkStream, tuple[int, int, int]]],
        early_bytes: int = LEAD_EARLY_BYTES,
        wire_max_bytes: int = LEAD_WIRE_MAX_BYTES,
    ) -> None:
        self.version = version
        self.each_max_bytes = max(1, wire_max_bytes // max(1, len(streams)))
        """The most bytes each stream reads once the manifest is in (`widen`)."""
        each_bytes = max(1, early_bytes // max(1, len(streams)))
        self._streams = []
        for stream, lead in streams:
            stream.pull_limit_bytes = each_bytes
            self._streams.append(LeadStream(stream, *lead, asyncio.ensure_future(stream.pull())))
        trace.count("lead_streams", len(self._streams))

    def widen(self) -> None:
        """The manifest is in (the sync is parsing it, the link idles): each stream reads
        on, up to its share of ``wire_max_bytes`` (a read that stopped at its early share
        starts again)."""
        for lead in self._streams:
            lead.stream.pull_limit_bytes = max(lead.stream.pull_limit_bytes, self.each_max_bytes)
            reading = lead.reading
            stopped = reading.done() and not reading.cancelled() and reading.exception() is None
            if stopped and reading.result():  # at its early share, not at its answer's end
                lead.reading = asyncio.ensure_future(lead.stream.pull())

    @property
    def held_bytes(self) -> int:
        """Bytes the streams have read and hold, all together."""
        return sum(lead.stream.pulled_bytes for lead in self._streams)

    async def _stopped(self) -> list[LeadStream]:
        """Each stream's reading stopped (cancelled where it still runs); those whose
        answer began and whose reads went well, the others closed."""
        for lead in self._streams:
            lead.reading.cancel()
        await asyncio.gather(*(lead.reading for lead in self._streams), return_exceptions=True)
        good: list[LeadStream] = []
        for lead in self._streams:
            failed = not lead.reading.cancelled() and lead.reading.exception() is not None
            # One whose answer had not begun is dropped: its request may be half sent.
            if failed or not lead.stream.answered:
                await _closed(lead.stream)
            else:
                good.append(lead)
        self._streams = []
        return good

    async def take(
        self, manifest: Manifest, lengths: Mapping[str, int] | None = None
    ) -> list[tuple[HttpChunkStream, list[str]]]:
        """Each good stream with the chunk names of its lead in ``manifest`` (already
        adopted by the stream: see `HttpChunkStream.adopt`); none when ``manifest`` is
        another version than the lead asked for (every stream closed). ``lengths``: its
        chunks' lengths, where the caller has them (else they are counted again)."""
        good = await self._stopped()
        if manifest.manifest_id != self.version:
            for lead in good:
                await _closed(lead.stream)
            trace.count("lead_other_version")
            return []
        order = manifest.chunk_order
        if lengths is None:
            lengths = manifest.unique_chunks()
        taken: list[tuple[HttpChunkStream, list[str]]] = []
        for lead in good:
            at = lead_positions(len(order), lead.start, lead.count, lead.every)
            names = [order[position] for position in at]
            lead.stream.adopt([(name, lengths[name]) for name in names])
            trace.count("lead_bytes_held", lead.stream.pulled_bytes)
            taken.append((lead.stream, names))
        return taken

    async def aclose(self) -> None:
        """Close every stream not taken."""
        for lead in await self._stopped():
            await _closed(lead.stream)


async def _closed(stream: HttpChunkStream) -> None:
    """``stream`` closed without waiting for its end (its connection is dropped)."""
    with contextlib.suppress(NetoptError, OSError):
        await stream.aclose(complete=False)
