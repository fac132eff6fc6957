"""The shared prober (one socket, one timer, many peers) and the agent's peer probing,
over real UDP on 127.0.0.1: per-peer series, unreachable peers, forged replies."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from netopt.agent.probing import PeerProbing
from netopt.config import ProbeSettings
from netopt.errors import PeerUnreachableError
from netopt.measure import ProbeSeries, ProbeTarget, Reflector, measure_link, summarise
from netopt.measure.multiprober import ProberCounters, SharedProber
from netopt.measure.packet import PacketKey, decode_fields, encode_reply

TOKEN = "shared-prober-token-0123"
KEY = PacketKey(TOKEN)


@dataclass(frozen=True)
class Peer:
    target: ProbeTarget


def closed_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_many_peers_share_one_socket_and_get_their_own_series() -> None:
    reflectors = [await Reflector.start(TOKEN) for _ in range(4)]
    try:
        prober = SharedProber(TOKEN, count=30, rate_pps=100, spacing="fixed", timeout_s=0.5)
        targets = [ProbeTarget("127.0.0.1", r.port) for r in reflectors]
        dead = ProbeTarget("127.0.0.1", closed_udp_port())
        series = await asyncio.gather(*(prober.probe(t) for t in [*targets, dead]))
    finally:
        for reflector in reflectors:
            reflector.close()
    for target, one, reflector in zip(targets, series, reflectors, strict=False):
        stats = summarise(one)
        assert one.target == str(target)
        assert stats.probes_sent == 30
        assert stats.probes_received == 30
        assert stats.rtt_ms is not None
        assert 0 < stats.rtt_ms.max < 500
        assert stats.duplicate_count == 0
        assert reflector.counters.reflected == 30  # each peer got its own probes only
    dead_stats = summarise(series[-1])
    assert series[-1].target == str(dead)
    assert (dead_stats.probes_sent, dead_stats.probes_received, dead_stats.loss_ratio) == (30, 0, 1)
    assert prober.counters.sent == 150
    assert prober.counters.replies == 120
    assert prober.counters.rejected == 0
    assert prober.peers == 0
    assert prober.local_addresses == []


async def test_continuous_windows_use_fresh_sessions_until_removed() -> None:
    async with await Reflector.start(TOKEN) as reflector:
        prober = SharedProber(TOKEN, count=10, rate_pps=100, timeout_s=0.5)
        windows: list[ProbeSeries] = []
        stream = prober.add(
            ProbeTarget("127.0.0.1", reflector.port), lambda _, s: windows.append(s)
        )
        assert len(prober.local_addresses) == 1
        await wait_for(lambda: len(windows) >= 3)
        prober.remove(stream)
        seen = len(windows)
        await asyncio.sleep(0.3)
    assert len(windows) == seen  # nothing after remove()
    assert all(w.probes_sent == 10 and len(w.answered_seqs) == 10 for w in windows)
    # Windows follow one another: each starts after the previous one's first probe.
    starts = [w.sent_at_s[0] for w in windows]
    assert starts == sorted(starts)
    assert reflector.counters.replayed == 0  # a fresh session per window
    assert prober.counters.rejected == 0


async def test_forged_foreign_and_stray_replies_are_counted_and_dropped() -> None:
    """A fake reflector answers once correctly, then with every kind of bad reply."""
    fake = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    fake.bind(("127.0.0.1", 0))
    other.bind(("127.0.0.1", 0))
    fake.setblocking(False)
    try:
        prober = SharedProber(TOKEN, count=3, rate_pps=20, spacing="fixed", timeout_s=1.0)
        probing = asyncio.create_task(prober.probe(ProbeTarget("127.0.0.1", fake.getsockname()[1])))
        loop = asyncio.get_running_loop()
        data, addr = await asyncio.wait_for(loop.sock_recvfrom(fake, 2048), 5)
        fields = decode_fields(data, KEY)
        kind, session, seq, pad, sender_ns, _, _ = fields
        fake.sendto(encode_reply(fields, 1, 2, KEY), addr)  # the one good answer
        fake.sendto(encode_reply(fields, 1, 2, PacketKey("another-cluster-xyz")), addr)
        fake.sendto(encode_reply((kind, session, 99, pad, sender_ns, 0, 0), 1, 2, KEY), addr)
        fake.sendto(encode_reply((kind, session ^ 1, seq, pad, sender_ns, 0, 0), 1, 2, KEY), addr)
        fake.sendto(data, addr)  # a request sent back: wrong kind
        fake.sendto(b"\x00" * 7, addr)  # truncated
        fake.sendto(b"x" * 3000, addr)  # oversized
        other.sendto(encode_reply(fields, 1, 2, KEY), addr)  # right session, wrong host:port
        series = await asyncio.wait_for(probing, 10)
    finally:
        fake.close()
        other.close()
    assert series.probes_sent == 3
    assert [r.seq for r in series.replies] == [seq]  # only the good answer counts
    counters = prober.counters
    assert counters.replies == 1
    expected = ProberCounters(
        sent=3,
        replies=1,
        truncated=1,
        oversized=1,
        unauthenticated=1,
        unexpected_kind=1,
        unknown_session=1,
        wrong_source=1,
        bad_seq=1,
    )
    assert counters == expected
    assert counters.rejected == 7


async def test_measure_link_accepts_the_shared_prober() -> None:
    async with await Reflector.start(TOKEN) as reflector:
        prober = SharedProber(TOKEN, count=20, rate_pps=200, timeout_s=0.5)
        settings = ProbeSettings(rate_pps=200, timeout_s=0.5)
        target = ProbeTarget("127.0.0.1", reflector.port)
        stats = await measure_link(target, settings, TOKEN, prober=prober)
    assert (stats.method, stats.probes_sent, stats.probes_received) == ("udp", 20, 20)


async def test_unresolvable_host_is_a_clear_error() -> None:
    prober = SharedProber(TOKEN, count=5)
    with pytest.raises(PeerUnreachableError, match="cannot resolve"):
        await prober.probe(ProbeTarget("no-such-host.invalid", 9))


async def test_peer_probing_reports_windows_and_moves_dead_peers_to_fallback() -> None:
    settings = ProbeSettings(rate_pps=50, window_s=0.2, timeout_s=0.3, batch_s=0.05)
    measured: list[tuple[Peer, int]] = []
    unreachable: list[tuple[Peer, str]] = []
    async with await Reflector.start(TOKEN) as reflector:
        alive = Peer(ProbeTarget("127.0.0.1", reflector.port))
        dead = Peer(ProbeTarget("127.0.0.1", closed_udp_port()))
        probing: PeerProbing[Peer] = PeerProbing(
            settings,
            TOKEN,
            lambda peer, stats: measured.append((peer, stats.probes_received)),
            lambda peer, reason: unreachable.append((peer, reason)),
        )
        probing.set_peers({alive, dead})
        try:
            await wait_for(lambda: len(measured) >= 2 and len(unreachable) >= 2)
            assert probing.peers == 2
            assert probing.fallback_peers == 1  # the dead one, retried by measure_link
            probing.set_peers({alive})
            assert (probing.peers, probing.fallback_peers) == (1, 0)
        finally:
            await probing.close()
    assert {peer for peer, _ in measured} == {alive}
    assert all(received == 10 for _, received in measured)
    assert {peer for peer, _ in unreachable} == {dead}
    assert "none of 10 udp probes" in unreachable[0][1]
    assert probing.prober.peers == 0
