"""Prometheus metrics of one coordinator application (its own CollectorRegistry)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from netopt.webshell import REQUEST_BUCKETS_S, RequestMetrics

__all__ = ["CONTENT_TYPE", "CoordinatorMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _NodeStates(Collector):
    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "netopt_coordinator_nodes", "Registered nodes by liveness state.", labels=["state"]
        )
        for state, count in sorted(self._counts().items()):
            family.add_metric([state], count)
        yield family


class _Leader(Collector):
    def __init__(self, is_leader: Callable[[], bool]) -> None:
        self._is_leader = is_leader

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "netopt_coordinator_leader",
            "1 on the replica elected to do once-only work (retention sweeps), else 0.",
            value=1 if self._is_leader() else 0,
        )


class CoordinatorMetrics:
    """Request (``http``, the service shell's), ingest and node-state metrics; ``render()``
    gives the exposition text."""

    def __init__(
        self,
        node_counts: Callable[[], dict[str, int]],
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.http = RequestMetrics("netopt_coordinator", self.registry)
        self.requests, self.latency = self.http.requests, self.http.latency
        self.batches = Counter(
            "netopt_coordinator_batches",
            "Summary batches received, stored or recognised as duplicates.",
            ["result"],
            registry=self.registry,
        )
        self.summaries = Counter(
            "netopt_coordinator_summaries",
            "Link summaries received: stored, or expired (older than retention).",
            ["result"],
            registry=self.registry,
        )
        self.store_latency = Histogram(
            "netopt_coordinator_store_duration_seconds",
            "Time of a call to the store (SQLite or PostgreSQL), by operation.",
            ["operation"],
            buckets=REQUEST_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_NodeStates(node_counts))
        self.registry.register(_Leader(is_leader))

    def observe_store(self, operation: str, seconds: float) -> None:
        """Record one store call (called from the event loop)."""
        self.store_latency.labels(operation).observe(seconds)

    def render(self, extra: Sequence[Metric] = ()) -> bytes:
        """The registry in Prometheus text format, then the ``extra`` families (the link
        matrix, computed per scrape)."""
        body = generate_latest(self.registry)
        if not extra:
            return body
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(extra))
        return body + generate_latest(registry)


class _Families(Collector):
    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families
