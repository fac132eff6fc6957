"""Which stored probe plan a replica serves, and when the leader stores a new one (pure).

On a store several replicas share, only the elected replica computes the plan;
it stores each new one with an activation time, ``active_from_s``, and every
replica (the leader too) serves the newest stored plan whose activation time has
come. A new plan is activated ``delay_s`` after it is stored: longer than two
follow periods, so every replica has read it by then and all switch at once
(their clocks agreeing within ``CLOCK_MARGIN_S``). Bandwidth slots therefore
come from one plan at any moment and two replicas never grant a node two
overlapping bandwidth tests. The first plan of a database (nothing stored, so
nothing served) is active at once.

A replica that could not read the stored plans for longer than the activation
delay might be missing one that is active elsewhere: it then serves its plan
without bandwidth tests (probes go on) until it reads again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from netopt.coordinator.plan import PlanNode, ProbePlan

__all__ = [
    "CLOCK_MARGIN_S",
    "StoredPlan",
    "activation_delay_s",
    "activation_s",
    "fresh_until_s",
    "needs_new_plan",
    "retained",
    "served",
    "without_bandwidth",
]

CLOCK_MARGIN_S = 1.0
"""How far the replicas' clocks (and a slow commit) may be apart, in seconds."""


@dataclass(frozen=True)
class StoredPlan:
    """A plan as the leader stored it: ``seq`` orders the stores."""

    seq: int
    plan: ProbePlan
    computed_at_s: float
    active_from_s: float


def activation_delay_s(follow_period_s: float) -> float:
    """Seconds between storing a plan and serving it: two follow periods and the margin."""
    return 2 * follow_period_s + CLOCK_MARGIN_S


def activation_s(now_s: float, anything_stored: bool, delay_s: float) -> float:
    """When a plan stored at ``now_s`` becomes active (at once when it is the first)."""
    return now_s + delay_s if anything_stored else now_s


def fresh_until_s(read_started_s: float, delay_s: float) -> float:
    """Until when a read of the stored plans that started at ``read_started_s`` is enough.

    A plan stored after that read's snapshot activates no earlier than
    ``read_started_s - CLOCK_MARGIN_S + delay_s``.
    """
    return read_started_s + delay_s - CLOCK_MARGIN_S


def served(plans: Sequence[StoredPlan], now_s: float) -> StoredPlan | None:
    """The newest plan (by ``seq``) already active at ``now_s``; None before the first."""
    active = [p for p in plans if p.active_from_s <= now_s]
    return max(active, key=lambda p: p.seq, default=None)


def retained(plans: Iterable[StoredPlan], now_s: float) -> tuple[StoredPlan, ...]:
    """The plans worth keeping, by ``seq``: the one served at ``now_s`` and every newer one."""
    ordered = sorted({p.seq: p for p in plans}.values(), key=lambda p: p.seq)
    current = served(ordered, now_s)
    return tuple(p for p in ordered if current is None or p.seq >= current.seq)


def needs_new_plan(newest: StoredPlan | None, live: Iterable[PlanNode]) -> bool:
    """Whether the live nodes differ from the members of the newest stored plan."""
    members = tuple(sorted({n.name: n for n in live}.values(), key=lambda n: n.name))
    return newest is None or newest.plan.nodes != members


def without_bandwidth(plan: ProbePlan) -> ProbePlan:
    """``plan`` with no bandwidth tests (its probes kept), under a version of its own."""
    return dataclasses.replace(plan, version=f"{plan.version}-nobw", bandwidth=())
