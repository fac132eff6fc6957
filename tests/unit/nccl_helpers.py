"""Builders for the NCCL tuner tests: nodes, NICs and link figures in one line each."""

from __future__ import annotations

from collections.abc import Sequence

from netopt.nccl.model import LinkFigures, Nic, NodeInfo

V_OLD = (2, 4, 8)
V_2_5 = (2, 5, 6)
V_2_16 = (2, 16, 5)
V_2_21 = (2, 21, 5)
V_2_24 = (2, 24, 3)
V_2_26 = (2, 26, 2)
ALL_VERSIONS = (V_OLD, V_2_5, V_2_16, (2, 17, 1), (2, 19, 3), V_2_21, V_2_24, V_2_26)
TORCH_NEW = (2, 4, 0)
TORCH_OLD = (2, 1, 2)


def nic(name: str, *addresses: str, speed_mbps: float | None = None, rdma: bool = False) -> Nic:
    return Nic(name, tuple(addresses), speed_mbps, rdma=rdma)


def node(name: str, region: str, *nics: Nic) -> NodeInfo:
    return NodeInfo(name, region, tuple(nics))


def link(
    a: str,
    b: str,
    *,
    rtt_ms: float = 0.2,
    loss_ratio: float = 0.0,
    single_stream_mbps: float = 9000.0,
    link_mbps: float = 10000.0,
    outages_s: Sequence[float] = (),
    interfaces: tuple[str, str] | None = None,
    rdma: bool = False,
    congestion_control: str = "cubic",
) -> LinkFigures:
    return LinkFigures(
        a,
        b,
        rtt_ms,
        loss_ratio,
        single_stream_mbps,
        link_mbps,
        tuple(outages_s),
        interfaces,
        rdma,
        congestion_control,
    )


def wan(a: str, b: str, **kwargs: object) -> LinkFigures:
    """A cross-border pair: 100 Mbit/s, 80 ms, 0.5% loss, 30 Mbit/s single stream."""
    figures: dict[str, object] = {
        "rtt_ms": 80.0,
        "loss_ratio": 0.005,
        "single_stream_mbps": 30.0,
        "link_mbps": 100.0,
    }
    figures.update(kwargs)
    return link(a, b, **figures)  # type: ignore[arg-type]


def two_region() -> tuple[list[NodeInfo], list[LinkFigures]]:
    """hk-1, hk-2 (eth0) and us-1, us-2 (eth0), LAN inside regions, a WAN between."""
    nodes = [
        node("hk-1", "hk", nic("lo", "127.0.0.1/8"), nic("eth0", "10.0.0.1/24")),
        node("hk-2", "hk", nic("lo", "127.0.0.1/8"), nic("eth0", "10.0.0.2/24")),
        node("us-1", "us", nic("lo", "127.0.0.1/8"), nic("eth0", "10.1.0.1/24")),
        node("us-2", "us", nic("lo", "127.0.0.1/8"), nic("eth0", "10.1.0.2/24")),
    ]
    links = [
        link("hk-1", "hk-2"),
        link("us-1", "us-2"),
        wan("hk-1", "us-1"),
        wan("hk-1", "us-2"),
        wan("hk-2", "us-1"),
        wan("hk-2", "us-2"),
    ]
    return nodes, links
