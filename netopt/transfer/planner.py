"""The transfer planner: codec, chunk size and parallel streams for one transfer.

Pure: `plan_transfer` takes frozen dataclasses (what the link does, how the data
compresses, how fast this node's CPUs and disks are) and returns a frozen
`TransferPlan`. It opens nothing and reads no clock, so the coordinator can
compute plans for any pair of nodes and tests can check every decision.

The model, in logical (uncompressed) bits per second:

    throughput(level) = min(cores x compress(level), cores x decompress(level),   [x CPU_SHARE]
                            wire_rate x ratio(level), disk, hashing)

where ``wire_rate`` is what the streams can carry: the link's goodput, or
less when ``streams x per-flow ceiling`` is lower. The per-flow ceiling is
congestion-control aware: loss-based TCP (cubic, reno) follows the Mathis
bound ``MSS / RTT x 1.22 / sqrt(p)``; BBR mostly ignores random loss and is
limited by the receive window over the RTT.

The predicted time is honest about fixed costs: the process start-up
(``startup_s``, calibrated per node), the request round trips before the first
chunk moves (`SETUP_RTTS`) and TCP's ramp to its share of the link, then the
size over the modelled throughput.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from netopt.errors import ValidationError
from netopt.tcpmath import is_loss_based, tcp_flow_ceiling_bps

__all__ = [
    "HEADER_EFFICIENCY",
    "LEVEL_GAIN_MIN",
    "MIN_USEFUL_RATIO",
    "SETUP_RTTS",
    "Bottleneck",
    "CongestionControl",
    "CpuProfile",
    "LinkProfile",
    "PlanInputError",
    "SampleProfile",
    "TransferPlan",
    "cpu_rate_bps",
    "pair_cpu_profile",
    "per_flow_ceiling_bps",
    "plan_transfer",
]

CongestionControl = Literal["bbr", "cubic", "reno"]
Bottleneck = Literal["link", "cpu", "disk", "files"]

MIN_USEFUL_RATIO = 1.05
"""Below this compression ratio the CPU spent is not worth the bytes saved."""

HEADER_EFFICIENCY = 0.95
"""TCP/IP goodput over the line rate at a 1500-byte MTU (1448 / 1538 ~ 0.94-0.96)."""

BBR_LINK_SHARE = 0.9
"""What BBR sustains on a lossy link with a few streams (LAB.md: ~0.9 of the link)."""

BBR_MIN_STREAMS = 4
"""The fewest streams over BBR: a few flows reach ~0.9 of the link and hide request gaps."""

BBR_STARTUP_GAIN = 2.89
"""How much BBR's start-up grows a flow's window each round trip (2/ln 2)."""

RAMP_RTTS = 2
"""Over BBR, enough streams (up to `RAMP_MAX_STREAMS`) that their first flights, grown
by start-up for this many round trips, fill the bandwidth-delay product: on a long fat
link every stream starts from its first flight (the sync's connections are fresh, or
idle long enough to start over), and fewer streams take more round trips to fill it."""

RAMP_MAX_STREAMS = 8
"""Measured on the lab's 80 Mbit/s, 140 ms, 1% loss link (bbr; 3 syncs each; 1.4 MB
bandwidth-delay product: 8 streams by `RAMP_RTTS`): 100 MB of random bytes took
12.2-12.7 s over 8 streams, 13.0-13.3 s over 4 and 13.5-16.5 s over 16; Parquet
10.4-11.0 s against 10.9-11.6, the packages tree 5.5-5.8 against 6.0, token shards
4.5-4.8 against 4.8-5.1; JSON lines 4.0-4.4 against 3.8-4.3 and the images 8.6-9.1
against 8.5-8.6, no better."""

LEVEL_GAIN_MIN = 1.05
"""A higher zstd level must promise this factor more throughput than the best lower one.

Measured on the lab's 100 Mbit/s, 80 ms link with the bench's JSON-lines: level 5
(ratio 2.80) was modelled 2% faster than level 1 (2.63) but ran no faster, at twice
the CPU per byte."""

CPU_SHARE = 1 / 3
"""Share of each core the codec may count on: hashing, TCP and disk I/O need the rest,
and the calibrated speed is a quiet machine's best. On the lab's shared 2-core machine
a one-thread server compressed at about a third of its calibrated level-5 speed."""

SETUP_RTTS = 5
"""Round trips before chunks flow: connect, info (twice, to measure the RTT) beside the
manifest, then the data connections' connect and first request."""

MIN_CHUNK_BYTES = 256 * 1024
MAX_CHUNK_BYTES = 8 * 1024 * 1024


class PlanInputError(ValidationError, ValueError):
    """A planner input out of range (a link's rate, RTT or loss; a size, a start-up, a
    stream count): in the error tree (exit code 2), and a ValueError still for callers
    that catch one."""


@dataclass(frozen=True)
class LinkProfile:
    """A path between two nodes, as measured (or as configured in the lab)."""

    rate_bps: float
    rtt_ms: float
    loss_ratio: float = 0.0
    congestion_control: CongestionControl = "bbr"
    mss_bytes: int = 1448
    max_window_bytes: int = 6 * 1024 * 1024
    single_stream_bps: float | None = None
    """A measured single-stream throughput; caps the modelled per-flow ceiling."""

    def __post_init__(self) -> None:
        if self.rate_bps <= 0:
            raise PlanInputError(f"rate_bps must be > 0, got {self.rate_bps}")
        if self.rtt_ms <= 0:
            raise PlanInputError(f"rtt_ms must be > 0, got {self.rtt_ms}")
        if not 0 <= self.loss_ratio < 1:
            raise PlanInputError(f"loss_ratio must be in [0, 1), got {self.loss_ratio}")

    @property
    def bdp_bytes(self) -> float:
        """Bandwidth-delay product: the bytes in flight that fill the link."""
        return self.rate_bps / 8 * self.rtt_ms / 1000


@dataclass(frozen=True)
class SampleProfile:
    """How a sample of the data compresses: zstd level -> ratio (raw / compressed)."""

    ratio_by_level: Mapping[int, float]
    sample_bytes: int = 0


@dataclass(frozen=True)
class CpuProfile:
    """This node's codec and disk speeds, in bytes of logical data per second per core."""

    cores: int
    compress_bytes_per_s: Mapping[int, float]
    decompress_bytes_per_s: Mapping[int, float]
    hash_bytes_per_s: float = 3.0e9
    disk_bytes_per_s: float | None = None
    startup_s: float = 0.0
    """Seconds from launching the CLI to its first request (interpreter and imports)."""
    per_file_s: float | None = None
    """Seconds a sync spends per file beyond its bytes, on this node (measured by a real
    sync of many small files, `netopt.cache.filecost`); None: not measured."""


@dataclass(frozen=True)
class TransferPlan:
    """What to do for one transfer, and what it is expected to achieve.

    ``zstd_level`` is None when compression is off. Rates are in bits per second
    of logical (uncompressed) data unless named ``wire``.
    """

    codec: Literal["none", "zstd"]
    zstd_level: int | None
    expected_ratio: float
    chunk_size_bytes: int
    streams: int
    per_flow_ceiling_bps: float
    wire_rate_bps: float
    logical_rate_bps: float
    predicted_time_s: float
    bottleneck: Bottleneck
    reasons: tuple[str, ...] = field(default=())
    startup_s: float = 0.0
    """Process start-up counted in ``predicted_time_s``."""
    setup_s: float = 0.0
    """Round trips and TCP ramp-up counted in ``predicted_time_s``."""

    @property
    def work_s(self) -> float:
        """The part of ``predicted_time_s`` that moves the data: no start-up, no set-up."""
        return self.predicted_time_s - self.startup_s - self.setup_s

    def to_dict(self) -> dict[str, object]:
        """The plan as JSON-able data."""
        return {
            "codec": self.codec,
            "zstd_level": self.zstd_level,
            "expected_ratio": round(self.expected_ratio, 3),
            "chunk_size_bytes": self.chunk_size_bytes,
            "streams": self.streams,
            "per_flow_ceiling_bps": round(self.per_flow_ceiling_bps),
            "wire_rate_bps": round(self.wire_rate_bps),
            "logical_rate_bps": round(self.logical_rate_bps),
            "predicted_time_s": round(self.predicted_time_s, 3),
            "bottleneck": self.bottleneck,
            "startup_s": round(self.startup_s, 3),
            "setup_s": round(self.setup_s, 3),
            "reasons": list(self.reasons),
        }


def per_flow_ceiling_bps(link: LinkProfile) -> float:
    """What one TCP flow can carry on ``link``, in bits per second.

    Loss-based congestion control: the Mathis bound MSS/RTT x 1.22/sqrt(p),
    capped by the window limit. BBR: a share of the link rate, capped by the window
    limit. A measured ``single_stream_bps`` caps either.
    """
    ceiling = tcp_flow_ceiling_bps(
        link.rtt_ms,
        link.loss_ratio,
        link.congestion_control,
        window_bytes=link.max_window_bytes,
        mss_bytes=link.mss_bytes,
    )
    if not is_loss_based(link.congestion_control):
        ceiling = min(ceiling, link.rate_bps * BBR_LINK_SHARE)
    if link.single_stream_bps is not None:
        ceiling = min(ceiling, link.single_stream_bps)
    return min(ceiling, link.rate_bps * HEADER_EFFICIENCY)


def _streams_wire_bps(
    streams: int, flow_bps: float, chunk_wire_bytes: float, rtt_s: float, link_bps: float
) -> float:
    """What ``streams`` request-response streams carry: each idles one RTT per chunk."""
    per_chunk_s = chunk_wire_bytes * 8 / flow_bps + rtt_s
    return min(link_bps, streams * chunk_wire_bytes * 8 / per_chunk_s)


def _choose_chunk_bytes(size_bytes: int, link: LinkProfile, flow_bps: float) -> int:
    # One chunk should take a flow at least about one RTT to send, so the request
    # gap (one RTT per chunk) costs at most about half of each flow's time.
    per_flow_bdp = flow_bps / 8 * link.rtt_ms / 1000
    chunk = MIN_CHUNK_BYTES
    while chunk < per_flow_bdp and chunk < MAX_CHUNK_BYTES:
        chunk *= 2
    return chunk if size_bytes >= chunk else max(MIN_CHUNK_BYTES, min(chunk, size_bytes))


def _choose_streams(
    link: LinkProfile, flow_bps: float, chunk_wire_bytes: float, max_streams: int
) -> int:
    link_bps = link.rate_bps * HEADER_EFFICIENCY
    rtt_s = link.rtt_ms / 1000
    floor = _bbr_floor(link) if link.congestion_control == "bbr" else 1
    for streams in range(1, max_streams + 1):
        carried = _streams_wire_bps(streams, flow_bps, chunk_wire_bytes, rtt_s, link_bps)
        if carried >= 0.97 * link_bps * (BBR_LINK_SHARE if floor > 1 else 1.0):
            return min(max(streams, floor), max_streams)
    return max_streams


def _bbr_floor(link: LinkProfile) -> int:
    """The fewest streams over BBR on ``link`` (see `RAMP_RTTS`)."""
    bdp_bytes = link.rate_bps * HEADER_EFFICIENCY / 8 * link.rtt_ms / 1000
    ramp_bytes = INITIAL_WINDOW_SEGMENTS * link.mss_bytes * BBR_STARTUP_GAIN**RAMP_RTTS
    return min(RAMP_MAX_STREAMS, max(BBR_MIN_STREAMS, math.ceil(bdp_bytes / ramp_bytes)))


def cpu_rate_bps(level: int, cpu: CpuProfile) -> float:
    """Logical bits per second the codec sustains at ``level`` (compressing and
    decompressing, `CPU_SHARE` of each core): inf with compression off, 0 for a level
    ``cpu`` never calibrated."""
    if level <= 0:
        return math.inf
    compress = cpu.compress_bytes_per_s.get(level)
    decompress = cpu.decompress_bytes_per_s.get(level)
    if compress is None or decompress is None:
        return 0.0
    return cpu.cores * CPU_SHARE * min(compress, decompress) * 8


def pair_cpu_profile(server: CpuProfile, client: CpuProfile) -> CpuProfile:
    """One profile for a fetch where ``server`` compresses and ``client`` decompresses
    (``cores`` folded into the speeds). zstd decompresses about as fast at any level: a
    level the client never calibrated (a server's precompressed 19, say) gets its
    slowest calibrated speed."""
    slowest = min(client.decompress_bytes_per_s.values(), default=0.0)
    decompress = {
        lvl: client.decompress_bytes_per_s.get(lvl, slowest) for lvl in server.compress_bytes_per_s
    }
    levels = {lvl for lvl, speed in decompress.items() if speed > 0}
    compress = {lvl: server.cores * server.compress_bytes_per_s[lvl] for lvl in levels}
    return CpuProfile(
        cores=1,
        compress_bytes_per_s=compress,
        decompress_bytes_per_s={lvl: client.cores * decompress[lvl] for lvl in levels},
        hash_bytes_per_s=client.cores * client.hash_bytes_per_s,
    )


def _level_rate_bps(
    level: int, ratio: float, wire_bps: float, cpu: CpuProfile
) -> tuple[float, Bottleneck]:
    limits: list[tuple[float, Bottleneck]] = [(wire_bps * ratio, "link")]
    if level > 0:
        codec_bps = cpu_rate_bps(level, cpu)
        if codec_bps <= 0:
            return 0.0, "cpu"
        limits.append((codec_bps, "cpu"))
    limits.append((cpu.cores * cpu.hash_bytes_per_s * 8, "cpu"))
    if cpu.disk_bytes_per_s is not None:
        limits.append((cpu.disk_bytes_per_s * 8, "disk"))
    return min(limits, key=lambda item: item[0])


def _compress_speed(level: int, cpu: CpuProfile) -> float:
    """Bytes per second per core at ``level`` (off: unbounded)."""
    return math.inf if level <= 0 else cpu.compress_bytes_per_s.get(level, 0.0)


def plan_transfer(
    size_bytes: int,
    sample_profile: SampleProfile,
    link: LinkProfile,
    cpu_profile: CpuProfile,
    *,
    max_streams: int = 64,
    startup_s: float = 0.0,
    meta_bytes: int = 0,
    files: int = 0,
    per_file_s: float = 0.0,
) -> TransferPlan:
    """Plan moving ``size_bytes`` of data like ``sample_profile`` over ``link``.

    Compression: the zstd level with the highest modelled logical throughput,
    min(cores x compress, cores x decompress, wire x ratio, ...) at the calibrated
    speeds, or none when no level's sampled ratio reaches `MIN_USEFUL_RATIO` (or
    none beats sending raw); a higher level must beat the best lower one by
    `LEVEL_GAIN_MIN`, else the cheaper level wins.
    Streams: enough request-response flows at the per-flow ceiling to fill the
    link (at most ``max_streams``). Chunk size: a power of two near one flow's
    bandwidth-delay product (256 KiB to 8 MiB). The predicted time adds
    ``startup_s`` (process start-up, s) and the setup round trips, and the round trips a
    fresh connection takes to carry ``meta_bytes`` (the info and manifest on the wire: a
    tree's manifest is megabytes) in its slow start. ``files`` of ``per_file_s`` each (the
    work per file beyond its bytes, `CpuProfile.per_file_s`) bound the rate too: a tree of
    small files is limited by them (bottleneck ``files``), whatever the link.

    Raises PlanInputError (a ValueError too) for a negative size, start-up, file count or
    per-file cost, or ``max_streams`` < 1.
    """
    if size_bytes < 0:
        raise PlanInputError(f"size_bytes must be >= 0, got {size_bytes}")
    if startup_s < 0:
        raise PlanInputError(f"startup_s must be >= 0, got {startup_s}")
    if max_streams < 1:
        raise PlanInputError(f"max_streams must be >= 1, got {max_streams}")
    if meta_bytes < 0:
        raise PlanInputError(f"meta_bytes must be >= 0, got {meta_bytes}")
    if files < 0 or per_file_s < 0:
        raise PlanInputError(f"files and per_file_s must be >= 0, got {files}, {per_file_s}")
    files_s = files * per_file_s
    files_bps = max(size_bytes, 1) * 8 / files_s if files_s > 0 else math.inf
    reasons: list[str] = []
    flow_bps = per_flow_ceiling_bps(link)
    reasons.append(
        f"per-flow ceiling {flow_bps / 1e6:.1f} Mbit/s ({link.congestion_control}, "
        f"rtt {link.rtt_ms:g} ms, loss {link.loss_ratio:g})"
    )
    chunk_bytes = _choose_chunk_bytes(size_bytes, link, flow_bps)

    candidates: list[tuple[float, int, float, int, float, Bottleneck]] = []
    usable = {lvl: r for lvl, r in sample_profile.ratio_by_level.items() if lvl > 0}
    if usable and max(usable.values()) < MIN_USEFUL_RATIO:
        reasons.append(
            f"compression off: best sampled ratio {max(usable.values()):.2f} < {MIN_USEFUL_RATIO}"
        )
        usable = {}
    link_bps = link.rate_bps * HEADER_EFFICIENCY
    rtt_s = link.rtt_ms / 1000
    for level, ratio in sorted({0: 1.0, **usable}.items()):
        if level > 0 and ratio < MIN_USEFUL_RATIO:
            continue
        streams = _choose_streams(link, flow_bps, chunk_bytes / ratio, max_streams)
        wire_bps = _streams_wire_bps(streams, flow_bps, chunk_bytes / ratio, rtt_s, link_bps)
        if link.congestion_control == "bbr":
            wire_bps = min(wire_bps, link.rate_bps * BBR_LINK_SHARE)
        rate_bps, bottleneck = _level_rate_bps(level, ratio, wire_bps, cpu_profile)
        candidates.append((rate_bps, level, ratio, streams, wire_bps, bottleneck))

    # Highest throughput wins, but a level's extra CPU must buy more than the model's
    # error: on a shared machine the cheaper level is the safer bet. A level that costs
    # no more CPU (a server's precompressed frames) needs only to be faster.
    best = candidates[0]
    for cand in candidates[1:]:
        cheaper = _compress_speed(cand[1], cpu_profile) >= _compress_speed(best[1], cpu_profile)
        if cand[0] > best[0] * (1.0 if cheaper else LEVEL_GAIN_MIN):
            best = cand
    rate_bps, level, ratio, streams, wire_bps, bottleneck = best
    # The level is chosen on the bytes: files bound every level alike, and the bytes a
    # level saves still spare the link.
    if files_bps < rate_bps:
        rate_bps, bottleneck = files_bps, "files"
    if level > 0:
        reasons.append(f"zstd level {level}: sampled ratio {ratio:.2f}")
    elif usable:
        reasons.append("compression off: no level beats sending raw bytes")
    reasons.append(f"{streams} streams of {chunk_bytes // 1024} KiB chunks")
    reasons.append(f"bottleneck {bottleneck}: {rate_bps / 1e6:.1f} Mbit/s logical")
    if bottleneck == "files":
        reasons.append(f"{files} files at {per_file_s * 1e6:.0f} us each: {files_s:.2f} s of work")
    setup_s = _setup_s(link, wire_bps, streams) + _meta_s(link, wire_bps, meta_bytes)
    predicted_s = startup_s + setup_s + (size_bytes * 8 / rate_bps if rate_bps > 0 else math.inf)
    reasons.append(f"fixed costs: start-up {startup_s:.2f} s, setup and ramp {setup_s:.2f} s")
    return TransferPlan(
        codec="zstd" if level > 0 else "none",
        zstd_level=level if level > 0 else None,
        expected_ratio=ratio,
        chunk_size_bytes=chunk_bytes,
        streams=streams,
        per_flow_ceiling_bps=flow_bps,
        wire_rate_bps=wire_bps,
        logical_rate_bps=rate_bps,
        predicted_time_s=predicted_s,
        bottleneck=bottleneck,
        reasons=tuple(reasons),
        startup_s=startup_s,
        setup_s=setup_s,
    )


INITIAL_WINDOW_SEGMENTS = 10
"""A fresh connection's first window (Linux's initcwnd)."""
_META_IN_SETUP_BYTES = 64 * 1024
"""Info and manifest bytes the `SETUP_RTTS` round trips already carry."""


def _meta_s(link: LinkProfile, wire_bps: float, meta_bytes: int) -> float:
    """Seconds beyond `SETUP_RTTS` that ``meta_bytes`` take on one fresh connection: slow
    start doubles its window each round trip from `INITIAL_WINDOW_SEGMENTS`, up to the
    window that fills ``wire_bps``; what is left after that flows at ``wire_bps``."""
    extra_bytes = meta_bytes - _META_IN_SETUP_BYTES
    if extra_bytes <= 0:
        return 0.0
    rtt_s = link.rtt_ms / 1000
    window = float(INITIAL_WINDOW_SEGMENTS * link.mss_bytes)
    full_window = max(window, wire_bps / 8 * rtt_s)
    seconds = 0.0
    left = float(meta_bytes)
    while left > 0 and window < full_window:
        left -= window
        window *= 2
        seconds += rtt_s
    if left > 0:
        seconds += left * 8 / wire_bps
    # The first round trips were counted in SETUP_RTTS.
    return max(0.0, seconds - _slow_start_s(link, _META_IN_SETUP_BYTES))


def _slow_start_s(link: LinkProfile, size_bytes: int) -> float:
    """Round trips (s) slow start needs to carry ``size_bytes`` on a fresh connection."""
    window, sent, rtts = float(INITIAL_WINDOW_SEGMENTS * link.mss_bytes), 0.0, 0
    while sent < size_bytes:
        sent += window
        window *= 2
        rtts += 1
    return rtts * link.rtt_ms / 1000


def _setup_s(link: LinkProfile, wire_bps: float, streams: int) -> float:
    """Round trips before chunks flow, plus the time slow start loses to reach the share."""
    rtt_s = link.rtt_ms / 1000
    # Slow start doubles each flow's window from ~10 segments until it carries its
    # share of the wire: about half of each ramp round trip is lost.
    share_bytes = max(wire_bps / 8 * rtt_s / streams, 1.0)
    ramp_rtts = max(0.0, math.log2(share_bytes / (INITIAL_WINDOW_SEGMENTS * link.mss_bytes)))
    return SETUP_RTTS * rtt_s + ramp_rtts * rtt_s / 2
