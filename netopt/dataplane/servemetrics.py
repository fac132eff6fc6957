"""`netopt serve`'s Prometheus metrics at ``/metrics`` (a registry per server).

Base units in the names, counters with ``_total`` (``promtool check metrics`` in
tests/service/test_serve_metrics.py): requests by route, method and status and their
durations (`netopt.webshell.RequestMetrics`), chunk requests served and payload bytes
sent (`ServeStats`), and each served dataset's current version: its files, bytes and
chunks. The endpoint needs no token: none of this is secret (dataset names are what
any client asks for).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from netopt.dataplane.handlers import ServeStats
from netopt.dataplane.served import DatasetView
from netopt.webshell import RequestMetrics

__all__ = ["ServeMetrics", "add_metrics_route"]


class _ServedCollector(Collector):
    def __init__(self, stats: ServeStats, datasets: Mapping[str, DatasetView]) -> None:
        self._stats = stats
        self._datasets = datasets

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        chunks = CounterMetricFamily(
            "netopt_serve_chunk_requests", "Chunks served (stream, batch and single requests)"
        )
        chunks.add_metric([], self._stats.chunk_requests_total)
        yield chunks
        sent = CounterMetricFamily(
            "netopt_serve_sent_payload_bytes", "Chunk payload bytes sent (after compression)"
        )
        sent.add_metric([], self._stats.payload_bytes_sent)
        yield sent
        files = GaugeMetricFamily(
            "netopt_serve_dataset_files", "Files in the served version", labels=["dataset"]
        )
        size = GaugeMetricFamily(
            "netopt_serve_dataset_bytes", "Bytes in the served version", labels=["dataset"]
        )
        count = GaugeMetricFamily(
            "netopt_serve_dataset_chunks", "Unique chunks in the served version", labels=["dataset"]
        )
        for name, dataset in sorted(self._datasets.items()):
            manifest = dataset.manifest
            files.add_metric([name], len(manifest.files))
            size.add_metric([name], manifest.total_bytes)
            count.add_metric([name], len(dataset.index))
        yield from (files, size, count)


class ServeMetrics:
    """The server's registry; ``http`` is the service shell's request observer."""

    def __init__(self, stats: ServeStats, datasets: Mapping[str, DatasetView]) -> None:
        self.registry = CollectorRegistry()
        self.http = RequestMetrics("netopt_serve", self.registry)
        self.registry.register(_ServedCollector(stats, datasets))


_METRICS = web.AppKey("serve_metrics", ServeMetrics)


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[_METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_metrics_route(app: web.Application, metrics: ServeMetrics) -> None:
    """Serve ``metrics`` at ``GET /metrics`` of ``app``."""
    app[_METRICS] = metrics
    app.router.add_get("/metrics", _metrics)
