"""The sync engine over a streaming source (fakes): ordering, tail stealing, retries."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from netopt.chunking import ChunkRef, chunk_bytes, chunk_id
from netopt.dataplane.chunkio import MemoryChunkSink, MemoryChunkSource, RawChunk
from netopt.dataplane.streamctx import ContextError
from netopt.dataplane.sync import SyncOptions, sync_manifest
from netopt.dataplane.syncrun import SyncRun
from netopt.errors import NetworkError
from netopt.transfer.manifest import FileEntry, Manifest

FAST = SyncOptions(
    streams=2,
    retry_window_s=0.05,
    max_attempts=3,
    backoff_initial_s=0.001,
    backoff_max_s=0.002,
    stream_ahead_bytes=1,  # two chunks asked per stream
    steal_after_s=0.05,
)


def _dataset(n_chunks: int) -> tuple[Manifest, dict[str, bytes], bytes]:
    data = os.urandom(16 * 1024 * n_chunks)
    refs = chunk_bytes(data, 16 * 1024)
    table = {r.chunk_id: data[r.offset_bytes : r.offset_bytes + r.length_bytes] for r in refs}
    entry = FileEntry("f.bin", len(data), 0o644, 1_600_000_000 * 10**9, tuple(refs))
    return Manifest("ds", (entry,), 16 * 1024), table, data


class FakeStream:
    """Frames in the order asked, each after ``delay_s``; can break after ``break_after``."""

    def __init__(self, source: StreamingSource, delay_s: float, break_after: int | None) -> None:
        self.source = source
        self.delay_s = delay_s
        self.break_after = break_after
        self.asked: list[str] = []
        self.sent = 0
        self.closed_complete: bool | None = None
        self.ended = False
        self.cancelled_in_frame = False

    def ask(self, chunk_id: str, length_bytes: int) -> None:
        assert not self.ended, "ask() after end()"
        self.asked.append(chunk_id)

    def end(self) -> None:
        self.ended = True

    async def next(self, chunk_id: str, length_bytes: int) -> RawChunk:
        assert self.asked[self.sent] == chunk_id  # frames come in the order asked
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled_in_frame = True
            raise
        if self.break_after is not None and self.sent >= self.break_after:
            raise NetworkError("stream cut")
        self.sent += 1
        return await self.source.fetch_chunk(chunk_id, length_bytes)

    async def aclose(self, *, complete: bool = True) -> None:
        self.closed_complete = complete


class BufferedFakeStream(FakeStream):
    """A `FakeStream` whose frames after the first of each wait have all arrived at once
    (``next_buffered`` hands them out without waiting), as a tree's small frames do."""

    def __init__(self, source: StreamingSource, delay_s: float, break_after: int | None) -> None:
        super().__init__(source, delay_s, break_after)
        self.buffered = 0

    def next_buffered(self, chunk_id: str, length_bytes: int) -> RawChunk | None:
        if self.break_after is not None and self.sent >= self.break_after:
            raise NetworkError("stream cut")  # the break shows in the bytes already read
        if self.sent >= len(self.asked):
            return None
        assert self.asked[self.sent] == chunk_id
        self.sent += 1
        self.buffered += 1
        return self.source.fetch_chunk_now(chunk_id)


class StreamingSource(MemoryChunkSource):
    """A memory source that also opens streams; per-stream delays and breaks by open order."""

    def __init__(
        self,
        manifest: Manifest,
        chunks: dict[str, bytes],
        delays_s: list[float],
        break_after: dict[int, int] | None = None,
        corrupt_first: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(manifest, chunks, corrupt_first=corrupt_first)
        self.delays_s = delays_s
        self.break_after = break_after or {}
        self.streams: list[FakeStream] = []

    buffered_streams = False

    def fetch_chunk_now(self, chunk_id: str) -> RawChunk:
        self.fetches[chunk_id] += 1
        data = self.chunks[chunk_id]
        if chunk_id in self.corrupt_first:
            self.corrupt_first.discard(chunk_id)
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return RawChunk(data, "identity", len(data))

    def open_stream(self) -> FakeStream:
        n = len(self.streams)
        kind = BufferedFakeStream if self.buffered_streams else FakeStream
        stream = kind(self, self.delays_s[min(n, len(self.delays_s) - 1)], None)
        stream.break_after = self.break_after.get(n)
        self.streams.append(stream)
        return stream


class CountingSink(MemoryChunkSink):
    def __init__(self) -> None:
        super().__init__()
        self.puts: Counter[str] = Counter()

    async def put(self, chunk_id: str, data: bytes) -> None:
        self.puts[chunk_id] += 1
        await super().put(chunk_id, data)


async def test_streams_fetch_every_chunk_once_in_order(tmp_path: Path) -> None:
    manifest, table, data = _dataset(12)
    source = StreamingSource(manifest, table, [0.0])
    sink = CountingSink()
    summary = await sync_manifest(manifest, source, sink, tmp_path, FAST)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert summary.chunks_fetched == len(table)
    assert set(source.fetches) == set(table)
    assert max(source.fetches.values()) == 1  # nothing stolen when no stream lags
    assert max(sink.puts.values()) == 1
    assert len(source.streams) == 2
    assert all(s.closed_complete for s in source.streams)
    assert all(s.ended for s in source.streams)  # names ended once the queue was empty


async def test_a_small_syncs_chunks_go_out_on_every_stream_at_once(tmp_path: Path) -> None:
    # Eight chunks, four streams, a look-ahead that would hold them all: each stream names
    # its share (two) before any frame arrives, so every connection's first round trip
    # carries data, and each ends its names with its last one.
    size = 16 * 1024
    data = os.urandom(8 * size)
    refs = [ChunkRef(i, size, chunk_id(data[i : i + size])) for i in range(0, len(data), size)]
    table = {r.chunk_id: data[r.offset_bytes : r.offset_bytes + size] for r in refs}
    entry = FileEntry("f.bin", len(data), 0o644, 1_600_000_000 * 10**9, tuple(refs))
    manifest = Manifest("ds", (entry,), size)
    source = StreamingSource(manifest, table, [0.0])
    opts = replace(FAST, streams=4, stream_ahead_bytes=64 * 1024 * 1024)
    await sync_manifest(manifest, source, CountingSink(), tmp_path, opts)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert [len(s.asked) for s in source.streams] == [2, 2, 2, 2]
    assert all(s.ended for s in source.streams)


async def _sync_until(
    tmp_path: Path, delays_s: list[float], premise: Callable[[StreamingSource], bool]
) -> StreamingSource:
    """Sync an 8-chunk dataset over streams of ``delays_s`` (by open order) until
    ``premise`` holds of the source, 5 tries at most, each within 4 s, whole and with each
    chunk stored once. Which stream asks for what depends on scheduling: on a loaded
    machine the fast stream sometimes takes all but the slow one's first chunk, and
    nothing is left to take over."""
    for attempt in range(5):
        manifest, table, data = _dataset(8)
        source = StreamingSource(manifest, table, delays_s)
        sink = CountingSink()
        dest = tmp_path / f"try{attempt}"
        summary = await asyncio.wait_for(
            sync_manifest(manifest, source, sink, dest, FAST), timeout=4.0
        )
        assert (dest / "f.bin").read_bytes() == data
        assert max(sink.puts.values()) == 1  # each chunk stored once
        assert summary.chunks_fetched == len(table)
        if premise(source):
            return source
    pytest.fail("in 5 tries the slow stream was never left with a chunk to take over")


async def test_idle_stream_takes_over_a_slow_streams_queued_chunk(tmp_path: Path) -> None:
    # The first stream needs 0.4 s per frame, the second none; the premise: the slow one
    # asked for more than one chunk, so one waits behind its first.
    source = await _sync_until(tmp_path, [0.4, 0.0], lambda src: len(src.streams[0].asked) > 1)
    # The fast stream's worker takes over a chunk on a fresh stream once its own stream
    # ended: every stream after the first runs at the fast pace.
    slow = source.streams[0]
    fast_asked = set().union(*(set(s.asked) for s in source.streams[1:]))
    stolen = set(slow.asked[slow.sent :]) | (set(slow.asked) & fast_asked)
    assert stolen, "the idle stream asked again for a chunk queued on the slow one"
    assert fast_asked & set(slow.asked)
    # The slow stream was cut instead of sending the chunk the fast one already delivered.
    assert slow.sent < len(slow.asked)
    assert slow.closed_complete is False


async def test_a_stolen_copy_still_arriving_is_cut_when_the_original_arrives(
    tmp_path: Path,
) -> None:
    # The first stream needs 0.3 s per frame; the second none, so it runs out of work and
    # asks again, on a fresh stream, for the first stream's last chunk. That third stream
    # is the slow one (5 s a frame, as a fresh request's small window can be): the
    # original arrives first, and the sync must not wait for the copy (each try: 4 s).
    source = await _sync_until(tmp_path, [0.3, 0.0, 5.0], lambda src: len(src.streams) >= 3)
    original, stealer = source.streams[0], source.streams[2]
    assert stealer.asked
    assert set(stealer.asked) <= set(original.asked)
    assert original.sent == len(original.asked)  # the original delivered everything
    assert stealer.sent == 0
    assert stealer.cancelled_in_frame
    assert stealer.closed_complete is False  # and its connection dropped


async def test_broken_stream_is_reopened_and_finishes(tmp_path: Path) -> None:
    manifest, table, data = _dataset(10)
    source = StreamingSource(manifest, table, [0.0], break_after={0: 1})
    summary = await sync_manifest(manifest, source, CountingSink(), tmp_path, FAST)
    assert (tmp_path / "f.bin").read_bytes() == data
    # The cut stream's chunks were asked for again (on a new stream or the other one:
    # which, depends on scheduling) and the file is whole.
    assert summary.chunk_retries >= 1
    assert len(source.streams) >= 2
    assert source.streams[0].closed_complete is False


async def test_corrupt_frame_on_a_stream_is_fetched_again(tmp_path: Path) -> None:
    manifest, table, data = _dataset(6)
    bad = next(iter(table))
    source = StreamingSource(manifest, table, [0.0], corrupt_first=frozenset({bad}))
    sink = CountingSink()
    summary = await sync_manifest(manifest, source, sink, tmp_path, FAST)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert source.fetches[bad] == 2
    assert sink.chunks[bad] == table[bad]
    assert summary.chunk_retries == 1


def _small_files(n_files: int) -> tuple[Manifest, dict[str, bytes], dict[str, bytes]]:
    """``n_files`` files of 1-3 KB, each one chunk."""
    rng = random.Random(22)
    entries, table, files = [], {}, {}
    for i in range(n_files):
        data = rng.randbytes(rng.randint(1000, 3000))
        ref = ChunkRef(0, len(data), chunk_id(data))
        table[ref.chunk_id] = data
        files[f"d/f{i:04d}"] = data
        entries.append(FileEntry(f"d/f{i:04d}", len(data), 0o644, 1_600_000_000 * 10**9, (ref,)))
    return Manifest("ds", tuple(entries), 16 * 1024), table, files


async def test_frames_that_arrived_together_are_stored_as_a_group_and_a_bad_one_refetched(
    tmp_path: Path,
) -> None:
    manifest, table, files = _small_files(300)
    ids = list(table)
    bad = {ids[5], ids[150]}  # inside groups, not at their starts
    source = StreamingSource(manifest, table, [0.0], corrupt_first=frozenset(bad))
    source.buffered_streams = True
    sink = CountingSink()
    options = replace(FAST, stream_ahead_bytes=1 << 20)
    summary = await sync_manifest(manifest, source, sink, tmp_path, options)
    for rel, data in files.items():
        assert (tmp_path / rel).read_bytes() == data
    assert sum(s.buffered for s in source.streams if isinstance(s, BufferedFakeStream)) > 200
    assert {cid for cid, n in source.fetches.items() if n > 1} == bad
    assert max(sink.puts.values()) == 1
    assert summary.chunk_retries == 2


async def test_a_stream_that_breaks_inside_a_group_keeps_the_frames_read_before(
    tmp_path: Path,
) -> None:
    manifest, table, files = _small_files(120)
    source = StreamingSource(manifest, table, [0.0], break_after={0: 40})
    source.buffered_streams = True
    sink = CountingSink()
    summary = await sync_manifest(
        manifest, source, sink, tmp_path, replace(FAST, stream_ahead_bytes=1 << 20)
    )
    for rel, data in files.items():
        assert (tmp_path / rel).read_bytes() == data
    # The 40 frames the first stream delivered were stored from it, never asked again.
    first = source.streams[0]
    assert first.sent == 40
    assert all(source.fetches[cid] == 1 for cid in first.asked[:40])
    assert max(sink.puts.values()) == 1
    assert summary.chunks_fetched == len(table)


class _BadBundleStream(FakeStream):
    """Reading the chunk before ``victim`` (asked behind it on this stream) fails once, as
    a bundle of the two whose second chunk came out wrong fails."""

    victim = ""
    failed = False

    async def next(self, chunk_id: str, length_bytes: int) -> RawChunk:
        at = self.asked.index(chunk_id)
        behind = self.asked[at + 1] if at + 1 < len(self.asked) else None
        if behind == self.victim and not _BadBundleStream.failed:
            _BadBundleStream.failed = True
            raise ContextError(f"chunk {self.victim[:16]}: does not decode", self.victim)
        return await super().next(chunk_id, length_bytes)


async def test_a_bad_chunk_inside_a_bundle_is_charged_to_itself(
    tmp_path: Path, monkeypatch
) -> None:
    manifest, table, data = _dataset(6)
    ids = list(table)
    _BadBundleStream.victim, _BadBundleStream.failed = ids[1], False
    source = StreamingSource(manifest, table, [0.0])
    monkeypatch.setattr(
        source,
        "open_stream",
        lambda: source.streams.append(_BadBundleStream(source, 0.0, None)) or source.streams[-1],
    )
    charged: list[str] = []
    real_charge = SyncRun.charge

    def charge(self: SyncRun, chunk_id: str, exc: Exception) -> None:
        charged.append(chunk_id)
        real_charge(self, chunk_id, exc)

    monkeypatch.setattr(SyncRun, "charge", charge)
    summary = await sync_manifest(
        manifest, source, CountingSink(), tmp_path,
        replace(FAST, streams=1, stream_ahead_bytes=1 << 20),  # ids[0], ids[1] on one stream
    )  # fmt: skip
    assert (tmp_path / "f.bin").read_bytes() == data
    assert _BadBundleStream.failed
    assert charged == [ids[1]]  # not ids[0], the bundle's first chunk
    assert summary.chunk_retries == 1
