"""Turn measurement results into the coordinator's link summaries (pure)."""

from __future__ import annotations

from netopt.measure.stats import LinkStats
from netopt.measure.throughput import BandwidthResult
from netopt.wire.schema import LinkSummary, OutageRecord, RttFigures

__all__ = ["bandwidth_summary", "probe_summary"]


def probe_summary(src: str, dst: str, stats: LinkStats, taken_at_s: float) -> LinkSummary:
    """A summary of one probe window; ``taken_at_s`` is unix time at its end."""
    rtt = stats.rtt_ms
    pdv = stats.delay_variation_ms
    return LinkSummary(
        src=src,
        dst=dst,
        taken_at_s=taken_at_s,
        window_s=max(stats.duration_s, 0.001),
        method=stats.method,
        probes_sent=stats.probes_sent,
        probes_received=stats.probes_received,
        rtt_ms=None
        if rtt is None
        else RttFigures(rtt.min, rtt.mean, rtt.p50, rtt.p90, rtt.p99, rtt.max),
        jitter_ms=stats.jitter_ms,
        delay_variation_ms=None if pdv is None else (pdv.p50, pdv.p90, pdv.p99),
        loss_ratio=stats.loss_ratio,
        loss_ratio_ci95=stats.loss_ratio_ci95,
        reordered_count=stats.reordered_count,
        duplicate_count=stats.duplicate_count,
        late_count=stats.late_count,
        outages=tuple(
            OutageRecord(o.start_s, o.duration_s, o.lost_count, o.ongoing) for o in stats.outages
        ),
        target=stats.target,
        duration_s=stats.duration_s,
    )


def bandwidth_summary(
    src: str,
    dst: str,
    single: BandwidthResult | None,
    multi: BandwidthResult | None,
    taken_at_s: float,
) -> LinkSummary:
    """A summary of a bulk-TCP test: single-stream and/or multi-stream goodput."""
    results = [r for r in (single, multi) if r is not None]
    if not results:
        raise ValueError("a bandwidth summary needs at least one result")
    duration_s = sum(r.duration_s for r in results)
    best = multi or single
    assert best is not None
    return LinkSummary(
        src=src,
        dst=dst,
        taken_at_s=taken_at_s,
        window_s=duration_s,
        method="bulk-tcp",
        single_stream_bps=None if single is None else single.goodput_bps,
        aggregate_bps=best.goodput_bps,
        streams=best.streams,
        congestion_control=best.congestion_control,
        duration_s=duration_s,
    )
