"""The relay's loop and control socket, on datagram socket pairs instead of TUN devices."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from netopt.errors import LabError
from netopt.lab.emulator import DirectionShape
from netopt.lab.relay import Endpoint, RelaySpec, relay_request, run_relay


def spec(tmp_path: Path, watch_pid: int, **shape: float) -> RelaySpec:
    fields = {"rate_bps": 1e9, "delay_ns": 20_000_000}
    fields.update(shape)
    direction = DirectionShape(**fields)  # type: ignore[arg-type]
    return RelaySpec(
        label="link-a-b",
        a=Endpoint("ns-a", "x0"),
        b=Endpoint("ns-b", "x0"),
        a_to_b=direction,
        b_to_a=direction,
        control_path=str(tmp_path / "relay.sock"),
        seed=5,
        watch_pid=watch_pid,
    )


@dataclass
class Running:
    a: socket.socket
    b: socket.socket
    control: str
    thread: threading.Thread


@pytest.fixture
def relay(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Running]:
    shape = getattr(request, "param", {})
    # The relay exits when the process it watches does: a sleeping child we kill at the end.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    relay_spec = spec(tmp_path, sleeper.pid, **shape)
    a_test, a_relay = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    b_test, b_relay = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    for sock in (a_relay, b_relay):
        sock.setblocking(False)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(relay_spec.control_path)
    server.listen(4)
    server.setblocking(False)
    thread = threading.Thread(
        target=run_relay, args=(relay_spec, a_relay.fileno(), b_relay.fileno(), server)
    )
    thread.start()
    a_test.settimeout(5)
    b_test.settimeout(5)
    try:
        yield Running(a_test, b_test, relay_spec.control_path, thread)
    finally:
        sleeper.kill()
        sleeper.wait()
        thread.join(timeout=10)
        assert not thread.is_alive()
        for sock in (a_test, a_relay, b_test, b_relay, server):
            sock.close()


def test_packets_cross_in_order_after_the_delay(relay: Running) -> None:
    sent_at = time.monotonic()
    for i in range(20):
        relay.a.send(b"%03d" % i + b"x" * 97)
    got = [relay.b.recv(2048) for _ in range(20)]
    assert time.monotonic() - sent_at >= 0.020  # never early
    assert [int(p[:3]) for p in got] == list(range(20))
    relay.b.send(b"reply")
    assert relay.a.recv(2048) == b"reply"
    stats = relay_request(relay.control, "stats")
    assert stats["a_to_b"]["packets"] == 20
    assert stats["a_to_b"]["bytes"] == 2000
    assert stats["b_to_a"]["packets"] == 1
    assert stats["up"] is True


def test_cut_link_drops_and_counts(relay: Running) -> None:
    assert relay_request(relay.control, "down")["up"] is False
    for _ in range(5):
        relay.a.send(b"lost")
    stats = relay_request(relay.control, "stats")
    assert stats["a_to_b"]["drops_link_down"] == 5
    assert relay_request(relay.control, "up")["up"] is True
    relay.a.send(b"through")
    assert relay.b.recv(2048) == b"through"


@pytest.mark.parametrize("relay", [{"loss_ratio": 0.3, "delay_ns": 0}], indirect=True)
def test_loss_is_counted_by_cause(relay: Running) -> None:
    for _ in range(200):
        relay.a.send(b"p" * 50)
    # Every packet is either delivered or dropped for loss; wait for the count to settle.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stats = relay_request(relay.control, "stats")["a_to_b"]
        if stats["packets"] + stats["drops_loss"] == 200:
            break
        time.sleep(0.01)
    assert stats["packets"] + stats["drops_loss"] == 200
    assert 30 < stats["drops_loss"] < 90  # 60 expected; seeded, so never flaky
    assert stats["drops_queue"] == 0


def test_unknown_command_is_refused(relay: Running) -> None:
    assert "unknown command" in relay_request(relay.control, "explode")["error"]


def test_a_dead_relay_is_a_lab_error(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="did not answer"):
        relay_request(tmp_path / "none.sock", "stats", timeout_s=0.5)


def test_spec_round_trips_through_json(tmp_path: Path) -> None:
    original = spec(tmp_path, os.getpid(), loss_ratio=0.01, jitter_ns=1000)
    assert RelaySpec.from_json(original.to_json()) == original
