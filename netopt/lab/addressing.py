"""The lab's address and name plan: a pure function of a topology and a lab prefix.

Layout (for region number ``i``, counted from 0 in file order, and its ``j``-th node):

- node namespace ``<prefix>-<node>``, router namespace ``<prefix>_<region>``
  (``_`` never occurs in node or region names, so the two never collide, and the
  prefix keeps two labs apart);
- region ``i`` owns the /24 ``subnet + (i + 1) * 256``; its router is ``.1``,
  node ``j`` is ``.(10 + j)``;
- in a node namespace the lab interface is ``eth0``; in a router namespace the
  port towards node ``j`` is ``n<j>`` (a bridge port, or a TUN device when the
  region's links are emulated in user space) and the device towards link ``k``
  is ``x<k>``.

Nothing here touches the system; :mod:`netopt.lab.lab` executes the plan.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from netopt.config.lab import LabTopology, LinkShape, LinkSpec
from netopt.errors import ConfigError, ValidationError

__all__ = [
    "FIRST_NODE_HOST",
    "MAX_NODES_PER_REGION",
    "PREFIX_RE",
    "LabPlan",
    "LinkPlan",
    "NodeAddresses",
    "RegionPlan",
    "ground_truth_rtt_ms",
    "hosts_file_text",
    "needs_emulation",
    "plan_lab",
]

PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{1,11}$")
"""Lab prefixes: short, so namespace names stay readable."""

FIRST_NODE_HOST = 10
MAX_NODES_PER_REGION = 254 - FIRST_NODE_HOST
NODE_IFNAME = "eth0"
BRIDGE_IFNAME = "br0"
PING_PACKET_BYTES = 84
"""An IPv4 echo request of ping's default 56 data bytes."""


def needs_emulation(shape: LinkShape) -> bool:
    """Whether a shape needs delay, jitter or loss (more than a rate limiter)."""
    return shape.delay_ms > 0 or shape.jitter_ms > 0 or shape.loss_ratio > 0


@dataclass(frozen=True)
class NodeAddresses:
    """One node: its namespace, interface and address."""

    name: str
    region: str
    index: int
    netns: str
    address: str
    router_port: str
    ifname: str = NODE_IFNAME


@dataclass(frozen=True)
class RegionPlan:
    """One region: its router namespace, /24 and intra-region shape."""

    name: str
    index: int
    netns: str
    subnet: str
    router_address: str
    intra: LinkShape
    nodes: tuple[str, ...]

    @property
    def emulated(self) -> bool:
        """True when node-to-router hops need the user-space emulator (delay/loss)."""
        return needs_emulation(self.intra)


@dataclass(frozen=True)
class LinkPlan:
    """One inter-region link: its two routers' devices."""

    index: int
    a: str
    b: str
    spec: LinkSpec
    ifname: str

    @property
    def key(self) -> str:
        """``"a-b"`` as written in the topology file."""
        return f"{self.a}-{self.b}"


@dataclass(frozen=True)
class LabPlan:
    """Every name and address of one lab."""

    prefix: str
    topology: LabTopology
    nodes: tuple[NodeAddresses, ...]
    regions: tuple[RegionPlan, ...]
    links: tuple[LinkPlan, ...]

    def node(self, name: str) -> NodeAddresses:
        """The plan of node ``name``; ValidationError naming the known nodes if unknown."""
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes)
        raise ValidationError(f"no node {name!r} in lab {self.prefix} (nodes: {known})")

    def region(self, name: str) -> RegionPlan:
        """The plan of region ``name``; ValidationError if unknown."""
        for region in self.regions:
            if region.name == name:
                return region
        known = ", ".join(r.name for r in self.regions)
        raise ValidationError(f"no region {name!r} in lab {self.prefix} (regions: {known})")

    def link(self, region_a: str, region_b: str) -> LinkPlan:
        """The link joining two regions (either order); ValidationError if none does."""
        wanted = {region_a, region_b}
        for link in self.links:
            if {link.a, link.b} == wanted:
                return link
        known = ", ".join(link.key for link in self.links) or "none"
        raise ValidationError(
            f"no link between {region_a!r} and {region_b!r} in lab {self.prefix} (links: {known})"
        )

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace of the lab: routers first, then nodes."""
        return tuple(r.netns for r in self.regions) + tuple(n.netns for n in self.nodes)


def plan_lab(topology: LabTopology, prefix: str) -> LabPlan:
    """Give every region, node and link of ``topology`` its names and addresses.

    Raises ValidationError for a bad prefix and ConfigError when the topology
    does not fit its subnet (too many regions, or too many nodes in a region).
    """
    if not PREFIX_RE.match(prefix):
        raise ValidationError(
            f"lab prefix {prefix!r} is not allowed (a letter then 1-11 lowercase letters/digits)"
        )
    net = ipaddress.IPv4Network(topology.subnet)
    max_regions = net.num_addresses // 256 - 1
    if len(topology.regions) > max_regions:
        raise ConfigError(
            f"{len(topology.regions)} regions do not fit in {topology.subnet}",
            key_path="regions",
            expected=f"at most {max_regions} regions (one /24 each)",
        )
    regions: list[RegionPlan] = []
    nodes: list[NodeAddresses] = []
    for i, (name, spec) in enumerate(topology.regions.items()):
        if len(spec.nodes) > MAX_NODES_PER_REGION:
            raise ConfigError(
                f"region {name!r} has {len(spec.nodes)} nodes",
                key_path=f"regions.{name}.nodes",
                expected=f"at most {MAX_NODES_PER_REGION} nodes per region",
            )
        base = net.network_address + (i + 1) * 256
        regions.append(
            RegionPlan(
                name=name,
                index=i,
                netns=f"{prefix}_{name}",
                subnet=f"{base}/24",
                router_address=str(base + 1),
                intra=topology.intra_shape(name),
                nodes=spec.nodes,
            )
        )
        for j, node in enumerate(spec.nodes):
            nodes.append(
                NodeAddresses(
                    name=node,
                    region=name,
                    index=j,
                    netns=f"{prefix}-{node}",
                    address=str(base + FIRST_NODE_HOST + j),
                    router_port=f"n{j}",
                )
            )
    links = tuple(
        LinkPlan(index=k, a=link.between[0], b=link.between[1], spec=link, ifname=f"x{k}")
        for k, link in enumerate(topology.links)
    )
    return LabPlan(prefix, topology, tuple(nodes), tuple(regions), links)


def _hop_ms(shape: LinkShape, fraction: float, packet_bytes: int) -> float:
    return shape.delay_ms * fraction + packet_bytes * 8 / shape.rate_bps * 1000


def ground_truth_rtt_ms(
    plan: LabPlan, node_a: str, node_b: str, *, packet_bytes: int = PING_PACKET_BYTES
) -> float:
    """The round-trip time a ping of ``packet_bytes`` should see between two nodes, in ms.

    Two times the one-way delays on the path plus the serialization time of the
    packet on every emulated hop. An intra-region shape is node to node, so each
    node-router hop carries half of it. Raises ValidationError for an unknown node
    or for two regions that no link joins.
    """
    a, b = plan.node(node_a), plan.node(node_b)
    if a.name == b.name:
        return 0.0
    region_a, region_b = plan.region(a.region), plan.region(b.region)
    one_way_ms = 0.0
    for region in (region_a, region_b):
        if region.emulated:
            one_way_ms += _hop_ms(region.intra, 0.5, packet_bytes)
    if a.region != b.region:
        link = plan.link(a.region, b.region)
        one_way_ms += _hop_ms(link.spec, 1.0, packet_bytes)
    return 2 * one_way_ms


def hosts_file_text(plan: LabPlan) -> str:
    """An /etc/hosts for the lab's nodes: every node name resolves to its address."""
    lines = [
        f"# netopt lab {plan.prefix} ({plan.topology.name})",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
    ]
    lines += [f"{node.address}\t{node.name}" for node in plan.nodes]
    return "\n".join(lines) + "\n"
