"""The pure part of group commit: which waiting batches form the next group."""

from __future__ import annotations

import pytest

from netopt.coordinator.groupcommit import GroupLimits, group_size


def test_a_group_is_bounded_by_batches_and_summaries() -> None:
    limits = GroupLimits(max_group_batches=4, max_group_summaries=10)
    assert group_size([1], limits) == 1
    assert group_size([1] * 9, limits) == 4  # the batch bound
    assert group_size([3, 3, 3, 3], limits) == 3  # a fourth would make 12 summaries
    assert group_size([5, 5, 1], limits) == 2  # exactly at the bound is allowed
    assert group_size([50, 1], limits) == 1  # an oversized batch still goes, alone


@pytest.mark.parametrize(
    "bad",
    [{"linger_s": -0.001}, {"linger_s": 2.0}, {"max_group_batches": 0},
     {"max_group_summaries": 0}, {"max_pending_batches": 0},
     {"linger_until_batches": 0}],
)  # fmt: skip
def test_limits_out_of_range_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="group commit limits"):
        GroupLimits(**bad)  # type: ignore[arg-type]
