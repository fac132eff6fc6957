"""The link watch's pure rules (which connections a cut left dead, how long a probe
waits) and a worker's wait after a failure (`SyncRun.back_off`, over a fake source)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from netopt.cache.weblink import silent
from netopt.chunking import chunk_bytes
from netopt.dataplane.chunkio import MemoryChunkSink, MemoryChunkSource
from netopt.dataplane.linkwatch import PROBE_TIMEOUT_MIN_S, probe_timeout_s, unheard
from netopt.dataplane.syncrun import SyncRun
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import IntegrityError, NetworkError
from netopt.tcpinfo import TCP_ESTABLISHED, TCP_INFO_BYTES, TcpInfo, parse_tcp_info
from netopt.transfer.manifest import FileEntry, Manifest

SYN_SENT = 2


def _info(state: int, data_ms: int, ack_ms: int, unacked: int = 0) -> TcpInfo:
    """A TCP_INFO as the kernel lays it out (linux/tcp.h), with the fields the rule reads."""
    raw = bytearray(TCP_INFO_BYTES)
    raw[0] = state
    struct.pack_into("=I", raw, 24, unacked)
    struct.pack_into("=II", raw, 52, data_ms, ack_ms)
    return parse_tcp_info(bytes(raw))


def test_tcp_info_reads_the_state_the_unacknowledged_and_when_the_peer_was_heard() -> None:
    info = _info(TCP_ESTABLISHED, 1234, 56, unacked=3)
    assert (info.state, info.unacked, info.last_data_recv_ms, info.last_ack_recv_ms) == (
        1, 3, 1234, 56,
    )  # fmt: skip


def test_an_established_connection_is_dead_if_it_waits_on_a_retransmission_into_the_cut() -> None:
    # Failures began 2.5 s ago; it sent what is still unacknowledged, and heard nothing.
    assert unheard(_info(TCP_ESTABLISHED, 3000, 2600, unacked=2), 2.5, True)
    assert unheard(_info(TCP_ESTABLISHED, 2500, 2500, unacked=1), 2.5, False)
    # Data, or only an acknowledgement, since then: alive.
    assert not unheard(_info(TCP_ESTABLISHED, 40, 9000, unacked=2), 2.5, True)
    assert not unheard(_info(TCP_ESTABLISHED, 9000, 40, unacked=2), 2.5, True)


def test_a_quiet_connection_that_owes_nothing_is_left_alone() -> None:
    """Idle in the pool, or its reader the slow side (its data waits in a buffer): the
    stall timer, which stops while this side is slow, judges it, not the link watch."""
    assert not unheard(_info(TCP_ESTABLISHED, 60_000, 60_000, unacked=0), 2.5, True)


def test_a_handshake_is_dead_only_if_it_began_before_the_probe_that_connected() -> None:
    assert unheard(_info(SYN_SENT, 0, 0, unacked=1), 2.5, True)
    assert not unheard(_info(SYN_SENT, 0, 0, unacked=1), 2.5, False)


def test_a_probe_sends_one_syn_on_a_short_link_and_waits_round_trips_on_a_long_one() -> None:
    assert probe_timeout_s(None) == PROBE_TIMEOUT_MIN_S < 1.0  # the kernel resends a SYN at 1 s
    assert probe_timeout_s(0.08) == PROBE_TIMEOUT_MIN_S
    assert probe_timeout_s(0.6) == pytest.approx(1.8)


class WatchingSource(MemoryChunkSource):
    """A memory source that watches for its server's return as `HttpChunkSource` does."""

    def __init__(self, manifest: Manifest, chunks: dict[str, bytes]) -> None:
        super().__init__(manifest, chunks)
        self.returns = 0
        self.watch_started = 0

    def link_returns(self) -> int:
        return self.returns

    def fetch_failed(self) -> None:
        self.watch_started += 1


def _source() -> WatchingSource:
    data = os.urandom(64 * 1024)
    refs = chunk_bytes(data, 16 * 1024)
    entry = FileEntry("f.bin", len(data), 0o644, 0, tuple(refs))
    table = {r.chunk_id: data[r.offset_bytes : r.offset_bytes + r.length_bytes] for r in refs}
    return WatchingSource(Manifest("ds", (entry,), 16 * 1024), table)


@contextlib.contextmanager
def _waiting_run(tmp_path: Path, backoff_s: float) -> Iterator[tuple[WatchingSource, SyncRun]]:
    """A run over a watching source, with work left (a worker waits out its backoff)."""
    source = _source()
    options = SyncOptions(backoff_initial_s=backoff_s, backoff_max_s=backoff_s)
    with ThreadPoolExecutor(1) as ex:
        run = SyncRun(source.manifest, source, MemoryChunkSink(), tmp_path, options, None, ex)
        run.queue.extend(run.lengths)
        yield source, run


async def test_a_fetch_that_failed_across_a_link_return_is_tried_again_at_once(
    tmp_path: Path,
) -> None:
    with _waiting_run(tmp_path, 30.0) as (source, run):
        source.returns = 1  # the server answered again since the fetch began (at 0)
        assert await asyncio.wait_for(run.back_off(NetworkError("cut"), 4, 0), 5) == 0
        assert source.watch_started == 0  # the outage is over: nothing to watch for


async def test_a_network_failure_starts_the_watch_and_its_return_ends_the_backoff(
    tmp_path: Path,
) -> None:
    with _waiting_run(tmp_path, 30.0) as (source, run):

        async def server_answers() -> None:
            await asyncio.sleep(0.1)
            source.returns += 1

        answering = asyncio.ensure_future(server_answers())
        assert await asyncio.wait_for(run.back_off(NetworkError("cut"), 2, 0), 5) == 0
        await answering
        assert source.watch_started == 1


async def test_a_bad_copy_waits_its_backoff_without_a_watch(tmp_path: Path) -> None:
    with _waiting_run(tmp_path, 0.05) as (source, run):
        assert await run.back_off(IntegrityError("bad copy"), 2, 0) == 2
        assert source.watch_started == 0


def test_the_web_rule_drops_what_heard_nothing_since_the_outage_began() -> None:
    """`silent`: a connection quiet since the outage began is dead whether or not it owes
    anything (its answer waits in the origin's retransmission backoff); one that heard
    from the origin since is kept; a handshake goes only if sent before the probe."""
    assert silent(_info(TCP_ESTABLISHED, 3000, 2600), 2.5, False)  # owes nothing: dead
    assert silent(_info(TCP_ESTABLISHED, 3000, 2600, unacked=2), 2.5, False)
    assert not silent(_info(TCP_ESTABLISHED, 40, 9000), 2.5, False)  # data came lately
    assert not silent(_info(TCP_ESTABLISHED, 9000, 40), 2.5, False)  # acks came lately
    assert silent(_info(SYN_SENT, 0, 0), 2.5, True)
    assert not silent(_info(SYN_SENT, 0, 0), 2.5, False)
