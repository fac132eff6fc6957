"""The agent's Prometheus metrics (a registry per agent, never the global one)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["AgentMetrics"]


@dataclass
class AgentMetrics:
    """Counters and gauges the agent exports at ``/metrics``."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
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
        self.spool_dropped = Gauge(
            "netopt_agent_spool_dropped_batches", "Batches dropped from a full spool", registry=r
        )
        self.peers = Gauge(
            "netopt_agent_probe_peers", "Peers in the current probe plan", registry=r
        )
        self.rtt_p50_ms = Gauge(
            "netopt_agent_rtt_p50_ms", "Median RTT of the last window", ["peer"], registry=r
        )
        self.loss_ratio = Gauge(
            "netopt_agent_loss_ratio", "Loss ratio of the last window", ["peer"], registry=r
        )
        self.goodput_bps = Gauge(
            "netopt_agent_goodput_bps",
            "Multi-stream goodput of the last test",
            ["peer"],
            registry=r,
        )
        self.reflected = Gauge(
            "netopt_agent_reflector_packets",
            "Reflector packets by outcome",
            ["outcome"],
            registry=r,
        )
