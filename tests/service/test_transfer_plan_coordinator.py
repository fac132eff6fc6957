"""`netopt plan --coordinator URL --to NODE`: link figures from a live coordinator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.coordinator_helpers import (
    TOKEN,
    call,
    coordinator_process,
    registration,
    summary,
)

CODEC_CACHE = {
    "version": 4,
    "cores": 2,
    "compress_bytes_per_s": {"1": 2.5e8, "3": 1.0e8, "5": 6.4e7, "7": 3.9e7, "9": 2.5e7},
    "decompress_bytes_per_s": {"1": 9e8, "3": 8e8, "5": 8e8, "7": 8e8, "9": 8e8},
    "hash_bytes_per_s": 2e9,
    "startup_s": 0.6,
}


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with coordinator_process(tmp_path_factory.mktemp("coordinator")) as url:
        _seed(url)
        yield url


def _seed(url: str) -> None:
    now = time.time()
    for node, region in (("hk-1", "hk"), ("us-1", "us"), ("sg-1", "sg")):
        call(url + "/api/v1/agents/register", "POST", registration(node, region))
    probes = summary("hk-1", "us-1", now - 5, rtt_ms=80.0, loss_ratio=0.01)
    bulk = {
        "src": "hk-1", "dst": "us-1", "taken_at_s": now - 2, "window_s": 5.0,
        "method": "bulk-tcp", "single_stream_bps": 60e6, "aggregate_bps": 85e6,
        "streams": 8, "congestion_control": "bbr",
    }  # fmt: skip
    call(url + "/api/v1/agents/hk-1/summaries", "POST",
          {"batch_id": "b1", "summaries": [probes, bulk]})  # fmt: skip
    # sg-1 -> us-1: probed, but no bandwidth test yet.
    probed = summary("sg-1", "us-1", now - 5, rtt_ms=170.0)
    call(url + "/api/v1/agents/sg-1/summaries", "POST", {"batch_id": "b2", "summaries": [probed]})


def _plan(tmp_path: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    sample = tmp_path / "s.jsonl"
    sample.write_bytes(b"".join(b'{"id": %d, "v": "abcabc"}\n' % i for i in range(40000)))
    cache = tmp_path / "codec.json"
    cache.write_text(json.dumps(CODEC_CACHE))
    return subprocess.run(
        [sys.executable, "-m", "netopt", "plan", "--coordinator", url, "--sample", str(sample),
         "--codec-cache", str(cache), "--size-bytes", "200000000", *extra],
        env={**os.environ, "NETOPT_TOKEN": TOKEN}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def test_plan_takes_the_pair_from_the_coordinator(tmp_path: Path, coordinator: str) -> None:
    proc = _plan(tmp_path, coordinator, "--to", "us-1", "--from", "hk-1", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert "hk-1 -> us-1" in plan["reasons"][0]
    assert "rtt p50 80 ms" in plan["reasons"][0]
    # ~85 Mbit/s measured, compressible sample: the logical rate beats the link.
    assert 60e6 < plan["wire_rate_bps"] <= 85e6
    assert plan["logical_rate_bps"] > plan["wire_rate_bps"]
    assert plan["startup_s"] > 0  # 0.6 from the codec cache (recalibrated on other core counts)


def test_plan_takes_this_node_from_the_agent_config(tmp_path: Path, coordinator: str) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(f"kind: agent\nnode: hk-1\nregion: hk\ncoordinator_url: {coordinator}\n")
    proc = _plan(tmp_path, coordinator, "--to", "us-1", "--config", str(config), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "hk-1 -> us-1" in json.loads(proc.stdout)["reasons"][0]


def test_a_pair_without_figures_is_named(tmp_path: Path, coordinator: str) -> None:
    proc = _plan(tmp_path, coordinator, "--to", "us-1", "--from", "sg-1")
    assert proc.returncode == 2
    assert "sg-1 -> us-1" in proc.stderr
    assert "bandwidth" in proc.stderr
    proc = _plan(tmp_path, coordinator, "--to", "sg-1", "--from", "hk-1")
    assert proc.returncode == 2
    assert "hk-1 -> sg-1" in proc.stderr
