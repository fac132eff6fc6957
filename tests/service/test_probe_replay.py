"""The reflector's replay check over real UDP on loopback: one captured request, many addresses."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator

import pytest

from netopt.measure import Reflector
from netopt.measure.packet import KIND_REPLY, PacketKey, decode, encode_request

TOKEN = "replay-test-token-0123"
KEY = PacketKey(TOKEN)
ADDRESSES = [f"127.0.0.{n}" for n in range(2, 22)]  # 20 sources, all on lo (127/8)


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.fixture
def sources() -> Iterator[list[socket.socket]]:
    socks = []
    try:
        for address in ADDRESSES:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((address, 0))
            sock.setblocking(False)
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


async def replies_on(sock: socket.socket, barrier_session: int, port: int) -> list[int]:
    """Sessions of the replies ``sock`` got, read up to a fresh request's reply.

    Replies from the reflector to one socket arrive in order, so the fresh
    request's answer is a barrier: anything sent to ``sock`` before it is in.
    """
    loop = asyncio.get_running_loop()
    sock.sendto(encode_request(barrier_session, 0, 1, 0, KEY), ("127.0.0.1", port))
    sessions = []
    while True:
        data = await asyncio.wait_for(loop.sock_recv(sock, 2048), 5)
        packet = decode(data, KEY)
        assert packet.kind == KIND_REPLY
        if packet.session == barrier_session:
            return sessions
        sessions.append(packet.session)


@pytest.mark.parametrize("batch_s", [0.0, 0.1])
async def test_a_captured_request_resent_from_20_addresses_is_answered_once(
    sources: list[socket.socket], batch_s: float
) -> None:
    captured_session = 0x5EED
    captured = encode_request(captured_session, 7, 123_456, 32, KEY)
    async with await Reflector.start(TOKEN, batch_s=batch_s) as reflector:
        for sock in sources:
            sock.sendto(captured, ("127.0.0.1", reflector.port))
        counters = reflector.counters
        await wait_for(lambda: counters.reflected + counters.replayed == len(sources))
        got = [await replies_on(sock, 0xB000 + n, reflector.port) for n, sock in enumerate(sources)]
    assert sum(len(sessions) for sessions in got) == 1
    assert [s for sessions in got for s in sessions] == [captured_session]
    assert counters.replayed == len(sources) - 1
