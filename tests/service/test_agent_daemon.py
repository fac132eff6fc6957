"""Agents and a coordinator as real processes on loopback.

Three agents in two regions register, follow the probe plan and fill the link
matrix. Then the coordinator is SIGKILLed for 20 s and restarted on the same
database: the agents spool, replay in order, and every summary they measured is
stored exactly once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service.coordinator_helpers import free_port

TOKEN = "agent-test-token-0123456789"
AGENTS = (("a1", "hk"), ("a2", "hk"), ("b1", "us"))
STOP_LINE = re.compile(
    r"agent (\S+) stopped: (\d+) summaries measured, (\d+) acknowledged, "
    r"(\d+) batches still spooled, (\d+) batches dropped"
)


def _get(url: str, token: str | None = TOKEN) -> Any:
    assert url.startswith("http://127.0.0.1:")
    request = urllib.request.Request(url)  # noqa: S310 - loopback http only (asserted)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
        return json.loads(response.read())


def _wait(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last_error = exc
            value = None
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_error})")


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.coord_port = free_port()
        self.db = root / "coordinator.db"
        self.env = {**os.environ, "NETOPT_TOKEN": TOKEN}
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.http_ports: dict[str, int] = {}
        (root / "coordinator.yaml").write_text(
            f"kind: coordinator\nlisten: {{host: 127.0.0.1, port: {self.coord_port}}}\n"
            f"database: {self.db}\nstale_after_s: 60\n"
        )
        for node, region in AGENTS:
            self.http_ports[node] = free_port()
            (root / f"{node}.yaml").write_text(
                f"kind: agent\nnode: {node}\nregion: {region}\n"
                f"coordinator_url: http://127.0.0.1:{self.coord_port}\n"
                f"listen: {{host: 127.0.0.1, port: {self.http_ports[node]}}}\n"
                "heartbeat_interval_s: 1\nreport_interval_s: 1\n"
                f"probe: {{port: {free_port()}, rate_pps: 20, window_s: 1}}\n"
                f"spool: {{dir: {root / ('spool-' + node)}}}\n"
                f"cache: {{dir: {root / ('cache-' + node)}}}\n"
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.coord_port}"

    def start_coordinator(self) -> None:
        config = str(self.root / "coordinator.yaml")
        with (self.root / "coordinator.log").open("ab") as log:
            self.coordinator = subprocess.Popen(
                [sys.executable, "-m", "netopt", "coordinator", "--config", config],
                env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait(lambda: _get(self.url + "/healthz", None), 20, "the coordinator")

    def start_agents(self) -> None:
        for node, _ in AGENTS:
            config = str(self.root / f"{node}.yaml")
            with (self.root / f"{node}.log").open("ab") as log:
                self.agents[node] = subprocess.Popen(
                    [sys.executable, "-m", "netopt", "--log-level", "info", "agent",
                     "--config", config],
                    env=self.env, stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip

    def health(self, node: str) -> dict[str, Any]:
        result: dict[str, Any] = _get(f"http://127.0.0.1:{self.http_ports[node]}/healthz", None)
        return result

    def stop_all(self) -> None:
        for proc in [*self.agents.values(), self.coordinator]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


def _planned_pairs(url: str) -> set[tuple[str, str]]:
    plan = _get(url + "/api/v1/plan")
    return {(probe["src"], probe["dst"]) for probe in plan["probes"]}


def _measured_pairs(url: str) -> set[tuple[str, str]]:
    links = _get(url + "/api/v1/links")["links"]
    return {
        (x["src"], x["dst"]) for x in links if (x["latest"] or {}).get("rtt_p50_ms") is not None
    }


def test_agents_fill_the_matrix_and_survive_a_coordinator_outage(cluster: Cluster) -> None:
    cluster.start_coordinator()
    cluster.start_agents()
    _wait(lambda: len(_get(cluster.url + "/api/v1/nodes")["nodes"]) == 3, 30, "3 registrations")

    def matrix_full() -> bool:
        planned = _planned_pairs(cluster.url)
        return bool(planned) and planned <= _measured_pairs(cluster.url)

    _wait(matrix_full, 30, "every planned pair in the link matrix")
    planned = _planned_pairs(cluster.url)
    # Full mesh inside hk is one pair; every hk node sees us (or us sees it).
    assert any({"a1", "a2"} == set(p) for p in planned)
    assert any("b1" in p for p in planned)
    links = {(x["src"], x["dst"]): x for x in _get(cluster.url + "/api/v1/links")["links"]}
    for pair in planned:
        latest = links[pair]["latest"]
        assert latest["loss_ratio"] == 0.0
        assert 0 < latest["rtt_p50_ms"] < 50  # loopback

    assert cluster.coordinator is not None
    cluster.coordinator.send_signal(signal.SIGKILL)
    cluster.coordinator.wait(10)
    probers = sorted({src for src, _ in planned})
    _wait(lambda: all(cluster.health(n)["spool_bytes"] > 0 for n in probers), 15, "spooling")
    time.sleep(20)
    assert all(cluster.health(n)["spool_bytes"] > 0 for n in probers)

    cluster.start_coordinator()
    _wait(lambda: all(cluster.health(n)["spool_bytes"] == 0 for n, _ in AGENTS), 30, "replay")

    for proc in cluster.agents.values():
        proc.send_signal(signal.SIGTERM)
    for proc in cluster.agents.values():
        assert proc.wait(20) == 0
    cluster.coordinator.send_signal(signal.SIGTERM)
    assert cluster.coordinator.wait(20) == 0

    with sqlite3.connect(cluster.db) as db:
        stored = dict(db.execute("SELECT node, COUNT(*) FROM summaries GROUP BY node").fetchall())
        batches = db.execute("SELECT COUNT(*), COUNT(DISTINCT node || batch_id) FROM batches")
        total_batches, distinct_batches = batches.fetchone()
    assert total_batches == distinct_batches
    for node, _ in AGENTS:
        match = STOP_LINE.search((cluster.root / f"{node}.log").read_text())
        assert match, f"{node} did not log its final counts"
        measured, acknowledged, still_spooled, dropped = map(int, match.groups()[1:])
        assert still_spooled == 0
        assert dropped == 0
        assert measured == acknowledged
        # Nothing lost, nothing counted twice:
        assert stored.get(node, 0) == measured
