"""Choose each node's NIC for NCCL and Gloo: exact names, one address family.

NCCL's own choice (src/misc/socket.cc ncclFindInterfaces) takes every interface
matching a *prefix* list, ``^docker,lo,virbr`` by default, and connects through
whatever route the kernel picks. So ``NCCL_SOCKET_IFNAME=bond0`` also selects
``bond0.2093`` (NVIDIA/nccl#177), and an exclusion such as ``^docker0`` alone still
admits ``lo`` and ``virbr0``. netopt therefore names exactly one NIC per node with
``=`` (exact match, NCCL 2.5.6+), never an exclusion list.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from netopt.errors import ValidationError
from netopt.nccl.domains import EXACT_IFNAME_SINCE
from netopt.nccl.model import LinkFigures, NcclVersion, Nic, NodeInfo

__all__ = ["InterfaceChoice", "choose_interfaces", "is_virtual", "nccl_ifname_value"]

_VIRTUAL_PREFIXES = ("docker", "virbr")


def is_virtual(name: str) -> bool:
    """Loopback, docker* and virbr* NICs never carry NCCL traffic between nodes."""
    return name == "lo" or name.startswith(_VIRTUAL_PREFIXES)


@dataclass(frozen=True)
class InterfaceChoice:
    """The NIC each node uses, the address family, and why."""

    nics: Mapping[str, str]
    family: int
    reasons: Mapping[str, str]
    warnings: tuple[str, ...] = ()

    @property
    def uniform(self) -> bool:
        """Whether every node uses the same NIC name."""
        return len(set(self.nics.values())) == 1


def nccl_ifname_value(name: str, nccl_version: NcclVersion) -> str:
    """``=bond0`` where NCCL matches exact names, else the bare (prefix) name."""
    return f"={name}" if nccl_version >= EXACT_IFNAME_SINCE else name


def choose_interfaces(
    nodes: Sequence[NodeInfo], links: Sequence[LinkFigures], nccl_version: NcclVersion
) -> InterfaceChoice:
    """Pick, per node, the NIC that reaches every peer with the best measured bandwidth.

    All nodes use one address family (IPv4 preferred on a tie). Raises
    ValidationError when a node has no usable NIC, or no family is common to all.
    """
    scores = {node.name: _scores(node, nodes, links) for node in nodes}
    for node in nodes:
        if not scores[node.name]:
            raise ValidationError(
                f"node {node.name} has no NIC that can carry NCCL traffic "
                f"(docker*, lo and virbr* are never used; a NIC needs a non-link-local "
                f"address and measured links to every peer)"
            )
    family = _pick_family(nodes, scores)
    chosen: dict[str, str] = {}
    reasons: dict[str, str] = {}
    warnings: list[str] = []
    for node in nodes:
        options = [
            (score, nic) for nic, score in scores[node.name].items() if family in nic.families()
        ]
        options.sort(key=lambda item: (-item[0], -(item[1].speed_mbps or 0.0), item[1].name))
        score, nic = options[0]
        chosen[node.name] = nic.name
        reasons[node.name] = _reason(node, nic, score, family)
        warnings.extend(_traps(node, nic, family, nccl_version))
    return InterfaceChoice(
        MappingProxyType(chosen), family, MappingProxyType(reasons), tuple(warnings)
    )


def _scores(
    node: NodeInfo, nodes: Sequence[NodeInfo], links: Sequence[LinkFigures]
) -> dict[Nic, float]:
    """Usable NICs of ``node`` -> worst-peer bandwidth (Mbit/s) through that NIC."""
    out: dict[Nic, float] = {}
    peers = [p.name for p in nodes if p.name != node.name]
    for nic in node.nics:
        if is_virtual(nic.name) or not nic.families():
            continue
        worst = math.inf
        for peer in peers:
            best = 0.0
            for link in links:
                if link.pair != frozenset((node.name, peer)):
                    continue
                used = link.nic_at(node.name)
                if used is None or used == nic.name:
                    best = max(best, link.link_mbps)
            worst = min(worst, best)
        if worst > 0:
            out[nic] = min(worst, nic.speed_mbps or math.inf)
    return out


def _pick_family(nodes: Sequence[NodeInfo], scores: Mapping[str, Mapping[Nic, float]]) -> int:
    best: tuple[float, int] | None = None
    for family in (4, 6):
        per_node = [
            max((s for nic, s in scores[n.name].items() if family in nic.families()), default=0)
            for n in nodes
        ]
        if min(per_node) <= 0:
            continue
        candidate = (min(per_node), -family)  # higher bandwidth, then IPv4
        if best is None or candidate > best:
            best = candidate
    if best is None:
        detail = "; ".join(
            f"{n.name}: "
            + ", ".join(
                f"{nic.name} IPv{'/'.join(str(f) for f in sorted(nic.families()))}"
                for nic in scores[n.name]
            )
            for n in nodes
        )
        raise ValidationError(f"no address family is usable on every node ({detail})")
    return -best[1]


def _reason(node: NodeInfo, nic: Nic, score_mbps: float, family: int) -> str:
    skipped = [n.name for n in node.nics if is_virtual(n.name)]
    text = (
        f"{node.name}: {nic.name} reaches every peer over IPv{family} at >= {score_mbps:g} Mbit/s"
    )
    if skipped:
        text += f"; never {', '.join(skipped)}"
    return text + " (exact name: '^docker0' alone would still admit lo)"


def _traps(node: NodeInfo, nic: Nic, family: int, nccl_version: NcclVersion) -> list[str]:
    warnings: list[str] = []
    longer = [n.name for n in node.nics if n.name != nic.name and n.name.startswith(nic.name)]
    if longer and nccl_version < EXACT_IFNAME_SINCE:
        warnings.append(
            f"{node.name}: NCCL {'.'.join(map(str, nccl_version))} matches NCCL_SOCKET_IFNAME "
            f"as a prefix, so {nic.name} also selects {', '.join(longer)}; upgrade to "
            f"{'.'.join(map(str, EXACT_IFNAME_SINCE))}+ for '=' exact names"
        )
    mine = [i for i in nic.interfaces() if i.version == family and not i.is_link_local]
    for other in node.nics:
        if other.name == nic.name or is_virtual(other.name):
            continue
        for theirs in other.interfaces():
            if any(_same_subnet(a, theirs) for a in mine):
                warnings.append(
                    f"{node.name}: {nic.name} and {other.name} share subnet {theirs.network}; "
                    f"NCCL binds only its listening socket, so outgoing connections may leave "
                    f"by {other.name} (ARP flux). Give them separate subnets or policy routes"
                )
                break
    return warnings


def _same_subnet(
    a: ipaddress.IPv4Interface | ipaddress.IPv6Interface,
    b: ipaddress.IPv4Interface | ipaddress.IPv6Interface,
) -> bool:
    return (
        a.version == b.version and a.network == b.network and a.network.prefixlen < a.max_prefixlen
    )
