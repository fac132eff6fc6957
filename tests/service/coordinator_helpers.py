"""Shared pieces of the coordinator's service tests."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from netopt.config import CoordinatorSettings, ListenAddress, ProbePlanSettings

TOKEN = "coordinator-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
T0 = 1_800_000_000.0


class FakeClock:
    """Unix seconds that only move when told."""

    def __init__(self, now_s: float = T0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_settings(tmp_path: Path, port: int = 0, **over: Any) -> CoordinatorSettings:
    base: dict[str, Any] = {
        "listen": ListenAddress("127.0.0.1", port),
        "token": TOKEN,
        "database": str(tmp_path / "coordinator.db"),
        "stale_after_s": 30.0,
        "max_request_bytes": 64 * 1024,
        "probe_plan": ProbePlanSettings(per_node_budget=8, representatives_per_region_pair=1),
    }
    base.update(over)
    return CoordinatorSettings(**base)


def registration(node: str, region: str, host: str = "127.0.0.1") -> dict[str, Any]:
    return {
        "node": node,
        "region": region,
        "netopt_version": "0.1.0",
        "cpu_count": 8,
        "advertise_host": host,
        "nics": [{"name": "eth0", "addresses": [f"{host}/24"], "speed_mbps": 10000, "mtu": 1500}],
    }


def summary(
    src: str, dst: str, taken_at_s: float, rtt_ms: float = 10.0, **over: Any
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "src": src,
        "dst": dst,
        "taken_at_s": taken_at_s,
        "window_s": 10.0,
        "method": "udp",
        "probes_sent": 100,
        "probes_received": 99,
        "rtt_ms": {"min": rtt_ms * 0.9, "mean": rtt_ms, "p50": rtt_ms, "p90": rtt_ms * 1.1,
                   "p99": rtt_ms * 1.3, "max": rtt_ms * 1.5},
        "jitter_ms": rtt_ms / 20,
        "loss_ratio": 0.01,
        "loss_ratio_ci95": [0.002, 0.05],
    }  # fmt: skip
    data.update(over)
    return data


def batch(batch_id: str, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"batch_id": batch_id, "summaries": summaries}


def call(url: str, method: str = "GET", body: Any = None) -> Any:
    """One JSON request with the test token to a loopback coordinator."""
    assert url.startswith("http://127.0.0.1:")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - loopback
    request.add_header("Authorization", f"Bearer {TOKEN}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
        return json.loads(response.read())


@contextlib.contextmanager
def coordinator_process(tmp_path: Path) -> Iterator[str]:
    """`python -m netopt coordinator` on a free loopback port; yields its URL."""
    port = free_port()
    config = tmp_path / "c.yaml"
    config.write_text(
        f"kind: coordinator\nlisten: {{host: 127.0.0.1, port: {port}}}\n"
        f"database: {tmp_path / 'c.db'}\nstale_after_s: 600\n"
    )
    env = {**os.environ, "NETOPT_TOKEN": TOKEN}
    with (tmp_path / "c.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "netopt", "coordinator", "--config", str(config)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                call(url + "/healthz")
                break
            except (OSError, urllib.error.URLError):
                assert time.monotonic() < deadline, "coordinator did not start"
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)
