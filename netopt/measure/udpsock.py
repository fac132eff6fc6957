"""Non-blocking UDP sockets that read in batches with kernel receive timestamps.

The prober and the reflector do not wake up for every datagram: they drain
their sockets on a shared timer grid (see :func:`next_tick_s`), so one process
probing many peers wakes a few dozen times a second, not once per packet.
Receive times come from the kernel (``SO_TIMESTAMPNS``), so the time a
datagram waits in the socket buffer is not mistaken for network delay.
"""

from __future__ import annotations

import math
import socket
import struct
from typing import Any, TypeAlias

from netopt.errors import NetworkError, PeerUnreachableError
from netopt.measure.packet import MAX_PACKET_BYTES
from netopt.measure.samples import Clock

__all__ = ["Datagram", "next_tick_s", "open_udp_socket", "recv_batch"]

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; not exported by Python
_TIMESPEC = struct.Struct("@ll")
_TIMESPEC_BYTES = _TIMESPEC.size
_SOL_SOCKET = socket.SOL_SOCKET
_ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)
_READ_BYTES = MAX_PACKET_BYTES + 1  # one more, so an oversized datagram shows as such


Datagram: TypeAlias = tuple[bytes, Any, int]
"""One received datagram: ``(data, sender address, kernel arrival time in ns)``
(a plain tuple: the cheapest thing to build per packet)."""


def next_tick_s(now_s: float, tick_s: float) -> float:
    """The first multiple of ``tick_s`` after ``now_s``: timers of every prober and
    reflector in a process land on the same instants, so the loop wakes once for all."""
    return (math.floor(now_s / tick_s) + 1) * tick_s


def open_udp_socket(
    local: tuple[str, int] | None = None,
    remote: tuple[str, int] | None = None,
    *,
    rcvbuf_bytes: int | None = None,
) -> socket.socket:
    """A non-blocking UDP socket with kernel receive timestamps, bound and/or connected.

    Raises NetworkError when ``local`` cannot be bound and PeerUnreachableError
    when ``remote`` cannot be addressed (for example an unknown host name).
    """
    host = (remote or local or ("0.0.0.0", 0))[0]  # noqa: S104 - only used to pick a family
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise PeerUnreachableError(f"cannot resolve {host}: {exc}") from None
    family = infos[0][0]
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        if rcvbuf_bytes is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
        if local is not None:
            try:
                sock.bind(local)
            except OSError as exc:
                raise NetworkError(f"cannot bind UDP {local[0]}:{local[1]}: {exc}") from None
        if remote is not None:
            try:
                sock.connect(remote)
            except OSError as exc:
                raise PeerUnreachableError(
                    f"cannot address {remote[0]}:{remote[1]} over UDP: {exc}"
                ) from None
    except BaseException:
        sock.close()
        raise
    return sock


def recv_batch(sock: socket.socket, clock: Clock, limit: int = 4096) -> tuple[list[Datagram], int]:
    """Read every datagram waiting on ``sock`` (at most ``limit``).

    Returns the datagrams and the number of socket errors seen (ICMP port
    unreachable and the like, reported on connected sockets). Never raises for
    what arrives.
    """
    batch: list[Datagram] = []
    errors = 0
    recvmsg = sock.recvmsg
    unpack = _TIMESPEC.unpack_from
    for _ in range(limit):
        try:
            data, ancillary, _flags, addr = recvmsg(_READ_BYTES, _ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            break
        except OSError:
            errors += 1
            continue
        rx_ns = 0
        for level, kind, payload in ancillary:
            if level == _SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= _TIMESPEC_BYTES:
                seconds, nanos = unpack(payload)
                rx_ns = seconds * 1_000_000_000 + nanos
        batch.append((data, addr, rx_ns or clock.now_ns()))
    return batch, errors
