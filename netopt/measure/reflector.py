"""The UDP reflector: answers authenticated probe requests, counts and drops the rest.

Runs inside any asyncio event loop (``await Reflector.start(...)``, ``close()``),
so the agent daemon and ``netopt probe serve`` share it. Nothing a datagram holds
can make it raise: every packet either gets one reply or bumps one counter.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass

from netopt.measure.packet import (
    KIND_REQUEST,
    PacketError,
    PacketKey,
    ReplayWindow,
    decode_fields,
    encode_reply,
)
from netopt.measure.samples import SYSTEM_CLOCK, Clock
from netopt.measure.udpsock import next_tick_s, open_udp_socket, recv_batch

__all__ = ["DEFAULT_BATCH_S", "Reflector", "ReflectorCounters"]

DEFAULT_BATCH_S = 0.1
# A drain this full means load: come back in 1 ms, not a tick. Well above the
# ~32 per 100 ms tick that 16 peers at 20/s bring (each extra wake-up costs more
# than the datagrams it reads), well below what the socket buffer holds.
_BUSY_DATAGRAMS = 128
_BUSY_WAIT_S = 0.001
_RCVBUF_BYTES = 1024 * 1024  # the kernel caps it at net.core.rmem_max

log = logging.getLogger(__name__)


@dataclass
class ReflectorCounters:
    """What the reflector did with each datagram it received."""

    reflected: int = 0
    malformed: int = 0
    truncated: int = 0
    oversized: int = 0
    unauthenticated: int = 0
    replayed: int = 0
    unexpected_kind: int = 0
    send_errors: int = 0

    @property
    def dropped(self) -> int:
        """Datagrams that got no reply."""
        return (
            self.malformed
            + self.truncated
            + self.oversized
            + self.unauthenticated
            + self.replayed
            + self.unexpected_kind
        )

    def to_dict(self) -> dict[str, int]:
        """The counters as JSON-able data."""
        return {**vars(self), "dropped": self.dropped}


class _Handler:
    """Turns one datagram into a reply or a counter bump; raises nothing."""

    def __init__(self, key: PacketKey, clock: Clock, counters: ReflectorCounters) -> None:
        self._key = key
        self._clock = clock
        self._counters = counters
        self._replay = ReplayWindow()

    def reply_to(self, data: bytes, rx_ns: int) -> bytes | None:
        try:
            fields = decode_fields(data, self._key)
            if fields[0] != KIND_REQUEST:
                self._counters.unexpected_kind += 1
                return None
            # The session is the authenticated sender id; the address is not.
            self._replay.check(fields[1], fields[2])
        except PacketError as exc:
            setattr(self._counters, exc.reason, getattr(self._counters, exc.reason) + 1)
            return None
        return encode_reply(fields, rx_ns, self._clock.now_ns(), self._key)


class Reflector:
    """A running reflector bound to one UDP address.

    With ``batch_s > 0`` (the default, 100 ms) it drains its socket on a timer grid
    shared with the probers of the same process instead of waking for every
    datagram; kernel receive timestamps keep the hold time out of the RTT. A busy
    drain brings the next one forward to 1 ms, so a burst cannot overflow the
    socket buffer. With ``batch_s == 0`` it answers each datagram as it arrives.
    """

    def __init__(
        self,
        sock: socket.socket,
        handler: _Handler,
        counters: ReflectorCounters,
        clock: Clock,
        batch_s: float,
    ) -> None:
        self._sock = sock
        self._handler = handler
        self._clock = clock
        self._batch_s = batch_s
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self.counters = counters
        if batch_s > 0:
            self._schedule()
        else:
            self._loop.add_reader(sock.fileno(), self._drain)

    @classmethod
    async def start(
        cls,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock = SYSTEM_CLOCK,
        *,
        batch_s: float = DEFAULT_BATCH_S,
    ) -> Reflector:
        """Bind ``host:port`` (0 = any free port) in the running loop and start answering.

        Raises NetworkError when the address cannot be bound.
        """
        counters = ReflectorCounters()
        sock = open_udp_socket(local=(host, port), rcvbuf_bytes=_RCVBUF_BYTES)
        log.info("reflector listening on udp %s:%s", host, sock.getsockname()[1])
        return cls(sock, _Handler(PacketKey(token), clock, counters), counters, clock, batch_s)

    def _schedule(self, busy: bool = False) -> None:
        if not self._closed:
            now_s = self._loop.time()
            when = now_s + _BUSY_WAIT_S if busy else next_tick_s(now_s, self._batch_s)
            self._timer = self._loop.call_at(when, self._tick)

    def _tick(self) -> None:
        self._schedule(busy=self._drain() >= _BUSY_DATAGRAMS)

    def _drain(self) -> int:
        batch, errors = recv_batch(self._sock, self._clock)
        self.counters.send_errors += errors
        reply_to = self._handler.reply_to
        sendto = self._sock.sendto
        for data, addr, rx_ns in batch:
            reply = reply_to(data, rx_ns)
            if reply is None:
                continue
            try:
                sendto(reply, addr)
            except OSError:
                self.counters.send_errors += 1
                continue
            self.counters.reflected += 1
        return len(batch)

    @property
    def port(self) -> int:
        """The UDP port it is bound to."""
        return int(self._sock.getsockname()[1])

    @property
    def host(self) -> str:
        """The address it is bound to."""
        return str(self._sock.getsockname()[0])

    def close(self) -> None:
        """Stop answering and release the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._batch_s <= 0:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()

    async def __aenter__(self) -> Reflector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
