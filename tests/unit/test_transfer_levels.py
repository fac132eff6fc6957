"""Level choice, fixed costs in the predicted time, coordinator link figures, and the
receive path's fast pieces (held chunks, one-shot decode, fsync-free resume store)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import zstandard

from netopt.chunking import chunk_bytes
from netopt.dataplane.chunkio import (
    DirChunkSink,
    MemoryChunkSink,
    MemoryChunkSource,
    RawChunk,
    decode_chunk,
)
from netopt.dataplane.sync import SyncOptions, sync_manifest
from netopt.errors import IntegrityError
from netopt.transfer.coordinator_link import MissingLinkError, link_profile_from_links
from netopt.transfer.manifest import FileEntry, Manifest
from netopt.transfer.planner import (
    CPU_SHARE,
    HEADER_EFFICIENCY,
    LEVEL_GAIN_MIN,
    SETUP_RTTS,
    CpuProfile,
    LinkProfile,
    SampleProfile,
    plan_transfer,
)
from netopt.transfer.profile import cpu_profile_from_dict, cpu_profile_to_dict
from netopt.wire.answers import LinkView
from netopt.wire.fields import Reader

MB = 1e6
LINK = LinkProfile(rate_bps=100e6, rtt_ms=80, loss_ratio=0.01, congestion_control="bbr")
# The bench's JSON-lines: zstd 1/3/5/7 ratios as measured on it.
SAMPLE = SampleProfile({1: 2.63, 3: 2.67, 5: 2.80, 7: 2.85}, 8 << 20)


def _cpu(cores: int, compress: dict[int, float], startup_s: float = 0.0) -> CpuProfile:
    return CpuProfile(
        cores=cores,
        compress_bytes_per_s={k: v * MB for k, v in compress.items()},
        decompress_bytes_per_s={k: 800 * MB for k in compress},
        startup_s=startup_s,
    )


def test_link_bound_prefers_the_better_ratio() -> None:
    # Plenty of CPU: the link is the limit, so the level with the best ratio wins...
    cpu = _cpu(8, {1: 250, 3: 100, 5: 65, 7: 40})
    sample = SampleProfile({**SAMPLE.ratio_by_level, 7: 3.0})
    plan = plan_transfer(200_000_000, sample, LINK, cpu)
    assert plan.zstd_level == 7
    assert plan.bottleneck == "link"
    # ... unless it gains under LEVEL_GAIN_MIN over a cheaper one (the bench's data:
    # 2.85 at level 7 vs 2.63 at level 1 is +8%, but 2.80 at level 5 is within 2% of 7).
    assert plan_transfer(200_000_000, SAMPLE, LINK, cpu).zstd_level == 5
    near = SampleProfile({1: 2.63, 3: 2.67, 5: 2.70, 7: 2.72})
    assert plan_transfer(200_000_000, near, LINK, cpu).zstd_level == 1


def test_cpu_bound_falls_back_to_a_faster_level() -> None:
    # One slow core: level 7 (10 MB/s here) would starve the link; level 1 keeps it full.
    plan = plan_transfer(200_000_000, SAMPLE, LINK, _cpu(1, {1: 250, 3: 30, 5: 15, 7: 10}))
    assert plan.zstd_level == 1


@pytest.mark.parametrize(("cores", "level"), [(1, 1), (8, 5)])
def test_level_maximises_min_of_cpu_and_link(cores: int, level: int) -> None:
    cpu = _cpu(cores, {1: 250, 3: 100, 5: 64, 7: 39})
    plan = plan_transfer(200_000_000, SAMPLE, LINK, cpu)
    rates = {
        lvl: min(
            CPU_SHARE * cores * cpu.compress_bytes_per_s[lvl] * 8,
            plan.wire_rate_bps * SAMPLE.ratio_by_level[lvl],
        )
        for lvl in (1, 3, 5, 7)
    }
    best = 1
    for lvl in (3, 5, 7):
        if rates[lvl] > rates[best] * LEVEL_GAIN_MIN:
            best = lvl
    assert plan.zstd_level == best
    assert plan.logical_rate_bps == pytest.approx(rates[best])
    # The bench's link and data: one compressing core cannot feed level 5; eight can.
    assert best == level


def test_predicted_time_counts_startup_and_setup() -> None:
    cpu = _cpu(2, {1: 250, 3: 100})
    bare = plan_transfer(100_000_000, SAMPLE, LINK, cpu)
    started = plan_transfer(100_000_000, SAMPLE, LINK, cpu, startup_s=0.7)
    assert started.predicted_time_s == pytest.approx(bare.predicted_time_s + 0.7)
    assert started.startup_s == 0.7
    assert started.setup_s >= SETUP_RTTS * LINK.rtt_ms / 1000
    body_s = 100_000_000 * 8 / started.logical_rate_bps
    assert started.predicted_time_s == pytest.approx(0.7 + started.setup_s + body_s)
    assert started.to_dict()["startup_s"] == 0.7
    with pytest.raises(ValueError, match="startup_s"):
        plan_transfer(1, SAMPLE, LINK, cpu, startup_s=-1)


def test_cpu_profile_keeps_startup_and_reads_version_2() -> None:
    cpu = _cpu(2, {1: 250}, startup_s=0.61)
    assert cpu_profile_from_dict(cpu_profile_to_dict(cpu)).startup_s == pytest.approx(0.61)
    old = {**cpu_profile_to_dict(cpu), "version": 2}
    del old["startup_s"]
    assert cpu_profile_from_dict(old).startup_s == 0.0


def _entry(src: str, dst: str, **bandwidth: float | None) -> LinkView:
    """One entry of a coordinator's ``/api/v1/links`` answer, read as the client reads it."""
    return LinkView.read(
        Reader({
            "src": src,
            "dst": dst,
            "latest": {"rtt_p50_ms": 81.0},
            "window": {"rtt_p50_ms": {"p50": 80.5, "p90": 82.0, "p99": 90.0}, "loss_ratio": 0.01},
            "bandwidth": {"single_stream_bps": None, "aggregate_bps": None, **bandwidth},
        })
    )  # fmt: skip


def test_coordinator_link_figures() -> None:
    links = [_entry("hk-1", "us-1", aggregate_bps=85e6, single_stream_bps=60e6)]
    link, notes = link_profile_from_links(links, "hk-1", "us-1")
    assert link.rtt_ms == 80.5
    assert link.loss_ratio == 0.01
    assert link.rate_bps == pytest.approx(85e6 / HEADER_EFFICIENCY)
    assert link.single_stream_bps == 60e6
    assert "hk-1 -> us-1" in notes[0]
    # Only the reverse direction was measured: it stands in, and the note says so.
    reverse, notes = link_profile_from_links(links, "us-1", "hk-1", "cubic")
    assert reverse.congestion_control == "cubic"
    assert "hk-1 -> us-1" in notes[0]


def test_coordinator_link_missing_pair_or_bandwidth_is_named() -> None:
    with pytest.raises(MissingLinkError, match="hk-2 -> us-1") as info:
        link_profile_from_links([_entry("hk-1", "us-1", aggregate_bps=1e8)], "hk-2", "us-1")
    assert info.value.exit_code == 2
    with pytest.raises(MissingLinkError, match=r"no bandwidth figures for hk-1 -> us-1"):
        link_profile_from_links([_entry("hk-1", "us-1")], "hk-1", "us-1")


def test_decode_one_shot_checks_the_stated_size() -> None:
    data = b"abc" * 50_000
    frame = zstandard.ZstdCompressor(level=3).compress(data)
    assert decode_chunk(RawChunk(frame, "zstd", len(frame)), _id(data), len(data)) == data
    with pytest.raises(IntegrityError):  # the frame says more than the manifest
        decode_chunk(RawChunk(frame, "zstd", len(frame)), _id(data), len(data) - 1)
    unsized = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(data)
    assert decode_chunk(RawChunk(unsized, "zstd", len(unsized)), _id(data), len(data)) == data


def _id(data: bytes) -> str:
    import blake3

    return blake3.blake3(data).hexdigest()


class CountingSink(MemoryChunkSink):
    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    async def get(self, chunk_id: str) -> bytes:
        self.gets += 1
        return await super().get(chunk_id)


def _dataset() -> tuple[Manifest, dict[str, bytes], dict[str, bytes]]:
    # Seeded: with random bytes, b.bin was now and then one chunk, a file the sync writes
    # from the verified bytes on arrival (`FileAssembler.claim`), never reading it back.
    rng = random.Random(190)
    files = {"a.bin": rng.randbytes(200_000), "b.bin": rng.randbytes(50_000)}
    files["c.bin"] = files["a.bin"]  # shared chunks: read twice, held until the last read
    entries, table = [], {}
    for path, data in files.items():
        refs = chunk_bytes(data, 16 * 1024)
        for ref in refs:
            table[ref.chunk_id] = data[ref.offset_bytes : ref.offset_bytes + ref.length_bytes]
        entries.append(FileEntry(path, len(data), 0o644, 10**18, tuple(refs)))
    return Manifest("ds", tuple(entries), 16 * 1024), table, files


@pytest.mark.parametrize("hold_bytes", [64 << 20, 0])
async def test_held_chunks_skip_the_read_back(tmp_path: Path, hold_bytes: int) -> None:
    manifest, table, files = _dataset()
    sink = CountingSink()
    options = SyncOptions(streams=3, hold_bytes=hold_bytes)
    await sync_manifest(manifest, MemoryChunkSource(manifest, table), sink, tmp_path, options)
    for path, data in files.items():
        assert (tmp_path / path).read_bytes() == data
    assert set(sink.chunks) == set(table)  # still stored for resumption
    refs = sum(len(e.chunks) for e in manifest.files)
    assert min(len(e.chunks) for e in manifest.files) > 1  # every file is read back
    assert sink.gets == (0 if hold_bytes else refs)


async def test_dir_sink_without_fsync_stores_and_verifies(tmp_path: Path) -> None:
    sink = DirChunkSink(tmp_path / "store", fsync=False)
    data = b"chunk" * 1000
    await sink.put(_id(data), data)
    assert await sink.has(_id(data))
    assert await sink.get(_id(data)) == data
    (tmp_path / "store" / _id(data)).write_bytes(b"torn")
    with pytest.raises(IntegrityError):
        await sink.get(_id(data))
    assert not await sink.has(_id(data))
