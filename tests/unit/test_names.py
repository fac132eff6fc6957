"""The one check for each kind of name: datasets, BLAKE3 ids, nodes, interfaces."""

from __future__ import annotations

import pytest

from netopt.config.common import check_name
from netopt.config.links import NicSpec
from netopt.config.loader import Invalid
from netopt.errors import PathTraversalError, ValidationError
from netopt.names import (
    is_dataset_name,
    is_hash_id,
    is_ifname,
    is_node_name,
    validate_dataset_name,
    validate_hash_id,
)
from netopt.nccl.domains import check_value

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


@pytest.mark.parametrize("name", ["a", "node-1", "eu.west-2", "a" * 63])
def test_node_names_accepted(name: str) -> None:
    assert is_node_name(name)


@pytest.mark.parametrize("name", ["", "Node", "-a", "a-", "a" * 64, "a\n", "a/b", None])
def test_node_names_refused(name: object) -> None:
    assert not is_node_name(name)


@pytest.mark.parametrize("name", ["eth0", "ens5.100", "ib0:1", "veth@if3", "x" * 15])
def test_interface_names_accepted(name: str) -> None:
    assert is_ifname(name)


@pytest.mark.parametrize("name", ["", "x" * 16, "eth0\n", "a/b", "eth 0", 3])
def test_interface_names_refused(name: object) -> None:
    assert not is_ifname(name)


def test_every_interface_name_check_refuses_a_trailing_newline() -> None:
    # config/links.py and nccl/domains.py had their own ``re.match`` with ``$``
    with pytest.raises(Invalid) as caught:
        NicSpec(name="eth0\n")
    assert isinstance(caught.value, ValidationError)  # in the error tree
    assert isinstance(caught.value, ValueError)
    with pytest.raises(ValidationError):
        check_value("GLOO_SOCKET_IFNAME", "eth0\n", (2, 21, 5), (2, 4, 0))
    with pytest.raises(ValidationError):
        check_value("NCCL_SOCKET_IFNAME", "eth0\n", (2, 21, 5), (2, 4, 0))
    check_value("NCCL_SOCKET_IFNAME", "eth0", (2, 21, 5), (2, 4, 0))
