"""Linux ``TCP_INFO`` on a socket (congestion control is set in ``dataplane.sockets``):
the one home of reading it (a bulk test's counters, `netopt.dataplane.linkwatch`'s
connection states).

:func:`parse_tcp_info` is pure (bytes from ``getsockopt(IPPROTO_TCP, TCP_INFO)``
to a :class:`TcpInfo`), following ``struct tcp_info`` in ``linux/tcp.h``; fields
a shorter (older kernel's) struct lacks are None.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from netopt.errors import ProtocolError

__all__ = [
    "TCP_ESTABLISHED",
    "TCP_INFO_BYTES",
    "TcpInfo",
    "parse_tcp_info",
    "read_tcp_info",
]

TCP_INFO_BYTES = 232
TCP_ESTABLISHED = 1
"""``TcpInfo.state`` of a connection whose handshake is done (linux/tcp_states.h)."""
_TCP_INFO = getattr(socket, "TCP_INFO", 11)

# (name, offset, struct format) of the fields read, from linux/tcp.h.
_FIELDS: tuple[tuple[str, int, str], ...] = (
    ("state", 0, "B"),
    ("snd_mss", 16, "I"),
    ("unacked", 24, "I"),
    ("lost", 32, "I"),
    ("retrans", 36, "I"),
    ("last_data_recv_ms", 52, "I"),
    ("last_ack_recv_ms", 56, "I"),
    ("rtt_us", 68, "I"),
    ("rttvar_us", 72, "I"),
    ("snd_cwnd", 80, "I"),
    ("total_retrans", 100, "I"),
    ("pacing_rate_Bps", 104, "Q"),
    ("bytes_acked", 120, "Q"),
    ("segs_out", 136, "I"),
    ("min_rtt_us", 148, "I"),
    ("data_segs_out", 156, "I"),
    ("delivery_rate_Bps", 160, "Q"),
    ("bytes_sent", 200, "Q"),
    ("bytes_retrans", 208, "Q"),
)
_MIN_BYTES = 104  # up to and including total_retrans: every kernel since 2.6


@dataclass(frozen=True)
class TcpInfo:
    """The parts of ``struct tcp_info`` netopt reads (units in the names)."""

    state: int
    """The connection's state (linux/tcp_states.h: 1 established, 2 SYN sent)."""
    snd_mss: int
    unacked: int
    """Segments sent and not yet acknowledged by the peer."""
    lost: int
    retrans: int
    last_data_recv_ms: int
    """Milliseconds since data last came from the peer (or since the handshake)."""
    last_ack_recv_ms: int
    """Milliseconds since the peer last acknowledged anything (or since the handshake)."""
    rtt_us: int
    rttvar_us: int
    snd_cwnd: int
    total_retrans: int
    pacing_rate_Bps: int | None = None
    bytes_acked: int | None = None
    segs_out: int | None = None
    min_rtt_us: int | None = None
    data_segs_out: int | None = None
    delivery_rate_Bps: int | None = None
    bytes_sent: int | None = None
    bytes_retrans: int | None = None


def parse_tcp_info(data: bytes) -> TcpInfo:
    """Parse ``getsockopt(TCP_INFO)`` bytes (native byte order).

    Raises ProtocolError when fewer than the classic 104 bytes are given.
    """
    if len(data) < _MIN_BYTES:
        raise ProtocolError(f"tcp_info of {len(data)} bytes is shorter than {_MIN_BYTES}")
    values: dict[str, int | None] = {}
    for name, offset, fmt in _FIELDS:
        size = struct.calcsize("=" + fmt)
        values[name] = (
            struct.unpack_from("=" + fmt, data, offset)[0] if offset + size <= len(data) else None
        )
    return TcpInfo(**values)  # type: ignore[arg-type]


def read_tcp_info(sock: socket.socket) -> TcpInfo:
    """The kernel's TCP_INFO for a connected TCP socket (ProtocolError if unavailable)."""
    try:
        data = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, TCP_INFO_BYTES)
    except OSError as exc:
        raise ProtocolError(f"cannot read TCP_INFO: {exc}") from None
    return parse_tcp_info(data)
