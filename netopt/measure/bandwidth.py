"""Bounded bulk-TCP bandwidth test: a sink server and a multi-stream client.

The client opens ``streams`` TCP connections to the peer's sink, pins their
congestion control (``TCP_CONGESTION``), sends an authenticated hello and then
zeros for ``duration_s``. Goodput is read from ``TCP_INFO`` (bytes acknowledged
between the end of a warm-up and the end of the test), so slow start is left
out and nothing has to agree on a clock. On EOF the sink answers with the
byte count it received, a cross-check.

The sink runs in any asyncio loop (``await BulkSink.start(...)``); it discards
data through a ``BufferedProtocol``, caps each stream's lifetime and the number
of concurrent streams, and drops streams whose hello does not authenticate.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from netopt.dataplane.sockets import set_congestion_control
from netopt.errors import AuthenticationError, NetworkError, PeerUnreachableError, ProtocolError
from netopt.measure.samples import ProbeTarget
from netopt.measure.throughput import BandwidthResult, StreamResult
from netopt.tcpinfo import read_tcp_info

__all__ = [
    "HELLO_BYTES",
    "MAX_TEST_DURATION_S",
    "BulkSink",
    "SinkCounters",
    "make_hello",
    "measure_bandwidth",
    "run_bulk_test",
    "verify_sink",
]

log = logging.getLogger(__name__)

_HELLO = struct.Struct("!4sB16sI")
_MAGIC: Final = b"NQBW"
_TAG_BYTES: Final = 16
HELLO_BYTES: Final = _HELLO.size + _TAG_BYTES
MAX_TEST_DURATION_S: Final = 120.0
_GRACE_S: Final = 30.0
_HELLO_TIMEOUT_S: Final = 10.0
_SEND_CHUNK = bytes(256 * 1024)
_SAMPLE_EVERY_S: Final = 0.05


def _bulk_key(token: str) -> bytes:
    return hmac.new(token.encode(), b"netopt-bulk-v1", hashlib.sha256).digest()


def make_hello(token: str, duration_s: float) -> bytes:
    """The authenticated first bytes of a bulk stream."""
    body = _HELLO.pack(_MAGIC, 1, os.urandom(16), int(duration_s * 1000))
    return body + hmac.new(_bulk_key(token), body, hashlib.sha256).digest()[:_TAG_BYTES]


@dataclass
class SinkCounters:
    """What the sink saw."""

    streams: int = 0
    bytes_received: int = 0
    rejected: int = 0
    connect_probes: int = 0
    over_limit: int = 0
    expired: int = 0


class _SinkProtocol(asyncio.BufferedProtocol):
    def __init__(self, sink: BulkSink) -> None:
        self.sink = sink
        self.hello = bytearray()
        self.received = 0
        self.authed = False
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if len(self.sink.active) >= self.sink.max_streams:
            self.sink.counters.over_limit += 1
            transport.abort()
            return
        self.sink.active.add(self)
        self.timer = asyncio.get_running_loop().call_later(_HELLO_TIMEOUT_S, self._expire)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.sink.buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self.authed:
            self.received += nbytes
            return
        self.hello += self.sink.buffer[:nbytes]
        if len(self.hello) < HELLO_BYTES:
            return
        body, tag = bytes(self.hello[: _HELLO.size]), bytes(self.hello[_HELLO.size : HELLO_BYTES])
        magic, version, _, duration_ms = _HELLO.unpack(body)
        good = hmac.new(self.sink.key, body, hashlib.sha256).digest()[:_TAG_BYTES]
        if magic != _MAGIC or version != 1 or not hmac.compare_digest(tag, good):
            self.sink.counters.rejected += 1
            self._abort()
            return
        self.authed = True
        self.sink.counters.streams += 1
        self.received = len(self.hello) - HELLO_BYTES
        if self.timer is not None:
            self.timer.cancel()
        limit_s = min(duration_ms / 1000, MAX_TEST_DURATION_S) + _GRACE_S
        self.timer = asyncio.get_running_loop().call_later(limit_s, self._expire)

    def eof_received(self) -> bool:
        if not self.authed:
            if not self.hello:
                self.sink.counters.connect_probes += 1
            return False
        if self.transport is not None:
            self.transport.write(struct.pack("!Q", self.received))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.sink.counters.bytes_received += self.received
        self.sink.active.discard(self)

    def _expire(self) -> None:
        self.sink.counters.expired += 1
        self._abort()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class BulkSink:
    """A running bulk-TCP sink bound to one address."""

    def __init__(self, token: str, max_streams: int) -> None:
        self.key = _bulk_key(token)
        self.max_streams = max_streams
        self.counters = SinkCounters()
        self.active: set[_SinkProtocol] = set()
        self.buffer = memoryview(bytearray(256 * 1024))
        self._server: asyncio.Server | None = None

    @classmethod
    async def start(
        cls, token: str, host: str = "127.0.0.1", port: int = 0, *, max_streams: int = 128
    ) -> BulkSink:
        """Listen on ``host:port`` (0 = any free port) in the running loop.

        Raises NetworkError when the address cannot be bound.
        """
        sink = cls(token, max_streams)
        loop = asyncio.get_running_loop()
        try:
            sink._server = await loop.create_server(lambda: _SinkProtocol(sink), host, port)
        except OSError as exc:
            raise NetworkError(f"cannot bind the bulk sink to {host}:{port}: {exc}") from None
        return sink

    @property
    def port(self) -> int:
        """The TCP port it listens on."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and drop every open stream."""
        if self._server is not None:
            self._server.close()
        for proto in list(self.active):
            proto._abort()
        if self._server is not None:
            await self._server.wait_closed()


def _connect(target: ProbeTarget, congestion_control: str, timeout_s: float) -> socket.socket:
    infos = socket.getaddrinfo(target.host, target.sink_port, type=socket.SOCK_STREAM)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if congestion_control != "default":
            set_congestion_control(sock, congestion_control)
        sock.settimeout(timeout_s)
        sock.connect(addr)
    except OSError as exc:
        sock.close()
        raise PeerUnreachableError(
            f"cannot open a bulk stream to {target.host}:{target.sink_port}: {exc}"
        ) from None
    except BaseException:
        sock.close()
        raise
    return sock


def _pump(sock: socket.socket, start_s: float, duration_s: float, warmup_s: float) -> StreamResult:
    """Send until ``start_s + duration_s``; goodput counts bytes acked after the warm-up."""
    sock.settimeout(_SAMPLE_EVERY_S)
    end_s = start_s + duration_s
    warm_s = start_s + warmup_s
    base: tuple[float, int] | None = None
    rtts_us: list[int] = []
    next_sample_s = warm_s
    try:
        while (now_s := time.monotonic()) < end_s:
            if now_s >= next_sample_s:
                info = read_tcp_info(sock)
                if base is None:
                    base = (now_s, info.bytes_acked or 0)
                rtts_us.append(info.rtt_us)
                next_sample_s = now_s + _SAMPLE_EVERY_S
            try:
                sock.send(_SEND_CHUNK)
            except TimeoutError:
                continue
        info = read_tcp_info(sock)
        stop_s = time.monotonic()
        sock.shutdown(socket.SHUT_WR)
    except OSError as exc:
        raise ProtocolError(
            f"the bulk stream broke ({exc}): is the peer a netopt sink with the same token?"
        ) from None
    base_s, base_acked = base if base is not None else (start_s, 0)
    acked = (info.bytes_acked or 0) - base_acked
    return StreamResult(
        goodput_bps=acked * 8 / max(stop_s - base_s, 1e-6),
        bytes_acked=info.bytes_acked or 0,
        sink_bytes=_read_count(sock),
        bytes_sent=info.bytes_sent or 0,
        bytes_retrans=info.bytes_retrans or 0,
        retransmits=info.total_retrans,
        delivery_rate_bps=(info.delivery_rate_Bps or 0) * 8.0,
        min_rtt_ms=info.min_rtt_us / 1e3 if info.min_rtt_us else None,
        mean_rtt_ms=sum(rtts_us) / len(rtts_us) / 1e3 if rtts_us else None,
    )


def _read_count(sock: socket.socket, timeout_s: float = 10.0) -> int | None:
    sock.settimeout(timeout_s)
    data = b""
    try:
        while len(data) < 8:
            chunk = sock.recv(8 - len(data))
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    return int(struct.unpack("!Q", data)[0])


def run_bulk_test(
    target: ProbeTarget,
    token: str,
    *,
    streams: int = 1,
    duration_s: float = 5.0,
    congestion_control: str = "bbr",
    warmup_s: float | None = None,
    timeout_s: float = 5.0,
) -> BandwidthResult:
    """Blocking: a ``streams``-stream test of ``duration_s`` (at most 120 s) to ``target``.

    Raises PeerUnreachableError (no connection), DependencyError (unknown
    congestion control) or ProtocolError (the sink dropped the stream).
    """
    if not 0 < duration_s <= MAX_TEST_DURATION_S or not 1 <= streams <= 256:
        raise ValueError(f"{streams} streams for {duration_s} s is out of bounds")
    warm_s = min(1.0, duration_s / 4) if warmup_s is None else warmup_s
    hello = make_hello(token, duration_s)
    socks: list[socket.socket] = []
    try:
        for _ in range(streams):
            sock = _connect(target, congestion_control, timeout_s)
            socks.append(sock)
            sock.sendall(hello)
        start_s = time.monotonic()
        with ThreadPoolExecutor(max_workers=streams, thread_name_prefix="netopt-bulk") as pool:
            futures = [pool.submit(_pump, s, start_s, duration_s, warm_s) for s in socks]
            results = tuple(f.result() for f in futures)
    except OSError as exc:
        raise PeerUnreachableError(f"bulk test to {target} failed: {exc}") from None
    finally:
        for sock in socks:
            sock.close()
    return BandwidthResult(streams, congestion_control, duration_s, warm_s, results)


async def verify_sink(target: ProbeTarget, token: str, timeout_s: float) -> None:
    """Check that ``target`` runs a netopt sink that accepts ``token`` (an empty test).

    Raises PeerUnreachableError when no connection can be made and
    AuthenticationError when the sink drops the authenticated hello.
    """
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(target.host, target.sink_port), timeout_s
        )
    except (OSError, TimeoutError) as exc:
        raise PeerUnreachableError(
            f"TCP connect to {target.host}:{target.sink_port} failed: {str(exc) or 'timed out'}"
        ) from None
    try:
        writer.write(make_hello(token, 0.0))
        writer.write_eof()
        count = await asyncio.wait_for(reader.readexactly(8), timeout_s)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        count = b""
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    if len(count) != 8:
        raise AuthenticationError(
            f"{target.host}:{target.sink_port} refused our token (or is not a netopt probe server)"
        )


async def measure_bandwidth(target: ProbeTarget, token: str, **options: Any) -> BandwidthResult:
    """:func:`run_bulk_test` in a worker thread, so the event loop keeps running."""
    return await asyncio.to_thread(run_bulk_test, target, token, **options)
