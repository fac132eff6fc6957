"""The region layout behind netopt's hierarchical hook and local SGD (pure, no torch)."""

from __future__ import annotations

import pytest

from netopt.errors import ValidationError
from netopt.torch.hierarchical import region_members


def test_region_members_groups_ranks_and_checks_names() -> None:
    assert region_members(["b", "a", "b"]) == (("b", (0, 2)), ("a", (1,)))
    with pytest.raises(ValidationError, match="rank 1's region"):
        region_members(["a", "../x"])
    with pytest.raises(ValidationError):
        region_members([])
