"""Reachability of the TCP ports training needs, between a pair of nodes.

The target runs ``netopt doctor --listen`` (:func:`serve_ports`: a tiny TCP
listener on every port of :func:`required_ports`); the source connects to each
(:func:`probe_ports`, bounded in time) and :func:`check_ports` turns the
outcomes into findings that name the direction, the port and the rule that
would open it. A connect that times out means a firewall drops the SYN; a
refusal, with the listener up, means a reject rule.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from netopt.config.services import DEFAULT_AGENT_PORT, DEFAULT_COORDINATOR_PORT
from netopt.doctor.findings import Finding
from netopt.doctor.sysctl import read_sysctl

__all__ = [
    "DEFAULT_MASTER_PORT",
    "Outcome",
    "PortResult",
    "PortSpec",
    "check_ports",
    "ephemeral_range",
    "local_address_towards",
    "probe_ports",
    "required_ports",
    "serve_ports",
]

DEFAULT_MASTER_PORT = 29500
EPHEMERAL_SAMPLES = 4
CONNECT_TIMEOUT_S = 1.5
Outcome = Literal["open", "refused", "timeout", "unreachable"]
Purpose = Literal["rendezvous", "ephemeral", "netopt"]
_IMPACT = {"rendezvous": 95.0, "ephemeral": 90.0, "netopt": 30.0}


@dataclass(frozen=True)
class PortSpec:
    """A TCP port and why training needs it."""

    port: int
    purpose: Purpose
    label: str
    rule_ports: str = ""
    """What a firewall rule should open (``32768-60999`` for an ephemeral range)."""


@dataclass(frozen=True)
class PortResult:
    """What one connect from ``source`` to ``target`` saw."""

    source: str
    source_address: str
    target: str
    spec: PortSpec
    outcome: Outcome
    detail: str = ""


def ephemeral_range() -> tuple[int, int]:
    """``net.ipv4.ip_local_port_range`` (the kernel default 32768-60999 if unreadable)."""
    parts = (read_sysctl("net.ipv4.ip_local_port_range") or "").split()
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return int(parts[0]), int(parts[1])
    return 32768, 60999


def required_ports(
    master_port: int = DEFAULT_MASTER_PORT,
    port_range: tuple[int, int] = (32768, 60999),
    samples: int = EPHEMERAL_SAMPLES,
) -> tuple[PortSpec, ...]:
    """The rendezvous port, ``samples`` ports spread evenly over the ephemeral range
    (NCCL and Gloo listen on ports from it) and netopt's own TCP ports (pure)."""
    low, high = port_range
    specs = [PortSpec(master_port, "rendezvous", "torchrun MASTER_PORT")]
    span = max(0, high - low)
    for i in range(samples):
        port = low + int(span * (i + 0.5) / samples)
        specs.append(
            PortSpec(port, "ephemeral", f"ephemeral {low}-{high} (NCCL/Gloo)", f"{low}-{high}")
        )
    specs.append(PortSpec(DEFAULT_COORDINATOR_PORT, "netopt", "netopt coordinator"))
    specs.append(PortSpec(DEFAULT_AGENT_PORT, "netopt", "netopt agent"))
    unique: dict[int, PortSpec] = {}
    for spec in specs:
        unique.setdefault(spec.port, spec)
    return tuple(unique.values())


async def serve_ports(
    host: str, specs: Sequence[PortSpec], duration_s: float, ready: asyncio.Event | None = None
) -> tuple[list[int], list[int]]:
    """Accept (and at once close) connections on every port for ``duration_s`` seconds.

    Returns ``(listened, busy)``: ports served, and ports already taken by another
    program (those answer connects anyway, so they still test reachability).
    """
    servers = []
    listened: list[int] = []
    busy: list[int] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    for spec in specs:
        try:
            servers.append(await asyncio.start_server(accept, host, spec.port, reuse_address=True))
            listened.append(spec.port)
        except OSError:
            busy.append(spec.port)
    if ready is not None:
        ready.set()
    try:
        await asyncio.sleep(duration_s)
    finally:
        for server in servers:
            server.close()
    return listened, busy


def local_address_towards(host: str) -> str:
    """This node's source address towards ``host`` (no packet is sent); ``?`` if unknown."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, 9))
            return str(sock.getsockname()[0])
    except OSError:
        return "?"


async def _connect(host: str, port: int, timeout_s: float) -> tuple[Outcome, str]:
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except TimeoutError:
        return "timeout", f"no answer in {timeout_s:g} s"
    except ConnectionRefusedError:
        return "refused", "connection refused"
    except OSError as exc:
        return "unreachable", exc.strerror or str(exc)
    writer.close()
    return "open", ""


async def probe_ports(
    source: str,
    target: str,
    specs: Sequence[PortSpec],
    timeout_s: float = CONNECT_TIMEOUT_S,
) -> list[PortResult]:
    """Connect from here to every port of ``target`` at once; bounded by ``timeout_s``."""
    address = local_address_towards(target)
    outcomes = await asyncio.gather(*(_connect(target, s.port, timeout_s) for s in specs))
    return [
        PortResult(source, address, target, spec, outcome, detail)
        for spec, (outcome, detail) in zip(specs, outcomes, strict=True)
    ]


def _rule(result: PortResult) -> str:
    src = result.source_address
    ports = result.spec.rule_ports or str(result.spec.port)
    return (
        f"on {result.target}: nft insert rule inet filter input ip saddr {src} tcp dport "
        f"{ports} accept  (or: iptables -I INPUT -p tcp -s {src} --dport "
        f"{ports.replace('-', ':')} -j ACCEPT); in a cloud, add an inbound rule to "
        f"{result.target}'s security group: allow TCP {ports} from {src}/32"
    )


def _why(outcome: Outcome, detail: str) -> str:
    if outcome == "timeout":
        return f"SYN dropped ({detail}): a firewall drop rule or security group"
    if outcome == "refused":
        return (
            "refused: a firewall reject rule, or nothing listening "
            "(is `netopt doctor --listen` up there?)"
        )
    return f"unreachable: {detail}"


def check_ports(results: Sequence[PortResult]) -> list[Finding]:
    """One finding per blocked rendezvous/netopt port, one per pair for ephemeral ports (pure)."""
    findings: list[Finding] = []
    blocked = [r for r in results if r.outcome != "open"]
    for result in blocked:
        if result.spec.purpose == "ephemeral":
            continue
        findings.append(_finding(result, [result], str(result.spec.port)))
    by_pair: dict[tuple[str, str], list[PortResult]] = {}
    for result in blocked:
        if result.spec.purpose == "ephemeral":
            by_pair.setdefault((result.source, result.target), []).append(result)
    for group in by_pair.values():
        ports = ",".join(str(r.spec.port) for r in group)
        findings.append(_finding(group[0], group, ports))
    return findings


def _finding(first: PortResult, group: Sequence[PortResult], ports: str) -> Finding:
    direction = f"{first.source} -> {first.target}"
    label = first.spec.label
    evidence = "; ".join(f"tcp/{r.spec.port}: {_why(r.outcome, r.detail)}" for r in group)
    return Finding(
        check="ports",
        impact=_IMPACT[first.spec.purpose],
        title=f"{direction} tcp/{ports} ({label}) is blocked",
        subject=f"{direction} tcp/{ports}",
        evidence=f"connect from {first.source} ({first.source_address}) to {first.target}: "
        + evidence,
        fix=_rule(first),
    )
