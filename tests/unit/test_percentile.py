"""The one percentile (netopt/percentile.py): numpy's "linear" definition."""

from __future__ import annotations

import pytest

from netopt.percentile import percentile, percentile_ranks


def test_percentile_interpolates_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 90) == pytest.approx(90.1)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 100.0
    assert percentile([1.0, 3.0], 25) == pytest.approx(1.5)


def test_percentile_edges() -> None:
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def test_ranks_stay_inside_the_values() -> None:
    assert percentile_ranks(1, 99) == (0.0, 0, 0)
    assert percentile_ranks(10, 50) == (4.5, 4, 5)
    assert percentile_ranks(10, 100) == (9.0, 9, 9)
