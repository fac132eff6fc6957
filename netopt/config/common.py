"""Settings pieces shared by several kinds of configuration file."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from netopt.config.loader import Invalid, bounded
from netopt.names import DATASET_NAME_RULE, NODE_NAME_RULE, is_dataset_name, is_node_name

__all__ = [
    "ListenAddress",
    "TlsSettings",
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


@dataclass(frozen=True)
class TlsSettings:
    """A service's ``tls:`` section: its certificate and key (issued by ``netopt tls issue``),
    the cluster CA its peers are verified against, and whether clients must present a
    certificate (mutual TLS). Without cert and key the service listens in plaintext, which
    on a non-loopback address needs ``allow_plaintext: true``."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    require_client_cert: bool = False
    allow_plaintext: bool = False
    """Listen without TLS on a non-loopback address: only on a network you trust."""
    insecure: bool = False
    """Let this service's own clients (the agent's reporter, region sharing; ``sync
    --config``) send the token over plain HTTP to non-loopback peers, warned once per
    host: the clients' ``--insecure``, apart from the listener's ``allow_plaintext``."""

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise Invalid("cert", "is given without key (or key without cert)", "both or neither")
        if self.require_client_cert and (self.ca is None or self.cert is None):
            raise Invalid("require_client_cert", "is set without ca, cert and key", "all three set")

    @property
    def serving(self) -> bool:
        """True when the service listens over TLS."""
        return self.cert is not None
