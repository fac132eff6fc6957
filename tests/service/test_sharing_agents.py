"""Region sharing through real processes on loopback: a coordinator, two hk agents and a
`netopt serve` origin; `netopt sync --config AGENT.yaml` as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_agent_daemon import _get, _wait

from tests.service.coordinator_helpers import free_port
from tests.service.dataplane_helpers import check_tree, make_dataset

TOKEN = "sharing-test-token-0123456789"


class Processes:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {**os.environ, "NETOPT_TOKEN": TOKEN}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.coord_port = free_port()
        self.agent_ports = {"hk-1": free_port(), "hk-2": free_port()}
        self.origin_port = free_port()

    def spawn(self, name: str, *args: str) -> None:
        with (self.root / f"{name}.log").open("ab") as log:
            argv = [sys.executable, "-m", "netopt", *args]
            proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
            self.procs.append(proc)

    def agent_config(self, node: str) -> Path:
        return self.root / f"{node}.yaml"

    def start(self, origin: Path) -> None:
        (self.root / "coordinator.yaml").write_text(
            f"kind: coordinator\nlisten: {{host: 127.0.0.1, port: {self.coord_port}}}\n"
            f"database: {self.root / 'coordinator.db'}\nstale_after_s: 60\n"
        )
        self.spawn("coordinator", "coordinator", "--config", str(self.root / "coordinator.yaml"))
        _wait(lambda: _get(f"http://127.0.0.1:{self.coord_port}/healthz", None), 20, "coordinator")
        for node, port in self.agent_ports.items():
            self.agent_config(node).write_text(
                f"kind: agent\nnode: {node}\nregion: hk\n"
                f"coordinator_url: http://127.0.0.1:{self.coord_port}\n"
                f"listen: {{host: 127.0.0.1, port: {port}}}\n"
                "heartbeat_interval_s: 1\nreport_interval_s: 1\n"
                f"probe: {{port: {free_port()}, rate_pps: 5, window_s: 1}}\n"
                f"spool: {{dir: {self.root / ('spool-' + node)}}}\n"
                f"cache: {{dir: {self.root / ('cache-' + node)}}}\n"
            )
            self.spawn(node, "agent", "--config", str(self.agent_config(node)))
        self.spawn("origin", "serve", str(origin), "--name", "ds", "--chunk-size", "65536",
                   "--bind", f"127.0.0.1:{self.origin_port}")  # fmt: skip

        def all_live() -> bool:
            nodes = _get(f"http://127.0.0.1:{self.coord_port}/api/v1/nodes", TOKEN)["nodes"]
            return sum(n["state"] == "live" for n in nodes) == 2

        _wait(all_live, 30, "both agents")
        _wait(lambda: _get(f"http://127.0.0.1:{self.origin_port}/v1/health", None), 30, "origin")

    def sync(self, source: str, dest: Path, *args: str) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-m", "netopt", "sync", source, str(dest), "--json", *args],
            env=self.env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
        report: dict[str, Any] = json.loads(proc.stdout)
        return report

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    p = Processes(tmp_path)
    try:
        yield p
    finally:
        p.stop()


def test_the_second_node_syncs_from_the_first_nodes_agent(procs: Processes, tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "origin" / "ds")
    procs.start(tmp_path / "origin" / "ds")
    origin = f"netopt://127.0.0.1:{procs.origin_port}/ds"

    first = procs.sync(origin, tmp_path / "d1", "--config", str(procs.agent_config("hk-1")))
    chunks = first["sharing"]["chunks_from_source"]
    assert first["sharing"]["enabled"] is True
    assert chunks > 0
    assert first["sharing"]["chunks_from_peers"] == 0

    second = procs.sync(origin, tmp_path / "d2", "--config", str(procs.agent_config("hk-2")))
    assert second["sharing"]["chunks_from_peers"] == chunks
    assert second["sharing"]["chunks_from_source"] == 0
    check_tree(tmp_path / "d1", files)
    check_tree(tmp_path / "d2", files)

    # hk-1's agent is also a gateway: a node may sync straight from its cache.
    gateway = f"netopt://127.0.0.1:{procs.agent_ports['hk-1']}/ds"
    third = procs.sync(gateway, tmp_path / "d3", "--no-share", "--cache-dir",
                       str(tmp_path / "cache-3"))  # fmt: skip
    assert third["chunks_fetched"] == chunks
    check_tree(tmp_path / "d3", files)

    # The agent's data plane needs the token; its health page does not.
    agent = f"http://127.0.0.1:{procs.agent_ports['hk-1']}"
    with pytest.raises(urllib.error.HTTPError) as refused:
        _get(agent + "/v1/datasets/ds", None)
    assert refused.value.code == 401
    refused.value.close()
    assert _get(agent + "/healthz", None)["ok"] is True
    info = _get(agent + "/v1/datasets/ds", TOKEN)
    assert info["chunks"] == chunks
    assert info["sample"]  # sampled from the cached chunks: a far node can plan compression
