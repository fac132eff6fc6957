"""``netopt lab up|status|exec|link|down`` as a user runs them, in separate processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netopt.lab.netns import list_netns

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]


def netopt(state_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NETOPT_LAB_STATE_DIR": str(state_dir)}
    proc = subprocess.run(
        [sys.executable, "-m", "netopt", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    if check:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


def test_up_status_exec_link_down(tmp_path: Path) -> None:
    up = json.loads(netopt(tmp_path, "lab", "up", "configs/lab/three-region.yaml", "--json").stdout)
    prefix = up["prefix"]
    try:
        assert {n["name"] for n in up["nodes"]} == {"hk-1", "hk-2", "sh-1", "sh-2", "sg-1", "sg-2"}
        # The lab outlives `lab up`: its namespaces and relays keep running.
        assert f"{prefix}-sg-2" in list_netns()

        ping = netopt(tmp_path, "lab", "exec", "hk-1", "--", "ping", "-c", "2", "-i", "0.1", "sg-2")
        assert "2 received" in ping.stdout

        [status] = json.loads(netopt(tmp_path, "lab", "status", "--json").stdout)
        assert status["prefix"] == prefix
        assert not status["stale"]
        hk_sg = next(c for c in status["counters"]["links"] if c["link"] == "hk-sg")
        assert hk_sg["hk->sg"]["packets"] >= 2
        assert hk_sg["sg->hk"]["bytes"] >= 2 * 84

        netopt(tmp_path, "lab", "link", "hk", "sg", "--down")
        cut = netopt(
            tmp_path, "lab", "exec", "hk-1", "--", "ping", "-c", "1", "-W", "1", "sg-1", check=False
        )
        assert cut.returncode == 1  # the command's own exit code
        text = netopt(tmp_path, "lab", "status", "three-region").stdout
        assert "DOWN" in text
        netopt(tmp_path, "lab", "link", "sg", "hk", "--up")
        netopt(tmp_path, "lab", "exec", "hk-1", "--", "ping", "-c", "1", "-W", "2", "sg-1")
    finally:
        down = netopt(tmp_path, "lab", "down", prefix)
    assert prefix in down.stdout
    assert not [ns for ns in list_netns() if ns.startswith(prefix)]
    assert not (tmp_path / prefix).exists()


def test_bad_topology_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("regions: {hk: {nodes: [hk-1]}}\nlinks: [{between: [hk, us]}]\n")
    proc = netopt(tmp_path, "lab", "up", str(bad), check=False)
    assert proc.returncode == 2
    assert "unknown region 'us'" in proc.stderr
