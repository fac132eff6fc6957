"""`netopt nccl-env --coordinator URL`: nodes, NICs and figures from a live coordinator."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from netopt.cli.coordinator_links import fetch_coordinator_links
from netopt.cli.doctor_cmd import _from_coordinator
from netopt.config import LinksSettings, parse_settings
from netopt.nccl.from_coordinator import links_from_coordinator
from netopt.wire.answers import LinksAnswer, NodesAnswer
from netopt.wire.client import CoordinatorClient
from tests.service.coordinator_helpers import (
    TOKEN,
    call,
    coordinator_process,
    registration,
    summary,
)

NODES = (
    ("hk-1", "hk", "198.18.1.10"),
    ("hk-2", "hk", "198.18.1.11"),
    ("us-1", "us", "198.18.2.10"),
)


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[str]:
    with coordinator_process(tmp_path) as url:
        yield url


def _seed(url: str, *, with_bandwidth: bool) -> None:
    now = time.time()
    for node, region, address in NODES:
        reg = registration(node, region, address)
        reg["nics"] = [
            {"name": "lo", "addresses": ["127.0.0.1/8"], "mtu": 65536},
            {"name": "docker0", "addresses": ["172.17.0.1/16"]},
            {"name": "eth0", "addresses": [f"{address}/24"], "speed_mbps": 25000, "mtu": 1500},
        ]
        call(url + "/api/v1/agents/register", "POST", reg)
    pairs = [("hk-1", "hk-2", 0.2, 9000e6), ("hk-1", "us-1", 160.0, 400e6)]
    if with_bandwidth:
        pairs.append(("hk-2", "us-1", 161.0, 380e6))
    else:
        pairs.append(("hk-2", "us-1", 161.0, None))
    for i, (src, dst, rtt_ms, bps) in enumerate(pairs):
        summaries = [summary(src, dst, now - 5, rtt_ms=rtt_ms, loss_ratio=0.001,
                             loss_ratio_ci95=[0.0, 0.01])]  # fmt: skip
        if bps is not None:
            summaries.append({
                "src": src, "dst": dst, "taken_at_s": now - 2, "window_s": 5.0,
                "method": "bulk-tcp", "single_stream_bps": bps / 4, "aggregate_bps": bps,
                "streams": 8, "congestion_control": "bbr",
            })  # fmt: skip
        call(url + f"/api/v1/agents/{src}/summaries", "POST",
              {"batch_id": f"b{i}", "summaries": summaries})  # fmt: skip


def _nccl_env(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netopt", "nccl-env", "--nodes", "hk-1,hk-2,us-1",
         "--coordinator", url, "--nccl-version", "2.26.2", *extra],
        env={**os.environ, "NETOPT_TOKEN": TOKEN}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def test_env_from_a_live_coordinator(coordinator: str) -> None:
    _seed(coordinator, with_bandwidth=True)
    proc = _nccl_env(coordinator)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "NCCL_SOCKET_IFNAME==eth0" in lines
    assert "GLOO_SOCKET_IFNAME=eth0" in lines
    assert "NCCL_SOCKET_FAMILY=AF_INET" in lines
    # every value is preceded by its reason
    for index, line in enumerate(lines):
        if line.startswith("NCCL_") and index > 0:
            assert lines[index - 1].startswith("#")
    # 160 ms, 0.1% loss, loss-based host TCP: one flow is far below 400 Mbit/s, so many sockets
    sockets = {
        k: int(v) for k, v in (x.split("=", 1) for x in lines if "NSOCKS" in x or "NTHREADS" in x)
    }
    assert sockets["NCCL_SOCKET_NTHREADS"] * sockets["NCCL_NSOCKS_PERTHREAD"] > 1


def test_a_pair_without_bandwidth_is_named(coordinator: str) -> None:
    _seed(coordinator, with_bandwidth=False)
    proc = _nccl_env(coordinator)
    assert proc.returncode == 2
    assert "hk-2" in proc.stderr
    assert "us-1" in proc.stderr


def test_links_and_coordinator_are_exclusive(coordinator: str) -> None:
    proc = _nccl_env(coordinator, "--links", "configs/links-example.yaml")
    assert proc.returncode == 2
    assert "exactly one of --links" in proc.stderr


def test_doctor_and_nccl_env_share_one_fetch_and_no_yaml_detour(coordinator: str) -> None:
    _seed(coordinator, with_bandwidth=False)
    fetched = fetch_coordinator_links(coordinator, TOKEN, 3600)
    assert list(fetched.settings.nodes) == ["hk-1", "hk-2", "us-1"]
    assert len(fetched.settings.links) == 2
    assert fetched.notes == ("hk-2<->us-1: no bandwidth figures yet",)

    async def answers() -> tuple[NodesAnswer, LinksAnswer]:
        async with CoordinatorClient(coordinator, TOKEN) as client:
            return await client.nodes(), await client.links(window_s=3600)

    nodes, links = asyncio.run(answers())
    document, _ = links_from_coordinator(nodes, links, fetched.settings.measured_at or "")
    via_yaml = parse_settings(yaml.safe_dump(document), "yaml", "links", env={})
    assert isinstance(via_yaml, LinksSettings)
    assert via_yaml == fetched.settings  # the old YAML round trip gave the same settings

    settings, peers = _from_coordinator(coordinator, TOKEN, "hk-1", ("hk-1", "hk-2"))
    assert list(settings.nodes) == ["hk-1", "hk-2", "us-1"]
    assert len(peers) == 1  # hk-2 only: us-1 is not wanted, hk-1 is the node itself
