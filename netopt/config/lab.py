"""Lab topology files: regions of nodes joined by emulated links (``configs/lab/``)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from netopt.config.common import check_name
from netopt.config.loader import Invalid, bounded

__all__ = ["LAB_NETWORK", "LabTopology", "LinkShape", "LinkSpec", "RegionSpec"]

LAB_NETWORK = ipaddress.IPv4Network("198.18.0.0/15")
"""The benchmarking range (RFC 2544): lab addresses never exist outside the lab."""

MAX_RATE_MBPS = 10_000.0
MAX_DELAY_MS = 2_000.0


@dataclass(frozen=True)
class LinkShape:
    """What a link does to packets, per direction."""

    rate_mbps: float = bounded(1000.0, gt=0, le=MAX_RATE_MBPS)
    delay_ms: float = bounded(0.0, ge=0, le=MAX_DELAY_MS)
    jitter_ms: float = bounded(0.0, ge=0, le=MAX_DELAY_MS)
    loss_ratio: float = bounded(0.0, ge=0, lt=1)
    queue_ms: float | None = bounded(None, gt=0, le=10_000)

    def __post_init__(self) -> None:
        if self.jitter_ms > self.delay_ms:
            raise Invalid("jitter_ms", "is larger than delay_ms", "jitter_ms <= delay_ms")

    @property
    def rate_bps(self) -> float:
        return self.rate_mbps * 1e6

    @property
    def queue_bytes(self) -> int:
        """Tail-drop queue size: ``queue_ms`` of the rate, or one BDP (min 64 KiB)."""
        queue_ms = self.queue_ms if self.queue_ms is not None else max(2 * self.delay_ms, 20.0)
        return max(64 * 1024, int(self.rate_bps / 8 * queue_ms / 1000))


@dataclass(frozen=True)
class LinkSpec(LinkShape):
    """An inter-region link: ``between: [hk, us]`` plus its shape (the same both ways)."""

    between: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.between) != 2:
            raise Invalid("between", "must name two regions", "a list of two region names")
        if self.between[0] == self.between[1]:
            raise Invalid("between", "names one region twice", "two different regions")

    @property
    def shape(self) -> LinkShape:
        return LinkShape(
            rate_mbps=self.rate_mbps,
            delay_ms=self.delay_ms,
            jitter_ms=self.jitter_ms,
            loss_ratio=self.loss_ratio,
            queue_ms=self.queue_ms,
        )


@dataclass(frozen=True)
class RegionSpec:
    """A region: its nodes and, optionally, its own intra-region link shape."""

    nodes: tuple[str, ...]
    intra: LinkShape | None = None

    def __post_init__(self) -> None:
        if not self.nodes:
            raise Invalid("nodes", "is empty", "at least one node name")
        for i, node in enumerate(self.nodes):
            check_name(f"nodes[{i}]", node, "node name")


@dataclass(frozen=True)
class LabTopology:
    """A whole lab: regions, the links between them and the intra-region default."""

    regions: Mapping[str, RegionSpec]
    links: tuple[LinkSpec, ...] = ()
    intra_region: LinkShape = field(default_factory=LinkShape)
    subnet: str = "198.18.0.0/16"
    seed: int = 1
    name: str = "lab"
    emulator: Literal["auto", "relay", "netem"] = "auto"
    """How links get delay and loss: ``netem`` (kernel), ``relay`` (netopt's TUN
    relay) or ``auto`` (netem where the kernel has it, the relay otherwise)."""

    def __post_init__(self) -> None:
        check_name("name", self.name, "lab name")
        if not self.regions:
            raise Invalid("regions", "is empty", "at least one region")
        seen: dict[str, str] = {}
        for region, spec in self.regions.items():
            check_name(f"regions.{region}", region, "region name")
            for i, node in enumerate(spec.nodes):
                if node in seen:
                    raise Invalid(
                        f"regions.{region}.nodes[{i}]",
                        f"node {node!r} is already in region {seen[node]!r}",
                        "each node name once",
                    )
                if node in self.regions:
                    raise Invalid(
                        f"regions.{region}.nodes[{i}]",
                        f"node {node!r} has the name of a region",
                        "node names distinct from region names",
                    )
                seen[node] = region
        pairs: set[frozenset[str]] = set()
        for i, link in enumerate(self.links):
            for j, region in enumerate(link.between):
                if region not in self.regions:
                    raise Invalid(
                        f"links[{i}].between[{j}]",
                        f"names unknown region {region!r}",
                        "one of " + ", ".join(self.regions),
                    )
            pair = frozenset(link.between)
            if pair in pairs:
                raise Invalid(f"links[{i}].between", "repeats a region pair", "one link per pair")
            pairs.add(pair)
        self._check_subnet()

    def _check_subnet(self) -> None:
        try:
            net = ipaddress.ip_network(self.subnet)
        except ValueError:
            raise Invalid("subnet", f"{self.subnet!r} is not a network", "CIDR notation") from None
        if not isinstance(net, ipaddress.IPv4Network) or not net.subnet_of(LAB_NETWORK):
            raise Invalid(
                "subnet", f"{self.subnet} is outside the lab range", f"inside {LAB_NETWORK}"
            )
        if net.prefixlen > 20:
            raise Invalid("subnet", f"{self.subnet} is too small", "a prefix of /20 or shorter")

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node, region by region in file order."""
        return tuple(n for spec in self.regions.values() for n in spec.nodes)

    def region_of(self, node: str) -> str:
        """The region that holds ``node``; KeyError if none does."""
        for region, spec in self.regions.items():
            if node in spec.nodes:
                return region
        raise KeyError(node)

    def link_between(self, a: str, b: str) -> LinkSpec | None:
        """The link joining regions ``a`` and ``b``, either way round."""
        wanted = frozenset((a, b))
        return next((link for link in self.links if frozenset(link.between) == wanted), None)

    def intra_shape(self, region: str) -> LinkShape:
        """The link shape between two nodes of ``region``."""
        return self.regions[region].intra or self.intra_region
