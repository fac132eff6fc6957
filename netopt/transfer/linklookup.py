"""The measured link from this node to a server's node, found through the coordinator.

A sync knows the server only by its address. `node_for_address` (pure) matches an
address to a registered node (its advertised host or an address of one of its NICs);
`measured_link` is the I/O edge: it asks the coordinator for its nodes and links
(`netopt.transfer.coordinator_link`, as ``netopt plan --coordinator`` does), names
this node (given, else the node owning the local address this host reaches the
server from) and returns the pair's `LinkProfile`, or why there is none.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from netopt.errors import NetoptError
from netopt.transfer.coordinator_link import link_profile_from_links
from netopt.transfer.planner import CongestionControl, LinkProfile

if TYPE_CHECKING:
    from netopt.wire.answers import NodeView

__all__ = ["CoordinatorRef", "local_address_to", "measured_link", "node_for_address"]

LOOKUP_TIMEOUT_S = 3.0
"""The most a sync waits for the coordinator's figures before planning without them."""


@dataclass(frozen=True)
class CoordinatorRef:
    """Where the coordinator is and who this node is (``node`` None: found by address)."""

    url: str
    token: str
    node: str | None = None
    window_s: float = 300.0


def node_for_address(nodes: Sequence[NodeView], addresses: Sequence[str]) -> str | None:
    """The registered node one of ``addresses`` belongs to; None when none (or several) match."""
    wanted = set()
    for address in addresses:
        try:
            wanted.add(str(ipaddress.ip_address(address)))
        except ValueError:
            continue
    matches = {n.node for n in nodes if wanted.intersection(n.addresses())}
    return matches.pop() if len(matches) == 1 else None


def local_address_to(host: str, port: int) -> str | None:
    """The local address this host reaches ``host`` from (a UDP connect: nothing is sent)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((host, port))
            return str(sock.getsockname()[0])
    except OSError:
        return None


async def _server_addresses(host: str) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({str(info[4][0]) for info in infos})


async def measured_link(
    ref: CoordinatorRef, host: str, port: int, congestion_control: CongestionControl = "bbr"
) -> tuple[LinkProfile, str] | str:
    """The coordinator's measured link from this node to the node serving at ``host``:
    the profile and a note of where it came from, or why there is none (a string)."""
    from netopt.wire.client import CoordinatorClient  # aiohttp: loaded by now

    try:
        async with CoordinatorClient(ref.url, ref.token, timeout_s=LOOKUP_TIMEOUT_S) as client:
            nodes = (await client.nodes()).nodes
            server = node_for_address(nodes, await _server_addresses(host))
            if server is None:
                return f"no node registered with the coordinator has the address {host}"
            local = local_address_to(host, port)
            this = ref.node or node_for_address(nodes, [local] if local else [])
            if this is None:
                return f"this node is not registered with the coordinator (address {local})"
            links = (await client.links(ref.window_s)).links
        link, notes = link_profile_from_links(links, this, server, congestion_control)
    except (NetoptError, TimeoutError) as exc:
        return f"coordinator {ref.url}: {exc}"
    return link, notes[0]
