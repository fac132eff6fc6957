"""Per-socket TCP settings: congestion control (Linux ``TCP_CONGESTION``) and the user
timeout (``TCP_USER_TIMEOUT``).

The one place that sets a socket's congestion control: :func:`set_congestion_control`
raises DependencyError naming why the kernel refused; a bulk measurement
(``measure.bandwidth``) lets that fail the test, the data plane calls
:func:`try_congestion_control` and keeps the node's default.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

from netopt.errors import DependencyError

__all__ = [
    "set_congestion_control",
    "set_user_timeout",
    "try_congestion_control",
]

log = logging.getLogger(__name__)

_TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
_TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)


def set_congestion_control(sock: socket.socket, name: str) -> None:
    """Have the kernel run ``name`` (bbr, cubic, reno) on ``sock``.

    Raises DependencyError when the kernel does not offer it (module not loaded,
    not in ``tcp_allowed_congestion_control`` for an unprivileged process, or not
    Linux); the message says which.
    """
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CONGESTION, name.encode())
    except OSError as exc:
        why = {
            errno.ENOENT: "is not available in this kernel",
            errno.EPERM: "is not allowed for this process (tcp_allowed_congestion_control)",
        }.get(exc.errno or 0, f"was refused: {exc}")
        raise DependencyError(f"congestion control {name!r} {why}") from None


def try_congestion_control(sock: socket.socket, name: str) -> bool:
    """:func:`set_congestion_control`, or False (logged) leaving the node's default."""
    try:
        set_congestion_control(sock, name)
    except DependencyError as exc:
        log.debug("%s; the node's default runs", exc)
        return False
    return True


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
