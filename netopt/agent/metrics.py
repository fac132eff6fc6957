"""The agent's Prometheus metrics (a registry per agent, never the global one).

Prometheus conventions: base units in the names (seconds, bytes, bits per second, ratios),
cumulative counts are counters with ``_total``, checked by ``promtool check metrics`` in
tests/service/test_metrics_conventions.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from netopt.cache.synctotals import SyncTotals, read_totals
from netopt.webshell import RequestMetrics

__all__ = ["AgentMetrics", "SyncTotalsCollector", "TotalsCounter"]


class TotalsCounter(Collector):
    """A counter whose totals are kept elsewhere (the reflector's, the spool's): ``set``
    copies the current total of a label value; it is exported as a counter."""

    def __init__(self, name: str, documentation: str, label: str | None = None) -> None:
        self._name = name
        self._documentation = documentation
        self._label = label
        self._totals: dict[str, float] = {}

    def set(self, total: float, label_value: str = "") -> None:
        self._totals[label_value] = max(float(total), self._totals.get(label_value, 0.0))

    def collect(self) -> Iterator[CounterMetricFamily]:
        labels = [self._label] if self._label else None
        family = CounterMetricFamily(self._name, self._documentation, labels=labels)
        for value, total in sorted(self._totals.items()):
            family.add_metric([value] if self._label else [], total)
        yield family


_SYNC_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("written_bytes", "netopt_sync_written_bytes", "Bytes of files syncs wrote into DEST"),
    (
        "reused_bytes",
        "netopt_sync_reused_bytes",
        "Bytes syncs needed and found in the cache or DEST (cache hits)",
    ),
    (
        "fetched_bytes",
        "netopt_sync_fetched_bytes",
        "Bytes of chunks syncs fetched (logical, before compression)",
    ),
    ("seconds", "netopt_sync_duration_seconds", "Wall clock of syncs, ended well or not"),
)


class SyncTotalsCollector(Collector):
    """The node's `netopt sync` totals (`netopt.cache.synctotals`), read at each scrape.

    Hit ratio: ``reused / (reused + fetched)``; throughput: ``rate(written) /
    rate(duration)``; border bytes saved: ``wire_bytes{source="peers"}``.
    """

    def __init__(self, cache_dir: str | Path) -> None:
        self._cache_dir = cache_dir

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        totals: dict[str, SyncTotals] = read_totals(self._cache_dir)
        runs = CounterMetricFamily(
            "netopt_sync_runs",
            "Syncs into this node's cache by outcome",
            labels=["dataset", "outcome"],
        )
        wire = CounterMetricFamily(
            "netopt_sync_wire_bytes",
            "Wire bytes syncs fetched, by source: the dataset's origin, or in-region peers "
            "(bytes that did not cross a border again)",
            labels=["dataset", "source"],
        )
        last = GaugeMetricFamily(
            "netopt_sync_last_success_timestamp_seconds",
            "Unix time of the last sync that ended well",
            labels=["dataset"],
        )
        families = {
            key: CounterMetricFamily(name, doc, labels=["dataset"])
            for key, name, doc in _SYNC_COUNTERS
        }
        for dataset, t in sorted(totals.items()):
            runs.add_metric([dataset, "ok"], t.runs_ok)
            runs.add_metric([dataset, "failed"], t.runs_failed)
            wire.add_metric([dataset, "origin"], t.origin_wire_bytes)
            wire.add_metric([dataset, "peers"], t.peer_wire_bytes)
            if t.last_success_s:
                last.add_metric([dataset], t.last_success_s)
            for key, family in families.items():
                family.add_metric([dataset], getattr(t, key))
        yield runs
        yield wire
        yield from families.values()
        yield last


@dataclass
class AgentMetrics:
    """Counters and gauges the agent exports at ``/metrics``."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.http = RequestMetrics("netopt_agent", r)  # its HTTP app's, by the service shell
        self.summaries = Counter(
            "netopt_agent_summaries", "Link summaries produced", ["method"], registry=r
        )
        self.batches_sent = Counter(
            "netopt_agent_batches_sent", "Batches the coordinator acknowledged", registry=r
        )
        self.batches_rejected = Counter(
            "netopt_agent_batches_rejected", "Batches the coordinator refused (4xx)", registry=r
        )
        self.report_failures = Counter(
            "netopt_agent_report_failures", "Report attempts that found no coordinator", registry=r
        )
        self.spool_bytes = Gauge(
            "netopt_agent_spool_bytes", "Bytes waiting in the spool", registry=r
        )
        self.spool_dropped = TotalsCounter(
            "netopt_agent_spool_dropped_batches", "Batches dropped from a full spool"
        )
        r.register(self.spool_dropped)
        self.peers = Gauge(
            "netopt_agent_probe_peers", "Peers in the current probe plan", registry=r
        )
        self.rtt_p50_seconds = Gauge(
            "netopt_agent_rtt_p50_seconds", "Median RTT of the last window", ["peer"], registry=r
        )
        self.loss_ratio = Gauge(
            "netopt_agent_loss_ratio", "Loss ratio of the last window", ["peer"], registry=r
        )
        self.loss_ratio_upper = Gauge(
            "netopt_agent_loss_ratio_upper",
            "Upper end of the last window's loss ratio, 95% Wilson interval (0 lost of "
            "100 probes: 0.037)",
            ["peer"],
            registry=r,
        )
        self.goodput_bits_per_second = Gauge(
            "netopt_agent_goodput_bits_per_second",
            "Multi-stream goodput of the last test",
            ["peer"],
            registry=r,
        )
        self.served_chunks = TotalsCounter(
            "netopt_agent_served_chunks", "Chunks this node's cache served to peers"
        )
        r.register(self.served_chunks)
        self.served_bytes = TotalsCounter(
            "netopt_agent_served_payload_bytes",
            "Payload bytes this node's cache served to peers (in-region: bytes that did not "
            "cross a border again)",
        )
        r.register(self.served_bytes)
        self.reflected = TotalsCounter(
            "netopt_agent_reflector_packets", "Reflector packets by outcome", "outcome"
        )
        r.register(self.reflected)
