"""Interface choice: exact names, never docker/lo/virbr, one family, the prefix traps."""

from __future__ import annotations

import pytest
from nccl_helpers import V_2_21, V_OLD, link, nic, node, wan

from netopt.errors import ValidationError
from netopt.nccl.interfaces import choose_interfaces, is_virtual, nccl_ifname_value
from netopt.nccl.tuner import tune_nccl


def pair(nics_a, nics_b, **link_kwargs):
    nodes = [node("a", "r1", *nics_a), node("b", "r2", *nics_b)]
    return nodes, [wan("a", "b", **link_kwargs)]


@pytest.mark.parametrize("name", ["lo", "docker0", "docker_gwbridge", "virbr0", "virbr1-nic"])
def test_virtual_interfaces_are_never_chosen(name) -> None:
    assert is_virtual(name)
    nodes, links = pair(
        [nic(name, "172.17.0.1/16", speed_mbps=100000), nic("eth0", "10.0.0.1/24")],
        [nic(name, "172.17.0.1/16"), nic("eth0", "10.0.1.1/24")],
    )
    choice = choose_interfaces(nodes, links, V_2_21)
    assert dict(choice.nics) == {"a": "eth0", "b": "eth0"}


def test_a_node_with_only_docker_and_lo_is_refused_by_name() -> None:
    nodes, links = pair(
        [nic("lo", "127.0.0.1/8"), nic("docker0", "172.17.0.1/16")],
        [nic("eth0", "10.0.1.1/24")],
    )
    with pytest.raises(ValidationError, match="node a has no NIC"):
        choose_interfaces(nodes, links, V_2_21)


def test_exact_name_never_an_exclusion_list() -> None:
    # '^docker0' alone would admit lo: netopt names the one NIC to use, exactly.
    nodes, links = pair(
        [nic("lo", "127.0.0.1/8"), nic("docker0", "172.17.0.1/16"), nic("ens5", "10.0.0.1/24")],
        [nic("lo", "127.0.0.1/8"), nic("ens5", "10.0.1.1/24")],
    )
    env = tune_nccl(nodes, links, V_2_21).env_for("a")
    assert env["NCCL_SOCKET_IFNAME"] == "=ens5"
    assert "^" not in env["NCCL_SOCKET_IFNAME"]
    assert env["GLOO_SOCKET_IFNAME"] == "ens5"


def test_bond_vlan_prefix_trap_uses_exact_match() -> None:
    nodes = [
        node("a", "hk", nic("bond0", "10.20.0.1/24"), nic("bond0.2093", "10.93.0.1/24")),
        node("b", "us", nic("eth0", "10.30.0.1/24")),
    ]
    links = [wan("a", "b", interfaces=("bond0", "eth0"))]
    choice = choose_interfaces(nodes, links, V_2_21)
    assert choice.nics["a"] == "bond0"
    assert nccl_ifname_value("bond0", V_2_21) == "=bond0"  # would also match bond0.2093 bare
    assert not choice.warnings
    old = choose_interfaces(nodes, links, V_OLD)
    assert any("bond0.2093" in w for w in old.warnings)  # prefix-only NCCL: said out loud


def test_vlan_that_reaches_every_peer_faster_wins_over_the_bond() -> None:
    nodes = [
        node("a", "hk", nic("bond0", "10.20.0.1/24"), nic("bond0.2093", "10.93.0.1/24")),
        node("b", "hk", nic("bond0", "10.20.0.2/24"), nic("bond0.2093", "10.93.0.2/24")),
    ]
    links = [
        link("a", "b", link_mbps=10000, interfaces=("bond0", "bond0")),
        link("a", "b", link_mbps=25000, interfaces=("bond0.2093", "bond0.2093")),
    ]
    choice = choose_interfaces(nodes, links, V_2_21)
    assert dict(choice.nics) == {"a": "bond0.2093", "b": "bond0.2093"}


def test_nic_that_does_not_reach_every_peer_is_not_chosen() -> None:
    nodes = [
        node("a", "hk", nic("bond0", "10.20.0.1/24"), nic("bond0.2093", "10.93.0.1/24")),
        node("b", "hk", nic("bond0", "10.20.0.2/24"), nic("bond0.2093", "10.93.0.2/24")),
        node("c", "us", nic("eth0", "10.30.0.1/24")),
    ]
    links = [
        link("a", "b", link_mbps=25000, interfaces=("bond0.2093", "bond0.2093")),
        link("a", "b", link_mbps=10000, interfaces=("bond0", "bond0")),
        wan("a", "c", interfaces=("bond0", "eth0")),
        wan("b", "c", interfaces=("bond0", "eth0")),
    ]
    choice = choose_interfaces(nodes, links, V_2_21)
    assert choice.nics["a"] == "bond0"  # the storage VLAN never reaches us
    assert choice.nics["b"] == "bond0"


def test_two_nics_on_one_subnet_are_flagged() -> None:
    nodes, links = pair(
        [nic("eth0", "10.0.0.1/24", speed_mbps=25000), nic("eth1", "10.0.0.2/24")],
        [nic("eth0", "10.0.1.1/24")],
    )
    choice = choose_interfaces(nodes, links, V_2_21)
    assert choice.nics["a"] == "eth0"  # the faster one, named exactly
    assert any("share subnet 10.0.0.0/24" in w for w in choice.warnings)


def test_names_that_differ_per_node_become_per_node_values() -> None:
    nodes, links = pair([nic("enp1s0", "10.0.0.1/24")], [nic("ens5", "10.0.1.1/24")])
    settings = tune_nccl(nodes, links, V_2_21)
    assert "NCCL_SOCKET_IFNAME" not in {v.key for v in settings.common}
    assert settings.env_for("a")["NCCL_SOCKET_IFNAME"] == "=enp1s0"
    assert settings.env_for("b")["NCCL_SOCKET_IFNAME"] == "=ens5"
    assert settings.env_for("b")["GLOO_SOCKET_IFNAME"] == "ens5"


def test_same_name_everywhere_is_one_common_value() -> None:
    nodes, links = pair([nic("eth0", "10.0.0.1/24")], [nic("eth0", "10.0.1.1/24")])
    settings = tune_nccl(nodes, links, V_2_21)
    assert {v.key: v.value for v in settings.common}["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert not any(settings.per_node.values())


def test_ipv6_only_node_forces_ipv6_on_all() -> None:
    nodes, links = pair(
        [nic("eth0", "10.0.0.1/24", "2001:db8::1/64")],
        [nic("eth0", "2001:db8:1::1/64", "fe80::1/64")],
    )
    settings = tune_nccl(nodes, links, V_2_21)
    assert settings.env_for("a")["NCCL_SOCKET_FAMILY"] == "AF_INET6"


def test_mixed_families_pick_the_nic_sharing_one() -> None:
    nodes, links = pair(
        [nic("eth0", "10.0.0.1/24", speed_mbps=100000), nic("eth1", "2001:db8::1/64")],
        [nic("eth0", "2001:db8:1::1/64")],
    )
    choice = choose_interfaces(nodes, links, V_2_21)
    assert choice.family == 6
    assert choice.nics["a"] == "eth1"


def test_dual_stack_everywhere_prefers_ipv4() -> None:
    nodes, links = pair(
        [nic("eth0", "10.0.0.1/24", "2001:db8::1/64")],
        [nic("eth0", "10.0.1.1/24", "2001:db8:1::1/64")],
    )
    assert choose_interfaces(nodes, links, V_2_21).family == 4


def test_no_common_family_is_an_error_naming_the_nics() -> None:
    nodes, links = pair([nic("eth0", "10.0.0.1/24")], [nic("eth0", "2001:db8:1::1/64")])
    with pytest.raises(ValidationError, match="no address family"):
        choose_interfaces(nodes, links, V_2_21)


def test_link_local_ipv6_does_not_count() -> None:
    nodes, links = pair([nic("eth0", "fe80::1/64")], [nic("eth0", "fe80::2/64")])
    with pytest.raises(ValidationError, match="has no NIC"):
        choose_interfaces(nodes, links, V_2_21)
