"""The lab's name and address plan, ground-truth RTTs and hosts file: pure functions."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from netopt.config import LabTopology, load_settings, parse_settings
from netopt.errors import ConfigError, ValidationError
from netopt.lab.addressing import ground_truth_rtt_ms, hosts_file_text, plan_lab

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def topology(text: str) -> LabTopology:
    result = parse_settings(text, "t.yaml", "lab", env={})
    assert isinstance(result, LabTopology)
    return result


@pytest.fixture
def two_region() -> LabTopology:
    return load_settings(CONFIGS / "lab" / "two-region.yaml", "lab", env={})


def test_names_and_addresses(two_region: LabTopology) -> None:
    plan = plan_lab(two_region, "nlab12")
    assert [n.name for n in plan.nodes] == ["hk-1", "hk-2", "us-1", "us-2"]
    assert plan.node("hk-1").address == "198.18.1.10"
    assert plan.node("us-2").address == "198.18.2.11"
    assert plan.node("us-2").netns == "nlab12-us-2"
    assert plan.region("hk").netns == "nlab12_hk"
    assert plan.region("us").router_address == "198.18.2.1"
    assert plan.link("us", "hk").key == "hk-us"
    assert plan.namespaces == (
        "nlab12_hk",
        "nlab12_us",
        "nlab12-hk-1",
        "nlab12-hk-2",
        "nlab12-us-1",
        "nlab12-us-2",
    )
    lab_range = ipaddress.ip_network("198.18.0.0/15")
    assert all(ipaddress.ip_address(n.address) in lab_range for n in plan.nodes)


def test_two_prefixes_share_no_namespace(two_region: LabTopology) -> None:
    first, second = plan_lab(two_region, "nla"), plan_lab(two_region, "nlb")
    assert not set(first.namespaces) & set(second.namespaces)


def test_router_and_node_names_never_collide() -> None:
    # A node called like "<region>" with a prefix would clash if routers used "-".
    plan = plan_lab(topology("regions: {r: {nodes: [r-x]}, x: {nodes: [x-1]}}\n"), "nl1")
    assert len(set(plan.namespaces)) == len(plan.namespaces)


@pytest.mark.parametrize("prefix", ["", "1abc", "Nl", "nl-1", "a" * 13, "nl_"])
def test_bad_prefixes(two_region: LabTopology, prefix: str) -> None:
    with pytest.raises(ValidationError, match="prefix"):
        plan_lab(two_region, prefix)


def test_unknown_names_say_what_exists(two_region: LabTopology) -> None:
    plan = plan_lab(two_region, "nl1")
    with pytest.raises(ValidationError, match="hk-1, hk-2, us-1, us-2"):
        plan.node("eu-1")
    with pytest.raises(ValidationError, match="no region 'eu'"):
        plan.region("eu")
    with pytest.raises(ValidationError, match="links: hk-us"):
        plan.link("hk", "eu")


def test_too_many_regions_for_the_subnet() -> None:
    regions = ", ".join(f"r{i}: {{nodes: [n{i}]}}" for i in range(16))
    topo = topology(f"subnet: 198.18.0.0/20\nregions: {{{regions}}}\n")
    with pytest.raises(ConfigError, match="16 regions do not fit"):
        plan_lab(topo, "nl1")


def test_ground_truth_rtt(two_region: LabTopology) -> None:
    plan = plan_lab(two_region, "nl1")
    # 2 x 40 ms plus an 84-byte ping serialised at 100 Mbit/s each way.
    assert ground_truth_rtt_ms(plan, "hk-1", "us-2") == pytest.approx(80.0 + 2 * 84 * 8 / 100e3)
    assert ground_truth_rtt_ms(plan, "hk-1", "hk-2") == 0.0
    assert ground_truth_rtt_ms(plan, "hk-1", "hk-1") == 0.0


def test_ground_truth_rtt_with_intra_region_delay() -> None:
    topo = topology(
        "regions:\n"
        "  a: {nodes: [a-1, a-2], intra: {rate_mbps: 1000, delay_ms: 2}}\n"
        "  b: {nodes: [b-1]}\n"
        "links: [{between: [a, b], rate_mbps: 1000, delay_ms: 10}]\n"
    )
    plan = plan_lab(topo, "nl1")
    ser_ms = 84 * 8 / 1e9 * 1000
    assert ground_truth_rtt_ms(plan, "a-1", "a-2") == pytest.approx(4.0 + 4 * ser_ms)
    assert ground_truth_rtt_ms(plan, "a-1", "b-1") == pytest.approx(22.0 + 4 * ser_ms)


def test_unlinked_regions_have_no_rtt() -> None:
    plan = plan_lab(topology("regions: {a: {nodes: [a-1]}, b: {nodes: [b-1]}}\n"), "nl1")
    with pytest.raises(ValidationError, match="no link"):
        ground_truth_rtt_ms(plan, "a-1", "b-1")


def test_hosts_file_names_every_node(two_region: LabTopology) -> None:
    text = hosts_file_text(plan_lab(two_region, "nl1"))
    assert "127.0.0.1\tlocalhost" in text
    assert "198.18.1.10\thk-1\n" in text
    assert "198.18.2.11\tus-2\n" in text
