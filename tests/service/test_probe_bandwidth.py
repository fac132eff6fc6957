"""Bulk-TCP test and iperf3 against real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest

from netopt.errors import DependencyError, PeerUnreachableError, ProtocolError
from netopt.measure import BulkSink, ProbeTarget, measure_bandwidth
from netopt.measure.bandwidth import HELLO_BYTES
from netopt.measure.iperf import run_iperf3

TOKEN = "bandwidth-test-token-42"


@pytest.fixture
async def sink() -> AsyncIterator[BulkSink]:
    running = await BulkSink.start(TOKEN)
    yield running
    await running.close()


@pytest.mark.parametrize("streams", [1, 3])
async def test_bulk_test_on_loopback(sink: BulkSink, streams: int) -> None:
    target = ProbeTarget("127.0.0.1", sink.port)
    result = await measure_bandwidth(
        target, TOKEN, streams=streams, duration_s=0.4, congestion_control="cubic"
    )
    assert result.streams == streams == len(result.per_stream)
    assert result.congestion_control == "cubic"
    assert result.goodput_bps > 100e6  # loopback moves far more than 100 Mbit/s
    for stream in result.per_stream:
        assert stream.bytes_acked > 0
        # The sink saw everything TCP says was acknowledged (less the hello and the SYN).
        assert stream.sink_bytes is not None
        assert stream.sink_bytes + HELLO_BYTES + 1 >= stream.bytes_acked
        assert stream.min_rtt_ms is not None
    assert result.tcp_efficiency_pct is not None
    assert 90 <= result.tcp_efficiency_pct <= 100
    assert sink.counters.streams == streams


async def test_sink_drops_a_stream_with_the_wrong_token(sink: BulkSink) -> None:
    with pytest.raises(ProtocolError, match="same token"):
        await measure_bandwidth(
            ProbeTarget("127.0.0.1", sink.port),
            "not-the-token-at-all",
            duration_s=0.3,
            congestion_control="cubic",
        )
    assert sink.counters.rejected == 1
    assert sink.counters.streams == 0


async def test_sink_drops_garbage(sink: BulkSink) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", sink.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(64))
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert sink.counters.rejected == 1


async def test_unknown_congestion_control_is_a_dependency_error(sink: BulkSink) -> None:
    with pytest.raises(DependencyError, match="no-such-cc"):
        await measure_bandwidth(
            ProbeTarget("127.0.0.1", sink.port),
            TOKEN,
            duration_s=0.2,
            congestion_control="no-such-cc",
        )


async def test_no_sink_is_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(PeerUnreachableError):
        await measure_bandwidth(ProbeTarget("127.0.0.1", port), TOKEN, duration_s=0.2)


@pytest.fixture
def iperf3_server() -> Iterator[int]:
    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    proc = subprocess.Popen(
        ["iperf3", "-s", "-B", "127.0.0.1", "-p", str(port), "-1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                proc.poll()
                assert proc.returncode is None, "iperf3 -s exited"
                subprocess.run(["sleep", "0.05"], check=True)
        # That probe connection used up `-1`'s single test: start a fresh server.
        proc.terminate()
        proc.wait(5)
        proc = subprocess.Popen(
            ["iperf3", "-s", "-B", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        subprocess.run(["sleep", "0.3"], check=True)
        yield port
    finally:
        proc.terminate()
        proc.wait(5)


async def test_iperf3_subprocess_on_loopback(iperf3_server: int) -> None:
    result = await run_iperf3(
        "127.0.0.1", iperf3_server, duration_s=1, streams=2, congestion_control="cubic"
    )
    assert result.streams == 2
    assert result.received_bps > 100e6
    assert result.congestion_control == "cubic"


async def test_iperf3_without_a_server_is_unreachable() -> None:
    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(PeerUnreachableError):
        await run_iperf3("127.0.0.1", port, duration_s=0.5, timeout_s=1)


async def test_missing_iperf3_binary_is_a_dependency_error() -> None:
    with pytest.raises(DependencyError, match="not installed"):
        await run_iperf3("127.0.0.1", 5201, binary="netopt-no-such-iperf3")
