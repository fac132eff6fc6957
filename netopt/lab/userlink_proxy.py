"""The sockets behind :mod:`netopt.lab.userlink`: a TCP proxy and a UDP proxy.

Both forward what a client sends to one target and the target's replies back,
each direction through a :class:`~netopt.lab.emulator.DirectionShaper`, which decides
when bytes arrive. The TCP proxy runs four loops per connection (read and
deliver, each way); reading pauses while the link queue is full or too many
bytes wait in the proxy, so a fast sender is slowed by TCP flow control, never
by unbounded memory. The UDP proxy maps each client address to a socket of
its own towards the target (so replies find their way back) and delivers
datagrams from a time-ordered outbox per direction.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from netopt.errors import LabError
from netopt.lab.emulator import DROP_LOSS, EARLY_NS

if TYPE_CHECKING:
    from netopt.lab.emulator import DirectionShaper

__all__ = ["FlowStats", "ProxyStats", "TcpProxy", "UdpProxy"]

_CHUNK_BYTES = 64 * 1024
_CONNECT_TIMEOUT_S = 10.0
_MAX_DATAGRAM_BYTES = 65535
_READ_BATCH = 64
_MAX_UDP_PEERS = 1024

_log = logging.getLogger(__name__)


def _now_ns() -> int:
    return int(asyncio.get_running_loop().time() * 1e9)


@dataclass
class FlowStats:
    """Mutable counters of one proxy direction (the proxy updates them in place)."""

    tcp_bytes: int = 0
    udp_bytes: int = 0
    udp_datagrams: int = 0
    drops_loss: int = 0
    drops_queue: int = 0


@dataclass
class ProxyStats:
    """Mutable counters of one proxy: connections and both directions."""

    forward: FlowStats = field(default_factory=FlowStats)
    backward: FlowStats = field(default_factory=FlowStats)
    tcp_connections: int = 0
    tcp_open: int = 0
    tcp_connect_failures: int = 0
    udp_peers: int = 0


class _Pipe:
    """One direction of one TCP connection: read, hold back per the clock, deliver in order."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        clock: DirectionShaper,
        rng: random.Random,
        stats: FlowStats,
    ) -> None:
        self._reader, self._writer, self._clock = reader, writer, clock
        self._rng, self._stats = rng, stats
        self._queue: deque[tuple[int, bytes]] = deque()  # (release_ns, data); b"" is EOF
        self._pending_bytes = 0
        shape = clock.shape
        in_flight_bytes = int(shape.rate_bps / 8 * (shape.delay_ns + shape.jitter_ns) / 1e9)
        # Read while the queue and the bytes in flight fit: enough to fill the
        # link, bounded so a stalled receiver cannot grow the proxy's memory.
        self._max_pending_bytes = shape.queue_bytes + in_flight_bytes + _CHUNK_BYTES
        self._min_read_bytes = max(1, min(_CHUNK_BYTES, shape.queue_bytes // 4))
        self._queued = asyncio.Event()
        self._drained = asyncio.Event()

    async def _room(self) -> int:
        while True:
            if self._pending_bytes >= self._max_pending_bytes:
                self._drained.clear()
                await self._drained.wait()
                continue
            room = self._clock.room_bytes(_now_ns())
            if room >= self._min_read_bytes:
                return min(room, _CHUNK_BYTES)
            await asyncio.sleep((self._min_read_bytes - room) * self._clock.ns_per_byte / 1e9)

    async def pump_in(self) -> None:
        """Read until EOF, stamping each chunk with its arrival time."""
        while True:
            data = await self._reader.read(await self._room())
            now = _now_ns()
            if not data:
                last = self._queue[-1][0] if self._queue else 0
                self._queue.append((max(last, now + self._clock.shape.delay_ns), b""))
                self._queued.set()
                return
            self._queue.append((self._clock.send(now, len(data), self._rng.random()), data))
            self._pending_bytes += len(data)
            self._queued.set()

    async def pump_out(self) -> None:
        """Deliver chunks at their arrival times; pass EOF on as a half-close."""
        while True:
            while not self._queue:
                self._queued.clear()
                await self._queued.wait()
            release_ns, data = self._queue[0]  # only pump_in appends, at the tail
            wait_ns = release_ns - _now_ns()
            if wait_ns > 0:
                await asyncio.sleep(wait_ns / 1e9)
            self._queue.popleft()
            if not data:
                if self._writer.can_write_eof():
                    self._writer.write_eof()
                return
            self._writer.write(data)
            await self._writer.drain()
            self._pending_bytes -= len(data)
            self._stats.tcp_bytes += len(data)
            self._drained.set()


class TcpProxy:
    """A TCP listener whose every connection is proxied to ``target`` through two clocks."""

    def __init__(
        self,
        target: tuple[str, int],
        forward: DirectionShaper,
        backward: DirectionShaper,
        rng: random.Random,
        stats: ProxyStats,
    ) -> None:
        self._target, self._forward, self._backward = target, forward, backward
        self._rng, self._stats = rng, stats
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._port = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._closing = False

    @classmethod
    async def start(
        cls,
        host: str,
        port: int,
        target: tuple[str, int],
        forward: DirectionShaper,
        backward: DirectionShaper,
        rng: random.Random,
        stats: ProxyStats,
    ) -> TcpProxy:
        """Listen on ``host:port`` (0: a free port); LabError when it cannot."""
        proxy = cls(target, forward, backward, rng, stats)
        try:
            proxy._server = await asyncio.start_server(proxy._handle, host, port)
        except OSError as exc:
            raise LabError(f"user link: cannot listen on {host}:{port}: {exc}") from exc
        proxy._port = int(proxy._server.sockets[0].getsockname()[1])
        return proxy

    @property
    def port(self) -> int:
        """The listening port (still known after :meth:`close`)."""
        return self._port

    def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The proxy runs in a task of ours: asyncio's own task for this callback
        # must not be cancelled (3.11 reports a cancelled one as an error).
        if self._closing:
            writer.close()
            return
        task = asyncio.get_running_loop().create_task(self._proxy(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            _log.error("user link: a proxied connection failed", exc_info=exc)

    async def _proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        stats = self._stats
        stats.tcp_connections += 1
        stats.tcp_open += 1
        target_writer: asyncio.StreamWriter | None = None
        try:
            try:
                target_reader, to_target = await asyncio.wait_for(
                    asyncio.open_connection(*self._target), _CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                stats.tcp_connect_failures += 1
                return
            target_writer = to_target
            self._writers.add(to_target)
            up = _Pipe(reader, to_target, self._forward, self._rng, stats.forward)
            down = _Pipe(target_reader, writer, self._backward, self._rng, stats.backward)
            try:
                async with asyncio.TaskGroup() as group:
                    for coro in (up.pump_in(), up.pump_out(), down.pump_in(), down.pump_out()):
                        group.create_task(coro)
            except* OSError:  # a reset or a broken pipe on either side ends the connection
                pass
        finally:
            stats.tcp_open -= 1
            for each in (writer, target_writer):
                if each is not None:
                    each.close()
                    self._writers.discard(each)

    async def close(self) -> None:
        """Stop listening, cut every proxied connection and wait until all are closed."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writers = list(self._writers)
        for writer in writers:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


class _Outbox:
    """Datagrams waiting for their arrival time, sent in order by one loop timer."""

    def __init__(self, stats: FlowStats) -> None:
        self._stats = stats
        self._queue: deque[tuple[int, socket.socket, bytes, tuple[str, int] | None]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def push(
        self, arrival_ns: int, sock: socket.socket, data: bytes, addr: tuple[str, int] | None
    ) -> None:
        self._queue.append((arrival_ns, sock, data, addr))
        if self._timer is None:
            self._schedule()

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(self._queue[0][0] / 1e9, self._flush)

    def _flush(self) -> None:
        self._timer = None
        now = _now_ns()
        while self._queue and self._queue[0][0] <= now + EARLY_NS:
            _, sock, data, addr = self._queue.popleft()
            try:
                if addr is None:
                    sock.send(data)
                else:
                    sock.sendto(data, addr)
            except OSError:  # a full socket buffer or a vanished peer: the datagram is gone
                self._stats.drops_queue += 1
                continue
            self._stats.udp_bytes += len(data)
            self._stats.udp_datagrams += 1
        if self._queue:
            self._schedule()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()


class UdpProxy:
    """A UDP socket proxying datagrams to ``target`` and replies back, through two clocks."""

    def __init__(
        self,
        sock: socket.socket,
        target: tuple[str, int],
        forward: DirectionShaper,
        backward: DirectionShaper,
        rng: random.Random,
        stats: ProxyStats,
    ) -> None:
        self._sock, self._target = sock, target
        self._forward, self._backward = forward, backward
        self._rng, self._stats = rng, stats
        self._peers: dict[tuple[str, int], socket.socket] = {}
        self._to_target = _Outbox(stats.forward)
        self._to_client = _Outbox(stats.backward)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._from_client)

    @classmethod
    def start(
        cls,
        host: str,
        port: int,
        target: tuple[str, int],
        forward: DirectionShaper,
        backward: DirectionShaper,
        rng: random.Random,
        stats: ProxyStats,
    ) -> UdpProxy:
        """Bind ``host:port`` (call in the event loop); OSError when the port is taken."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        return cls(sock, target, forward, backward, rng, stats)

    def _peer(self, addr: tuple[str, int]) -> socket.socket | None:
        peer = self._peers.get(addr)
        if peer is None and len(self._peers) < _MAX_UDP_PEERS:
            peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                peer.setblocking(False)
                peer.connect(self._target)
            except OSError:
                peer.close()
                return None
            self._peers[addr] = peer
            self._stats.udp_peers += 1
            self._loop.add_reader(peer.fileno(), self._from_target, addr, peer)
        return peer

    def _offer(self, clock: DirectionShaper, stats: FlowStats, size_bytes: int) -> int | None:
        rng = self._rng
        arrival = clock.offer(_now_ns(), size_bytes, rng.random(), rng.random())
        if arrival < 0:
            if arrival == DROP_LOSS:
                stats.drops_loss += 1
            else:
                stats.drops_queue += 1
            return None
        return arrival

    def _from_client(self) -> None:
        for _ in range(_READ_BATCH):
            try:
                data, addr = self._sock.recvfrom(_MAX_DATAGRAM_BYTES)
            except OSError:  # nothing more to read (or an ICMP error from a client)
                return
            peer = self._peer(addr)
            if peer is None:
                self._stats.forward.drops_queue += 1
                continue
            arrival = self._offer(self._forward, self._stats.forward, len(data))
            if arrival is not None:
                self._to_target.push(arrival, peer, data, None)

    def _from_target(self, addr: tuple[str, int], peer: socket.socket) -> None:
        for _ in range(_READ_BATCH):
            try:
                data = peer.recv(_MAX_DATAGRAM_BYTES)
            except OSError:  # nothing more (or the target's port is closed: ICMP refused)
                return
            arrival = self._offer(self._backward, self._stats.backward, len(data))
            if arrival is not None:
                self._to_client.push(arrival, self._sock, data, addr)

    def close(self) -> None:
        """Stop reading, drop what waits and close every socket."""
        self._to_target.close()
        self._to_client.close()
        for sock in (self._sock, *self._peers.values()):
            self._loop.remove_reader(sock.fileno())
            sock.close()
        self._peers.clear()
