"""`netopt sync` runs leave totals in the cache, and the node's agent exports them.

Real `netopt serve`-style server and real `netopt sync` processes on loopback: a first
sync (everything fetched), a second one (everything found in the cache: the hit ratio's
numerator), a refused one (a wrong token: a failed run). A real agent whose cache is that
directory then exports the totals at /metrics, and promtool accepts the text.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from netopt.cache.synctotals import read_totals
from tests.service.coordinator_helpers import free_port
from tests.service.dataplane_helpers import TOKEN, make_dataset, start
from tests.service.test_agent_daemon import _wait
from tests.service.test_metrics_conventions import _promtool

REPO = Path(__file__).resolve().parents[2]


async def _sync(url: str, dest: Path, cache: Path, token: str) -> int:
    env = {**os.environ, "NETOPT_TOKEN": token}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "netopt", "sync", url, str(dest), "--cache-dir", str(cache),
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return await asyncio.wait_for(proc.wait(), 120)


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("netopt_sync_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _agent_metrics(tmp_path: Path, cache: Path) -> str:
    """Start a real agent on ``cache`` and return its /metrics text."""
    http_port = free_port()
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"kind: agent\nnode: a1\nregion: hk\ncoordinator_url: http://127.0.0.1:{free_port()}\n"
        f"listen: {{host: 127.0.0.1, port: {http_port}}}\n"
        f"probe: {{port: {free_port()}}}\nspool: {{dir: {tmp_path / 'spool'}}}\n"
        f"cache: {{dir: {cache}}}\n"
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "netopt", "agent", "--config", str(config)],
        env={**os.environ, "NETOPT_TOKEN": TOKEN}, cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    metrics_url = f"http://127.0.0.1:{http_port}/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            body: bytes = response.read()
        return body.decode()

    try:
        text: str = _wait(scrape, 30, "the agent's /metrics")
    finally:
        agent.kill()
        agent.wait(10)
    return text


async def test_sync_totals_reach_the_agents_metrics(tmp_path: Path) -> None:
    src, cache = tmp_path / "src", tmp_path / "cache"
    files = make_dataset(src)
    size = sum(len(data) for data in files.values())
    runner, port, _, _ = await start(src, "ds")
    url = f"netopt://127.0.0.1:{port}/ds"
    try:
        assert await _sync(url, tmp_path / "d1", cache, TOKEN) == 0
        assert await _sync(url, tmp_path / "d2", cache, TOKEN) == 0
        assert await _sync(url, tmp_path / "d3", cache, "wrong-token-0123456789") != 0
    finally:
        await runner.cleanup()
    totals = read_totals(cache)["ds"]
    assert (totals.runs_ok, totals.runs_failed) == (2, 1)
    assert totals.written_bytes == 2 * size  # both DESTs were empty
    assert totals.fetched_bytes == size  # the first fetched everything ...
    assert totals.reused_bytes >= size  # ... the second found it all in the cache
    assert totals.origin_wire_bytes > 0
    assert totals.peer_wire_bytes == 0

    text = await asyncio.to_thread(_agent_metrics, tmp_path, cache)
    got = _samples(text)
    assert got['netopt_sync_runs_total{dataset="ds",outcome="ok"}'] == 2
    assert got['netopt_sync_runs_total{dataset="ds",outcome="failed"}'] == 1
    assert got['netopt_sync_written_bytes_total{dataset="ds"}'] == 2 * size
    assert got['netopt_sync_fetched_bytes_total{dataset="ds"}'] == size
    assert got['netopt_sync_reused_bytes_total{dataset="ds"}'] == totals.reused_bytes
    assert got['netopt_sync_wire_bytes_total{dataset="ds",source="origin"}'] > 0
    assert got['netopt_sync_wire_bytes_total{dataset="ds",source="peers"}'] == 0
    assert got['netopt_sync_duration_seconds_total{dataset="ds"}'] > 0
    assert got['netopt_sync_last_success_timestamp_seconds{dataset="ds"}'] > 1.7e9
    lint = _promtool(text)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert lint.stdout.strip() == "", lint.stdout
