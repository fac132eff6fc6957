"""A lead: a cold sync's first chunks, asked for by their place in the version before
the manifest is in.

A cold sync of a tree spends its first seconds on the manifest while the link idles: a
100,000-file tree's 4.8 MB of zstd took 1.3 s to arrive over the lab's 140 ms, 80 Mbit/s
link, and the client then worked 1.1 s on it before it asked for a chunk. The chunks'
names are in the manifest, but their order is known to both ends: every chunk of a
version once, in first-use order (`Manifest.chunk_order`), the order a sync with nothing
in hand fetches them in. So as soon as the info names the version, the client opens
streams asking the server for "COUNT chunks of version V from START, in runs of
`LEAD_BLOCK_CHUNKS` every EVERY" (the stream route's ``lead``, ``from``, ``count`` and
``every``; `lead_positions` is the one rule both ends count them by). It holds the
bytes unread (at most `LEAD_WIRE_MAX_BYTES`) until the manifest is in and checked; it
then knows the names (the same positions of the same order), and the sync carries those
streams on as its own: each frame is checked against its name as on any stream, and a
server that sent others breaks its stream, whose chunks are fetched again.

Only a sync with nothing of the dataset in hand leads (see `lead_ranges` for how much);
pure: the streams are `netopt.dataplane.lead`'s.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = [
    "LEAD_BLOCK_CHUNKS",
    "LEAD_EARLY_BYTES",
    "LEAD_MAX_BYTES",
    "LEAD_MAX_CHUNKS",
    "LEAD_MIN_BYTES",
    "LEAD_MIN_CHUNKS",
    "LEAD_WIRE_MAX_BYTES",
    "lead_positions",
    "lead_ranges",
]

LEAD_MIN_CHUNKS = 64
LEAD_MIN_BYTES = 16 * 1024 * 1024
"""A dataset of fewer chunks or bytes is not led: its manifest is small and comes in a
round trip or two, and a small sync spreads its few chunks over every warm connection
instead (`netopt.dataplane.streamwork.parts_per_chunk`)."""

LEAD_MAX_BYTES = 16 * 1024 * 1024
"""Logical bytes a sync asks for as its lead, at most, over all its streams; and never
more than half of the dataset (`lead_ranges`), so the rest goes to each stream at the
rate its frames arrive. Enough to keep the link busy from the info to the end of the
manifest's parse for a tree of packages on the lab's link (the manifest of 7,955 files
came 0.5 s after the info, and the first frame used to come 0.35 s after that); a
96 MiB lead, read into memory as it came, held back a 100,000-file tree's manifest from
1.8 s to 2.0-3.5 s and its sync ended no sooner."""

LEAD_EARLY_BYTES = 2 * 1024 * 1024
"""Bytes of a lead's frames read, all streams together, while the manifest is still
coming: past it a stream stops reading, and TCP holds the server back (once the kernel's
buffers are full). The streams open and their windows grow without taking the link from
the manifest: read without this bound, 8 lead streams held back the 100,000-file tree's
4.8 MB manifest from 1.8 s to 2.9-3.5 s on the lab's link; with it (and a 16 MiB lead)
it came at 1.9-2.2 s, against 1.7-1.8 s without a lead."""

LEAD_WIRE_MAX_BYTES = LEAD_MAX_BYTES + 1024 * 1024
"""Bytes of a lead's answers held in memory, all streams together, once the manifest is
in, while the sync parses and checks it: a lead's frames are about its chunks' bytes
(zstd adds at most 1/128 to an incompressible chunk), so this bounds only a server that
sends more than it was asked for. Past it a stream stops reading and TCP holds the
server back."""

LEAD_MAX_CHUNKS = 1 << 24
"""The most chunks one lead request may count (``count``, and ``every``); the server
walks the version's order as it sends, so this only bounds the digits it parses."""

LEAD_BLOCK_CHUNKS = 64
"""A lead's streams take the version's chunks in turn by runs of this many (see
`lead_positions`), so that together they bring them nearly in order: a sync writes its
files as their chunks come, and on the lab's ext4 creating 100,000 small files took
2.7-3.3 s in path order but 6.3-10.4 s as 8 interleaved runs of 12,500 (one per stream,
each its own directories), which made the first leads (a contiguous range per stream)
slower than no lead at all. Within a run a stream's chunks are neighbours, which its
zstd context compresses together as well as the sync's own streams' runs."""


def lead_positions(total_chunks: int, start: int, count: int, every: int) -> Iterator[int]:
    """The positions in a version's `Manifest.chunk_order` (of ``total_chunks``) that a
    lead of ``count`` chunks stands for: runs of `LEAD_BLOCK_CHUNKS` starting at
    ``start``, ``start + every``, ``start + 2 * every`` and so on, until ``count`` or the
    end of the order. ValueError, before any position, for a lead that counts none
    (``count`` < 1, ``start`` outside the order), more than `LEAD_MAX_CHUNKS`, or whose
    runs overlap (``every`` < `LEAD_BLOCK_CHUNKS`)."""
    if not 0 <= start < total_chunks:
        raise ValueError(f"a lead from chunk {start} of a version of {total_chunks} chunks")
    if not 1 <= count <= LEAD_MAX_CHUNKS:
        raise ValueError(f"a lead of {count} chunks (1..{LEAD_MAX_CHUNKS})")
    if not LEAD_BLOCK_CHUNKS <= every <= LEAD_MAX_CHUNKS:
        raise ValueError(
            f"a lead's runs every {every} chunks ({LEAD_BLOCK_CHUNKS}..{LEAD_MAX_CHUNKS})"
        )
    return _positions(total_chunks, start, count, every)


def _positions(total_chunks: int, start: int, count: int, every: int) -> Iterator[int]:
    for index in range(count):
        position = start + index // LEAD_BLOCK_CHUNKS * every + index % LEAD_BLOCK_CHUNKS
        if position >= total_chunks:
            return
        yield position


def lead_ranges(
    total_chunks: int, total_bytes: int, streams: int, max_bytes: int = LEAD_MAX_BYTES
) -> list[tuple[int, int, int]]:
    """``(start, count, every)`` of each stream's lead (see `lead_positions`), for a
    version of ``total_chunks`` chunks and ``total_bytes`` (the info's): the first
    ``min(max_bytes, total_bytes / 2)`` bytes' worth of chunks at the average chunk
    size, dealt to ``streams`` streams in turn by runs of `LEAD_BLOCK_CHUNKS`; none for
    a dataset under `LEAD_MIN_CHUNKS` or `LEAD_MIN_BYTES`."""
    if total_chunks < LEAD_MIN_CHUNKS or total_bytes < LEAD_MIN_BYTES or streams < 1:
        return []
    lead_bytes = min(max_bytes, total_bytes // 2)
    chunks = min(total_chunks, lead_bytes * total_chunks // total_bytes)
    per_stream = chunks // streams
    if per_stream < 1:
        return []
    every = streams * LEAD_BLOCK_CHUNKS
    return [(index * LEAD_BLOCK_CHUNKS, per_stream, every) for index in range(streams)]
