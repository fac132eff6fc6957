"""Per-socket TCP settings: congestion control (Linux ``TCP_CONGESTION``) and the user
timeout (``TCP_USER_TIMEOUT``)."""

from __future__ import annotations

import logging
import socket
from typing import Any

__all__ = ["congestion_control_of", "set_congestion_control", "set_user_timeout"]

log = logging.getLogger(__name__)

_TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
_TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)


def set_congestion_control(sock: socket.socket, name: str) -> bool:
    """Ask the kernel to run ``name`` (bbr, cubic, reno) on ``sock``.

    Returns False, leaving the node's default, when the kernel does not offer it
    (module not loaded, not in ``tcp_allowed_congestion_control`` for an
    unprivileged process, or not Linux).
    """
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CONGESTION, name.encode())
    except OSError as exc:
        log.debug("TCP_CONGESTION=%s refused: %s", name, exc)
        return False
    return True


def congestion_control_of(sock: socket.socket) -> str | None:
    """The congestion control ``sock`` runs, or None where it cannot be read."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, _TCP_CONGESTION, 16)
    except OSError:
        return None
    return raw.split(b"\0", 1)[0].decode() or None


def set_user_timeout(sock: Any, timeout_s: float) -> bool:
    """Have the kernel drop ``sock``'s connection when data it sent stays unacknowledged
    for ``timeout_s`` (Linux ``TCP_USER_TIMEOUT``), instead of retransmitting on a
    backed-off timer for many minutes. ``sock`` is a socket or asyncio's wrapper of one.

    Returns False where the kernel refuses (not Linux, not a TCP socket).
    """
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_USER_TIMEOUT, max(1, round(timeout_s * 1000)))
    except OSError as exc:
        log.debug("TCP_USER_TIMEOUT=%.1f s refused: %s", timeout_s, exc)
        return False
    return True
