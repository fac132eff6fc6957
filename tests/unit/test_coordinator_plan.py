"""The pure probe plan: mesh in regions, representatives across, budget, bandwidth slots."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netopt.coordinator.plan import PlanNode, PlanOptions, ProbePlan, make_plan


def fleet(**sizes: int) -> list[PlanNode]:
    return [
        PlanNode(f"{region}-{i}", region, f"198.18.{j}.{i + 1}")
        for j, (region, size) in enumerate(sizes.items())
        for i in range(size)
    ]


def pairs(plan: ProbePlan) -> set[frozenset[str]]:
    return {frozenset((p.src, p.dst)) for p in plan.probes}


def degree(plan: ProbePlan) -> Counter[str]:
    counts: Counter[str] = Counter()
    for p in plan.probes:
        counts[p.src] += 1
        counts[p.dst] += 1
    return counts


def assert_slots_disjoint(plan: ProbePlan) -> None:
    by_slot: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for test in plan.bandwidth:
        by_slot[test.slot].append((test.src, test.dst))
        assert test.offset_s == pytest.approx(test.slot * plan.slot_s)
        assert test.offset_s + plan.slot_s <= plan.cycle_s + 1e-9
    for slot, tests in by_slot.items():
        busy = [n for link in tests for n in link]
        assert len(busy) == len(set(busy)), f"a node is in two tests in slot {slot}"
        links = [frozenset(link) for link in tests]
        assert len(links) == len(set(links)), f"a link carries two tests in slot {slot}"


def test_full_mesh_inside_each_region_and_each_pair_probed_once() -> None:
    plan = make_plan(fleet(hk=5, us=4), PlanOptions(per_node_budget=32))
    found = pairs(plan)
    for region, size in (("hk", 5), ("us", 4)):
        for a, b in combinations(range(size), 2):
            assert frozenset((f"{region}-{a}", f"{region}-{b}")) in found
    assert len(plan.probes) == len(found), "a pair is probed from both ends"
    assert all(p.kind == "in-region" for p in plan.probes if p.src[:2] == p.dst[:2])


def test_representatives_across_regions() -> None:
    plan = make_plan(fleet(hk=6, us=6, sg=6), PlanOptions(representatives_per_region_pair=2))
    cross = [p for p in plan.probes if p.kind == "cross-border"]
    by_pair: dict[frozenset[str], list[tuple[str, str]]] = defaultdict(list)
    for p in cross:
        assert p.src.split("-")[0] != p.dst.split("-")[0]
        by_pair[frozenset((p.src.split("-")[0], p.dst.split("-")[0]))].append((p.src, p.dst))
    assert set(by_pair) == {frozenset(x) for x in (("hk", "us"), ("hk", "sg"), ("sg", "us"))}
    for links in by_pair.values():
        assert len(links) == 4  # 2 representatives on each side, all pairs between them
        assert len({n for link in links for n in link}) == 4


def test_budget_respected_and_big_region_stays_connected() -> None:
    options = PlanOptions(per_node_budget=6, representatives_per_region_pair=3)
    plan = make_plan(fleet(hk=40, us=30, sg=3), options)
    assert max(degree(plan).values()) <= 6
    assert any(p.kind == "cross-border" for p in plan.probes)
    # Connected inside hk even though a full mesh would need degree 39.
    adjacency: dict[str, set[str]] = defaultdict(set)
    for p in plan.probes:
        if p.kind == "in-region":
            adjacency[p.src].add(p.dst)
            adjacency[p.dst].add(p.src)
    seen, todo = {"hk-0"}, ["hk-0"]
    while todo:
        for peer in adjacency[todo.pop()] - seen:
            seen.add(peer)
            todo.append(peer)
    assert {n for n in seen if n.startswith("hk")} == {f"hk-{i}" for i in range(40)}
    # Near-linear: far fewer pairs than a full mesh of 73 nodes.
    assert len(plan.probes) <= 73 * 6 // 2


def test_bandwidth_slots_never_overlap_per_node_or_link() -> None:
    plan = make_plan(fleet(hk=8, us=7, sg=5), PlanOptions(per_node_budget=10))
    assert {(t.src, t.dst) for t in plan.bandwidth} == {(p.src, p.dst) for p in plan.probes}
    assert_slots_disjoint(plan)


def test_cycle_grows_when_slots_do_not_fit_the_interval() -> None:
    options = PlanOptions(bandwidth_interval_s=10.0, bandwidth_slot_s=15.0)
    plan = make_plan(fleet(hk=4), options)
    slots = {t.slot for t in plan.bandwidth}
    assert plan.cycle_s == pytest.approx(len(slots) * 15.0)
    assert_slots_disjoint(plan)


def test_bandwidth_tests_can_be_switched_off() -> None:
    on = make_plan(fleet(hk=3, us=3), PlanOptions())
    off = make_plan(fleet(hk=3, us=3), PlanOptions(bandwidth_tests=False))
    assert on.bandwidth
    assert off.bandwidth == ()
    assert off.probes == on.probes
    assert off.version != on.version  # agents refetch the plan when the switch flips


def test_plan_follows_join_and_leave_and_is_deterministic() -> None:
    nodes = fleet(hk=4, us=3)
    options = PlanOptions()
    before = make_plan(nodes, options)
    assert make_plan(list(reversed(nodes)), options) == before
    joined = make_plan([*nodes, PlanNode("hk-9", "hk", "198.18.0.99")], options)
    assert joined.version != before.version
    assert any("hk-9" in pair for pair in pairs(joined))
    left = make_plan([n for n in nodes if n.name != "us-0"], options)
    assert all("us-0" not in pair for pair in pairs(left))
    assert all(t.src != "us-0" and t.dst != "us-0" for t in left.bandwidth)
    assert left.for_node("us-0").peers == ()


def test_node_plan_lists_peers_with_addresses() -> None:
    plan = make_plan(fleet(hk=3), PlanOptions())
    body = plan.for_node("hk-0").to_dict()
    assert body["plan_version"] == plan.version
    probed = {p["node"] for p in body["probes"]}
    assert probed == {p.dst for p in plan.probes if p.src == "hk-0"}
    assert all(p["host"].startswith("198.18.") for p in body["probes"])


def test_empty_and_single_node_fleets() -> None:
    assert make_plan([], PlanOptions()).probes == ()
    single = make_plan(fleet(hk=1), PlanOptions())
    assert single.probes == ()
    assert single.bandwidth == ()


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    budget=st.integers(1, 12),
    reps=st.integers(1, 3),
)
def test_invariants_hold_for_any_fleet(sizes: list[int], budget: int, reps: int) -> None:
    nodes = fleet(**{f"r{i}": size for i, size in enumerate(sizes)})
    plan = make_plan(
        nodes, PlanOptions(per_node_budget=budget, representatives_per_region_pair=reps)
    )
    assert max(degree(plan).values(), default=0) <= budget
    assert len(plan.probes) == len(pairs(plan))
    assert all(p.src != p.dst for p in plan.probes)
    assert_slots_disjoint(plan)
