"""Link statistics from a probe series, as pure functions.

``summarise(series) -> LinkStats``: RTT min/mean/p50/p90/p99/max; RFC 3550
interarrival jitter over RTTs in arrival order (no synchronised clocks needed);
packet delay variation percentiles (RFC 5481 PDV: RTT minus the minimum RTT);
loss ratio with a 95% Wilson score interval; reordered (RFC 4737: arrived after a
higher sequence number), duplicated and late (after ``timeout_s``, counted as
lost) replies; outages as runs of consecutive losses.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from netopt.measure.samples import Method, ProbeSeries
from netopt.percentile import percentile

__all__ = [
    "Z_95",
    "LinkStats",
    "Outage",
    "PdvSummary",
    "RttSummary",
    "find_outages",
    "rfc3550_jitter_ms",
    "summarise",
    "wilson_interval",
]

Z_95 = 1.959963984540054
"""The two-sided 95% quantile of the standard normal distribution."""


@dataclass(frozen=True)
class RttSummary:
    """Round-trip times in milliseconds."""

    min: float
    mean: float
    p50: float
    p90: float
    p99: float
    max: float


@dataclass(frozen=True)
class PdvSummary:
    """Packet delay variation (RTT above the minimum) percentiles in milliseconds."""

    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class Outage:
    """A run of consecutive lost probes.

    ``start_s`` is when its first lost probe left, relative to the first probe;
    ``duration_s`` runs to the next answered probe (or one probe interval past the
    last probe when the run reaches the end, then ``ongoing`` is true).
    """

    start_s: float
    duration_s: float
    lost_count: int
    ongoing: bool = False


@dataclass(frozen=True)
class LinkStats:
    """A summary of one probe series."""

    method: Method
    target: str
    probes_sent: int
    probes_received: int
    duration_s: float
    rtt_ms: RttSummary | None
    jitter_ms: float | None
    delay_variation_ms: PdvSummary | None
    loss_ratio: float
    loss_ratio_ci95: tuple[float, float]
    reordered_count: int
    duplicate_count: int
    late_count: int
    outages: tuple[Outage, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able data; every numeric key carries its unit."""
        return {
            "target": self.target,
            "method": self.method,
            "probes_sent": self.probes_sent,
            "probes_received": self.probes_received,
            "duration_s": self.duration_s,
            "rtt_ms": None if self.rtt_ms is None else vars(self.rtt_ms).copy(),
            "jitter_ms": self.jitter_ms,
            "delay_variation_ms": (
                None if self.delay_variation_ms is None else vars(self.delay_variation_ms).copy()
            ),
            "loss_ratio": self.loss_ratio,
            "loss_ratio_ci95": list(self.loss_ratio_ci95),
            "reordered_count": self.reordered_count,
            "duplicate_count": self.duplicate_count,
            "late_count": self.late_count,
            "outages": [vars(o).copy() for o in self.outages],
        }


def wilson_interval(failures: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a ratio ``failures / trials`` (``(0, 1)`` for no trials)."""
    if trials <= 0:
        return (0.0, 1.0)
    if not 0 <= failures <= trials:
        raise ValueError(f"{failures} failures out of {trials} trials")
    p = failures / trials
    z2 = z * z
    denom = 1 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
    low = 0.0 if failures == 0 else max(0.0, centre - half)
    high = 1.0 if failures == trials else min(1.0, centre + half)
    return (low, high)


def rfc3550_jitter_ms(rtts_ms: Sequence[float]) -> float:
    """RFC 3550 interarrival jitter over consecutive delays: J += (|D| - J) / 16."""
    jitter = 0.0
    for prev, cur in itertools.pairwise(rtts_ms):
        jitter += (abs(cur - prev) - jitter) / 16
    return jitter


def find_outages(
    sent_at_s: Sequence[float], lost: Sequence[bool], min_lost: int = 3
) -> tuple[Outage, ...]:
    """Runs of at least ``min_lost`` consecutive losses, in sequence order."""
    outages: list[Outage] = []
    n = len(sent_at_s)
    origin = sent_at_s[0] if n else 0.0
    interval = (sent_at_s[-1] - origin) / (n - 1) if n > 1 else 0.0
    seq = 0
    while seq < n:
        if not lost[seq]:
            seq += 1
            continue
        first = seq
        while seq < n and lost[seq]:
            seq += 1
        count = seq - first
        if count < min_lost:
            continue
        ongoing = seq >= n
        end = sent_at_s[-1] + interval if ongoing else sent_at_s[seq]
        outages.append(
            Outage(sent_at_s[first] - origin, end - sent_at_s[first], count, ongoing=ongoing)
        )
    return tuple(outages)


def summarise(series: ProbeSeries, *, outage_min_lost: int = 3) -> LinkStats:
    """Summarise ``series``; a reply later than ``series.timeout_s`` counts as lost."""
    sent = series.sent_at_s
    n = len(sent)
    on_time: dict[int, float] = {}
    arrival_rtts: list[float] = []
    answered: set[int] = set()
    duplicates = late = reordered = 0
    highest = -1
    for reply in series.replies:
        if not 0 <= reply.seq < n:
            continue
        if reply.seq in answered:
            duplicates += 1
            continue
        answered.add(reply.seq)
        if reply.received_at_s - sent[reply.seq] > series.timeout_s:
            late += 1
            continue
        on_time[reply.seq] = reply.rtt_ms
        arrival_rtts.append(reply.rtt_ms)
        if reply.seq < highest:
            reordered += 1
        highest = max(highest, reply.seq)
    received = len(on_time)
    lost = n - received
    rtt: RttSummary | None = None
    pdv: PdvSummary | None = None
    jitter: float | None = None
    if arrival_rtts:
        ordered = sorted(arrival_rtts)
        rtt = RttSummary(
            min=ordered[0],
            mean=math.fsum(ordered) / len(ordered),
            p50=percentile(ordered, 50),
            p90=percentile(ordered, 90),
            p99=percentile(ordered, 99),
            max=ordered[-1],
        )
        pdv = PdvSummary(p50=rtt.p50 - rtt.min, p90=rtt.p90 - rtt.min, p99=rtt.p99 - rtt.min)
        jitter = rfc3550_jitter_ms(arrival_rtts)
    return LinkStats(
        method=series.method,
        target=series.target,
        probes_sent=n,
        probes_received=received,
        duration_s=(sent[-1] - sent[0]) if n > 1 else 0.0,
        rtt_ms=rtt,
        jitter_ms=jitter,
        delay_variation_ms=pdv,
        loss_ratio=lost / n if n else 0.0,
        loss_ratio_ci95=wilson_interval(lost, n),
        reordered_count=reordered,
        duplicate_count=duplicates,
        late_count=late,
        outages=find_outages(sent, [s not in on_time for s in range(n)], outage_min_lost),
    )
