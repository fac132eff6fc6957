"""``netopt bench train`` on loopback: a tiny model, 2 ranks, 3 steps.

Both runs (defaults: plain HTTP reads; netopt: CachedDataset) train real Gloo ranks on
shards of this machine's text. Same seed, same data order: the first step's loss
(before any update) is the same in both; every loss is finite; the report's JSON has
the fields the README promises, and the plot is written. Bounded by --timeout-s.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from netopt.cli.main import main

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:Failed to initialize NumPy"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

STEP_KEYS = {"step_s", "data_wait_s", "comm_exposed_s", "compute_s"}


def test_bench_train_loopback_two_runs_same_start(tmp_path: Path) -> None:
    out = tmp_path / "report"
    code = main([
        "bench", "train", "--ranks", "2", "--steps", "3", "--dim", "32", "--layers", "1",
        "--heads", "2", "--seq", "16", "--batch", "2", "--shards", "2", "--shard-size", "4KiB",
        "--out", str(out), "--timeout-s", "120", "--json",
    ])  # fmt: skip
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["where"] == "loopback"
    assert report["steps"] == 3
    assert report["model"]["tokenizer"].startswith("bytes")
    runs = report["runs"]
    assert set(runs) == {"defaults", "netopt"}
    for run in runs.values():
        assert run["steps"] == 3
        assert len(run["losses"]) == 3
        assert len(run["per_step"]) == 3
        assert all(math.isfinite(x) and 0 < x < 10 for x in run["losses"])
        for step in run["per_step"]:
            assert set(step) == STEP_KEYS
            assert step["step_s"] > 0
            parts = step["data_wait_s"] + step["comm_exposed_s"] + step["compute_s"]
            assert parts == pytest.approx(step["step_s"], rel=1e-6)
        assert run["time_to_n_s"] > 0
        assert run["grad_bytes"] == 4 * report["model"]["params"]
        assert 0 <= run["exposed_comm_share"] <= 1
        assert 0 <= run["exposed_after_backward_share"] <= 1  # the goal's measure
    assert runs["defaults"]["losses"][0] == pytest.approx(runs["netopt"]["losses"][0], rel=1e-6)
    assert runs["defaults"]["hook"] == "none"
    assert "<svg" in (out / "report.svg").read_text()
