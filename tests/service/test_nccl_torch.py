"""netopt.torch on real Gloo groups over loopback (needs the torch extra).

Each test starts its ranks once: importing torch takes seconds on a busy machine.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from torch_ranks import run_worker_ranks

from netopt.cli.main import main
from netopt.torch.bench import bus_bandwidth_gbps

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
    pytest.mark.filterwarnings("ignore:Failed to initialize NumPy"),
]

WORKER = Path(__file__).with_name("nccl_ddp_worker.py")
REPO = Path(__file__).resolve().parents[2]
HOOKS = ("none", "bf16_compress_hook", "powerSGD_hook")


def run_ranks(hooks: tuple[str, ...], world: int = 2) -> dict[str, list[dict]]:
    by_hook: dict[str, list[dict]] = {hook: [] for hook in hooks}
    for result in run_worker_ranks(WORKER, world, hooks, 150):
        by_hook[result["hook"]].append(result)
    return by_hook


def test_advised_hooks_are_applied_to_ddp_on_a_two_process_gloo_group() -> None:
    results = run_ranks(HOOKS)
    for hook in HOOKS:
        ranks = results[hook]
        assert len(ranks) == 2
        assert ranks[0]["grad"] == ranks[1]["grad"]  # every rank holds the same reduced gradient
    plain = results["none"][0]
    assert plain["applied"] == "none"
    assert not plain["fp16_exact"]  # a plain fp32 all-reduce
    assert plain["matrix_rank"] > 1
    # PyTorch runs bf16 only on CUDA+NCCL: on CPU Gloo the helper sends fp16 instead.
    half = results["bf16_compress_hook"][0]
    assert half["applied"] == "fp16_compress_hook"
    assert half["fp16_exact"]  # the gradient crossed the wire as 16-bit floats
    powersgd = results["powerSGD_hook"][0]
    # On Gloo netopt's own low-rank hook runs (PyTorch's fails with several buckets).
    assert powersgd["applied"] == "netopt_lowrank_hook"
    assert powersgd["state"] == "LowRankState"
    assert powersgd["matrix_rank"] == 1  # rank-1 approximation after start_powerSGD_iter


def test_apply_comm_hook_refuses_non_ddp_and_unknown_hooks() -> None:
    from netopt.errors import ValidationError
    from netopt.torch import apply_comm_hook, import_torch

    torch = import_torch()
    with pytest.raises(ValidationError, match="DistributedDataParallel"):
        apply_comm_hook(torch.nn.Linear(2, 2), "bf16_compress_hook")
    with pytest.raises(ValidationError, match="unknown DDP comm hook"):
        apply_comm_hook(object.__new__(torch.nn.parallel.DistributedDataParallel), "zstd")


def test_bench_allreduce_on_loopback_with_predictions(capsys) -> None:
    links = REPO / "configs" / "links-example.yaml"
    code = main(["bench", "allreduce", "--nodes", "hk-1,hk-2,us-1", "--links", str(links),
                 "--min-size", "1KiB", "--max-size", "64KiB", "--factor", "64",
                 "--iters", "2", "--timeout-s", "120", "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err + out  # with --json the error is a JSON document on stdout
    document = json.loads(out)
    assert document["ranks"] == 3
    rows = document["rows"]
    assert [row["size_bytes"] for row in rows] == [1024, 64 * 1024]
    for row in rows:
        assert row["time_s"] > 0
        assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / row["time_s"] / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 2 / 3)  # nccl-tests
        assert row["predicted_algorithm"] == "ring"
        assert row["predicted_s"] > 0.3  # 4 ring steps over a 158 ms RTT link


def test_bus_bandwidth_definition() -> None:
    assert bus_bandwidth_gbps(3.0, 2) == pytest.approx(3.0)
    assert bus_bandwidth_gbps(3.0, 8) == pytest.approx(3.0 * 14 / 8)
    assert bus_bandwidth_gbps(3.0, 1) == 0.0


def test_bench_cli_refuses_contradictions(capsys) -> None:
    assert main(["bench", "allreduce", "--ranks", "3", "--nodes", "a,b"]) == 2
    assert main(["bench", "allreduce", "--links", "x.yaml"]) == 2
    assert main(["bench", "allreduce", "--min-size", "lots"]) == 2
    assert main(["bench", "allreduce", "--lab", "x.yaml", "--ranks", "2"]) == 2
    _, err = capsys.readouterr()
    assert "contradicts" in err
