"""TCP settings against the bandwidth-delay product of each link (pure checks + a reader).

A TCP flow cannot carry more than ``window / RTT``; the kernel's autotuning
ceilings (``net.ipv4.tcp_rmem`` / ``tcp_wmem`` maxima) and the ceilings for
applications that size their own buffers (``net.core.rmem_max`` / ``wmem_max``)
cap the window. Loss-based congestion control (cubic, reno) is further held to
the Mathis bound ``MSS/RTT * 1.22/sqrt(loss)`` per flow, which BBR escapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from netopt.doctor.findings import Finding
from netopt.doctor.sysctl import read_sysctl
from netopt.tcpmath import INITIAL_WINDOW_BYTES, mathis_bound_bps, window_cap_bps

__all__ = [
    "LinkView",
    "TcpFacts",
    "bdp_bytes",
    "check_tcp",
    "read_tcp_facts",
    "recommended_buffer_bytes",
]

LOSSY_RATIO = 0.001
"""Loss above which a loss-based algorithm is held well below a fast link's rate."""
MIN_RECOMMENDED_BUFFER_BYTES = 16 * 2**20
UNKNOWN_RATE_IMPACT = 30.0


@dataclass(frozen=True)
class TcpFacts:
    """This node's TCP sysctls (None where unreadable); byte triples are (min, default, max)."""

    rmem_max_bytes: int | None
    wmem_max_bytes: int | None
    tcp_rmem_bytes: tuple[int, int, int] | None
    tcp_wmem_bytes: tuple[int, int, int] | None
    congestion_control: str | None
    available_congestion_control: tuple[str, ...] = ()
    mtu_probing: int | None = None
    slow_start_after_idle: int | None = None


@dataclass(frozen=True)
class LinkView:
    """A link as the TCP check sees it: RTT, and rate/loss where measured."""

    name: str
    rtt_ms: float
    rate_mbps: float | None = None
    loss_ratio: float | None = None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _triple(text: str | None) -> tuple[int, int, int] | None:
    parts = (text or "").split()
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def read_tcp_facts() -> TcpFacts:
    """Read the TCP sysctls of this process's network namespace (never raises)."""
    return TcpFacts(
        rmem_max_bytes=_int(read_sysctl("net.core.rmem_max")),
        wmem_max_bytes=_int(read_sysctl("net.core.wmem_max")),
        tcp_rmem_bytes=_triple(read_sysctl("net.ipv4.tcp_rmem")),
        tcp_wmem_bytes=_triple(read_sysctl("net.ipv4.tcp_wmem")),
        congestion_control=read_sysctl("net.ipv4.tcp_congestion_control"),
        available_congestion_control=tuple(
            (read_sysctl("net.ipv4.tcp_available_congestion_control") or "").split()
        ),
        mtu_probing=_int(read_sysctl("net.ipv4.tcp_mtu_probing")),
        slow_start_after_idle=_int(read_sysctl("net.ipv4.tcp_slow_start_after_idle")),
    )


def bdp_bytes(rate_mbps: float, rtt_ms: float) -> float:
    """Bandwidth-delay product in bytes."""
    return rate_mbps * 1e6 * rtt_ms / 1e3 / 8


def recommended_buffer_bytes(bdp: float) -> int:
    """Twice the BDP (the kernel spends part of a buffer on overhead), a power of two, >=16 MiB."""
    need = max(float(MIN_RECOMMENDED_BUFFER_BYTES), 2 * bdp)
    return int(2 ** math.ceil(math.log2(need)))


def _mbps(rate_bps: float) -> str:
    return f"{rate_bps / 1e6:.1f} Mbit/s"


def _impact(cap_bps: float, link: LinkView, weight: float) -> float:
    if link.rate_mbps is None:
        return UNKNOWN_RATE_IMPACT * weight if cap_bps < 1e9 else 0.0
    rate_bps = link.rate_mbps * 1e6
    return 100 * weight * max(0.0, 1 - cap_bps / rate_bps)


def _buffer_finding(
    name: str,
    max_bytes: int,
    current: str,
    new_value: str,
    links: Sequence[LinkView],
    weight: float,
) -> Finding | None:
    worst: tuple[float, LinkView, float] | None = None
    for link in links:
        cap = window_cap_bps(max_bytes, link.rtt_ms)
        impact = _impact(cap, link, weight)
        if impact > 0 and (worst is None or impact > worst[0]):
            worst = (impact, link, cap)
    if worst is None:
        return None
    impact, link, cap = worst
    if link.rate_mbps is not None:
        bdp = bdp_bytes(link.rate_mbps, link.rtt_ms)
        need = f"the BDP of {link.rate_mbps:g} Mbit/s x {link.rtt_ms:g} ms is {bdp:,.0f} bytes"
        verdict = f"caps one flow at {_mbps(cap)} of {link.rate_mbps:g} Mbit/s"
    else:
        need = "link rate unknown (pass --links with measured figures)"
        verdict = f"caps one flow at {_mbps(cap)}"
    return Finding(
        check="tcp",
        impact=impact,
        title=f"{name} max {max_bytes:,} bytes is below the bandwidth-delay product",
        subject=link.name,
        evidence=(
            f"{name} = {current}; on {link.name} (RTT {link.rtt_ms:g} ms) it {verdict} "
            f"(window/RTT); {need}"
        ),
        fix=f"sysctl -w {name}='{new_value}' (persist in /etc/sysctl.d/90-netopt.conf)",
        sysctls=((name, new_value),),
    )


def _buffer_findings(facts: TcpFacts, links: Sequence[LinkView]) -> list[Finding]:
    rated = [bdp_bytes(link.rate_mbps, link.rtt_ms) for link in links if link.rate_mbps]
    want = recommended_buffer_bytes(max(rated, default=0.0))
    out: list[Finding | None] = []
    for name, triple in (
        ("net.ipv4.tcp_rmem", facts.tcp_rmem_bytes),
        ("net.ipv4.tcp_wmem", facts.tcp_wmem_bytes),
    ):
        if triple is not None and triple[2] < want:
            current = " ".join(map(str, triple))
            new = f"{triple[0]} {triple[1]} {want}"
            out.append(_buffer_finding(name, triple[2], current, new, links, 0.9))
    # Only applications that set SO_RCVBUF/SO_SNDBUF (iperf3 -w, some NCCL builds) hit these.
    for name, value in (
        ("net.core.rmem_max", facts.rmem_max_bytes),
        ("net.core.wmem_max", facts.wmem_max_bytes),
    ):
        if value is not None and value < want:
            out.append(_buffer_finding(name, value, str(value), str(want), links, 0.3))
    return [f for f in out if f is not None]


def _congestion_finding(facts: TcpFacts, links: Sequence[LinkView]) -> Finding | None:
    cc = facts.congestion_control
    if cc is None or cc == "bbr":
        return None
    worst: tuple[float, LinkView, float] | None = None
    for link in links:
        if link.loss_ratio is None or link.loss_ratio < LOSSY_RATIO:
            continue
        bound = mathis_bound_bps(link.rtt_ms, link.loss_ratio)
        rate_bps = (link.rate_mbps or 1000.0) * 1e6
        impact = 80 * max(0.0, 1 - bound / rate_bps)
        if impact > 0 and (worst is None or impact > worst[0]):
            worst = (impact, link, bound)
    if worst is None:
        return None
    impact, link, bound = worst
    rate = f" of {link.rate_mbps:g} Mbit/s" if link.rate_mbps else ""
    can = "bbr" in facts.available_congestion_control
    return Finding(
        check="tcp",
        impact=impact,
        title=f"{cc} congestion control on a lossy link: use bbr",
        subject=link.name,
        evidence=(
            f"net.ipv4.tcp_congestion_control = {cc}; {link.name} loses "
            f"{link.loss_ratio or 0:.2%} at RTT {link.rtt_ms:g} ms, so one {cc} flow is held "
            f"to the Mathis bound {_mbps(bound)}{rate}; bbr ignores random loss (lab, 1% loss, "
            "80 ms: cubic 3.0 vs bbr 86 Mbit/s of 100)"
        ),
        fix=(
            "sysctl -w net.ipv4.tcp_congestion_control=bbr"
            if can
            else "modprobe tcp_bbr && sysctl -w net.ipv4.tcp_congestion_control=bbr"
        ),
        sysctls=(("net.ipv4.tcp_congestion_control", "bbr"),) if can else (),
    )


def _idle_restart_finding(facts: TcpFacts, links: Sequence[LinkView]) -> Finding | None:
    """``tcp_slow_start_after_idle=1`` on a link whose BDP is many initial windows."""
    if facts.slow_start_after_idle != 1:
        return None
    worst: tuple[float, LinkView] | None = None
    for link in links:
        bdp = bdp_bytes(link.rate_mbps or 1000.0, link.rtt_ms)
        if bdp >= 8 * INITIAL_WINDOW_BYTES and (worst is None or bdp > worst[0]):
            worst = (bdp, link)
    if worst is None:
        return None
    bdp, link = worst
    rtts = math.ceil(math.log2(bdp / INITIAL_WINDOW_BYTES))
    return Finding(
        check="tcp",
        impact=20,
        title="TCP restarts idle connections from the initial window",
        subject=link.name,
        evidence=(
            f"net.ipv4.tcp_slow_start_after_idle = 1: a connection idle for one RTO "
            f"(>= 200 ms) starts again at 10 segments; on {link.name} (RTT {link.rtt_ms:g} ms, "
            f"BDP {bdp:,.0f} bytes) a burst after idle, such as a training step's gradient "
            f"exchange after its compute, waits about {rtts} extra round trips "
            f"({rtts * link.rtt_ms:g} ms) to reach the link's rate"
        ),
        fix="sysctl -w net.ipv4.tcp_slow_start_after_idle=0",
        sysctls=(("net.ipv4.tcp_slow_start_after_idle", "0"),),
    )


def check_tcp(facts: TcpFacts, links: Sequence[LinkView]) -> list[Finding]:
    """Findings about buffer ceilings, congestion control and MTU probing (pure).

    Buffer ceilings are judged against every link: with a rate, the finding's
    impact is the share of the link the cap forbids; without one, a cap under
    1 Gbit/s is reported with the rate called unknown.
    """
    findings = _buffer_findings(facts, links) if links else []
    congestion = _congestion_finding(facts, links)
    if congestion is not None:
        findings.append(congestion)
    idle = _idle_restart_finding(facts, links)
    if idle is not None:
        findings.append(idle)
    if facts.mtu_probing == 0:
        findings.append(
            Finding(
                check="tcp",
                impact=8,
                title="TCP MTU probing is off",
                evidence=(
                    "net.ipv4.tcp_mtu_probing = 0: a path that black-holes large packets "
                    "(tunnels, VPNs) stalls TCP instead of shrinking the segment size"
                ),
                fix="sysctl -w net.ipv4.tcp_mtu_probing=1",
                sysctls=(("net.ipv4.tcp_mtu_probing", "1"),),
            )
        )
    return findings
