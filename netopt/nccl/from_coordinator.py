"""Links figures from a running coordinator, for ``netopt nccl-env --coordinator URL``.

The coordinator knows every node's NICs (from registration) and each pair's
RTT, loss and bandwidth (from the agents' summaries). This module turns its
``/api/v1/nodes`` and ``/api/v1/links`` answers into the same links document a
``--links`` file holds (pure), so both paths share one loader and one tuner.
"""

from __future__ import annotations

from typing import Any

from netopt.nccl.linksdoc import PairFigures, links_document
from netopt.wire.answers import LinksAnswer, NodesAnswer

__all__ = ["links_from_coordinator"]


def links_from_coordinator(
    nodes_answer: NodesAnswer,
    links_answer: LinksAnswer,
    measured_at: str,
    congestion_control: str = "cubic",
) -> tuple[dict[str, Any], list[str]]:
    """(links document, notes). Pairs without bandwidth figures are left out and named
    in the notes; the tuner then names any such pair among the chosen nodes.

    ``congestion_control`` is the hosts' default TCP (what NCCL's sockets use), not
    the agents' probe setting: the default cubic keeps the Mathis loss bound.
    """
    live = nodes_answer.live()
    regions = {node.node: node.region for node in live}
    nics = {node.node: node.nics for node in live}
    pairs: list[PairFigures] = []
    notes: list[str] = []
    seen: set[frozenset[str]] = set()
    for link in links_answer.links:
        src, dst = link.src, link.dst
        if src not in regions or dst not in regions:
            continue
        if frozenset((src, dst)) in seen:
            continue  # both directions measured: the matrix is sorted, keep the first
        # The median of the window's per-summary medians: steadier than the latest one.
        spread = link.window.rtt_p50_ms
        rtt_ms = None if spread is None else spread.p50
        aggregate_bps = link.bandwidth.aggregate_bps
        single_bps = link.bandwidth.single_stream_bps or aggregate_bps
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
                rtt_ms,
                link.window.loss_ratio or 0.0,
                single_bps / 1e6,
                max(aggregate_bps, single_bps) / 1e6,
                congestion_control,
            )
        )
    return links_document(regions, nics, pairs, measured_at), notes
