"""`netopt probe serve` and `netopt probe TARGET` as real processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from netopt.cli.probe_cmd import parse_address
from netopt.errors import ValidationError

TOKEN = "cli-test-token-0123456789"


def netopt(
    *args: str, token: str | None = TOKEN, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NETOPT_TOKEN"}
    if token is not None:
        env["NETOPT_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "netopt", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    env = {**os.environ, "NETOPT_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "netopt", "probe", "serve", "--bind", "127.0.0.1:0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)$", line.strip())
        assert match, f"unexpected first line from serve: {line!r}"
        yield int(match.group(1)), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)


def test_probe_json_has_units_in_every_key(server: tuple[int, subprocess.Popen[str]]) -> None:
    port, _ = server
    done = netopt(
        "probe",
        f"127.0.0.1:{port}",
        "--duration",
        "0.5",
        "--rate",
        "200",
        "--bandwidth",
        "--bandwidth-duration",
        "0.3",
        "--cc",
        "cubic",
        "--streams",
        "2",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["method"] == "udp"
    assert data["probes_sent"] == 100
    assert data["loss_ratio"] == 0
    assert 0 < data["rtt_ms"]["p50"] < 100
    assert data["jitter_ms"] >= 0
    bandwidth = data["bandwidth"]
    assert bandwidth["congestion_control"] == "cubic"
    assert bandwidth["streams"] == 2
    assert bandwidth["streams_chosen"] == "given"
    assert bandwidth["single_stream_bps"] > 0
    assert bandwidth["aggregate_bps"] > 0
    assert 0 < bandwidth["tcp_efficiency_pct"] <= 100


def test_probe_table(server: tuple[int, subprocess.Popen[str]]) -> None:
    port, _ = server
    done = netopt("probe", f"127.0.0.1:{port}", "--duration", "0.3", "--rate", "50")
    assert done.returncode == 0, done.stderr
    assert "rtt_ms.p50" in done.stdout
    assert "loss_ratio" in done.stdout


def test_unreachable_target_exits_1_with_a_clear_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, socket.socket() as tcp:
        udp.bind(("127.0.0.1", 0))
        port = udp.getsockname()[1]
    del tcp
    done = netopt("probe", f"127.0.0.1:{port}", "--timeout", "0.3", "--duration", "1", "--json")
    assert done.returncode == 1
    error = json.loads(done.stdout)
    assert error["error"] == "PeerUnreachableError"
    assert "no UDP answer within 0.3 s" in error["message"]


def test_missing_token_is_a_usage_error() -> None:
    done = netopt("probe", "127.0.0.1:9", "--duration", "0.1", token=None)
    assert done.returncode == 2
    assert "token" in done.stderr


def test_serve_counts_what_it_saw_and_stops_on_sigterm() -> None:
    env = {**os.environ, "NETOPT_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "netopt", "probe", "serve", "--bind", "127.0.0.1:0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        port = int(proc.stderr.readline().strip().rsplit(":", 1)[1])
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _ in range(3):
                sock.sendto(b"garbage", ("127.0.0.1", port))
        assert (
            netopt("probe", f"127.0.0.1:{port}", "--duration", "0.2", "--rate", "50").returncode
            == 0
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    counters = json.loads(out)
    assert counters["reflector"]["truncated"] == 3
    assert counters["reflector"]["reflected"] >= 10


def test_parse_address() -> None:
    assert parse_address("10.0.0.1") == ("10.0.0.1", 7471)
    assert parse_address("10.0.0.1:99") == ("10.0.0.1", 99)
    assert parse_address("[::1]:5") == ("::1", 5)
    assert parse_address("::1") == ("::1", 7471)
    assert parse_address("node-a.example:0") == ("node-a.example", 0)
    for bad in ("", ":5", "h:99999", "h:x", "a:b:c"):
        with pytest.raises(ValidationError):
            parse_address(bad)
