"""The link matrix: latest figures and windowed percentiles, as pure functions.

``link_figures(rows, regions)`` turns stored summaries of one window into one
entry per measured (src, dst) pair; ``region_figures(links, rows, regions)``
pools them per unordered region pair. RTT percentiles are taken over the
window's per-summary medians (``rtt_p50_ms`` of each summary), loss is pooled
(lost probes over sent probes), bandwidth is the latest figure in the window.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LinkRow", "link_figures", "percentile", "region_figures"]


@dataclass(frozen=True)
class LinkRow:
    """The columns of one stored summary that the matrix needs."""

    src: str
    dst: str
    taken_at_s: float
    rtt_p50_ms: float | None
    rtt_p99_ms: float | None
    rtt_min_ms: float | None
    jitter_ms: float | None
    loss_ratio: float | None
    probes_sent: int
    probes_received: int
    single_stream_bps: float | None
    aggregate_bps: float | None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th (0..100) percentile of ascending values, linearly interpolated.

    Raises ValueError for no values.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = (len(sorted_values) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    values.sort()
    return {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


def _pooled_loss(rows: Iterable[LinkRow]) -> tuple[float | None, int]:
    sent = received = 0
    for row in rows:
        if row.probes_sent > 0:
            sent += row.probes_sent
            received += row.probes_received
    return ((sent - received) / sent if sent else None), sent


def _latest(rows: Sequence[LinkRow], attr: str) -> tuple[float | None, float | None]:
    for row in reversed(rows):
        value = getattr(row, attr)
        if value is not None:
            return value, row.taken_at_s
    return None, None


def link_figures(rows: Iterable[LinkRow], regions: Mapping[str, str]) -> list[dict[str, Any]]:
    """One JSON-able entry per (src, dst) pair in ``rows`` (any order), sorted by pair."""
    by_pair: dict[tuple[str, str], list[LinkRow]] = defaultdict(list)
    for row in rows:
        by_pair[(row.src, row.dst)].append(row)
    out: list[dict[str, Any]] = []
    for (src, dst), pair_rows in sorted(by_pair.items()):
        pair_rows.sort(key=lambda r: r.taken_at_s)
        probe_rows = [r for r in pair_rows if r.rtt_p50_ms is not None or r.probes_sent > 0]
        last = probe_rows[-1] if probe_rows else None
        loss, sent = _pooled_loss(pair_rows)
        single, single_at = _latest(pair_rows, "single_stream_bps")
        aggregate, aggregate_at = _latest(pair_rows, "aggregate_bps")
        mins = [r.rtt_min_ms for r in pair_rows if r.rtt_min_ms is not None]
        out.append(
            {
                "src": src,
                "dst": dst,
                "src_region": regions.get(src),
                "dst_region": regions.get(dst),
                "summary_count": len(pair_rows),
                "latest_at_s": pair_rows[-1].taken_at_s,
                "latest": None
                if last is None
                else {
                    "taken_at_s": last.taken_at_s,
                    "rtt_p50_ms": last.rtt_p50_ms,
                    "rtt_p99_ms": last.rtt_p99_ms,
                    "jitter_ms": last.jitter_ms,
                    "loss_ratio": last.loss_ratio,
                },
                "window": {
                    "rtt_p50_ms": _spread(
                        [r.rtt_p50_ms for r in pair_rows if r.rtt_p50_ms is not None]
                    ),
                    "rtt_min_ms": min(mins) if mins else None,
                    "jitter_ms": _spread(
                        [r.jitter_ms for r in pair_rows if r.jitter_ms is not None]
                    ),
                    "loss_ratio": loss,
                    "probes_sent": sent,
                },
                "bandwidth": {
                    "single_stream_bps": single,
                    "aggregate_bps": aggregate,
                    "taken_at_s": max((t for t in (single_at, aggregate_at) if t), default=None),
                },
            }
        )
    return out


def region_figures(
    links: Sequence[Mapping[str, Any]], rows: Iterable[LinkRow], regions: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Per unordered region pair (``a <= b``; ``a == b`` is in-region): pooled figures.

    ``links`` is the output of :func:`link_figures` over the same ``rows``; links
    whose ends have no known region are left out.
    """
    rtts: dict[tuple[str, str], list[float]] = defaultdict(list)
    pooled: dict[tuple[str, str], list[LinkRow]] = defaultdict(list)
    for row in rows:
        key = _region_key(regions.get(row.src), regions.get(row.dst))
        if key is None:
            continue
        pooled[key].append(row)
        if row.rtt_p50_ms is not None:
            rtts[key].append(row.rtt_p50_ms)
    rates: dict[tuple[str, str], list[float]] = defaultdict(list)
    link_count: dict[tuple[str, str], int] = defaultdict(int)
    for link in links:
        key = _region_key(link.get("src_region"), link.get("dst_region"))
        if key is None:
            continue
        link_count[key] += 1
        rate = link["bandwidth"]["aggregate_bps"] or link["bandwidth"]["single_stream_bps"]
        if rate is not None:
            rates[key].append(rate)
    out: list[dict[str, Any]] = []
    for key in sorted(pooled):
        loss, sent = _pooled_loss(pooled[key])
        key_rates = sorted(rates[key])
        out.append(
            {
                "src_region": key[0],
                "dst_region": key[1],
                "link_count": link_count[key],
                "summary_count": len(pooled[key]),
                "rtt_p50_ms": _spread(rtts[key]),
                "loss_ratio": loss,
                "probes_sent": sent,
                "bandwidth_bps": {
                    "median": percentile(key_rates, 50) if key_rates else None,
                    "max": key_rates[-1] if key_rates else None,
                },
            }
        )
    return out


def _region_key(a: str | None, b: str | None) -> tuple[str, str] | None:
    if a is None or b is None:
        return None
    return (a, b) if a <= b else (b, a)
