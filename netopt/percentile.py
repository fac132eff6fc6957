"""The percentile, one definition: linear interpolation between the two nearest ranks.

The ``q``-th percentile (0..100) of ``n`` ascending values sits at rank
``(n - 1) * q / 100`` (numpy's default, "linear"). The probe statistics
(``measure.stats``), the coordinator's link matrix (whose SQL query returns only
the two values around each rank, ``coordinator.matrix``) and the benchmarks read it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile", "percentile_ranks"]


def percentile_ranks(count: int, q: float) -> tuple[float, int, int]:
    """``(rank, low, high)`` of the ``q``-th percentile of ``count`` (>= 1) values:
    the fractional rank and the two whole ranks around it (equal at the ends)."""
    rank = (count - 1) * q / 100
    low = math.floor(rank)
    return rank, low, min(low + 1, count - 1)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ascending values, linearly interpolated.

    Raises ValueError for an empty sequence or ``q`` outside 0..100.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    rank, low, high = percentile_ranks(len(sorted_values), q)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)
