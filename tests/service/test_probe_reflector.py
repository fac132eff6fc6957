"""Reflector and prober over real UDP on 127.0.0.1: answers, counters, fallback, errors."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from netopt.config import ProbeSettings
from netopt.errors import AuthenticationError, PeerUnreachableError
from netopt.measure import BulkSink, ProbeTarget, Reflector, UdpProber, measure_link
from netopt.measure.packet import KIND_REPLY, KIND_REQUEST, PacketKey, ProbePacket, encode

TOKEN = "service-test-token-0123"


@pytest.fixture
async def reflector() -> AsyncIterator[Reflector]:
    async with await Reflector.start(TOKEN) as running:
        yield running


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def recv(sock: socket.socket) -> bytes:
    return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 2048), 5)


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_prober_measures_loopback(reflector: Reflector) -> None:
    prober = UdpProber(TOKEN, count=200, rate_pps=1000, spacing="fixed", padding_bytes=100)
    series = await prober.probe(ProbeTarget("127.0.0.1", reflector.port))
    assert series.method == "udp"
    assert series.probes_sent == 200
    assert len(series.answered_seqs) == 200
    assert all(0 < r.rtt_ms < 1000 for r in series.replies)
    assert reflector.counters.reflected == 200
    assert reflector.counters.dropped == 0


@pytest.mark.parametrize("batch_s", [0.0, 0.1])
async def test_batched_reading_keeps_hold_time_out_of_the_rtt(batch_s: float) -> None:
    """Both sides read on a 100 ms grid (or per packet); kernel timestamps keep RTTs exact."""
    async with await Reflector.start(TOKEN, batch_s=batch_s) as slow:
        prober = UdpProber(TOKEN, count=40, rate_pps=20, spacing="fixed", batch_s=0.1)
        series = await prober.probe(ProbeTarget("127.0.0.1", slow.port))
    assert len(series.answered_seqs) == 40
    rtts = sorted(r.rtt_ms for r in series.replies)
    # Without kernel receive timestamps these would be up to 2 x 100 ms of waiting.
    assert rtts[len(rtts) // 2] < 10.0


async def test_measure_link_end_to_end(reflector: Reflector) -> None:
    settings = ProbeSettings(rate_pps=500, spacing="poisson", timeout_s=1.0)
    stats = await measure_link(
        ProbeTarget("127.0.0.1", reflector.port), settings, TOKEN, duration_s=0.5
    )
    assert stats.method == "udp"
    assert stats.probes_sent == 250
    assert stats.loss_ratio == 0
    assert stats.rtt_ms is not None
    assert stats.rtt_ms.min <= stats.rtt_ms.p50 <= stats.rtt_ms.max


async def test_bad_datagrams_are_counted_and_dropped(reflector: Reflector) -> None:
    key = PacketKey(TOKEN)
    good = encode(ProbePacket(KIND_REQUEST, 42, 0, 1), key)
    bad = {
        "truncated": good[:30],
        "oversized": bytes(3000),
        "malformed": b"XX" + good[2:],
        "unauthenticated": encode(
            ProbePacket(KIND_REQUEST, 43, 0, 1), PacketKey("foreign-token-xyz")
        ),
        "unexpected_kind": encode(ProbePacket(KIND_REPLY, 44, 0, 1), key),
    }
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        sock.sendto(good, ("127.0.0.1", reflector.port))
        assert len(await recv(sock)) == len(good)
        sock.sendto(good, ("127.0.0.1", reflector.port))  # a replay
        for data in bad.values():
            sock.sendto(data, ("127.0.0.1", reflector.port))
        counters = reflector.counters
        await wait_for(lambda: counters.dropped == 6)
        assert counters.replayed == 1
        for name in bad:
            assert getattr(counters, name) == 1, name
        assert counters.reflected == 1
        # Still answering after all that.
        fresh = encode(ProbePacket(KIND_REQUEST, 42, 1, 2), key)
        sock.sendto(fresh, ("127.0.0.1", reflector.port))
        assert len(await recv(sock)) == len(fresh)
    assert counters.reflected == 2


async def test_prober_ignores_forged_replies() -> None:
    """A fake reflector that answers with the wrong key gets no RTT recorded."""
    loop = asyncio.get_running_loop()
    wrong = PacketKey("not-the-cluster-token")

    class Liar(asyncio.DatagramProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr: object) -> None:
            reply = ProbePacket(KIND_REPLY, 1, 0, 0)
            self.transport.sendto(encode(reply, wrong), addr)  # type: ignore[attr-defined]

    transport, _ = await loop.create_datagram_endpoint(Liar, local_addr=("127.0.0.1", 0))
    try:
        port = transport.get_extra_info("sockname")[1]
        series = await UdpProber(TOKEN, count=5, rate_pps=100, timeout_s=0.3).probe(
            ProbeTarget("127.0.0.1", port)
        )
    finally:
        transport.close()
    assert series.replies == ()


async def test_falls_back_to_tcp_connect_when_udp_gets_no_answer() -> None:
    sink = await BulkSink.start(TOKEN)
    try:
        target = ProbeTarget("127.0.0.1", free_port(socket.SOCK_DGRAM), tcp_port=sink.port)
        settings = ProbeSettings(rate_pps=20, timeout_s=0.3)
        stats = await measure_link(target, settings, TOKEN, duration_s=0.5)
        assert stats.method == "tcp-connect"
        assert stats.probes_received == stats.probes_sent >= 2
        assert stats.rtt_ms is not None
        await wait_for(lambda: sink.counters.connect_probes == stats.probes_sent)
        with pytest.raises(AuthenticationError, match="refused our token"):
            await measure_link(target, settings, "some-other-token-1234", duration_s=0.5)
    finally:
        await sink.close()


async def test_unreachable_target_raises_after_its_timeout() -> None:
    target = ProbeTarget(
        "127.0.0.1", free_port(socket.SOCK_DGRAM), tcp_port=free_port(socket.SOCK_STREAM)
    )
    with pytest.raises(PeerUnreachableError, match=r"no UDP answer within 0\.3 s"):
        await measure_link(target, ProbeSettings(timeout_s=0.3), TOKEN, duration_s=1)


async def test_reflector_bind_failure_is_a_network_error(reflector: Reflector) -> None:
    from netopt.errors import NetworkError

    with pytest.raises(NetworkError, match="cannot bind"):
        await Reflector.start(TOKEN, "127.0.0.1", reflector.port)
