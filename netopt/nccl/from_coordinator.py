"""Links figures from a running coordinator, for ``netopt nccl-env --coordinator URL``.

The coordinator knows every node's NICs (from registration) and each pair's
RTT, loss and bandwidth (from the agents' summaries). This module turns its
``/api/v1/nodes`` and ``/api/v1/links`` answers into the same links document a
``--links`` file holds (pure), so both paths share one loader and one tuner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from netopt.nccl.linksdoc import PairFigures, links_document
from netopt.wire.schema import Nic

__all__ = ["links_from_coordinator"]


def links_from_coordinator(
    nodes_answer: Mapping[str, Any],
    links_answer: Mapping[str, Any],
    measured_at: str,
    congestion_control: str = "cubic",
) -> tuple[dict[str, Any], list[str]]:
    """(links document, notes). Pairs without bandwidth figures are left out and named
    in the notes; the tuner then names any such pair among the chosen nodes.

    ``congestion_control`` is the hosts' default TCP (what NCCL's sockets use), not
    the agents' probe setting: the default cubic keeps the Mathis loss bound.
    """
    regions: dict[str, str] = {}
    nics: dict[str, Sequence[Nic]] = {}
    for node in nodes_answer.get("nodes", []):
        if node.get("state") == "left":
            continue
        regions[node["node"]] = node["region"]
        nics[node["node"]] = tuple(
            Nic(
                name=n["name"],
                addresses=tuple(n.get("addresses", ())),
                speed_mbps=n.get("speed_mbps"),
                mtu=int(n.get("mtu", 1500)),
            )
            for n in node.get("nics", [])
        )
    pairs: list[PairFigures] = []
    notes: list[str] = []
    seen: set[frozenset[str]] = set()
    for link in links_answer.get("links", []):
        src, dst = link["src"], link["dst"]
        if src not in regions or dst not in regions:
            continue
        if frozenset((src, dst)) in seen:
            continue  # both directions measured: the matrix is sorted, keep the first
        window = link.get("window") or {}
        bandwidth = link.get("bandwidth") or {}
        # The median of the window's per-summary medians: steadier than the latest one.
        rtt_ms = (window.get("rtt_p50_ms") or {}).get("p50")
        aggregate_bps = bandwidth.get("aggregate_bps")
        single_bps = bandwidth.get("single_stream_bps") or aggregate_bps
        if rtt_ms is None or not aggregate_bps or not single_bps:
            notes.append(
                f"{src}<->{dst}: no {'RTT' if rtt_ms is None else 'bandwidth'} figures yet"
            )
            continue
        seen.add(frozenset((src, dst)))
        pairs.append(
            PairFigures(
                src,
                dst,
                float(rtt_ms),
                float(window.get("loss_ratio") or 0.0),
                single_bps / 1e6,
                max(aggregate_bps, single_bps) / 1e6,
                congestion_control,
            )
        )
    return links_document(regions, nics, pairs, measured_at), notes
