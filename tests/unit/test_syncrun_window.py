"""A chunk's retry window counts its failures since a chunk (any) last arrived: a chunk
that failed once (a stalled stream) and then waited behind others rides out a later
outage for the whole window, as a chunk that never failed does."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from netopt.chunking import chunk_bytes
from netopt.dataplane.chunkio import MemoryChunkSink, MemoryChunkSource
from netopt.dataplane.syncrun import SyncRun
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import NetworkError, PeerUnreachableError
from netopt.transfer.manifest import FileEntry, Manifest

WINDOW_S = 0.3


async def test_a_failure_before_a_chunk_arrived_is_forgiven(tmp_path: Path) -> None:
    data = os.urandom(64 * 1024)
    refs = chunk_bytes(data, 16 * 1024)
    entry = FileEntry("f.bin", len(data), 0o644, 0, tuple(refs))
    manifest = Manifest("ds", (entry,), 16 * 1024)
    table = {r.chunk_id: data[r.offset_bytes : r.offset_bytes + r.length_bytes] for r in refs}
    source = MemoryChunkSource(manifest, table)
    options = SyncOptions(retry_window_s=WINDOW_S)
    waited, other = refs[0].chunk_id, refs[1].chunk_id
    with ThreadPoolExecutor(1) as pool:
        run = SyncRun(manifest, source, MemoryChunkSink(), tmp_path, options, None, pool)
        run.charge(waited, NetworkError("the stream stalled"))
        await asyncio.sleep(WINDOW_S + 0.05)
        # Another chunk arrives: the link worked after that failure.
        assert await run.fetch_verified(other) == table[other]
        # The server goes away: the waiting chunk's cut starts its window now ...
        run.charge(waited, NetworkError("cut mid-stream"))
        await asyncio.sleep(WINDOW_S / 2)
        run.charge(waited, PeerUnreachableError("refused"))
        await asyncio.sleep(WINDOW_S / 2 + 0.05)
        # ... and ends it once it has been failing that long with nothing arriving.
        with pytest.raises(PeerUnreachableError, match="retry window"):
            run.charge(waited, PeerUnreachableError("refused"))


async def test_without_an_arrival_the_window_counts_from_the_first_failure(
    tmp_path: Path,
) -> None:
    data = os.urandom(32 * 1024)
    refs = chunk_bytes(data, 16 * 1024)
    entry = FileEntry("f.bin", len(data), 0o644, 0, tuple(refs))
    manifest = Manifest("ds", (entry,), 16 * 1024)
    table = {r.chunk_id: data[r.offset_bytes : r.offset_bytes + r.length_bytes] for r in refs}
    options = SyncOptions(retry_window_s=WINDOW_S)
    chunk_id = refs[0].chunk_id
    with ThreadPoolExecutor(1) as pool:
        source = MemoryChunkSource(manifest, table)
        run = SyncRun(manifest, source, MemoryChunkSink(), tmp_path, options, None, pool)
        run.charge(chunk_id, NetworkError("cut"))
        await asyncio.sleep(WINDOW_S + 0.05)
        with pytest.raises(NetworkError, match="retry window"):
            run.charge(chunk_id, NetworkError("cut again"))
