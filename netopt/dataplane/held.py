"""A sink wrapper that keeps freshly verified chunks in memory until their files are written."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from netopt.dataplane.chunkio import ChunkSink

__all__ = ["BlockingPut", "GroupPut", "HeldSink", "blocking_put", "blocking_put_group"]

BlockingPut = Callable[[str], Callable[[bytes], None]]
"""A sink's optional ``blocking_put(chunk_id)``: called on the loop, it returns a plain
function that stores the chunk's bytes as `ChunkSink.put` would, safe to run on a pool
thread (the sync then verifies and stores a chunk in one hand-off)."""


GroupPut = Callable[[], Callable[[Sequence[tuple[str, bytes]]], None]]
"""A sink's optional ``blocking_put_group()``: called on the loop, it returns a plain
function that stores several chunks (name, bytes) at once, as many `BlockingPut` calls
would, safe to run on a pool thread; raises for them all when it fails."""


def blocking_put_group(sink: ChunkSink) -> GroupPut | None:
    """``sink``'s `GroupPut` (through a `HeldSink`: its sink's), None when it has none."""
    maker = getattr(sink.sink if isinstance(sink, HeldSink) else sink, "blocking_put_group", None)
    return maker if callable(maker) else None


def blocking_put(sink: ChunkSink) -> BlockingPut | None:
    """``sink``'s `BlockingPut` (through a `HeldSink`: its sink's), None when it has none."""
    maker = getattr(sink.sink if isinstance(sink, HeldSink) else sink, "blocking_put", None)
    return maker if callable(maker) else None


class HeldSink:
    """The sink, plus the chunks just stored, held in memory until the files using them read them.

    A file's writer then takes a fresh chunk from memory instead of reading it back
    from the sink and hashing it again. ``uses`` counts the reads to come per chunk;
    a chunk is held only while reads remain and the total stays within ``budget_bytes``
    (beyond it, the writer reads the sink as before).
    """

    def __init__(self, sink: ChunkSink, uses: Counter[str], budget_bytes: int) -> None:
        self.sink = sink
        self.uses = uses
        self.budget_bytes = budget_bytes
        self.held: dict[str, bytes] = {}
        self.held_bytes = 0

    async def has(self, chunk_id: str) -> bool:
        return await self.sink.has(chunk_id)

    async def put(self, chunk_id: str, data: bytes) -> None:
        await self.sink.put(chunk_id, data)
        self.keep(chunk_id, data)

    def keep(self, chunk_id: str, data: bytes) -> None:
        """Hold a chunk just stored for the files still to read it (within the budget)."""
        fits = self.held_bytes + len(data) <= self.budget_bytes
        if self.uses[chunk_id] > 0 and fits and chunk_id not in self.held:
            self.held[chunk_id] = data
            self.held_bytes += len(data)

    async def get(self, chunk_id: str) -> bytes:
        self.uses[chunk_id] -= 1
        data = self.held.get(chunk_id)
        if self.uses[chunk_id] <= 0 and data is not None:
            del self.held[chunk_id]
            self.held_bytes -= len(data)
        return data if data is not None else await self.sink.get(chunk_id)
