"""netopt's region-hierarchical all-reduce hook over real Gloo ranks (issue 22).

Four ranks, region layouts 2+2, 3+1 and interleaved (a,b,a,b), a 1.7 M-parameter
model in uneven 1 MB buckets: DDP's gradient with the hook equals the default
group's ``all_reduce`` mean. Every rank is bounded by a timeout (and the groups
by theirs), so a hang fails the test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from torch_ranks import run_worker_ranks

from netopt.errors import ValidationError
from netopt.torch.hierarchical import region_members

WORKER = Path(__file__).with_name("hierarchical_worker.py")
LAYOUTS = ("hk,hk,us,us", "hk,hk,hk,us", "hk,us,hk,us")
LEADERS = {"hk,hk,us,us": [0, 0, 2, 2], "hk,hk,hk,us": [0, 0, 0, 3], "hk,us,hk,us": [0, 1, 0, 1]}


def test_region_members_groups_ranks_and_checks_names() -> None:
    assert region_members(["b", "a", "b"]) == (("b", (0, 2)), ("a", (1,)))
    with pytest.raises(ValidationError, match="rank 1's region"):
        region_members(["a", "../x"])
    with pytest.raises(ValidationError):
        region_members([])


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:Failed to initialize NumPy")
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_hierarchical_hook_equals_all_reduce_four_ranks() -> None:
    results = run_worker_ranks(WORKER, 4, LAYOUTS, 120)
    by_layout: dict[str, list[dict]] = {layout: [] for layout in LAYOUTS}
    for result in results:
        by_layout[result["layout"]].append(result)
    for layout, ranks in by_layout.items():
        assert len(ranks) == 4
        assert [r["leader"] for r in sorted(ranks, key=lambda r: r["rank"])] == LEADERS[layout]
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
