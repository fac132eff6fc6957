"""The tail of a sync over streams (fakes above the I/O edge; the real server's part route
is in tests/service/test_sync_tail_hedge.py): a slow stream's share, and the chunk it
lags on fetched again in parts by a stream left idle. Without a part route the tail
steals whole chunks, as `test_dataplane_streamwork` shows."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from netopt.chunking import ChunkRef, chunk_id
from netopt.dataplane.asked import RATE_FRAMES, Asked
from netopt.dataplane.chunkio import RawChunk
from netopt.dataplane.streamwork import _share_bytes
from netopt.dataplane.sync import sync_manifest
from netopt.dataplane.syncrun import SyncRun
from netopt.dataplane.tailhedge import MIN_HEDGE_PART_BYTES, hedge_candidate
from netopt.transfer.manifest import FileEntry, Manifest
from tests.unit.test_dataplane_streamwork import FAST, CountingSink, StreamingSource

CHUNK = 128 * 1024
"""A chunk worth cutting into parts (at least two of `MIN_HEDGE_PART_BYTES`)."""


def _dataset(n_chunks: int) -> tuple[Manifest, dict[str, bytes], bytes]:
    data = os.urandom(CHUNK * n_chunks)
    refs = [ChunkRef(i, CHUNK, chunk_id(data[i : i + CHUNK])) for i in range(0, len(data), CHUNK)]
    table = {r.chunk_id: data[r.offset_bytes : r.offset_bytes + CHUNK] for r in refs}
    entry = FileEntry("f.bin", len(data), 0o644, 1_600_000_000 * 10**9, tuple(refs))
    return Manifest("ds", (entry,), CHUNK), table, data


class PartsSource(StreamingSource):
    """A `StreamingSource` whose chunks can also be fetched in parts, each fetch taking
    ``parts_delay_s``; it reports ``read_first_bytes`` read at once (a copy cut later
    read them too)."""

    chunk_parts = 32

    def __init__(
        self,
        manifest: Manifest,
        chunks: dict[str, bytes],
        delays_s: list[float],
        parts_delay_s: float,
        read_first_bytes: int = 0,
    ) -> None:
        super().__init__(manifest, chunks, delays_s)
        self.parts_delay_s = parts_delay_s
        self.read_first_bytes = read_first_bytes
        self.parts_fetched: Counter[str] = Counter()
        self.parts_asked: list[int] = []
        self.parts_cut = 0

    async def fetch_chunk_parts(
        self,
        chunk_id: str,
        length_bytes: int,
        parts: int,
        on_read: Callable[[int], None] | None = None,
    ) -> RawChunk:
        self.parts_asked.append(parts)
        if on_read is not None and self.read_first_bytes:
            on_read(self.read_first_bytes)
        try:
            await asyncio.sleep(self.parts_delay_s)
        except asyncio.CancelledError:
            self.parts_cut += 1
            raise
        self.parts_fetched[chunk_id] += 1
        data = self.chunks[chunk_id]
        if on_read is not None:
            on_read(len(data) - self.read_first_bytes)
        return RawChunk(data, "identity", len(data))


async def test_a_slow_streams_chunks_are_fetched_again_in_parts_and_the_stream_is_cut(
    tmp_path: Path,
) -> None:
    # The first stream needs 1 s a frame, the second none. The fast one takes all but the
    # slow one's first two chunks; once idle, it fetches those two in parts (each in
    # 20 ms) and the slow stream is cut in its first frame: the sync does not wait 2 s.
    manifest, table, data = _dataset(8)
    source = PartsSource(manifest, table, [1.0, 0.0], parts_delay_s=0.02)
    sink = CountingSink()
    summary = await asyncio.wait_for(
        sync_manifest(manifest, source, sink, tmp_path, FAST), timeout=1.5
    )
    assert (tmp_path / "f.bin").read_bytes() == data
    assert max(sink.puts.values()) == 1  # each chunk stored once
    assert summary.chunks_fetched == len(table)
    slow = source.streams[0]
    assert slow.sent == 0
    assert slow.cancelled_in_frame  # cut in the middle of its frame
    assert set(source.parts_fetched) == set(slow.asked)
    assert source.parts_asked == [CHUNK // MIN_HEDGE_PART_BYTES] * len(slow.asked)
    # Every chunk came whole once: over the fast stream or in parts.
    assert set(source.fetches) | set(source.parts_fetched) == set(table)
    assert summary.wire_bytes == len(data)


async def test_a_hedge_the_stream_beats_is_cut_and_its_bytes_count_as_wire(
    tmp_path: Path,
) -> None:
    # Parts that would take 5 s: the slow stream's own copies (0.3 s a frame) come first,
    # each hedge is cut, and what the cut copies had read counts in the wire bytes.
    manifest, table, data = _dataset(8)
    source = PartsSource(manifest, table, [0.3, 0.0], parts_delay_s=5.0, read_first_bytes=1000)
    sink = CountingSink()
    summary = await asyncio.wait_for(
        sync_manifest(manifest, source, sink, tmp_path, FAST), timeout=2.0
    )
    assert (tmp_path / "f.bin").read_bytes() == data
    assert max(sink.puts.values()) == 1
    assert not source.parts_fetched  # no hedge came in
    hedges = len(source.parts_asked)
    assert hedges >= 1
    assert source.parts_cut == hedges
    assert source.streams[0].sent == len(source.streams[0].asked)  # its copies were used
    assert summary.wire_bytes == len(data) + 1000 * hedges


def _asked(arrivals: list[tuple[float, int]], chunks: list[str], lengths: dict[str, int]) -> Asked:
    asked = Asked()
    for cid in chunks:
        asked.ask(cid, lengths[cid])
    for at_s, n_bytes in arrivals:
        asked.recent.append((at_s, n_bytes))
        asked.recent_bytes += n_bytes
    if arrivals:
        asked.last_frame_s = arrivals[-1][0]
        asked.frames = len(arrivals)
    return asked


def test_a_streams_pace_is_its_last_frames_bytes_over_their_span() -> None:
    asked = Asked()
    assert asked.rate_bytes_per_s == 0.0
    asked.recent.extend([(10.0, 500), (10.0, 500)])
    asked.recent_bytes = 1000
    assert asked.rate_bytes_per_s == 0.0  # frames read together make no rate
    asked = _asked([(10.0, 400), (10.5, 1000), (11.0, 1000)], [], {})
    assert asked.rate_bytes_per_s == 2000.0  # 2,000 bytes in 1 s after the first
    # Due 1 s after its last frame at that pace; late, as long again as it is late.
    assert asked.head_left_s(2000, 11.25) == 0.75
    assert asked.head_left_s(2000, 12.5) == 0.5


def test_a_chunk_is_expected_after_the_bytes_ahead_of_it_at_the_streams_pace() -> None:
    lengths = {"a": 2000, "b": 500, "c": 3000}
    asked = _asked([(10.0, 400), (10.5, 1000), (11.0, 1000)], ["a", "b", "c"], lengths)
    # 2,000 bytes/s: "a" due at 12.0, then "b" 0.25 s and "c" 1.5 s behind it.
    assert asked.expected_in_s(0, lengths, 11.5) == 0.5
    assert asked.expected_in_s(1, lengths, 11.5) == 0.75
    assert asked.expected_in_s(2, lengths, 11.5) == 2.25
    # Late: "a" counts as long again as it is late, and the rest behind it as before.
    assert asked.expected_in_s(2, lengths, 13.0) == 1.0 + 1.75
    # No pace yet: each frame up to it as long as the one arriving has taken so far.
    fresh = _asked([(10.0, 400)], ["a", "b", "c"], lengths)
    assert fresh.expected_in_s(2, lengths, 10.5) == 1.5


def test_the_pace_window_forgets_old_frames() -> None:
    asked = Asked()
    for i in range(RATE_FRAMES + 5):
        asked.last_frame_s = 0.0
        asked.ask(f"c{i}", 100 if i < 5 else 300)
        asked.arrived(100 if i < 5 else 300)
    assert len(asked.recent) == RATE_FRAMES
    assert asked.recent_bytes == 300 * RATE_FRAMES


def _run(asking: list[Asked], lengths: dict[str, int], **kw: Any) -> SyncRun:
    source = SimpleNamespace(chunk_parts=32, fetch_chunk_parts=lambda *a: None)
    run = SimpleNamespace(
        asking=asking,
        lengths=lengths,
        claimed=set(),
        hedged=set(),
        stolen={},
        source=source,
        queued_bytes=0,
        chunks_total=100,
        options=replace(FAST, streams=len(asking)),
    )
    for key, value in kw.items():
        setattr(run, key, value)
    return cast(SyncRun, run)


def test_a_slow_stream_gets_a_smaller_share_of_what_is_left() -> None:
    lengths = {f"c{i}": 1000 for i in range(8)}
    fast = _asked([(0.0, 1000), (1.0, 9000)], ["c0", "c1"], lengths)  # 9,000 B/s
    slow = _asked([(0.0, 1000), (1.0, 3000)], ["c2", "c3"], lengths)  # 3,000 B/s
    run = _run([fast, slow], lengths, queued_bytes=4000)
    # 8,000 bytes outstanding, split 3:1 by pace.
    assert _share_bytes(run, fast) == 6000
    assert _share_bytes(run, slow) == 2000
    fresh = Asked()
    assert _share_bytes(run, fresh) == 4000  # a pace not known yet: an even share


def test_the_hedge_takes_the_chunk_expected_last_and_skips_what_it_must() -> None:
    lengths = {f"c{i}": CHUNK for i in range(8)}
    lengths["tiny"] = MIN_HEDGE_PART_BYTES  # one part only: not worth a hedge
    # Both streams at CHUNK bytes a second, their last frames in at 10.0.
    a = _asked([(9.0, CHUNK), (10.0, CHUNK)], ["c0", "c1", "c2"], lengths)
    b = _asked([(9.0, CHUNK), (10.0, CHUNK)], ["c3", "c4"], lengths)
    run = _run([a, b], lengths)
    # a's c2 is due at 13.0, b's c4 at 12.0: c2 first.
    assert hedge_candidate(run, 10.0, 0.5) == ("c2", a)
    assert hedge_candidate(run, 10.0, 3.5) is None  # none is due that late
    run.hedged.add("c2")
    assert hedge_candidate(run, 10.0, 0.5) == ("c1", a)  # the next of a's, due at 12.0
    run.claimed.add("c1")
    b.append("c0")  # c0 asked on two streams already (a steal): not hedged too
    # Nor c4 on b: c0 behind it is still to come, and a hedge of c4 that came first would
    # cut b before it (a's chunks are all in, hedged, or c0).
    assert hedge_candidate(run, 10.0, 0.5) is None
    run.claimed.add("c0")
    assert hedge_candidate(run, 10.0, 0.5) == ("c4", b)
    # A chunk being received is hedged only if read so that it can be cut.
    c = _asked([(9.0, CHUNK), (10.0, CHUNK)], ["c5"], lengths)
    only = _run([c], lengths)
    assert hedge_candidate(only, 11.8, 0.5) is None
    only.stolen["c5"] = asyncio.Event()
    assert hedge_candidate(only, 11.8, 0.5) == ("c5", c)  # due at 11.0: 0.8 s late
    # A small chunk last on a stream is not worth a hedge, and holds off one of the
    # large chunk before it until it is in.
    tiny = _asked([(9.0, CHUNK), (10.0, CHUNK)], ["c6", "c7", "tiny"], lengths)
    tiny_run = _run([tiny], lengths)
    assert hedge_candidate(tiny_run, 10.0, 0.5) is None
    tiny_run.claimed.add("tiny")
    assert hedge_candidate(tiny_run, 10.0, 0.5) == ("c7", tiny)


def test_a_stream_with_no_pace_yet_is_hedged_once_its_first_frame_is_late() -> None:
    lengths = {f"c{i}": CHUNK for i in range(2)}
    stuck = Asked()
    stuck.ask("c0", CHUNK)
    stuck.ask("c1", CHUNK)
    stuck.last_frame_s = 10.0  # asked at 10.0, nothing in yet
    run = _run([stuck], lengths)
    assert hedge_candidate(run, 10.1, 0.5) is None
    # At 10.4 the first frame has taken 0.4 s: the second is taken to need as long again.
    assert hedge_candidate(run, 10.4, 0.5) == ("c1", stuck)
