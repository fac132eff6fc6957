"""`netopt demo` end to end on the lab, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from netopt.config import load_settings
from netopt.lab.emulator import EARLY_NS


@pytest.mark.lab
def test_demo_measures_tunes_and_crosses_the_border_once(tmp_path: Path) -> None:
    report_dir = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "netopt", "demo", "--report-dir", str(report_dir),
         "--dataset-mb", "8", "--train-steps", "2", "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["mode"] == "lab"
    assert json.loads((report_dir / "report.json").read_text()) == report

    cross = [m for m in report["matrix"] if m["src"][:2] != m["dst"][:2]]
    assert cross
    # 40 ms each way (the emulator's accuracy has tests of its own); the relay sends a
    # packet due within EARLY_NS at once, so a round trip may be 2 x EARLY_NS short (a p50
    # of 79.978 ms failed the bound of 80.0 once in four runs).
    shortest_ms = 80.0 - 2 * EARLY_NS / 1e6
    for m in cross:
        assert shortest_ms <= m["rtt_p50_ms"] <= 85.0
    # The links file the demo wrote is a valid links file, and the env file exists.
    load_settings(report_dir / "links.yaml", "links", env={})
    env = (report_dir / "nccl.env").read_text()
    assert "NCCL_SOCKET_IFNAME==eth0" in env or "NCCL_SOCKET_IFNAME=" in env
    assert "NCCL_IB_DISABLE=1" in env

    border = report["border_bytes"]
    shared = [s for s in report["syncs"] if s["kind"] == "shared"]
    naive = [s for s in report["syncs"] if s["kind"] == "naive"]
    assert len(shared) == len(naive) == border["hk_nodes"] == 3
    for sync in report["syncs"]:
        assert sync["logical_bytes"] == border["dataset_bytes"]
    # Shared: every chunk came from us once, the other two copies from hk peers.
    from_us = sum(s["sharing"]["chunks_from_source"] for s in shared)
    assert from_us > 0
    assert sum(s["sharing"]["chunks_from_peers"] for s in shared) == 2 * from_us
    # The dataset is compressible: fewer bytes cross the border than it holds, and the
    # naive way crosses about three times as often. (The counter also sees the agents'
    # probes and the acknowledgements going back: a few kB per second.)
    assert border["netopt_bytes"] < border["dataset_bytes"]
    assert border["netopt_bytes"] < 0.45 * border["naive_per_node_bytes"]
    for plot in report["plots"]:
        data = Path(plot).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert len(data) > 10_000

    # The training section: both DDP runs on a lab of the demo's shape; the advised
    # hierarchical hook sends less across the border per step than the flat ring.
    train = report["train"]
    assert train["where"] == "lab"
    assert train["netopt"]["hook"].startswith("hierarchical")
    for direction in ("hk->us", "us->hk"):
        assert (
            train["netopt"]["border_bytes_per_step"][direction]
            < 0.5 * train["defaults"]["border_bytes_per_step"][direction]
        )
    for run in (train["defaults"], train["netopt"]):
        assert run["step_s"] > 0
        assert 0 < run["final_loss"] < 10
    assert Path(train["plot"]).read_text().startswith("<svg")
