"""The link matrix: latest figures and windowed percentiles, as pure functions.

``link_figures(rows, regions)`` turns stored summaries of one window into one
entry per measured (src, dst) pair; ``region_figures(links, rows, regions)``
pools them per unordered region pair. RTT percentiles are taken over the
window's per-summary medians (``rtt_p50_ms`` of each summary), loss is pooled
(lost probes over sent probes), bandwidth is the latest figure in the window.

Both go through per-pair aggregates (:class:`PairAggregate`,
:class:`RegionAggregate`) and :func:`link_entries` / :func:`region_entries`;
:mod:`netopt.coordinator.matrix_query` computes the same aggregates in SQL, so
the coordinator never holds a window's summaries as Python objects.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from netopt.percentile import percentile, percentile_ranks

__all__ = [
    "SPREAD_QUANTILES",
    "LinkRow",
    "PairAggregate",
    "RankedValues",
    "RegionAggregate",
    "link_entries",
    "link_figures",
    "ranked_values",
    "region_entries",
    "region_figures",
    "spread_from_ranks",
]

SPREAD_QUANTILES: tuple[int, ...] = (50, 90, 99)


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


@dataclass(frozen=True)
class RankedValues:
    """What a spread needs of ``count`` ascending values: for each of
    :data:`SPREAD_QUANTILES`, the values at ranks ``floor(r)`` and ``floor(r) + 1``
    (``None`` past the end), where ``r = (count - 1) * q / 100``."""

    count: int
    values: tuple[float | None, ...]


def ranked_values(sorted_values: Sequence[float]) -> RankedValues | None:
    """The :class:`RankedValues` of ascending values; ``None`` for no values."""
    n = len(sorted_values)
    if n == 0:
        return None
    picks: list[float | None] = []
    for q in SPREAD_QUANTILES:
        _, low, _ = percentile_ranks(n, q)
        picks.append(sorted_values[low])
        picks.append(sorted_values[low + 1] if low + 1 < n else None)
    return RankedValues(n, tuple(picks))


def spread_from_ranks(ranked: RankedValues | None) -> dict[str, float] | None:
    """``{"p50", "p90", "p99"}``, interpolated exactly as :func:`~netopt.percentile.percentile`."""
    if ranked is None or ranked.count == 0:
        return None
    out: dict[str, float] = {}
    for index, q in enumerate(SPREAD_QUANTILES):
        rank, low, high = percentile_ranks(ranked.count, q)
        low_value = ranked.values[2 * index]
        high_value = ranked.values[2 * index + 1] if high > low else low_value
        if low_value is None or high_value is None:
            raise ValueError(f"ranked values of {ranked.count} values lack rank {low} or {high}")
        out[f"p{q}"] = low_value + (high_value - low_value) * (rank - low)
    return out


@dataclass(frozen=True)
class PairAggregate:
    """One (src, dst) pair over a window, reduced to what its matrix entry shows.

    ``latest_probe`` is ``(taken_at_s, rtt_p50_ms, rtt_p99_ms, jitter_ms,
    loss_ratio)`` of the newest summary with probes; ``latest_single`` and
    ``latest_aggregate`` are ``(rate_bps, taken_at_s)`` of the newest rates.
    ``probes_sent``/``probes_received`` are summed over summaries with probes.
    """

    src: str
    dst: str
    summary_count: int
    latest_at_s: float
    rtt_min_ms: float | None
    probes_sent: int
    probes_received: int
    latest_probe: tuple[Any, ...] | None
    latest_single: tuple[Any, ...] | None
    latest_aggregate: tuple[Any, ...] | None
    rtt_p50_ms: RankedValues | None
    jitter_ms: RankedValues | None


@dataclass(frozen=True)
class RegionAggregate:
    """One unordered region pair (``src_region <= dst_region``) over a window."""

    src_region: str
    dst_region: str
    summary_count: int
    probes_sent: int
    probes_received: int
    rtt_p50_ms: RankedValues | None


def _loss(sent: int, received: int) -> float | None:
    return (sent - received) / sent if sent else None


def link_entries(
    pairs: Iterable[PairAggregate], regions: Mapping[str, str]
) -> list[dict[str, Any]]:
    """One JSON-able matrix entry per pair, sorted by (src, dst)."""
    out: list[dict[str, Any]] = []
    for p in sorted(pairs, key=lambda p: (p.src, p.dst)):
        last = p.latest_probe
        single, single_at = p.latest_single or (None, None)
        aggregate, aggregate_at = p.latest_aggregate or (None, None)
        out.append(
            {
                "src": p.src,
                "dst": p.dst,
                "src_region": regions.get(p.src),
                "dst_region": regions.get(p.dst),
                "summary_count": p.summary_count,
                "latest_at_s": p.latest_at_s,
                "latest": None
                if last is None
                else {
                    "taken_at_s": last[0],
                    "rtt_p50_ms": last[1],
                    "rtt_p99_ms": last[2],
                    "jitter_ms": last[3],
                    "loss_ratio": last[4],
                },
                "window": {
                    "rtt_p50_ms": spread_from_ranks(p.rtt_p50_ms),
                    "rtt_min_ms": p.rtt_min_ms,
                    "jitter_ms": spread_from_ranks(p.jitter_ms),
                    "loss_ratio": _loss(p.probes_sent, p.probes_received),
                    "probes_sent": p.probes_sent,
                },
                "bandwidth": {
                    "single_stream_bps": single,
                    "aggregate_bps": aggregate,
                    "taken_at_s": max((t for t in (single_at, aggregate_at) if t), default=None),
                },
            }
        )
    return out


def region_entries(
    aggregates: Iterable[RegionAggregate], links: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Region-pair entries, sorted; link counts and rates come from ``links`` (same window)."""
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
    for agg in sorted(aggregates, key=lambda a: (a.src_region, a.dst_region)):
        key = (agg.src_region, agg.dst_region)
        key_rates = sorted(rates[key])
        out.append(
            {
                "src_region": agg.src_region,
                "dst_region": agg.dst_region,
                "link_count": link_count[key],
                "summary_count": agg.summary_count,
                "rtt_p50_ms": spread_from_ranks(agg.rtt_p50_ms),
                "loss_ratio": _loss(agg.probes_sent, agg.probes_received),
                "probes_sent": agg.probes_sent,
                "bandwidth_bps": {
                    "median": percentile(key_rates, 50) if key_rates else None,
                    "max": key_rates[-1] if key_rates else None,
                },
            }
        )
    return out


def _sums(rows: Iterable[LinkRow]) -> tuple[int, int]:
    sent = received = 0
    for row in rows:
        if row.probes_sent > 0:
            sent += row.probes_sent
            received += row.probes_received
    return sent, received


def _latest(rows: Sequence[LinkRow], attr: str) -> tuple[Any, float] | None:
    for row in reversed(rows):
        value = getattr(row, attr)
        if value is not None:
            return value, row.taken_at_s
    return None


def _sorted_values(values: Iterable[float | None]) -> RankedValues | None:
    return ranked_values(sorted(v for v in values if v is not None))


def link_figures(rows: Iterable[LinkRow], regions: Mapping[str, str]) -> list[dict[str, Any]]:
    """One JSON-able entry per (src, dst) pair in ``rows`` (any order), sorted by pair.

    The reference implementation in Python; rows in stored order (ties in
    ``taken_at_s`` are resolved in favour of the later row).
    """
    by_pair: dict[tuple[str, str], list[LinkRow]] = defaultdict(list)
    for row in rows:
        by_pair[(row.src, row.dst)].append(row)
    pairs = []
    for (src, dst), pair_rows in by_pair.items():
        pair_rows.sort(key=lambda r: r.taken_at_s)
        probe_rows = [r for r in pair_rows if r.rtt_p50_ms is not None or r.probes_sent > 0]
        last = probe_rows[-1] if probe_rows else None
        sent, received = _sums(pair_rows)
        mins = [r.rtt_min_ms for r in pair_rows if r.rtt_min_ms is not None]
        pairs.append(
            PairAggregate(
                src, dst, len(pair_rows), pair_rows[-1].taken_at_s, min(mins) if mins else None,
                sent, received,
                None if last is None else (last.taken_at_s, last.rtt_p50_ms, last.rtt_p99_ms,
                                           last.jitter_ms, last.loss_ratio),
                _latest(pair_rows, "single_stream_bps"), _latest(pair_rows, "aggregate_bps"),
                _sorted_values(r.rtt_p50_ms for r in pair_rows),
                _sorted_values(r.jitter_ms for r in pair_rows),
            )
        )  # fmt: skip
    return link_entries(pairs, regions)


def region_figures(
    links: Sequence[Mapping[str, Any]], rows: Iterable[LinkRow], regions: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Per unordered region pair (``a <= b``; ``a == b`` is in-region): pooled figures.

    ``links`` is the output of :func:`link_figures` over the same ``rows``; links
    whose ends have no known region are left out.
    """
    pooled: dict[tuple[str, str], list[LinkRow]] = defaultdict(list)
    for row in rows:
        key = _region_key(regions.get(row.src), regions.get(row.dst))
        if key is not None:
            pooled[key].append(row)
    aggregates = []
    for (a, b), key_rows in pooled.items():
        sent, received = _sums(key_rows)
        aggregates.append(
            RegionAggregate(
                a, b, len(key_rows), sent, received, _sorted_values(r.rtt_p50_ms for r in key_rows)
            )
        )
    return region_entries(aggregates, links)


def _region_key(a: str | None, b: str | None) -> tuple[str, str] | None:
    if a is None or b is None:
        return None
    return (a, b) if a <= b else (b, a)
