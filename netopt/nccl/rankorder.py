"""Rank placement: rings follow rank order, so ranks of one region belong together.

A ring all-reduce passes data from rank i to rank i+1 (and from the last back to the
first). A job whose node order alternates regions crosses the border on every hop;
listing each region's nodes together crosses it only twice per ring (once per region
pair boundary and once on the wrap-around). Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["RankOrder", "border_hops", "rank_order"]


@dataclass(frozen=True)
class RankOrder:
    """The node order given and the one that keeps each region contiguous."""

    given: tuple[str, ...]
    advised: tuple[str, ...]
    border_hops_given: int
    border_hops_advised: int

    def node_rank(self) -> dict[str, int]:
        """torchrun's ``--node-rank`` of each node in the advised order."""
        return {node: i for i, node in enumerate(self.advised)}


def border_hops(order: Sequence[str], region_of: Mapping[str, str]) -> int:
    """Ring hops (i -> i+1, and the last back to the first) between different regions."""
    if len(order) < 2:
        return 0
    return sum(
        region_of[a] != region_of[b] for a, b in zip(order, (*order[1:], order[0]), strict=True)
    )


def rank_order(order: Sequence[str], region_of: Mapping[str, str]) -> RankOrder:
    """Group ``order`` by region (regions in order of first appearance, nodes keeping
    their relative order), and count each order's border hops."""
    regions: list[str] = []
    for node in order:
        if region_of[node] not in regions:
            regions.append(region_of[node])
    advised = tuple(node for region in regions for node in order if region_of[node] == region)
    return RankOrder(
        tuple(order), advised, border_hops(order, region_of), border_hops(advised, region_of)
    )
