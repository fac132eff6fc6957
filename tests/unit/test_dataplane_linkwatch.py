"""The link watch's pure rules: which connections a cut left dead, how long a probe waits."""

from __future__ import annotations

import struct

import pytest

from netopt.dataplane.linkwatch import PROBE_TIMEOUT_MIN_S, probe_timeout_s, unheard
from netopt.tcpinfo import TCP_ESTABLISHED, TCP_INFO_BYTES, TcpInfo, parse_tcp_info

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
