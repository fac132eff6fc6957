"""The order a sync asks for its chunks in: file order, from a starting point, and the
tail largest first.

Pure: `fetch_order` takes the missing chunks in file order and their lengths and returns
the queue. Two rules:

- Nodes of a region syncing one dataset at once start at different places
  (``start_fraction``, wrapping around), so they fetch different chunks first.
- Over streams, the last `TAIL_ROUNDS` rounds of the sync's streams (each keeps about
  ``ahead_bytes`` asked for) are reordered largest first, so the chunks asked for last
  are the smallest ones: the longest-processing-time-first rule of scheduling. Content-
  defined chunks run from a quarter of their average size to several times it (2.8 MiB
  in the benchmark's random file chunked at 1 MiB, 3.5 MiB in its Parquet), and a
  stream of a long lossy link carries 5-18 Mbit/s: on the lab, a 1.2 MiB chunk asked
  last on a 5 Mbit/s stream arrived 1.1 s after every other chunk. Three interleaved
  syncs each: the random file 12.92 s on average in file order, 12.32 s with this rule
  and the streams' shares by rate (`netopt.dataplane.streamwork`). Chunks too small to
  matter keep their order (`SMALL_CHUNK_BYTES`), last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["SMALL_CHUNK_BYTES", "TAIL_ROUNDS", "fetch_order", "tail_window_bytes"]

TAIL_ROUNDS = 4
"""How many rounds of asked-ahead bytes over all streams the largest-first tail covers:
when the queue empties, each stream still has about one round asked for, so the tail
that is sorted must be several rounds long for its last round to hold only small chunks."""


SMALL_CHUNK_BYTES = 64 * 1024
"""Chunks under this size keep their file order at the end of the tail: at the ~9 Mbit/s
of one stream of a long lossy link one takes under 60 ms, never what the streams wait
for at the end, and a tree of small files is then still written directory by directory."""


def tail_window_bytes(streams: int, ahead_bytes: int, *, streamed: bool = True) -> int:
    """Logical bytes at the end of the queue that are ordered largest first: none unless
    the sync fetches over streams (``streamed``). A region's shared sync fetches in
    batches, and its nodes start at different places to stay on different chunks; a
    largest-first tail would send them all after the same chunks of a dataset smaller
    than the window."""
    if not streamed:
        return 0
    return TAIL_ROUNDS * max(1, streams) * max(0, ahead_bytes)


def fetch_order(
    file_order: Sequence[str],
    lengths_bytes: Mapping[str, int],
    start_fraction: float,
    tail_bytes: int,
) -> list[str]:
    """``file_order`` (chunk ids, each once) rotated to start at ``start_fraction`` of it
    (clamped to 0..1), then its last chunks, ``tail_bytes`` of them at least (by
    ``lengths_bytes``), reordered: those of `SMALL_CHUNK_BYTES` or more largest first
    (ties keep their order), then the smaller ones in their order."""
    count = len(file_order)
    if count == 0:
        return []
    start = int(count * min(max(start_fraction, 0.0), 1.0)) % count
    order = [*file_order[start:], *file_order[:start]]
    window = 0
    covered_bytes = 0
    while window < count and covered_bytes < tail_bytes:
        window += 1
        covered_bytes += lengths_bytes[order[count - window]]
    if window < 2:
        return order
    head, tail = order[: count - window], order[count - window :]
    large = [cid for cid in tail if lengths_bytes[cid] >= SMALL_CHUNK_BYTES]
    large.sort(key=lambda chunk_id: -lengths_bytes[chunk_id])
    small = [cid for cid in tail if lengths_bytes[cid] < SMALL_CHUNK_BYTES]
    return [*head, *large, *small]
