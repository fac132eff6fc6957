"""Bandwidth decisions and parsers: N-stream choice, RFC 6349 figures, TCP_INFO, iperf3 JSON."""

from __future__ import annotations

import contextlib
import json
import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netopt.errors import NetworkError, PeerUnreachableError, ProtocolError
from netopt.measure.iperf import iperf3_argv, parse_iperf3_json
from netopt.measure.throughput import (
    BandwidthResult,
    StreamResult,
    buffer_delay_pct,
    choose_streams,
    tcp_efficiency_pct,
)
from netopt.tcpinfo import parse_tcp_info
from netopt.tcpmath import mathis_bound_bps


def test_loss_based_flows_need_many_streams_bbr_few() -> None:
    cubic = choose_streams(80, 0.01, "cubic", 64, target_rate_bps=100e6)
    bbr = choose_streams(80, 0.01, "bbr", 64, target_rate_bps=100e6)
    assert cubic == math.ceil(100e6 / mathis_bound_bps(80, 0.01))
    assert cubic > 40
    assert bbr == 4  # lossy: a few flows hide each other's stalls
    assert choose_streams(80, 0.0, "bbr", 64, target_rate_bps=100e6) == 2
    assert choose_streams(80, 0.01, "cubic", 16) == 16  # capped
    assert choose_streams(0.1, 0.0, "cubic", 16) == 2  # LAN: the floor
    assert choose_streams(300, 0.0, "bbr", 16, target_rate_bps=10e9) == 16
    assert choose_streams(300, 0.0, "bbr", 1) == 1
    with pytest.raises(ValueError, match="max_streams"):
        choose_streams(10, 0, "bbr", 0)


@given(
    st.floats(0.01, 1000),
    st.floats(0, 0.5),
    st.sampled_from(["bbr", "cubic", "reno"]),
    st.integers(1, 64),
)
def test_stream_choice_is_bounded_and_monotone_in_loss(
    rtt_ms: float, loss_ratio: float, cc: str, max_streams: int
) -> None:
    n = choose_streams(rtt_ms, loss_ratio, cc, max_streams)
    assert 1 <= n <= max_streams
    assert choose_streams(rtt_ms, min(0.5, loss_ratio * 2), cc, max_streams) >= n
    assert choose_streams(rtt_ms * 2, loss_ratio, cc, max_streams) >= n


def test_rfc6349_figures() -> None:
    assert tcp_efficiency_pct(1000, 10) == pytest.approx(99.0)
    assert tcp_efficiency_pct(0, 0) is None
    assert buffer_delay_pct(100, 80) == pytest.approx(25.0)
    assert buffer_delay_pct(100, 0) is None


def test_bandwidth_result_aggregates_streams() -> None:
    def stream(bps: float, rtt: float) -> StreamResult:
        return StreamResult(bps, 10, 10, 1000, 50, 3, bps, rtt - 5, rtt)

    result = BandwidthResult(2, "bbr", 5.0, 1.0, (stream(40e6, 85), stream(50e6, 95)))
    assert result.goodput_bps == pytest.approx(90e6)
    assert result.retransmits == 6
    assert result.min_rtt_ms == 80
    assert result.mean_rtt_ms == 90
    assert result.tcp_efficiency_pct == pytest.approx(95.0)
    assert result.buffer_delay_pct() == pytest.approx(12.5)
    data = result.to_dict(baseline_rtt_ms=90)
    assert data["buffer_delay_pct"] == 0
    assert data["per_stream_bps"] == [40e6, 50e6]


def _tcp_info_bytes(size: int = 232) -> bytes:
    raw = bytearray(size)
    struct.pack_into("=I", raw, 16, 1448)  # snd_mss
    struct.pack_into("=I", raw, 68, 80_500)  # rtt_us
    struct.pack_into("=I", raw, 100, 7)  # total_retrans
    if size >= 232:
        struct.pack_into("=Q", raw, 120, 123_456_789)  # bytes_acked
        struct.pack_into("=I", raw, 148, 80_100)  # min_rtt_us
        struct.pack_into("=Q", raw, 160, 12_000_000)  # delivery_rate
        struct.pack_into("=Q", raw, 200, 200_000)  # bytes_sent
        struct.pack_into("=Q", raw, 208, 1_000)  # bytes_retrans
    return bytes(raw)


def test_parse_tcp_info() -> None:
    info = parse_tcp_info(_tcp_info_bytes())
    assert (info.snd_mss, info.rtt_us, info.total_retrans) == (1448, 80_500, 7)
    assert (info.bytes_acked, info.min_rtt_us) == (123_456_789, 80_100)
    assert (info.delivery_rate_Bps, info.bytes_sent, info.bytes_retrans) == (12e6, 200_000, 1000)
    old = parse_tcp_info(_tcp_info_bytes(104))
    assert old.total_retrans == 7
    assert old.bytes_acked is None
    with pytest.raises(ProtocolError):
        parse_tcp_info(b"\0" * 50)


IPERF_OK = {
    "start": {"test_start": {"num_streams": 2}},
    "end": {
        "streams": [
            {"sender": {"mean_rtt": 81000, "bits_per_second": 4.5e7}},
            {"sender": {"mean_rtt": 83000, "bits_per_second": 4.6e7}},
        ],
        "sum_sent": {"seconds": 5.0, "bits_per_second": 9.1e7, "retransmits": 12},
        "sum_received": {"seconds": 5.08, "bits_per_second": 9.0e7},
        "sender_tcp_congestion": "bbr",
    },
}


def test_parse_iperf3_json() -> None:
    result = parse_iperf3_json(json.dumps(IPERF_OK))
    assert result.received_bps == 9.0e7
    assert result.sent_bps == 9.1e7
    assert result.retransmits == 12
    assert result.streams == 2
    assert result.congestion_control == "bbr"
    assert result.mean_rtt_ms == pytest.approx(82.0)
    assert result.duration_s == 5.08


def test_parse_iperf3_errors() -> None:
    with pytest.raises(PeerUnreachableError):
        parse_iperf3_json('{"error": "unable to connect to server: Connection refused"}')
    with pytest.raises(NetworkError):
        parse_iperf3_json('{"error": "the server is busy running a test"}')
    with pytest.raises(ProtocolError):
        parse_iperf3_json("iperf3: error")
    with pytest.raises(ProtocolError):
        parse_iperf3_json('{"end": {}}')
    with pytest.raises(ProtocolError):
        parse_iperf3_json("[1, 2]")


@given(st.text(max_size=200))
def test_parse_iperf3_never_raises_foreign_errors(text: str) -> None:
    with contextlib.suppress(NetworkError):
        parse_iperf3_json(text)


def test_iperf3_argv() -> None:
    argv = iperf3_argv(
        "198.18.0.2",
        5201,
        duration_s=5,
        streams=4,
        congestion_control="cubic",
        connect_timeout_s=2,
    )
    assert argv[:3] == ["iperf3", "-c", "198.18.0.2"]
    assert "-J" in argv
    assert argv[argv.index("-P") + 1] == "4"
    assert argv[argv.index("-C") + 1] == "cubic"
    assert argv[argv.index("--connect-timeout") + 1] == "2000"
    short = iperf3_argv(
        "h", 1, duration_s=0.4, streams=1, congestion_control=None, connect_timeout_s=1
    )
    assert short[short.index("-t") + 1] == "1"  # never "0": iperf3 would run forever
    assert "-C" not in short
