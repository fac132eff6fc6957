"""Run the doctor: gather facts on this node, probe the peers, rank the findings.

:func:`run_doctor` is the one entry point the CLI calls. Each check that cannot
run (no root, no ping, no GPU, no token, no peers) adds a :class:`Skipped`
saying so instead of a guess.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from netopt.config.links import LinksSettings
from netopt.config.services import DEFAULT_PROBE_PORT
from netopt.doctor import certs, clock, gpu, host, mtu, ports, tcp
from netopt.doctor.findings import DoctorReport, Finding, Skipped
from netopt.errors import NetoptError
from netopt.tlsca import read_expiry

__all__ = ["DoctorOptions", "link_views", "ping_rtt_ms", "run_doctor"]

_RTT_RE = re.compile(r"= [\d.]+/([\d.]+)/")


@dataclass(frozen=True)
class DoctorOptions:
    """What to check. ``peers`` are host names or addresses reachable from here."""

    node: str
    peers: tuple[str, ...] = ()
    links: LinksSettings | None = None
    dataset_dir: Path | None = None
    master_port: int = ports.DEFAULT_MASTER_PORT
    ephemeral_samples: int = ports.EPHEMERAL_SAMPLES
    connect_timeout_s: float = ports.CONNECT_TIMEOUT_S
    token: str | None = None
    probe_port: int = DEFAULT_PROBE_PORT
    check_mtu: bool = True
    notes: tuple[str, ...] = field(default=())
    cert_files: tuple[str, ...] = ()
    """TLS certificates (a node's, the CA) whose expiry is checked."""


def ping_rtt_ms(peer: str, count: int = 3) -> float | None:
    """Average RTT of ``count`` pings in ms (about ``count * 0.2 + 1`` s); None if none answered."""
    exe = shutil.which("ping")
    if exe is None:
        return None
    argv = [exe, "-n", "-q", "-c", str(count), "-i", "0.2", "-W", "1", peer]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=count + 3, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _RTT_RE.search(proc.stdout)
    return float(match.group(1)) if match else None


def link_views(
    node: str, links: LinksSettings | None, measured_rtt_ms: dict[str, float]
) -> list[tcp.LinkView]:
    """Links the TCP check judges (pure): the links file's pairs that include ``node``
    (all pairs when ``node`` is in none), then measured peers the file does not cover."""
    views: list[tcp.LinkView] = []
    covered: set[str] = set()
    if links is not None:
        mine = [p for p in links.links if node in p.between] or list(links.links)
        for pair in mine:
            views.append(
                tcp.LinkView(
                    f"{pair.between[0]}<->{pair.between[1]}",
                    pair.rtt_ms,
                    pair.link_mbps,
                    pair.loss_ratio,
                )
            )
            covered.update(pair.between)
    for peer, rtt_ms in measured_rtt_ms.items():
        if peer not in covered:
            views.append(tcp.LinkView(f"{node}<->{peer}", rtt_ms))
    return views


def _host_checks(options: DoctorOptions) -> tuple[list[Finding], list[Skipped], dict[str, Any]]:
    facts = host.gather_host_facts(options.dataset_dir)
    findings, skipped = host.check_host(facts)
    gpus, why_not = gpu.query_gpus()
    if gpus is None:
        skipped.append(Skipped("gpu", why_not or "GPU not checked"))
    else:
        gpu_findings, gpu_skipped = gpu.check_gpus(gpus)
        findings += gpu_findings
        skipped += gpu_skipped
    summary = asdict(facts)
    if facts.disk is not None:
        summary["disk"]["rate_mbps"] = round(facts.disk.rate_mbps, 1)
    summary["gpus"] = [asdict(g) for g in gpus or ()]
    return findings, skipped, summary


def _peer_checks(
    options: DoctorOptions,
) -> tuple[list[Finding], list[Skipped], dict[str, float], list[str]]:
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    rtts: dict[str, float] = {}
    notes: list[str] = []
    if not options.peers:
        skipped.append(Skipped("ports", "no --peers: port reachability not checked"))
        skipped.append(Skipped("mtu", "no --peers: path MTU not checked"))
        return findings, skipped, rtts, notes
    specs = ports.required_ports(
        options.master_port, ports.ephemeral_range(), options.ephemeral_samples
    )
    has_ping = shutil.which("ping") is not None
    for peer in options.peers:
        results = asyncio.run(
            ports.probe_ports(options.node, peer, specs, options.connect_timeout_s)
        )
        findings += ports.check_ports(results)
        notes.append(f"{peer}: " + ", ".join(f"{r.spec.port} {r.outcome}" for r in results))
        rtt = ping_rtt_ms(peer) if has_ping else None
        if rtt is not None:
            rtts[peer] = rtt
        if not options.check_mtu:
            continue
        route = mtu.interface_towards(peer)
        if not has_ping or rtt is None or route is None:
            why = (
                "no ping program"
                if not has_ping
                else "no ping reply (ICMP blocked, or ping not permitted)"
                if rtt is None
                else "no route found"
            )
            skipped.append(Skipped("mtu", f"{peer}: {why}: path MTU not checked"))
            continue
        result = mtu.discover_path_mtu(peer, route[0], route[1], mtu.ping_probe(peer))
        notes.append(f"{peer}: path MTU {result.path_mtu} via {route[0]} (MTU {route[1]})")
        finding = mtu.check_mtu(result)
        if finding is not None:
            findings.append(finding)
    return findings, skipped, rtts, notes


def _clock_checks(options: DoctorOptions) -> tuple[list[Finding], list[Skipped], list[str]]:
    if not options.peers:
        return [], [Skipped("clock", "no --peers: clock offset not checked")], []
    if not options.token:
        reason = "no cluster token (NETOPT_TOKEN or --token-file): clock offset not checked"
        return [], [Skipped("clock", reason)], []
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    notes: list[str] = []
    for peer in options.peers:
        try:
            samples = clock.measure_stamps(peer, options.probe_port, options.token)
        except NetoptError as exc:
            samples = []
            notes.append(f"{peer}: {exc}")
        offset = clock.estimate_offset(peer, samples)
        if offset is None:
            skipped.append(
                Skipped(
                    "clock",
                    f"{peer}: no reflector answered on udp/"
                    f"{options.probe_port} (agent not running?): clock not checked",
                )
            )
            continue
        notes.append(f"{peer}: clock offset {offset.offset_ms:+.3f} ms")
        finding = clock.check_clock(offset)
        if finding is not None:
            findings.append(finding)
    return findings, skipped, notes


def _cert_checks(cert_files: tuple[str, ...], skipped: list[Skipped]) -> list[Finding]:
    if not cert_files:
        skipped.append(Skipped("tls", "no --tls-cert / --tls-ca given: expiry not checked"))
        return []
    expiries = []
    for path in cert_files:
        try:
            expiries.append((path, read_expiry(path)))
        except NetoptError as exc:
            skipped.append(Skipped("tls", str(exc)))
    return certs.check_certs(expiries, dt.datetime.now(dt.UTC))


def run_doctor(options: DoctorOptions) -> DoctorReport:
    """Run every check this node can; bounded by the probes' timeouts (seconds per peer)."""
    findings, skipped, host_facts = _host_checks(options)
    peer_findings, peer_skipped, rtts, notes = _peer_checks(options)
    clock_findings, clock_skipped, clock_notes = _clock_checks(options)
    tcp_facts = tcp.read_tcp_facts()
    views = link_views(options.node, options.links, rtts)
    if not views:
        skipped.append(
            Skipped(
                "tcp",
                "no --links and no peers measured: TCP buffers not "
                "judged against a bandwidth-delay product",
            )
        )
    tcp_findings = tcp.check_tcp(tcp_facts, views)
    tcp_findings += _cert_checks(options.cert_files, skipped)
    if os.geteuid() != 0:
        skipped.append(Skipped("apply", "not root: sysctl fixes cannot be applied (--apply)"))
    checks = ["host", "gpu", "tcp", "ports", "mtu", "clock", "tls"]
    return DoctorReport.build(
        findings + peer_findings + clock_findings + tcp_findings,
        skipped + peer_skipped + clock_skipped,
        [c for c in checks if not any(s.check == c for s in skipped + peer_skipped)],
        {
            "node": options.node,
            "host": host_facts,
            "tcp": asdict(tcp_facts),
            "links": [asdict(v) for v in views],
            "notes": [*options.notes, *notes, *clock_notes],
        },
    )
