"""The alternating hierarchical PowerSGD hook (one border exchange per bucket and step)
on four real Gloo ranks, regions 3+1, several DDP buckets.

One start of the four ranks (``alternating_worker.py``) serves every test; each rank
is bounded by a timeout (the groups by theirs), so a hang fails the test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from torch_ranks import run_worker_ranks

WORKER = Path(__file__).with_name("alternating_worker.py")
pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:Failed to initialize NumPy"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]


@pytest.fixture(scope="module")
def four_ranks() -> dict[str, list[dict]]:
    by_part: dict[str, list[dict]] = {}
    for result in run_worker_ranks(WORKER, 4, (), 300):
        by_part.setdefault(result["part"], []).append(result)
    return by_part


def test_at_full_rank_every_step_equals_all_reduces_mean(four_ranks: dict[str, list[dict]]):
    ranks = four_ranks["square"]
    assert len(ranks) == 4
    for r in ranks:  # warm-up, then P, Q, P, Q steps: both projections are the identity
        assert r["applied"] == "hierarchical_powerSGD_hook"
        assert "one of them per step" in r["note"]
        assert r["compressed"] == 7  # every matrix went through the projections
        assert r["buckets"] >= 3
        assert len(r["errors"]) == 5
        assert max(r["errors"]) < 1e-5, r["errors"]


@pytest.mark.parametrize(
    ("part", "psgd_rank", "buckets"), [("bench", 4, 3), ("bench_advised", 8, 2)]
)
def test_the_bench_model_alternates_one_side_at_a_time(
    four_ranks: dict[str, list[dict]], part: str, psgd_rank: int, buckets: int
):
    ranks = four_ranks[part]
    assert len(ranks) == 4
    for r in ranks:
        assert r["psgd_rank"] == psgd_rank
        assert r["buckets"] >= buckets  # 23 MB of gradients in 8 (16) MB buckets
        assert r["compressed"] >= 20
        assert r["errors"][0] < 1e-5  # the warm-up step is a full all-reduce
        assert min(r["errors"][1:]) > 1e-3  # then a low rank: an approximation
        assert max(r["ranks"][1:]) <= psgd_rank
        assert max(r["ranks"][1:]) > psgd_rank // 2  # the rank it was given, used
        # each step keeps the previous step's basis (a Q step its columns, a P step its
        # rows); PowerSGD's two exchanges would give a new subspace every step
        assert len(r["subspace"]) == 3
        assert max(r["subspace"]) < 1e-4, r["subspace"]
        assert r["fingerprints"] == ranks[0]["fingerprints"]  # every rank holds the same


def test_the_bench_model_at_full_rank_is_averaged_whole(four_ranks: dict[str, list[dict]]):
    ranks = four_ranks["bench_full"]
    assert len(ranks) == 4
    for r in ranks:
        assert r["compressed"] == 0
        assert max(r["errors"]) < 1e-5
