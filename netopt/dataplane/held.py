"""A sink wrapper that keeps freshly verified chunks in memory until their files are written."""

from __future__ import annotations

from collections import Counter

from netopt.dataplane.chunkio import ChunkSink

__all__ = ["HeldSink"]


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
