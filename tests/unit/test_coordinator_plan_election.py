"""The elected plan's pure parts: the plan's JSON, which stored plan is served, when a
new one activates and when the leader stores one."""

from __future__ import annotations

import pytest

from netopt.coordinator import plan_election as election
from netopt.coordinator.plan import PlanNode, PlanOptions, make_plan
from netopt.coordinator.plan_json import plan_from_json, plan_to_json
from netopt.errors import StorageError

NODES = tuple(
    PlanNode(f"{region}-{i}", region, f"10.0.{r}.{i}", 7471, 7480 if i % 2 else None)
    for r, region in enumerate(("hk", "sg", "us"))
    for i in range(5)
)


def _stored(
    seq: int, active_from_s: float, nodes: tuple[PlanNode, ...] = NODES
) -> election.StoredPlan:
    return election.StoredPlan(seq, make_plan(nodes, PlanOptions()), 0.0, active_from_s)


def test_a_plan_comes_back_from_its_json_unchanged() -> None:
    plan = make_plan(NODES, PlanOptions(per_node_budget=4))
    again = plan_from_json(plan_to_json(plan))
    assert again == plan
    assert again.bandwidth
    assert again.probes
    assert again.for_node("hk-1").to_dict() == plan.for_node("hk-1").to_dict()


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"version": "v"}',
        '{"version": "v", "cycle_s": 1, "slot_s": 1, "nodes": [], "probes": [["a", "b", "x"]],'
        ' "bandwidth": []}',
        '{"version": "v", "cycle_s": 1, "slot_s": 1, "nodes": [], "probes": [["a", "b",'
        ' "in-region"]], "bandwidth": []}',
    ],
)
def test_a_malformed_stored_plan_is_a_storage_error(text: str) -> None:
    with pytest.raises(StorageError, match="stored probe plan"):
        plan_from_json(text)


def test_the_newest_active_plan_is_served() -> None:
    plans = (_stored(1, 100.0), _stored(2, 105.0), _stored(3, 104.0))
    assert election.served(plans, 99.0) is None
    assert election.served(plans, 100.0) == plans[0]
    assert election.served(plans, 104.5) == plans[2]  # by seq, not by activation time
    assert election.served(plans, 200.0) == plans[2]
    # Kept: the served one and every newer one; older ones go.
    assert [p.seq for p in election.retained(plans, 104.5)] == [3]
    assert [p.seq for p in election.retained(plans[:2], 104.0)] == [1, 2]
    assert [p.seq for p in election.retained((plans[1], plans[0], plans[1]), 0.0)] == [1, 2]


def test_activation_waits_two_follows_and_a_read_covers_until_then() -> None:
    delay = election.activation_delay_s(2.0)
    assert delay == 4.0 + election.CLOCK_MARGIN_S
    assert election.activation_s(50.0, False, delay) == 50.0  # the first: nothing to replace
    assert election.activation_s(50.0, True, delay) == 50.0 + delay
    # A plan stored just after a read that started at 50 s (with the leader's clock up to
    # the margin behind) activates no earlier than the read stays fresh.
    read_started = 50.0
    earliest_active = election.activation_s(read_started - election.CLOCK_MARGIN_S, True, delay)
    assert election.fresh_until_s(read_started, delay) == earliest_active


def test_a_new_plan_is_needed_only_when_the_members_move() -> None:
    newest = _stored(1, 0.0)
    assert election.needs_new_plan(None, NODES)
    assert not election.needs_new_plan(newest, reversed(NODES))  # order does not matter
    assert election.needs_new_plan(newest, NODES[1:])
    moved = (PlanNode("hk-0", "hk", "10.9.9.9"), *NODES[1:])
    assert election.needs_new_plan(newest, moved)


def test_without_bandwidth_keeps_the_probes_under_its_own_version() -> None:
    plan = make_plan(NODES, PlanOptions())
    stripped = election.without_bandwidth(plan)
    assert plan.bandwidth
    assert not stripped.bandwidth
    assert stripped.probes == plan.probes
    assert stripped.version != plan.version
