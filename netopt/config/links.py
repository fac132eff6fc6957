"""Links files (``netopt nccl-env --links FILE``): nodes, their NICs, measured pairs.

Example: ``configs/links-example.yaml``. Each node names its region and NICs (as
``ip addr`` shows them); each link gives what was measured between two nodes:
RTT, loss, single-stream and link bandwidth, and the outages seen.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

from netopt.config.common import check_name
from netopt.config.loader import Invalid, bounded
from netopt.names import is_ifname

__all__ = ["LinkPairSpec", "LinksSettings", "NicSpec", "NodeLinksSpec"]


@dataclass(frozen=True)
class NicSpec:
    """A NIC: ``name``, ``addresses`` in CIDR form, optional ``speed_mbps`` and ``rdma``."""

    name: str
    addresses: tuple[str, ...] = ()
    speed_mbps: float | None = bounded(None, gt=0)
    rdma: bool = False

    def __post_init__(self) -> None:
        if not is_ifname(self.name):
            raise Invalid("name", f"{self.name!r} is not an interface name", "1-15 characters")
        for i, text in enumerate(self.addresses):
            try:
                ipaddress.ip_interface(text)
            except ValueError:
                raise Invalid(
                    f"addresses[{i}]", f"{text!r} is not an address", "CIDR such as 10.0.0.5/24"
                ) from None


@dataclass(frozen=True)
class NodeLinksSpec:
    """A node of the links file: its region and NICs."""

    region: str
    nics: tuple[NicSpec, ...] = ()

    def __post_init__(self) -> None:
        check_name("region", self.region, "region name")
        seen: set[str] = set()
        for i, nic in enumerate(self.nics):
            if nic.name in seen:
                raise Invalid(f"nics[{i}].name", f"{nic.name!r} is listed twice", "unique names")
            seen.add(nic.name)


@dataclass(frozen=True)
class LinkPairSpec:
    """What was measured between two nodes (both directions alike)."""

    between: tuple[str, ...]
    rtt_ms: float = bounded(ge=0, le=10_000)
    single_stream_mbps: float = bounded(gt=0, le=1_000_000)
    link_mbps: float = bounded(gt=0, le=1_000_000)
    loss_ratio: float = bounded(0.0, ge=0, lt=1)
    outages_s: tuple[float, ...] = ()
    interfaces: tuple[str, ...] | None = None
    rdma: bool = False
    congestion_control: str = "cubic"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9_]{1,16}", self.congestion_control):
            raise Invalid(
                "congestion_control", f"{self.congestion_control!r}", "a name such as cubic or bbr"
            )
        if len(self.between) != 2 or self.between[0] == self.between[1]:
            raise Invalid("between", "must name two different nodes", "[node-a, node-b]")
        if self.single_stream_mbps > self.link_mbps:
            raise Invalid(
                "single_stream_mbps",
                f"{self.single_stream_mbps:g} exceeds link_mbps {self.link_mbps:g}",
                "single_stream_mbps <= link_mbps",
            )
        for i, outage in enumerate(self.outages_s):
            if outage < 0:
                raise Invalid(f"outages_s[{i}]", f"is {outage:g}", "a duration >= 0 s")
        if self.interfaces is not None and len(self.interfaces) != 2:
            raise Invalid("interfaces", "must name two NICs", "[nic-at-a, nic-at-b]")


@dataclass(frozen=True)
class LinksSettings:
    """A whole links file: ``nodes`` by name, ``links`` between them."""

    nodes: Mapping[str, NodeLinksSpec]
    links: tuple[LinkPairSpec, ...] = ()
    measured_at: str | None = None

    def __post_init__(self) -> None:
        if not self.nodes:
            raise Invalid("nodes", "is empty", "at least one node")
        for name in self.nodes:
            check_name(f"nodes.{name}", name, "node name")
        seen: set[tuple[frozenset[str], tuple[str, ...] | None]] = set()
        for i, link in enumerate(self.links):
            for j, node in enumerate(link.between):
                if node not in self.nodes:
                    raise Invalid(
                        f"links[{i}].between[{j}]",
                        f"names unknown node {node!r}",
                        "one of " + ", ".join(self.nodes),
                    )
            if link.interfaces is not None:
                for j, (node, nic) in enumerate(zip(link.between, link.interfaces, strict=True)):
                    if all(n.name != nic for n in self.nodes[node].nics):
                        raise Invalid(
                            f"links[{i}].interfaces[{j}]",
                            f"{node} has no NIC {nic!r}",
                            "a NIC listed under the node",
                        )
            key = (frozenset(link.between), tuple(sorted(link.interfaces or ())) or None)
            if key in seen:
                raise Invalid(f"links[{i}]", "repeats a pair", "one entry per pair and NIC pair")
            seen.add(key)
