"""A links file (:class:`~netopt.config.links.LinksSettings`) as the tuner's figures.

The links file's reader lives in ``netopt.config`` and knows nothing of the
tuner; this module turns its validated specs into :class:`NodeInfo` and
:class:`LinkFigures` (pure).
"""

from __future__ import annotations

from netopt.config.links import LinkPairSpec, LinksSettings, NicSpec
from netopt.nccl.model import LinkFigures, Nic, NodeInfo

__all__ = ["link_figures", "nic_from_spec", "node_infos", "pair_figures"]


def nic_from_spec(spec: NicSpec) -> Nic:
    """A links file's NIC (``config.links.NicSpec``, checked by the loader) as the one
    NIC type (``wire.schema.Nic``); a file gives no MTU, so it is the default."""
    return Nic(spec.name, spec.addresses, spec.speed_mbps, rdma=spec.rdma)


def node_infos(links: LinksSettings) -> tuple[NodeInfo, ...]:
    """Every node as the tuner's NodeInfo, in file order."""
    return tuple(
        NodeInfo(
            name=name,
            region=spec.region,
            nics=tuple(nic_from_spec(n) for n in spec.nics),
        )
        for name, spec in links.nodes.items()
    )


def pair_figures(link: LinkPairSpec) -> LinkFigures:
    """One measured pair as the tuner's LinkFigures."""
    return LinkFigures(
        a=link.between[0],
        b=link.between[1],
        rtt_ms=link.rtt_ms,
        loss_ratio=link.loss_ratio,
        single_stream_mbps=link.single_stream_mbps,
        link_mbps=link.link_mbps,
        outages_s=link.outages_s,
        interfaces=(link.interfaces[0], link.interfaces[1]) if link.interfaces else None,
        rdma=link.rdma,
        congestion_control=link.congestion_control,
    )


def link_figures(links: LinksSettings) -> tuple[LinkFigures, ...]:
    """Every measured pair as the tuner's LinkFigures, in file order."""
    return tuple(pair_figures(link) for link in links.links)
