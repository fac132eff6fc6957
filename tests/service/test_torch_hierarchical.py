"""netopt's region-aware gradient syncs over real Gloo ranks.

Four ranks, a 1.7 M-parameter model in uneven 1 MB buckets. The hierarchical
all-reduce hook, on region layouts 2+2, 3+1, interleaved (a,b,a,b) (the two leaders
exchange point to point) and three regions 1+1+2 (the leaders' all-reduce): DDP's
gradient equals the default group's ``all_reduce`` mean. The advised gradient
accumulation and local SGD (3+1) run and do what they say. One start of the
four ranks serves every test (torch's import dominates); each rank is bounded
by a timeout (the groups by theirs), so a hang fails the test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from torch_ranks import run_worker_ranks

WORKER = Path(__file__).with_name("region_sync_worker.py")
pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:Failed to initialize NumPy"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]
LAYOUTS = ("hk,hk,us,us", "hk,hk,hk,us", "hk,us,eu,eu", "hk,us,hk,us")
LEADERS = {
    "hk,hk,us,us": [0, 0, 2, 2],
    "hk,hk,hk,us": [0, 0, 0, 3],
    "hk,us,eu,eu": [0, 1, 2, 2],
    "hk,us,hk,us": [0, 1, 0, 1],
}
# two regions: the leaders exchange point to point; three: Gloo's all-reduce among them
PEERS = {
    "hk,hk,us,us": [2, None, 0, None],
    "hk,hk,hk,us": [3, None, None, 0],
    "hk,us,eu,eu": [None, None, None, None],
    "hk,us,hk,us": [1, 0, None, None],
}


@pytest.fixture(scope="module")
def four_ranks() -> list[dict]:
    return run_worker_ranks(WORKER, 4, LAYOUTS, 180)


def test_hierarchical_hook_equals_all_reduce_four_ranks(four_ranks: list[dict]) -> None:
    by_layout: dict[str, list[dict]] = {layout: [] for layout in LAYOUTS}
    for result in four_ranks:
        if result["part"] == "hierarchical":
            by_layout[result["layout"]].append(result)
    for layout, ranks in by_layout.items():
        assert len(ranks) == 4
        by_rank = sorted(ranks, key=lambda r: r["rank"])
        assert [r["leader"] for r in by_rank] == LEADERS[layout]
        assert [r["peer_leader"] for r in by_rank] == PEERS[layout]
        first = ranks[0]
        assert first["applied"] == "hierarchical_allreduce_hook"
        assert first["grad_bytes"] > 6_000_000  # several MB of gradients
        sizes = first["bucket_sizes"]
        assert len(sizes) >= 4  # several buckets
        assert len(set(sizes)) > 1  # of uneven sizes
        for rank in ranks:
            for diff in rank["diffs"]:
                assert diff["scale"] > 0
                # float32 sums in another order: equal up to rounding
                assert diff["max_abs"] <= 1e-5 * diff["scale"] + 1e-7, (layout, rank["rank"])


def test_hierarchical_powersgd_is_exact_at_full_rank_and_agrees_compressed(
    four_ranks: list[dict],
) -> None:
    results = [r for r in four_ranks if r["part"] == "hierarchical_powersgd"]
    full = [r for r in results if r["psgd_rank"] == 1024]
    low = [r for r in results if r["psgd_rank"] == 2]
    assert len(full) == 4
    assert len(low) == 4
    assert sorted(r["leader"] for r in full) == [0, 0, 0, 3]
    for r in full:  # warm-up step, then P and Q through region, leaders, region: exact
        assert len(r["errors"]) == 3
        assert max(r["errors"]) < 1e-4, r
    for r in low:  # rank 2 of 256-768 wide layers: an approximation, the same on every rank
        assert r["errors"][0] < 1e-5  # the warm-up step is a full all-reduce
        assert max(r["errors"][1:]) > 1e-3
        assert r["fingerprints"] == low[0]["fingerprints"]


def test_advised_accumulation_and_local_sgd_run_on_gloo(four_ranks: list[dict]) -> None:
    assert LAYOUTS[-1] == "hk,us,hk,us"  # the worker's local SGD runs on the last layout
    results = four_ranks
    accumulated = [r for r in results if r["part"] == "accumulation"]
    assert len(accumulated) == 4
    for r in accumulated:  # K micro-batches, no_sync for K-1: one all-reduce of their sum
        assert r["scale"] > 0
        assert r["max_abs"] <= 1e-5 * r["scale"] + 1e-7
    local = [r for r in results if r["part"] == "local_sgd"]
    assert len(local) == 4
    steps = local[0]["steps"]
    assert [s["averaged"] for s in steps] == [False, False, True, False, False, True, False]
    for index, step in enumerate(steps):
        prints = step["fingerprints"]
        hk, us = prints[0::2], prints[1::2]
        assert hk[0] == hk[1]  # a region's ranks share one gradient every step
        assert us[0] == us[1]
        if index < 2 or step["averaged"]:  # warm-up is synchronous; averaging meets all
            assert us[0] == pytest.approx(hk[0], rel=1e-6)
        else:  # local steps: the regions drift apart until the next average
            assert us[0] != pytest.approx(hk[0], rel=1e-6)
