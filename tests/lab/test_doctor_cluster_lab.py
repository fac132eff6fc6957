"""`netopt doctor --coordinator URL --via-agents`: the doctor on every node through
the agents, on the two-region lab with a port blocked in one namespace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from netopt.demo.cluster import Cluster
from netopt.demo.sites import LabSite
from tests.lab.conftest import CONFIGS, MakeLab


@pytest.mark.lab
def test_cluster_doctor_finds_the_blocked_direction(make_lab: MakeLab, tmp_path: Path) -> None:
    lab = make_lab(CONFIGS / "lab" / "two-region.yaml")
    cluster = Cluster(LabSite(lab), tmp_path / "cluster", probe_rate_pps=20, probe_window_s=2)
    cluster.start()
    cluster.wait_for_full_matrix(timeout_s=60)
    # us-1 drops new connections to the rendezvous port from hk-1 only.
    nft = ["ip", "netns", "exec", lab.netns("us-1"), "nft"]
    subprocess.run([*nft, "add table inet doctortest"], check=True)
    subprocess.run(
        [*nft, "add chain inet doctortest input { type filter hook input priority 0 ; }"],
        check=True,
    )
    subprocess.run(
        [*nft, f"add rule inet doctortest input ip saddr {lab.address('hk-1')} "
               "tcp dport 29500 drop"],
        check=True,
    )  # fmt: skip
    proc = lab.exec(
        "hk-2",
        [sys.executable, "-m", "netopt", "doctor", "--coordinator", cluster.coordinator_url,
         "--via-agents", "--no-mtu", "--token-file", str(cluster.token_file), *cluster.tls_args(),
         "--json"],
        timeout_s=240,
    )  # fmt: skip
    report = json.loads(proc.stdout)
    assert sorted(report["nodes"]) == sorted(lab.nodes)
    blocked = [f for f in report["findings"] if f["check"] == "ports"]
    # Exactly one direction of one pair is blocked, seen from its source, hk-1.
    assert [f["node"] for f in blocked] == ["hk-1"]
    assert f"-> {lab.address('us-1')} tcp/29500" in blocked[0]["title"]
    assert report["hosts"]["us-1"] == lab.address("us-1")
    assert f"ip saddr {lab.address('hk-1')}" in blocked[0]["fix"]
    # Every node ran its host checks and said what it could not check.
    assert {s["node"] for s in report["not_checked"]} == set(lab.nodes)
