"""Rank placement: the region-contiguous node order and nccl-env's advice for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netopt.cli.main import main
from netopt.nccl.rankorder import border_hops, rank_order

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "links-example.yaml"
REGIONS = {"hk-1": "hk", "hk-2": "hk", "us-1": "us", "us-2": "us", "sg-1": "sg"}


@pytest.mark.parametrize(
    ("order", "hops"),
    [
        (["hk-1", "us-1", "hk-2", "us-2"], 4),
        (["hk-1", "hk-2", "us-1", "us-2"], 2),
        (["hk-1", "hk-2"], 0),
        (["hk-1", "us-1", "sg-1"], 3),
        (["hk-1"], 0),
    ],
)
def test_border_hops_count_the_wrap_around(order: list[str], hops: int) -> None:
    assert border_hops(order, REGIONS) == hops


def test_rank_order_groups_regions_in_order_of_first_appearance() -> None:
    order = rank_order(["us-1", "hk-1", "us-2", "sg-1", "hk-2"], REGIONS)
    assert order.advised == ("us-1", "us-2", "hk-1", "hk-2", "sg-1")
    assert (order.border_hops_given, order.border_hops_advised) == (5, 3)
    assert order.node_rank() == {"us-1": 0, "us-2": 1, "hk-1": 2, "hk-2": 3, "sg-1": 4}
    grouped = rank_order(["hk-1", "hk-2", "us-1"], REGIONS)
    assert grouped.advised == grouped.given


def test_nccl_env_advises_the_grouped_order(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["nccl-env", "--nodes", "hk-1,us-1,hk-2,us-2", "--links", str(EXAMPLE),
                 "--nccl-version", "2.26.2", "--format", "json"])  # fmt: skip
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["rank_order"]["advised"] == ["hk-1", "hk-2", "us-1", "us-2"]
    assert document["rank_order"]["border_hops_given"] == 4
    assert document["rank_order"]["node_rank"]["us-1"] == 2
    (note,) = [n for n in document["advice"]["notes"] if n.startswith("rank order")]
    assert "us-1: torchrun --node-rank=2" in note
    # Already grouped: no advice to change it.
    code = main(["nccl-env", "--nodes", "hk-1,hk-2,us-1,us-2", "--links", str(EXAMPLE),
                 "--nccl-version", "2.26.2", "--format", "json"])  # fmt: skip
    document = json.loads(capsys.readouterr().out)
    assert not [n for n in document["advice"]["notes"] if n.startswith("rank order")]
