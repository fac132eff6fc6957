"""Per-socket TCP congestion control (Linux ``TCP_CONGESTION``)."""

from __future__ import annotations

import logging
import socket

__all__ = ["congestion_control_of", "set_congestion_control"]

log = logging.getLogger(__name__)

_TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)


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
