"""Byte and drop counters of the lab's inter-region links, per direction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from netopt.errors import ValidationError

__all__ = ["DirectionCounters", "LabCounters", "LinkCounters"]


@dataclass(frozen=True)
class DirectionCounters:
    """One direction of a link: what it delivered and what it dropped, by cause.

    ``packets``/``bytes`` count IP packets handed to the far side (IP header
    included); packets still in flight when the counters were read are not in yet.
    """

    packets: int = 0
    bytes: int = 0
    drops_loss: int = 0
    drops_queue: int = 0
    drops_link_down: int = 0

    @property
    def drops(self) -> int:
        """All drops, whatever the cause."""
        return self.drops_loss + self.drops_queue + self.drops_link_down

    @property
    def offered_packets(self) -> int:
        """Packets that entered the link (delivered or dropped; in-flight ones excluded)."""
        return self.packets + self.drops

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DirectionCounters:
        """Build from a relay's ``stats`` reply (unknown keys are ignored)."""
        return cls(
            packets=int(data.get("packets", 0)),
            bytes=int(data.get("bytes", 0)),
            drops_loss=int(data.get("drops_loss", 0)),
            drops_queue=int(data.get("drops_queue", 0)),
            drops_link_down=int(data.get("drops_link_down", 0)),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: packets, bytes and drops by cause."""
        return {
            "packets": self.packets,
            "bytes": self.bytes,
            "drops": {
                "loss": self.drops_loss,
                "queue": self.drops_queue,
                "link_down": self.drops_link_down,
            },
        }


@dataclass(frozen=True)
class LinkCounters:
    """Both directions of the link between regions ``a`` and ``b``."""

    a: str
    b: str
    up: bool
    a_to_b: DirectionCounters
    b_to_a: DirectionCounters

    def direction(self, src_region: str, dst_region: str) -> DirectionCounters:
        """Counters of the ``src_region -> dst_region`` direction; ValidationError if neither."""
        if (src_region, dst_region) == (self.a, self.b):
            return self.a_to_b
        if (src_region, dst_region) == (self.b, self.a):
            return self.b_to_a
        raise ValidationError(f"link {self.a}-{self.b} has no direction {src_region}->{dst_region}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form keyed by direction (``"hk->us"``)."""
        return {
            "link": f"{self.a}-{self.b}",
            "up": self.up,
            f"{self.a}->{self.b}": self.a_to_b.to_dict(),
            f"{self.b}->{self.a}": self.b_to_a.to_dict(),
        }


@dataclass(frozen=True)
class LabCounters:
    """Counters of every inter-region link of a lab, read at one moment."""

    links: tuple[LinkCounters, ...]

    def link(self, region_a: str, region_b: str) -> LinkCounters:
        """The link between two regions (either order); ValidationError if none."""
        for link in self.links:
            if {link.a, link.b} == {region_a, region_b}:
                return link
        raise ValidationError(f"no link between {region_a!r} and {region_b!r}")

    def between(self, src_region: str, dst_region: str) -> DirectionCounters:
        """Counters of traffic from ``src_region`` to ``dst_region``."""
        return self.link(src_region, dst_region).direction(src_region, dst_region)

    def total_bytes(self) -> int:
        """Bytes delivered across all borders, both directions."""
        return sum(link.a_to_b.bytes + link.b_to_a.bytes for link in self.links)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: a list of links."""
        return {"links": [link.to_dict() for link in self.links]}
