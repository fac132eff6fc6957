"""A rendezvous port for local ranks: free now, and outside the kernel's ephemeral range.

Rank 0 of a torch.distributed job listens on ``MASTER_PORT`` (its TCP store) while the
other ranks, started at the same moment, connect to it and retry until it listens. A
port picked by binding port 0 comes from the ephemeral range, the same range the
kernel draws the other ranks' own local ports from: before rank 0 binds it, another
connection may take it as its local port, or a rank's retried connect to
``127.0.0.1:PORT`` may connect to itself (TCP's simultaneous open), and rank 0 then
fails with "address already in use". A port outside that range is never handed out as
a connection's local port. This module never imports torch.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["PORT_RANGE", "ephemeral_range", "rendezvous_port"]

PORT_RANGE = (20000, 32767)
"""Where rendezvous ports are looked for (below Linux's default ephemeral range)."""
_TRIES = 64
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range(text: str | None = None) -> tuple[int, int]:
    """The kernel's ephemeral port range (``ip_local_port_range``); Linux's default when
    it cannot be read or makes no sense."""
    try:
        if text is None:
            text = _RANGE_FILE.read_text()
        low, high = (int(part) for part in text.split())
    except (OSError, ValueError):
        return 32768, 60999
    return (low, high) if 0 < low <= high <= 65535 else (32768, 60999)


def rendezvous_port(host: str = "127.0.0.1", *, rng: random.Random | None = None) -> int:
    """A port free on ``host`` now, outside the ephemeral range (`PORT_RANGE`), for rank 0
    to listen on; one from the ephemeral range only when none outside is free."""
    low, high = ephemeral_range()
    candidates = [p for p in range(PORT_RANGE[0], PORT_RANGE[1] + 1) if not low <= p <= high]
    pick = rng or random.SystemRandom()
    for port in pick.sample(candidates, min(_TRIES, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port_any: int = sock.getsockname()[1]
        return port_any
