"""Build a links file (``kind: links``, what ``netopt nccl-env --links`` reads) from
measurements: node NICs, per-pair RTT/loss from the link matrix, bandwidth tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from netopt.wire.schema import Nic

__all__ = ["PairFigures", "links_document"]


@dataclass(frozen=True)
class PairFigures:
    """What was measured between two nodes."""

    a: str
    b: str
    rtt_ms: float
    loss_ratio: float
    single_stream_mbps: float
    link_mbps: float
    congestion_control: str = "bbr"
    outages_s: tuple[float, ...] = ()


def links_document(
    regions: Mapping[str, str],
    nics: Mapping[str, Sequence[Nic]],
    pairs: Sequence[PairFigures],
    measured_at: str,
) -> dict[str, Any]:
    """The links file as a YAML-ready mapping (pure).

    ``regions`` maps node -> region; ``nics`` node -> its NICs. Link speeds must be
    positive; a single stream is capped at the link figure (the file requires it).
    """
    nodes = {
        node: {
            "region": region,
            "nics": [
                {"name": nic.name, "addresses": list(nic.addresses)}
                | ({"speed_mbps": nic.speed_mbps} if nic.speed_mbps else {})
                for nic in nics.get(node, ())
            ],
        }
        for node, region in regions.items()
    }
    links = [
        {
            "between": [p.a, p.b],
            "rtt_ms": round(p.rtt_ms, 4),
            "loss_ratio": round(min(p.loss_ratio, 0.99), 6),
            "single_stream_mbps": round(min(p.single_stream_mbps, p.link_mbps), 3),
            "link_mbps": round(p.link_mbps, 3),
            "congestion_control": p.congestion_control,
            "outages_s": [round(o, 3) for o in p.outages_s],
        }
        for p in pairs
    ]
    return {"kind": "links", "measured_at": measured_at, "nodes": nodes, "links": links}
