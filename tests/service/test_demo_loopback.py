"""`netopt demo --loopback`: what a user without root gets, end to end on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.image


def test_loopback_demo_emulates_the_border_and_shares(tmp_path: Path) -> None:
    report_dir = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "netopt", "demo", "--loopback", "--report-dir", str(report_dir),
         "--dataset-mb", "4", "--train-steps", "2", "--json"],
        capture_output=True, text=True, timeout=400, check=False,
        # A node already set up for a real cluster: the demo must use only its own settings.
        env={**os.environ, "NETOPT_TOKEN": "production-token-0123456789",
             "NETOPT_COORDINATOR": "http://127.0.0.1:1", "NETOPT_AGENT__REGION": "eu"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert report["mode"] == "loopback"
    # The hk <-> us bandwidth test went through the user-space link (100 Mbit/s), not
    # plain loopback (Gbit/s).
    cross = [pair for pair in report["bandwidth"] if pair.startswith("hk") and "us" in pair]
    assert cross
    for pair in cross:
        assert report["bandwidth"][pair]["aggregate_mbps"] < 150
        assert report["bandwidth"][pair]["rtt_p50_ms"] >= 80.0  # 40 ms each way, emulated
    border = report["border_bytes"]
    shared = [s for s in report["syncs"] if s["kind"] == "shared"]
    assert len(shared) == 3
    assert sum(s["sharing"]["chunks_from_peers"] for s in shared) == 2 * sum(
        s["sharing"]["chunks_from_source"] for s in shared
    )
    # Relay payload bytes: the shared syncs cross once, the naive ones three times.
    assert 0 < border["netopt_bytes"] < 0.45 * border["naive_per_node_bytes"]
    for plot in report["plots"]:
        pixels = matplotlib.image.imread(plot)
        assert pixels.std() > 0.05  # not a blank image
    assert (report_dir / "nccl.env").is_file() or report["notes"]
    # The training section: two loopback ranks (no border), both runs metered.
    train = report["train"]
    assert train["where"] == "loopback"
    assert train["steps"] == 2
    for name in ("defaults", "netopt"):
        assert train[name]["step_s"] > 0
        assert 0 <= train[name]["exposed_comm_share"] <= 1
    assert json.loads((report_dir / "train" / "report.json").read_text())["steps"] == 2
    assert Path(train["plot"]).read_text().startswith("<svg")
