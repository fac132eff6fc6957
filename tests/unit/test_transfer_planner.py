"""The transfer planner's decisions, on fixed inputs (no I/O)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from netopt.errors import NetoptError
from netopt.transfer.planner import (
    BBR_MIN_STREAMS,
    RAMP_MAX_STREAMS,
    CpuProfile,
    LinkProfile,
    PlanInputError,
    SampleProfile,
    per_flow_ceiling_bps,
    plan_transfer,
)
from netopt.transfer.profile import sample_bytes

MB = 1e6
# Roughly the LAB.md figures for one core: zstd 1/3/9 compress and decompress speeds.
CPU = CpuProfile(
    cores=2,
    compress_bytes_per_s={1: 170 * MB, 3: 145 * MB, 9: 38 * MB},
    decompress_bytes_per_s={1: 470 * MB, 3: 870 * MB, 9: 900 * MB},
)
LINK_BBR = LinkProfile(rate_bps=100e6, rtt_ms=80, loss_ratio=0.01, congestion_control="bbr")


def _jsonl(n_lines: int) -> bytes:
    rng = random.Random(3)
    words = [f"w{i}" for i in range(500)]
    rows = (
        json.dumps({"id": i, "text": " ".join(rng.choices(words, k=15)), "y": rng.random()})
        for i in range(n_lines)
    )
    return ("\n".join(rows) + "\n").encode()


def test_random_data_turns_compression_off() -> None:
    profile = sample_bytes([random.Random(1).randbytes(1 << 20)], levels=(1, 3, 9))
    plan = plan_transfer(200 * 1024**2, profile, LINK_BBR, CPU)
    assert plan.codec == "none"
    assert plan.zstd_level is None
    assert any("compression off" in r for r in plan.reasons)


def test_json_lines_turn_zstd_on() -> None:
    profile = sample_bytes([_jsonl(20000)], levels=(1, 3, 9))
    assert profile.ratio_by_level[3] > 2
    plan = plan_transfer(200 * 1024**2, profile, LINK_BBR, CPU)
    assert plan.codec == "zstd"
    assert plan.zstd_level in (1, 3, 9)
    assert plan.logical_rate_bps > 2 * LINK_BBR.rate_bps


def test_ratio_just_under_threshold_is_off() -> None:
    plan = plan_transfer(10**9, SampleProfile({1: 1.04, 3: 1.049}), LINK_BBR, CPU)
    assert plan.codec == "none"


def test_streams_grow_with_loss_for_cubic() -> None:
    streams = []
    for loss in (0.0001, 0.001, 0.01, 0.03):
        link = LinkProfile(rate_bps=100e6, rtt_ms=80, loss_ratio=loss, congestion_control="cubic")
        streams.append(plan_transfer(10**9, SampleProfile({}), link, CPU).streams)
    assert streams == sorted(streams)
    assert streams[0] < streams[-1]
    assert streams[2] >= 32  # Mathis: ~1.8 Mbit/s per flow at 1% loss and 80 ms


def test_bbr_needs_few_streams_despite_loss() -> None:
    cubic = LinkProfile(rate_bps=100e6, rtt_ms=80, loss_ratio=0.01, congestion_control="cubic")
    bbr_plan = plan_transfer(10**9, SampleProfile({}), LINK_BBR, CPU)
    cubic_plan = plan_transfer(10**9, SampleProfile({}), cubic, CPU)
    assert bbr_plan.streams <= 8
    assert cubic_plan.streams > bbr_plan.streams


def test_bbr_streams_follow_the_ramp_a_long_fat_link_needs() -> None:
    """Over BBR the streams' first flights must fill the link within a couple of start-up
    round trips: a LAN or a short link keeps the few streams BBR needs; a long fat one
    (the lab's 80 Mbit/s, 140 ms: 1.4 MB in flight) takes up to `RAMP_MAX_STREAMS`, more
    than which were slower there."""

    def streams(rate_bps: float, rtt_ms: float) -> int:
        link = LinkProfile(rate_bps=rate_bps, rtt_ms=rtt_ms, loss_ratio=0.01)
        return plan_transfer(10**9, SampleProfile({}), link, CPU).streams

    assert streams(1e9, 0.2) == streams(1e9, 1) == streams(100e6, 20) == BBR_MIN_STREAMS
    assert streams(80e6, 140) == streams(100e6, 80) == streams(1e9, 40) == RAMP_MAX_STREAMS
    assert streams(10e9, 100) > RAMP_MAX_STREAMS  # a flow's largest window caps it: more
    by_rtt = [streams(50e6, rtt) for rtt in (10, 40, 60, 80, 100, 120, 140, 200)]
    assert by_rtt == sorted(by_rtt)
    assert BBR_MIN_STREAMS < by_rtt[-2] < RAMP_MAX_STREAMS  # 50 Mbit/s, 140 ms: between
    assert max(by_rtt) == RAMP_MAX_STREAMS
    with_cap = LinkProfile(rate_bps=80e6, rtt_ms=140, loss_ratio=0.01)
    assert plan_transfer(10**9, SampleProfile({}), with_cap, CPU, max_streams=2).streams == 2


def test_mathis_ceiling() -> None:
    link = LinkProfile(rate_bps=1e9, rtt_ms=80, loss_ratio=0.01, congestion_control="reno")
    expected = 1448 * 8 / 0.08 * 1.22 / 0.1
    assert per_flow_ceiling_bps(link) == pytest.approx(expected)
    measured = LinkProfile(rate_bps=1e9, rtt_ms=80, loss_ratio=0.01, single_stream_bps=1e6)
    assert per_flow_ceiling_bps(measured) == 1e6


def test_bottleneck_link_cpu_disk() -> None:
    jsonl = SampleProfile({1: 3.0, 3: 3.3})
    clean_link = LinkProfile(rate_bps=100e6, rtt_ms=10, congestion_control="cubic")
    # One slow core: level 1 still beats raw bytes (160 > 95 Mbit/s) but the CPU limits it.
    slow_cpu = CpuProfile(1, {1: 40 * MB, 3: 20 * MB}, {1: 400 * MB, 3: 400 * MB})
    assert plan_transfer(10**9, jsonl, LINK_BBR, CPU).bottleneck == "link"
    cpu_bound = plan_transfer(10**9, jsonl, clean_link, slow_cpu)
    assert cpu_bound.bottleneck == "cpu"
    assert cpu_bound.zstd_level == 1
    slow_disk = CpuProfile(
        2, CPU.compress_bytes_per_s, CPU.decompress_bytes_per_s, disk_bytes_per_s=5 * MB
    )
    assert plan_transfer(10**9, jsonl, LINK_BBR, slow_disk).bottleneck == "disk"


def test_fast_link_prefers_cheaper_level_or_none() -> None:
    # On a fast link a slow level-9 codec loses against level 1 (given cores to run it).
    fast_link = LinkProfile(rate_bps=1e9, rtt_ms=1, congestion_control="bbr")
    profile = SampleProfile({1: 2.6, 9: 3.3})
    four_cores = dataclasses.replace(CPU, cores=4)
    plan = plan_transfer(10**9, profile, fast_link, four_cores)
    assert plan.zstd_level == 1
    # Two cores at a third each barely beat 1 Gbit/s raw: not worth the CPU.
    assert plan_transfer(10**9, profile, fast_link, CPU).codec == "none"
    very_fast = LinkProfile(rate_bps=10e9, rtt_ms=1, congestion_control="bbr")
    assert plan_transfer(10**9, profile, very_fast, four_cores).codec == "none"


def test_predicted_time_scales_with_size() -> None:
    profile = SampleProfile({})
    small = plan_transfer(10 * 1024**2, profile, LINK_BBR, CPU)
    large = plan_transfer(100 * 1024**2, profile, LINK_BBR, CPU)
    assert large.predicted_time_s > 5 * small.predicted_time_s
    # 100 MiB at 90 Mbit/s is ~9.3 s plus a little setup.
    assert 9 < large.predicted_time_s < 11


def test_chunk_size_bounds_and_json() -> None:
    plan = plan_transfer(10**9, SampleProfile({}), LINK_BBR, CPU)
    assert 256 * 1024 <= plan.chunk_size_bytes <= 8 * 1024**2
    data = plan.to_dict()
    assert data["streams"] == plan.streams
    assert json.loads(json.dumps(data))["bottleneck"] == plan.bottleneck


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="rtt_ms") as caught:
        LinkProfile(rate_bps=1e6, rtt_ms=0)
    # In the error tree (a ValidationError, exit code 2) and still a ValueError.
    assert isinstance(caught.value, PlanInputError)
    assert isinstance(caught.value, NetoptError)
    assert caught.value.exit_code == 2
    with pytest.raises(ValueError, match="size_bytes"):
        plan_transfer(-1, SampleProfile({}), LINK_BBR, CPU)


def test_a_large_manifest_adds_its_slow_start_round_trips_to_the_setup() -> None:
    """A tree's manifest is megabytes: on a fresh connection slow start carries 14.5 KB,
    then twice that each round trip; the setup counts those round trips."""
    profile = SampleProfile({1: 3.0}, 1 << 20)
    base = plan_transfer(100 * 1024**2, profile, LINK_BBR, CPU)
    small = plan_transfer(100 * 1024**2, profile, LINK_BBR, CPU, meta_bytes=30_000)
    big = plan_transfer(100 * 1024**2, profile, LINK_BBR, CPU, meta_bytes=1_000_000)
    rtt_s = LINK_BBR.rtt_ms / 1000
    assert small.setup_s == base.setup_s  # within the setup's own round trips
    # 64 KiB take 3 round trips from a 14.5 KB window, 1 MB about 6-7: 3-4 more.
    assert 2.5 * rtt_s <= big.setup_s - base.setup_s <= 4.5 * rtt_s
    assert big.predicted_time_s - base.predicted_time_s == pytest.approx(big.setup_s - base.setup_s)
    with pytest.raises(PlanInputError, match="meta_bytes"):
        plan_transfer(1, profile, LINK_BBR, CPU, meta_bytes=-1)


def test_many_small_files_are_bound_by_their_per_file_cost() -> None:
    # The lab's extreme: 100,000 files of ~2.5 KB (256 MB) at 266 us a file, the figure
    # `netopt.cache.filecost` measured there: 26.6 s of work where the bytes need ~9 s.
    ratios = SampleProfile({1: 3.0, 3: 3.2})
    bytes_only = plan_transfer(256 * 10**6, ratios, LINK_BBR, CPU)
    tree = plan_transfer(256 * 10**6, ratios, LINK_BBR, CPU, files=100_000, per_file_s=266e-6)
    assert bytes_only.bottleneck != "files"
    assert tree.bottleneck == "files"
    assert tree.logical_rate_bps == pytest.approx(256e6 * 8 / 26.6, rel=0.01)
    work_s = tree.predicted_time_s - tree.startup_s - tree.setup_s
    assert work_s == pytest.approx(26.6, rel=0.01)
    assert tree.predicted_time_s > 2 * bytes_only.predicted_time_s
    # The level is chosen on the bytes: the files bind every level alike.
    assert tree.zstd_level == bytes_only.zstd_level
    assert any("100000 files at 266 us each" in r for r in tree.reasons)


def test_a_few_files_or_an_unknown_cost_leave_the_plan_to_the_bytes() -> None:
    ratios = SampleProfile({1: 3.0, 3: 3.2})
    base = plan_transfer(10**9, ratios, LINK_BBR, CPU)
    assert plan_transfer(10**9, ratios, LINK_BBR, CPU, files=10, per_file_s=266e-6) == base
    assert plan_transfer(10**9, ratios, LINK_BBR, CPU, files=100_000) == base
    with pytest.raises(PlanInputError):
        plan_transfer(10**9, ratios, LINK_BBR, CPU, files=-1)
    with pytest.raises(PlanInputError):
        plan_transfer(10**9, ratios, LINK_BBR, CPU, files=5, per_file_s=-1e-6)
