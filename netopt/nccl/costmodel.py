"""Alpha-beta cost model of all-reduce over measured links.

Times are in seconds, sizes in bytes, rates in bit/s. ``alpha`` is the one-way
latency of the slowest hop an algorithm waits on (RTT/2), ``rate`` the bottleneck
rate a hop gets. For ``n`` ranks and a message of ``S`` bytes:

- ring:  ``2(n-1)·alpha + 2(n-1)/n · S/rate``
- tree:  ``2·log2(n)·alpha + 2·S/rate``
- two-level: reduce-scatter inside each region, all-reduce of the shards across
  regions (the ``m`` shard flows of a region share the cross-region link), then
  all-gather inside the region.

A hop's rate is ``min(link rate, flows x per-flow ceiling)``: a TCP flow gets at most
``min(measured single-stream goodput, MSS/RTT x 1.22/sqrt(loss))`` (Mathis et al.;
the loss term only for loss-based congestion control, not BBR),
and NCCL's socket transport opens ``flows`` sockets per connection (Gloo opens one).

Gloo (PyTorch's CPU backend) pays each message twice the latency: its TCP transport
writes a message only once the receiver's ready notice for it has arrived (the
receiver posts the receive, the notice crosses, then the data), and its ring posts
each step's receive when the step before is done. So a Gloo message is
``2·alpha + S/rate`` and Gloo's ring ``2(n-1)·2·alpha + 2(n-1)/n · S/rate``: two round
trips for two ranks, where the plain ring counts one (:func:`gloo_ring_allreduce_s`).
On a lossy hop each Gloo message also waits, on average, for its lost segments'
retransmission (:func:`loss_recovery_s`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from netopt.errors import ValidationError
from netopt.nccl.model import LinkFigures, NodeInfo, Prediction
from netopt.tcpmath import mathis_bound_bps

MSS_BYTES = 1448
"""The segment size the loss term counts messages in (Ethernet MTU 1500, TCP options)."""

__all__ = [
    "Fabric",
    "Hop",
    "best_link",
    "fabric_from_links",
    "flow_ceiling_bps",
    "gloo_hierarchical_allreduce_s",
    "gloo_message_s",
    "gloo_ring_allreduce_s",
    "loss_recovery_s",
    "predict",
    "predict_table",
    "ring_allreduce_s",
    "tree_allreduce_s",
    "two_level_allreduce_s",
]


@dataclass(frozen=True)
class Hop:
    """One hop as the model sees it: one-way latency and usable rate."""

    alpha_s: float
    rate_bps: float
    loss_ratio: float = 0.0
    """Packet loss per direction (Gloo's messages pay its recovery: :func:`loss_recovery_s`)."""


@dataclass(frozen=True)
class Fabric:
    """The hops each algorithm waits on, for one set of nodes."""

    n: int
    ring: Hop
    tree: Hop
    region_sizes: tuple[int, ...]
    local: Hop | None
    wan: Hop | None
    wan_link_bps: float | None


def flow_ceiling_bps(link: LinkFigures, mss_bytes: int) -> float:
    """The most one TCP flow gets on ``link``: min(single-stream, Mathis bound).

    The Mathis bound applies to loss-based congestion control (reno, cubic); with
    BBR the measured single-stream goodput alone is the ceiling.
    """
    measured = link.single_stream_mbps * 1e6
    if not link.loss_based:
        return measured
    return min(measured, mathis_bound_bps(link.rtt_ms, link.loss_ratio, mss_bytes))


def ring_allreduce_s(n: int, size_bytes: float, alpha_s: float, rate_bps: float) -> float:
    """Ring all-reduce time: ``2(n-1)a + 2(n-1)/n * S/B``; 0 for one rank."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * size_bytes * 8 / rate_bps


def loss_recovery_s(size_bytes: float, alpha_s: float, loss_ratio: float) -> float:
    """Expected wait for lost segments at the end of one message of ``S`` bytes:
    ``(1 - (1-p)^segments) x 2a``.

    A message that loses a segment ends one round trip later, when the retransmission
    arrives (SACK recovery; the flow keeps sending meanwhile, so a message that loses
    several still waits about one round trip at its end). A collective's step waits
    for its whole message, so on a lossy border even small messages pay it often:
    70 segments (100 KB) at 0.5% loss lose one 30% of the time.
    """
    if loss_ratio <= 0 or size_bytes <= 0:
        return 0.0
    segments = math.ceil(size_bytes / MSS_BYTES)
    return (1 - (1 - min(loss_ratio, 1.0)) ** segments) * 2 * alpha_s


def gloo_message_s(size_bytes: float, hop: Hop) -> float:
    """One Gloo message of ``S`` bytes over ``hop``: the receiver's ready notice one way,
    then the data: ``2a + S/B``, plus its expected :func:`loss_recovery_s`. Two ranks
    sending each other one at once (netopt's leaders' exchange) take the same: both
    notices cross, then both messages."""
    recovery = loss_recovery_s(size_bytes, hop.alpha_s, hop.loss_ratio)
    return 2 * hop.alpha_s + size_bytes * 8 / hop.rate_bps + recovery


def gloo_ring_allreduce_s(
    n: int, size_bytes: float, alpha_s: float, rate_bps: float, loss_ratio: float = 0.0
) -> float:
    """Gloo's ring all-reduce: ``2(n-1) 2a + 2(n-1)/n * S/B``, plus each step's expected
    :func:`loss_recovery_s` for its ``S/n`` bytes; 0 for one rank.

    Gloo's ring (``gloo::allreduce``) cuts the buffer into two segments per rank and
    runs n-1 reduce-scatter steps then n-1 all-gather steps; a step's receive is posted
    when the step before it is done and its data waits for that receive's ready notice
    (one way) before it is written (one way), so every step waits ``2a``.
    """
    if n <= 1:
        return 0.0
    recovery = 2 * (n - 1) * loss_recovery_s(size_bytes / n, alpha_s, loss_ratio)
    return ring_allreduce_s(n, size_bytes, 2 * alpha_s, rate_bps) + recovery


def gloo_hierarchical_allreduce_s(fabric: Fabric, size_bytes: float) -> float | None:
    """netopt's region-hierarchical all-reduce on Gloo (``netopt.torch.hierarchical``).

    A reduce to the region leader and a broadcast back inside the largest region, each
    one pass of the bytes over the local hop (one Gloo message), and between the leaders
    one exchange (two regions: both send at once, one message) or Gloo's ring (more).
    None when the nodes sit in one region.
    """
    if fabric.wan is None or len(fabric.region_sizes) < 2:
        return None
    local = 0.0
    if fabric.local is not None and max(fabric.region_sizes) > 1:
        local = 2 * gloo_message_s(size_bytes, fabric.local)
    regions = len(fabric.region_sizes)
    if regions == 2:
        return local + gloo_message_s(size_bytes, fabric.wan)
    wan = fabric.wan
    return local + gloo_ring_allreduce_s(
        regions, size_bytes, wan.alpha_s, wan.rate_bps, wan.loss_ratio
    )


def tree_allreduce_s(n: int, size_bytes: float, alpha_s: float, rate_bps: float) -> float:
    """Tree all-reduce time: ``2 log2(n) a + 2 S/B``; 0 for one rank."""
    if n <= 1:
        return 0.0
    return 2 * math.log2(n) * alpha_s + 2 * size_bytes * 8 / rate_bps


def two_level_allreduce_s(fabric: Fabric, size_bytes: float) -> float | None:
    """Region-local reduce-scatter, cross-region all-reduce, region-local all-gather.

    None when the nodes sit in a single region (the ring model applies).
    """
    if fabric.wan is None or fabric.wan_link_bps is None or len(fabric.region_sizes) < 2:
        return None
    regions = len(fabric.region_sizes)
    local_ranks = max(fabric.region_sizes)
    shard_ranks = min(fabric.region_sizes)
    local = 0.0
    if fabric.local is not None and local_ranks > 1:
        # Reduce-scatter then all-gather: each is half a ring all-reduce.
        local = ring_allreduce_s(
            local_ranks, size_bytes, fabric.local.alpha_s, fabric.local.rate_bps
        )
    shard_rate = min(fabric.wan_link_bps / shard_ranks, fabric.wan.rate_bps)
    cross = ring_allreduce_s(regions, size_bytes / shard_ranks, fabric.wan.alpha_s, shard_rate)
    return local + cross


def best_link(links: Sequence[LinkFigures], a: str, b: str) -> LinkFigures:
    """The figures for the pair (highest link rate if several). ValidationError if none."""
    wanted = frozenset((a, b))
    found = [link for link in links if link.pair == wanted]
    if not found:
        raise ValidationError(f"no link figures for the pair {a} <-> {b}")
    return max(found, key=lambda link: link.link_mbps)


def _hop(link: LinkFigures, flows: int, mss_bytes: int) -> Hop:
    rate = min(link.link_mbps * 1e6, flows * flow_ceiling_bps(link, mss_bytes))
    return Hop(alpha_s=link.rtt_ms / 2000, rate_bps=rate, loss_ratio=link.loss_ratio)


def _worst(hops: Sequence[Hop]) -> Hop:
    return Hop(
        max(h.alpha_s for h in hops),
        min(h.rate_bps for h in hops),
        max(h.loss_ratio for h in hops),
    )


def fabric_from_links(
    nodes: Sequence[NodeInfo], links: Sequence[LinkFigures], flows: int, mss_bytes: int = 1448
) -> Fabric:
    """Summarise the links among ``nodes`` into the hops each algorithm waits on.

    The ring visits the nodes region by region (the order NCCL and Gloo get when
    ranks are numbered that way). ``flows`` is the number of TCP flows per
    connection. Raises ValidationError naming a pair without figures.
    """
    if len(nodes) < 2:
        raise ValidationError("an all-reduce across nodes needs at least two nodes")
    order = sorted(nodes, key=lambda n: [x.region for x in nodes].index(n.region))
    pairs = {
        (a.name, b.name): _hop(best_link(links, a.name, b.name), flows, mss_bytes)
        for i, a in enumerate(order)
        for b in order[i + 1 :]
    }

    def hop(a: str, b: str) -> Hop:
        return pairs.get((a, b)) or pairs[(b, a)]

    ring = _worst([hop(order[i].name, order[(i + 1) % len(order)].name) for i in range(len(order))])
    tree = _worst(list(pairs.values()))
    regions: dict[str, list[str]] = {}
    for node in order:
        regions.setdefault(node.region, []).append(node.name)
    local_hops = [
        hop(a, b) for names in regions.values() for i, a in enumerate(names) for b in names[i + 1 :]
    ]
    wan_pairs = [(a, b) for (a, b) in pairs if _region(order, a) != _region(order, b)]
    wan = _worst([hop(a, b) for a, b in wan_pairs]) if wan_pairs else None
    wan_link = (
        min(best_link(links, a, b).link_mbps * 1e6 for a, b in wan_pairs) if wan_pairs else None
    )
    return Fabric(
        n=len(order),
        ring=ring,
        tree=tree,
        region_sizes=tuple(len(v) for v in regions.values()),
        local=_worst(local_hops) if local_hops else None,
        wan=wan,
        wan_link_bps=wan_link,
    )


def _region(nodes: Sequence[NodeInfo], name: str) -> str:
    return next(n.region for n in nodes if n.name == name)


def predict(fabric: Fabric, size_bytes: int) -> dict[str, float]:
    """Predicted all-reduce time (s) per algorithm: ring, tree, and two-level if it applies."""
    times = {
        "ring": ring_allreduce_s(fabric.n, size_bytes, fabric.ring.alpha_s, fabric.ring.rate_bps),
        "tree": tree_allreduce_s(fabric.n, size_bytes, fabric.tree.alpha_s, fabric.tree.rate_bps),
    }
    two_level = two_level_allreduce_s(fabric, size_bytes)
    if two_level is not None:
        times["two-level"] = two_level
    return times


def predict_table(fabric: Fabric, sizes_bytes: Sequence[int]) -> tuple[Prediction, ...]:
    """``predict`` for every size, as rows."""
    return tuple(
        Prediction(algorithm, size, time_s)
        for size in sizes_bytes
        for algorithm, time_s in predict(fabric, size).items()
    )
