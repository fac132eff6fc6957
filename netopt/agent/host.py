"""What this host looks like: network interfaces, addresses, speeds, MTUs, CPUs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

from netopt.wire.schema import Nic

__all__ = ["cpu_count", "local_nics", "parse_ip_addr_json"]

log = logging.getLogger(__name__)

_SYS_NET = Path("/sys/class/net")


def cpu_count() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parse_ip_addr_json(text: str, speeds_mbps: dict[str, float] | None = None) -> tuple[Nic, ...]:
    """NICs from ``ip -j address show`` output (pure). ``speeds_mbps`` adds link speeds.

    Raises ValueError when ``text`` is not that command's JSON.
    """
    entries = json.loads(text)
    if not isinstance(entries, list):
        raise ValueError("expected a JSON list")
    nics = []
    for entry in entries:
        name = str(entry.get("ifname", ""))
        if not name or len(name) > 15:
            continue
        addresses = tuple(
            f"{info['local']}/{info['prefixlen']}"
            for info in entry.get("addr_info", [])
            if "local" in info and "prefixlen" in info
        )
        mtu = int(entry.get("mtu", 1500))
        speed = (speeds_mbps or {}).get(name)
        nics.append(Nic(name=name, addresses=addresses, speed_mbps=speed, mtu=mtu))
    return tuple(nics)


def _speed_mbps(name: str) -> float | None:
    try:
        value = int((_SYS_NET / name / "speed").read_text().strip())
    except (OSError, ValueError):
        return None  # virtual devices have no speed (reading it fails with EINVAL)
    return float(value) if value > 0 else None


def local_nics() -> tuple[Nic, ...]:
    """This host's NICs with addresses; empty (and a warning) if ``ip`` is unavailable."""
    try:
        result = subprocess.run(
            ["ip", "-j", "address", "show"], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot list interfaces with `ip -j address show`: %s", exc)
        return ()
    try:
        names = [str(e.get("ifname", "")) for e in json.loads(result.stdout)]
        return parse_ip_addr_json(result.stdout, {n: s for n in names if (s := _speed_mbps(n))})
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("cannot parse `ip -j address show`: %s", exc)
        return ()
