"""Settings pieces shared by several kinds of configuration file."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from netopt.config.loader import Invalid, bounded
from netopt.names import DATASET_NAME_RULE, NODE_NAME_RULE, is_dataset_name, is_node_name

__all__ = [
    "ListenAddress",
    "check_dataset_name",
    "check_name",
]


def check_name(key: str, value: str, what: str = "name") -> None:
    """Raise Invalid unless ``value`` is a node/region name."""
    if not is_node_name(value):
        raise Invalid(key, f"{what} {value!r} is not allowed", NODE_NAME_RULE)


def check_dataset_name(key: str, value: str) -> None:
    """Raise Invalid unless ``value`` is a dataset name (never a path)."""
    if not is_dataset_name(value):
        raise Invalid(key, f"dataset name {value!r} is not allowed", DATASET_NAME_RULE)


@dataclass(frozen=True)
class ListenAddress:
    """Where a service listens. Defaults to loopback: nothing is exposed unless asked."""

    host: str = "127.0.0.1"
    port: int = bounded(0, ge=0, le=65535)

    def __post_init__(self) -> None:
        if self.host == "localhost":
            return
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            raise Invalid(
                "host", f"{self.host!r} is not an IP address", "an IPv4 or IPv6 address"
            ) from None

    @property
    def url_host(self) -> str:
        """The host as it appears in a URL (IPv6 in brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host
