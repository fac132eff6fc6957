"""One stream's chunks asked for and not yet arrived, and the pace its frames arrive at.

The stream worker (`netopt.dataplane.streamwork`) keeps one `Asked` per live stream: what
it has named on the stream and not received, the bytes that stands for, and when its
last frames came, from which it estimates when a chunk still coming will be in (the
tail's take-over and hedge, `netopt.dataplane.tailhedge`, and each stream's share of
what is left).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from itertools import islice

__all__ = ["RATE_FRAMES", "RATE_MIN_SPAN_S", "Asked"]

RATE_FRAMES = 8
"""A stream's pace is taken over its last this many frames (see `Asked.rate_bytes_per_s`)."""
RATE_MIN_SPAN_S = 0.05
"""And only once they span this long."""


class Asked(deque[str]):
    """One stream's chunks asked for and not yet arrived, and the pace its frames arrive at."""

    def __init__(self) -> None:
        super().__init__()
        self.frames = 0
        """Frames that arrived on this stream."""
        self.asked_bytes = 0
        """Logical bytes of the chunks asked for and not yet arrived (kept as they change:
        summing them per frame costs O(chunks ahead), thousands for a tree of small files)."""
        self.last_frame_s = time.monotonic()
        self.recent: deque[tuple[float, int]] = deque(maxlen=RATE_FRAMES)
        """When its last frames arrived (monotonic s) and their logical bytes."""
        self.recent_bytes = 0
        """The sum of ``recent``'s bytes."""
        self.end_names: Callable[[], None] | None = None
        """Its stream's `ChunkStream.end` (set by the worker that opened it)."""
        self.cut_hook: Callable[[], None] | None = None
        """Its stream's ``may_be_cut``, where the source has one (set with `end_names`)."""
        self.ended = False
        """Whether its stream named its end: nothing more is asked on it."""

    def ask(self, chunk_id: str, length_bytes: int) -> None:
        """Note ``chunk_id`` (of ``length_bytes``) as asked for, last."""
        self.append(chunk_id)
        self.asked_bytes += length_bytes

    def arrived(self, length_bytes: int) -> None:
        """The oldest chunk asked for (of ``length_bytes``) arrived: drop it, time it."""
        self.popleft()
        self.asked_bytes -= length_bytes
        now_s = time.monotonic()
        if len(self.recent) == RATE_FRAMES:
            self.recent_bytes -= self.recent[0][1]
        self.recent.append((now_s, length_bytes))
        self.recent_bytes += length_bytes
        self.last_frame_s = now_s
        self.frames += 1

    @property
    def rate_bytes_per_s(self) -> float:
        """Logical bytes per second its last frames arrived at (`RATE_FRAMES`, the first
        one's arrival as the start); 0 until they span `RATE_MIN_SPAN_S`. Frames that
        arrive together (read from one buffer) make no rate of their own."""
        if len(self.recent) < 2:
            return 0.0
        span_s = self.recent[-1][0] - self.recent[0][0]
        if span_s < RATE_MIN_SPAN_S:
            return 0.0
        return (self.recent_bytes - self.recent[0][1]) / span_s

    def head_left_s(self, length_bytes: int, now_s: float) -> float:
        """Estimated seconds until the chunk arriving (of ``length_bytes``) is in, at the
        stream's pace (0 while unknown); once it is overdue, as long again as it is
        overdue: a stream that has slowed counts as slow."""
        rate = self.rate_bytes_per_s
        if not rate:
            return 0.0
        expected_s = self.last_frame_s + length_bytes / rate
        return abs(expected_s - now_s)

    def expected_in_s(self, position: int, lengths_bytes: Mapping[str, int], now_s: float) -> float:
        """Estimated seconds from ``now_s`` until the chunk at ``position`` (0: the one
        arriving) is in. At the stream's pace: the one arriving as `head_left_s` says, and
        each behind it, up to that one, by its bytes. Before the stream has a pace: each
        frame up to it as long as the one arriving has taken so far. The one estimate of
        a stream's lateness: the tail's take-over (`netopt.dataplane.streamwork`) and
        hedge (`netopt.dataplane.tailhedge`) both ask it."""
        rate = self.rate_bytes_per_s
        if not rate:
            return (now_s - self.last_frame_s) * (position + 1)
        behind_bytes = sum(lengths_bytes[cid] for cid in islice(self, 1, position + 1))
        return self.head_left_s(lengths_bytes[self[0]], now_s) + behind_bytes / rate
