"""Real agents and a coordinator (processes on loopback) export metrics that follow
Prometheus's conventions (``promtool check metrics``: base units, ``_total`` counters),
and the coordinator exports the link matrix with the loss's interval, never a bare 0."""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request

import pytest

from tests.service.test_agent_daemon import (
    TOKEN,
    Cluster,
    _measured_pairs,
    _planned_pairs,
    _wait,
    cluster,
)

__all__ = ["cluster"]


def _metrics(url: str, token: str | None) -> str:
    assert url.startswith("http://127.0.0.1:")
    request = urllib.request.Request(url)  # noqa: S310 - loopback http only (asserted)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
        body: bytes = response.read()
    return body.decode()


def _promtool(text: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus; scripts/setup.sh --dev)")
    return subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )


def test_agent_and_coordinator_metrics_pass_promtool(cluster: Cluster) -> None:
    cluster.start_coordinator()
    cluster.start_agents()

    def matrix_full() -> bool:
        planned = _planned_pairs(cluster.url)
        return bool(planned) and planned <= _measured_pairs(cluster.url)

    _wait(matrix_full, 40, "every planned pair in the link matrix")
    coordinator = _metrics(cluster.url + "/metrics", TOKEN)
    agent = _metrics(f"http://127.0.0.1:{cluster.http_ports['a1']}/metrics", None)
    # promtool's lint does fail on what it checks (so passing means something).
    bad = _promtool("# HELP y_milliseconds In ms.\n# TYPE y_milliseconds gauge\ny_milliseconds 1\n")
    assert bad.returncode != 0
    assert "base unit" in bad.stdout + bad.stderr
    for name, text in (("coordinator", coordinator), ("agent", agent)):
        done = _promtool(text)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
        assert done.stdout.strip() == "", f"{name}: {done.stdout}"
    assert "netopt_agent_rtt_p50_seconds{" in agent
    assert "netopt_agent_reflector_packets_total{" in agent
    assert "netopt_agent_spool_dropped_batches_total " in agent
    assert "netopt_agent_served_payload_bytes_total " in agent
    # The link matrix: RTT in seconds, loss with its interval and the probes behind it.
    lines = [line for line in coordinator.splitlines() if line.startswith("netopt_link_")]
    rtts = [
        line
        for line in lines
        if line.startswith(("netopt_link_rtt_p50_seconds{", "netopt_link_rtt_p99_seconds{"))
    ]
    assert rtts
    for line in rtts:
        value = float(line.rsplit(" ", 1)[1])
        assert 0 < value < 1.0, line  # seconds on loopback, not milliseconds
    uppers = [line for line in lines if line.startswith("netopt_link_loss_ratio_upper{")]
    assert uppers
    for line in uppers:
        assert float(line.rsplit(" ", 1)[1]) > 0, line  # 0 lost still has an upper bound
    assert any(line.startswith("netopt_link_probes{") for line in lines)
    # `netopt status` shows a loopback link's 0 loss with its bound, not a bare 0.
    status = subprocess.run(
        [sys.executable, "-m", "netopt", "status", "--coordinator", cluster.url],
        env={**cluster.env, "COLUMNS": "200"}, capture_output=True, text=True, check=False,
        timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert "0 (< " in status.stdout, status.stdout
