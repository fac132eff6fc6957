"""Path MTU per link: find the largest packet that crosses, detect black holes.

A tunnel or VPN on the path often carries less than the NICs' MTU. Probes are
``ping -M do`` (don't fragment) of chosen sizes; :func:`discover_path_mtu`
searches sizes with an injected probe function (so it is testable without a
network) and :func:`check_mtu` is pure. A too-large probe that gets an ICMP
"fragmentation needed" back is survivable (PMTU discovery works); one that
vanishes is a black hole that stalls TCP connections sending full-size segments.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from netopt.doctor.findings import Finding

__all__ = [
    "IP_ICMP_HEADER_BYTES",
    "PathMtu",
    "ProbeOutcome",
    "check_mtu",
    "discover_path_mtu",
    "interface_towards",
    "ping_probe",
]

IP_ICMP_HEADER_BYTES = 28
MIN_PAYLOAD_BYTES = 548 - IP_ICMP_HEADER_BYTES
MAX_PROBES = 16
MAX_IP_PACKET_BYTES = 65535
_MTU_HINT = re.compile(r"mtu\s*[=:]?\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class ProbeOutcome:
    """One don't-fragment probe: did a reply come back, and did an ICMP error name an MTU."""

    ok: bool
    mtu_hint: int | None = None
    icmp_error: bool = False
    detail: str = ""


@dataclass(frozen=True)
class PathMtu:
    """What the search found towards ``target`` (``path_mtu`` None: not even small pings pass)."""

    target: str
    interface: str
    interface_mtu: int
    path_mtu: int | None
    blackholed: bool
    probes: int


Probe = Callable[[int], ProbeOutcome]


def ping_probe(host: str, timeout_s: float = 1.0) -> Probe:
    """A probe function sending one ``ping -M do -s PAYLOAD`` to ``host``.

    Raises FileNotFoundError (from the first call) when ``ping`` is missing.
    """
    exe = shutil.which("ping") or "ping"

    def probe(payload_bytes: int) -> ProbeOutcome:
        argv = [exe, "-n", "-M", "do", "-s", str(payload_bytes), "-c", "1"]
        argv += ["-W", f"{timeout_s:g}", host]
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s + 2, check=False
            )
        except subprocess.TimeoutExpired:
            return ProbeOutcome(False, detail="ping hung")
        text = proc.stdout + proc.stderr
        if proc.returncode == 0:
            return ProbeOutcome(True)
        match = _MTU_HINT.search(text)
        icmp = bool(match) or "too long" in text or "Frag needed" in text
        return ProbeOutcome(
            False, int(match.group(1)) if match else None, icmp, text.strip()[-200:]
        )

    return probe


def interface_towards(host: str) -> tuple[str, int] | None:
    """``(device, its MTU)`` of the route to ``host`` (``ip route get``); None if unknown."""
    try:
        address = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
        proc = subprocess.run(
            ["ip", "-o", "route", "get", str(address)],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):  # socket.gaierror is an OSError
        return None
    match = re.search(r"\bdev (\S+)", proc.stdout)
    if proc.returncode != 0 or not match:
        return None
    device = match.group(1)
    try:
        return device, int(Path(f"/sys/class/net/{device}/mtu").read_text().strip())
    except (OSError, ValueError):
        return None


def discover_path_mtu(target: str, interface: str, interface_mtu: int, probe: Probe) -> PathMtu:
    """Search for the largest don't-fragment packet that reaches ``target`` (<= MAX_PROBES).

    Tries the interface MTU first, then a small packet, then an MTU named by an
    ICMP error, then a binary search to the byte.
    """
    interface_mtu = min(interface_mtu, MAX_IP_PACKET_BYTES)
    count = 0

    def run(mtu: int) -> ProbeOutcome:
        nonlocal count
        count += 1
        return probe(mtu - IP_ICMP_HEADER_BYTES)

    first = run(interface_mtu)
    if first.ok:
        return PathMtu(target, interface, interface_mtu, interface_mtu, False, count)
    icmp_seen = first.icmp_error
    low = MIN_PAYLOAD_BYTES + IP_ICMP_HEADER_BYTES
    if not run(low).ok:
        return PathMtu(target, interface, interface_mtu, None, False, count)
    high = interface_mtu  # smallest size known to fail
    hint = first.mtu_hint
    if hint is not None and low < hint < high:
        if run(hint).ok:
            low = hint
        else:
            high = hint
    while high - low > 1 and count < MAX_PROBES:
        middle = (low + high) // 2
        outcome = run(middle)
        icmp_seen = icmp_seen or outcome.icmp_error
        if outcome.ok:
            low = middle
        else:
            high = middle
    return PathMtu(target, interface, interface_mtu, low, not icmp_seen, count)


def check_mtu(result: PathMtu) -> Finding | None:
    """A finding when the path carries less than the interface MTU (pure)."""
    if result.path_mtu is None or result.path_mtu >= min(result.interface_mtu, MAX_IP_PACKET_BYTES):
        return None
    how = (
        "larger packets vanish without an ICMP error (black hole): TCP stalls on full-size segments"
        if result.blackholed
        else "larger packets get ICMP 'fragmentation needed' (PMTU discovery copes, at a cost)"
    )
    return Finding(
        check="mtu",
        impact=70 if result.blackholed else 20,
        title=f"path MTU to {result.target} is {result.path_mtu}, below {result.interface} "
        f"MTU {result.interface_mtu}",
        subject=result.target,
        evidence=f"don't-fragment pings to {result.target} pass up to {result.path_mtu} bytes "
        f"and fail above ({result.probes} probes); {how}",
        fix=f"ip link set dev {result.interface} mtu {result.path_mtu} (or only for that "
        f"route: ip route change <prefix of {result.target}> dev {result.interface} mtu "
        f"{result.path_mtu}); and sysctl -w net.ipv4.tcp_mtu_probing=1",
        sysctls=(("net.ipv4.tcp_mtu_probing", "1"),),
    )
