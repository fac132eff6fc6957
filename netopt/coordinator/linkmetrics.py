"""The link matrix as Prometheus metrics (pure: matrix entries in, metric families out).

Per measured pair (labels ``src``, ``dst``, ``src_region``, ``dst_region``), over the
coordinator's last :data:`WINDOW_S` seconds:

- ``netopt_link_rtt_p50_seconds`` and ``netopt_link_rtt_p99_seconds``: the latest
  window's RTT (not a ``quantile`` label: that belongs to summaries);
- ``netopt_link_jitter_seconds``;
- ``netopt_link_loss_ratio`` with ``netopt_link_loss_ratio_lower`` / ``_upper``: the 95%
  Wilson interval of the window's probes (a link with 0 lost of 100 probes is "0, upper
  0.037", never a bare 0), and ``netopt_link_probes`` the probes behind it;
- ``netopt_link_bandwidth_bits_per_second{kind="single_stream"|"aggregate"}``;
- ``netopt_link_last_measured_timestamp_seconds`` (Unix time).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from netopt.measure.stats import wilson_interval

__all__ = ["WINDOW_S", "link_families"]

WINDOW_S = 900.0
"""The window the exported matrix covers: long enough for 1% loss to show at the probe
plan's rates, short enough that a healed link stops alerting within minutes."""

_LABELS = ["src", "dst", "src_region", "dst_region"]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def link_families(links: Iterable[Mapping[str, Any]]) -> Sequence[Metric]:
    """Metric families for ``links`` (entries as ``GET /api/v1/links`` returns them)."""
    rtts = {
        key: GaugeMetricFamily(
            f"netopt_link_rtt_{name}_seconds", f"Latest probe window's RTT, {name}.", labels=_LABELS
        )
        for name, key in (("p50", "rtt_p50_ms"), ("p99", "rtt_p99_ms"))
    }
    jitter = GaugeMetricFamily(
        "netopt_link_jitter_seconds", "Latest probe window's jitter.", labels=_LABELS
    )
    loss = GaugeMetricFamily(
        "netopt_link_loss_ratio", "Loss ratio of the window's probes.", labels=_LABELS
    )
    lower = GaugeMetricFamily(
        "netopt_link_loss_ratio_lower", "Lower end of the loss ratio's 95% Wilson interval.",
        labels=_LABELS,
    )  # fmt: skip
    upper = GaugeMetricFamily(
        "netopt_link_loss_ratio_upper", "Upper end of the loss ratio's 95% Wilson interval.",
        labels=_LABELS,
    )  # fmt: skip
    probes = GaugeMetricFamily(
        "netopt_link_probes", "Probes sent in the window (behind the loss ratio).", labels=_LABELS
    )
    bandwidth = GaugeMetricFamily(
        "netopt_link_bandwidth_bits_per_second", "Latest bandwidth test's goodput.",
        labels=[*_LABELS, "kind"],
    )  # fmt: skip
    last = GaugeMetricFamily(
        "netopt_link_last_measured_timestamp_seconds", "When the pair was last measured.",
        labels=_LABELS,
    )  # fmt: skip
    for link in links:
        labels = [str(link["src"]), str(link["dst"]),
                  str(link.get("src_region") or ""), str(link.get("dst_region") or "")]  # fmt: skip
        latest = link.get("latest") or {}
        for key, family in rtts.items():
            if (value := _number(latest.get(key))) is not None:
                family.add_metric(labels, value / 1000.0)
        if (value := _number(latest.get("jitter_ms"))) is not None:
            jitter.add_metric(labels, value / 1000.0)
        window = link.get("window") or {}
        ratio, sent = _number(window.get("loss_ratio")), _number(window.get("probes_sent"))
        if ratio is not None and sent:
            low, high = wilson_interval(round(ratio * sent), int(sent))
            loss.add_metric(labels, ratio)
            lower.add_metric(labels, low)
            upper.add_metric(labels, high)
            probes.add_metric(labels, sent)
        speeds = link.get("bandwidth") or {}
        for kind in ("single_stream", "aggregate"):
            if (value := _number(speeds.get(f"{kind}_bps"))) is not None:
                bandwidth.add_metric([*labels, kind], value)
        if (value := _number(link.get("latest_at_s"))) is not None:
            last.add_metric(labels, value)
    return (*rtts.values(), jitter, loss, lower, upper, probes, bandwidth, last)
