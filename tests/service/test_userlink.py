"""User-space link relays over real loopback sockets: delay, rate, loss, clean shutdown."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import socketserver
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest

from netopt.config.lab import LinkShape
from netopt.demo.sites import LoopbackSite
from netopt.errors import ValidationError
from netopt.lab.userlink import UserLink, UserLinks

HOST = "127.0.0.1"


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.write_eof()
    finally:
        writer.close()


@asynccontextmanager
async def _server(handler: object) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, HOST, 0)  # type: ignore[arg-type]
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def _link(target_port: int, shape: LinkShape, **kwargs: object) -> AsyncIterator[UserLink]:
    link = await UserLink.open(HOST, target_port, shape, **kwargs)  # type: ignore[arg-type]
    try:
        yield link
    finally:
        await link.close()


async def _round_trip_s(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> float:
    started = time.monotonic()
    writer.write(b"?")
    await writer.drain()
    assert await reader.readexactly(1) == b"?"
    return time.monotonic() - started


async def test_tcp_relay_delays_each_way_and_keeps_bytes_intact_and_in_order() -> None:
    payload = os.urandom(2_000_000)
    async with _server(_echo) as port, _link(port, LinkShape(delay_ms=30)) as link:
        reader, writer = await asyncio.open_connection(HOST, link.port)
        try:
            # 30 ms each way: a round trip can't be shorter than 60 ms.
            assert await _round_trip_s(reader, writer) >= 0.060

            async def send() -> None:
                writer.write(payload)
                await writer.drain()
                writer.write_eof()

            sender = asyncio.create_task(send())
            echoed = await asyncio.wait_for(reader.read(-1), 60)
            await sender
        finally:
            writer.close()
            await writer.wait_closed()
        assert len(echoed) == len(payload)
        assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()
        counters = link.counters()
        assert counters.tcp_connections == 1
        assert counters.forward.tcp_bytes == len(payload) + 1
        assert counters.backward.tcp_bytes == len(payload) + 1
        assert counters.bytes == 2 * (len(payload) + 1)


async def test_rate_limited_relay_counts_every_byte_sent() -> None:
    received: list[int] = []

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        total = 0
        while data := await reader.read(65536):
            total += len(data)
        received.append(total)
        writer.close()

    sent_bytes = 1_500_000
    shape = LinkShape(rate_mbps=50, delay_ms=5, queue_ms=10)
    async with _server(sink) as port, _link(port, shape) as link:
        reader, writer = await asyncio.open_connection(HOST, link.port)
        started = time.monotonic()
        for _ in range(sent_bytes // 100_000):
            writer.write(b"z" * 100_000)
            await writer.drain()
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 60) == b""  # the sink closed: all in
        elapsed_s = time.monotonic() - started
        writer.close()
        await writer.wait_closed()
        assert received == [sent_bytes]
        counters = link.counters()
        assert counters.forward.tcp_bytes == sent_bytes
        assert counters.backward.tcp_bytes == 0
    # A floor, not a speed claim: 1.5 MB can't cross 50 Mbit/s in under 0.24 s.
    assert elapsed_s >= 0.9 * sent_bytes * 8 / 50e6


async def test_a_receiver_that_stops_reading_stops_the_sender() -> None:
    stalled = asyncio.Event()

    async def stuck(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await stalled.wait()  # never reads
        writer.close()

    offered_bytes = 0
    async with _server(stuck) as port, _link(port, LinkShape(rate_mbps=2000)) as link:
        _reader, writer = await asyncio.open_connection(HOST, link.port)
        block = b"b" * 1_000_000
        try:
            for _ in range(64):  # far more than every buffer on the way holds
                writer.write(block)
                try:
                    await asyncio.wait_for(writer.drain(), 1.0)
                except TimeoutError:
                    break
                offered_bytes += len(block)
        finally:
            stalled.set()
            writer.transport.abort()
        # Back-pressure: the sender was held up long before 64 MB.
        assert offered_bytes < 48_000_000
        assert link.counters().forward.tcp_bytes < 48_000_000


class _UdpSink(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.datagrams = 0

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.datagrams += 1


async def _udp_losses(seed: int) -> tuple[int, int, int]:
    """Send 200 datagrams through a 50%-loss relay: (dropped, delivered, received)."""
    loop = asyncio.get_running_loop()
    transport, sink = await loop.create_datagram_endpoint(_UdpSink, local_addr=(HOST, 0))
    target_port = transport.get_extra_info("sockname")[1]
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        shape = LinkShape(loss_ratio=0.5, delay_ms=2)
        async with _link(target_port, shape, seed=seed, udp=True) as link:
            for i in range(200):
                sender.sendto(i.to_bytes(4, "big") * 25, (HOST, link.port))
                if i % 20 == 19:
                    await asyncio.sleep(0.005)  # let the relay read: its socket buffer is finite
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                fwd = link.counters().forward
                if fwd.udp_datagrams + fwd.udp_drops == 200 and sink.datagrams == fwd.udp_datagrams:
                    break
                await asyncio.sleep(0.02)
            fwd = link.counters().forward
            assert fwd.udp_drops_queue == 0
            return fwd.udp_drops_loss, fwd.udp_datagrams, sink.datagrams
    finally:
        sender.close()
        transport.close()


async def test_udp_relay_loses_about_half_with_a_seeded_rng() -> None:
    dropped, delivered, received = await _udp_losses(seed=7)
    assert dropped + delivered == 200
    assert 60 <= dropped <= 140  # Binomial(200, 0.5): mean 100, sd ~7
    assert received == delivered
    # The same seed loses the same datagrams.
    assert await _udp_losses(seed=7) == (dropped, delivered, received)


async def test_udp_replies_come_back_through_the_relay() -> None:
    loop = asyncio.get_running_loop()

    class Echo(asyncio.DatagramProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            self.transport.sendto(data[::-1], addr)  # type: ignore[attr-defined]

    echo, _ = await loop.create_datagram_endpoint(Echo, local_addr=(HOST, 0))
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.setblocking(False)
    try:
        async with _link(echo.get_extra_info("sockname")[1], LinkShape(delay_ms=15)) as link:
            started = time.monotonic()
            client.sendto(b"abc", (HOST, link.port))
            reply = await asyncio.wait_for(loop.sock_recv(client, 100), 10)
            assert time.monotonic() - started >= 0.030
            assert reply == b"cba"
            counters = link.counters()
            assert counters.udp_peers == 1
            assert counters.forward.udp_bytes == counters.backward.udp_bytes == 3
    finally:
        client.close()
        echo.close()


async def test_closing_cuts_connections_and_frees_the_port() -> None:
    async with _server(_echo) as port:
        link = await UserLink.open(HOST, port, LinkShape(delay_ms=1))
        reader, writer = await asyncio.open_connection(HOST, link.port)
        assert await _round_trip_s(reader, writer) >= 0.002
        await link.close()
        # The relayed connection is gone: reading ends (EOF or reset), not hangs.
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), 10)
        writer.close()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(HOST, link.port)
        # The UDP socket is closed too: the port number can be bound again.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind((HOST, link.port))


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@contextmanager
def _threaded_echo() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer((HOST, 0), _EchoHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _echo_once(address: tuple[str, int], message: bytes) -> float:
    with socket.create_connection(address, timeout=10) as conn:
        started = time.monotonic()
        conn.sendall(message)
        got = b""
        while len(got) < len(message):
            got += conn.recv(65536)
        elapsed_s = time.monotonic() - started
    assert got == message
    return elapsed_s


def test_user_links_run_relays_in_a_thread() -> None:
    with _threaded_echo() as port, UserLinks(seed=3) as links:
        relay = links.add(HOST, port, LinkShape(delay_ms=10), link=("hk", "us"))
        assert links.ports == (relay,)
        assert _echo_once((HOST, relay), b"hello") >= 0.020
        assert links.counters(relay).bytes == 10
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, relay), timeout=5).close()


def test_loopback_site_routes_cross_region_traffic_through_a_relay() -> None:
    regions = {"hk": ["hk-1", "hk-2"], "us": ["us-1"]}
    shape = LinkShape(rate_mbps=500, delay_ms=20)
    with _threaded_echo() as echo_port:
        base = echo_port - 2 * LoopbackSite.PORT_STRIDE  # us-1 is node 2: its port is echo's
        with LoopbackSite(regions, links={("us", "hk"): shape}) as site:
            direct = site.port("us-1", base)
            assert direct == echo_port
            assert site.endpoint("hk-1", "hk-2", base) == (HOST, site.port("hk-2", base))
            assert site.endpoint("us-1", "us-1", base) == (HOST, direct)
            assert site.border_bytes("hk", "us") == 0  # no relay yet
            address = site.endpoint("hk-1", "us-1", base)
            assert address[1] != direct
            assert site.endpoint("hk-2", "us-1", base) == address  # one relay per source region
            assert _echo_once(address, b"x" * 1000) >= 0.040  # 20 ms each way
            assert _echo_once((HOST, direct), b"y" * 1000) >= 0  # straight, not counted
            assert site.border_bytes("hk", "us") == 2000
            assert site.border_bytes("us", "hk") == 2000
            assert site.border_bytes("hk", "hk") == 0
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address, timeout=5).close()


def test_loopback_site_without_links_is_direct_and_refuses_unknown_regions() -> None:
    regions = {"hk": ["hk-1"], "us": ["us-1"]}
    with LoopbackSite(regions, port_offset=1000) as site:
        assert site.endpoint("hk-1", "us-1", 7000) == (HOST, site.port("us-1", 7000))
        assert site.border_bytes("hk", "us") == 0
    with pytest.raises(ValidationError, match="unknown region 'eu'"):
        LoopbackSite(regions, links={("hk", "eu"): LinkShape()})
