"""Percentiles from two values per rank equal percentiles over the whole sorted list."""

from __future__ import annotations

import random

from netopt.coordinator.matrix import ranked_values, spread_from_ranks
from netopt.percentile import percentile


def test_spread_from_ranks_matches_percentile() -> None:
    rng = random.Random(5)
    for n in range(1, 120):
        values = sorted(rng.uniform(0, 500) for _ in range(n))
        spread = spread_from_ranks(ranked_values(values))
        assert spread == {f"p{q}": percentile(values, q) for q in (50, 90, 99)}


def test_no_values_have_no_spread() -> None:
    assert ranked_values([]) is None
    assert spread_from_ranks(None) is None
