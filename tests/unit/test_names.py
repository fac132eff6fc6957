"""The one check for names that become paths: dataset names and BLAKE3 ids."""

from __future__ import annotations

import pytest

from netopt.config.common import check_name
from netopt.config.loader import Invalid
from netopt.errors import PathTraversalError
from netopt.names import is_dataset_name, is_hash_id, validate_dataset_name, validate_hash_id

GOOD = ["ds", "imagenet-1k", "a.b_c-d", "A" * 128, "v1.2"]
BAD = ["", "ds\n", "\nds", "ds\x00", "a/b", "/abs", "..", "a..b", ".hidden", "-x", "A" * 129, 7]


@pytest.mark.parametrize("name", GOOD)
def test_dataset_names_accepted(name: str) -> None:
    assert is_dataset_name(name)
    assert validate_dataset_name(name) == name


@pytest.mark.parametrize("name", BAD)
def test_dataset_names_refused(name: object) -> None:
    assert not is_dataset_name(name)
    with pytest.raises(PathTraversalError, match="not allowed"):
        validate_dataset_name(name)


@pytest.mark.parametrize(
    "value", ["ab" * 31, "AB" * 32, "ab" * 32 + "\n", "ab" * 33, "g" * 64, None]
)
def test_hash_ids_refused(value: object) -> None:
    assert not is_hash_id(value)
    with pytest.raises(PathTraversalError):
        validate_hash_id(value)
    assert is_hash_id("ab" * 32)


def test_node_names_refuse_a_trailing_newline() -> None:
    check_name("node", "node-1")
    with pytest.raises(Invalid):
        check_name("node", "node-1\n")
