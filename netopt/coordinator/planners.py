"""Where a coordinator's probe plan comes from: one interface, two kinds, chosen once.

- :class:`LocalPlanner` (one coordinator, SQLite): the plan is computed in this
  process from the registry it holds, following every join and leave.
- :class:`ElectedPlanner` (replicas sharing PostgreSQL): only the elected
  replica computes the plan, stores it, and every replica serves the stored plan
  from its activation time on (the rules: ``plan_election``), so all replicas
  serve one plan and its bandwidth slots at any moment.

Both take the live nodes as a callable (``live_nodes(now_s)``) and the clock
from the coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from netopt.coordinator import plan_election as election
from netopt.coordinator.database import StoreRunner
from netopt.coordinator.plan import PlanNode, PlanOptions, ProbePlan, make_plan
from netopt.coordinator.plan_json import plan_from_json, plan_to_json
from netopt.coordinator.storeapi import PlanRow

__all__ = ["ElectedPlanner", "LocalPlanner", "Planner"]

PLAN_CACHE_S = 1.0
INLINE_PLAN_NODES = 128
REPLAN_MIN_INTERVAL_S = 2.0
LiveNodes = Callable[[float], tuple[PlanNode, ...]]


class Planner(Protocol):
    """The plan this replica serves (``plan()`` is called by every heartbeat: cheap)."""

    def plan(self) -> ProbePlan: ...

    async def start(self, leader: bool) -> None:
        """At start-up, after the registry is loaded and the election held."""
        ...

    async def follow(self, leader: bool) -> None:
        """Each follow period (the heartbeat flush). Raises StorageError."""
        ...

    async def close(self) -> None: ...


@dataclass
class _PlanCache:
    generation: int = -1
    computed_at_s: float = float("-inf")
    key: tuple[PlanNode, ...] = ()
    plan: ProbePlan | None = None


class LocalPlanner:
    """The plan over the live nodes this process holds; ``generation()`` moves whenever
    membership may have (a join, a leave, a node back from stale)."""

    def __init__(
        self,
        options: PlanOptions,
        clock: Callable[[], float],
        live_nodes: LiveNodes,
        generation: Callable[[], int],
        fleet_size: Callable[[], int],
    ) -> None:
        self._options = options
        self._clock = clock
        self._live_nodes = live_nodes
        self._generation = generation
        self._fleet_size = fleet_size
        self._cache = _PlanCache()
        self._planning: asyncio.Task[None] | None = None
        self._replan_started_s = float("-inf")

    def plan(self) -> ProbePlan:
        """The fleet's plan over the live nodes, following joins, leaves and staleness.

        Small fleets are planned inline. For more than ``INLINE_PLAN_NODES`` live
        nodes the new plan is computed on a worker thread while the previous one is
        served, so a registration storm never stalls the event loop.
        """
        now = self._clock()
        cache = self._cache
        big = self._fleet_size() > INLINE_PLAN_NODES
        if (
            cache.plan is not None
            and (big or cache.generation == self._generation())
            and now - cache.computed_at_s < PLAN_CACHE_S
        ):
            # A big fleet looks at its membership at most once per PLAN_CACHE_S: during
            # a registration storm every join would otherwise cost O(fleet) work.
            return cache.plan
        key = self._live_nodes(now)
        cache.generation, cache.computed_at_s = self._generation(), now
        if cache.plan is not None and key == cache.key:
            return cache.plan
        if cache.plan is None or len(key) <= INLINE_PLAN_NODES:
            cache.plan, cache.key = make_plan(key, self._options), key
        elif (self._planning is None or self._planning.done()) and (
            now - self._replan_started_s >= REPLAN_MIN_INTERVAL_S
        ):
            # At most one big replan per interval: a registration storm of a thousand
            # agents then costs a few plans, not a thousand.
            self._replan_started_s = now
            self._planning = asyncio.get_running_loop().create_task(self._replan(key))
        else:
            cache.key = ()  # not planned yet: compare again at the next look
        return cache.plan

    async def _replan(self, key: tuple[PlanNode, ...]) -> None:
        plan = await asyncio.to_thread(make_plan, key, self._options)
        self._cache.plan, self._cache.key = plan, key
        self._cache.computed_at_s = float("-inf")  # membership may have moved on meanwhile

    async def start(self, leader: bool) -> None:
        """Compute the plan now on a worker thread (at start-up, after loading)."""
        key = self._live_nodes(self._clock())
        plan = await asyncio.to_thread(make_plan, key, self._options)
        self._cache = _PlanCache(self._generation(), self._clock(), key, plan)

    async def follow(self, leader: bool) -> None:
        """Nothing to follow: this process is the only planner."""

    async def close(self) -> None:
        """Stop a plan computation in progress."""
        if self._planning is not None and not self._planning.done():
            self._planning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._planning


class ElectedPlanner:
    """Serves the stored plan; while ``leader``, computes and stores a new one when the
    live nodes differ from the newest stored plan's members.

    ``follow_period_s`` is how often :meth:`follow` runs on every replica; a stored
    plan activates ``plan_election.activation_delay_s(follow_period_s)`` after it is
    stored, so every replica has read it by then.
    """

    def __init__(
        self,
        db: StoreRunner,
        options: PlanOptions,
        clock: Callable[[], float],
        live_nodes: LiveNodes,
        follow_period_s: float,
    ) -> None:
        self._db = db
        self._options = options
        self._clock = clock
        self._live_nodes = live_nodes
        self.delay_s = election.activation_delay_s(follow_period_s)
        self._plans: tuple[election.StoredPlan, ...] = ()
        self._seq = 0
        self._fresh_until_s = float("-inf")
        self._empty = make_plan((), options)
        self._stripped: tuple[int, ProbePlan] | None = None

    def plan(self) -> ProbePlan:
        """The stored plan active now (an empty plan before the first); its bandwidth
        tests withheld while this replica's last read of the stored plans is too old."""
        now = self._clock()
        current = election.served(self._plans, now)
        if current is None:
            return self._empty
        if now <= self._fresh_until_s:
            return current.plan
        if self._stripped is None or self._stripped[0] != current.seq:
            self._stripped = (current.seq, election.without_bandwidth(current.plan))
        return self._stripped[1]

    async def start(self, leader: bool) -> None:
        """Read the stored plans (and, leading, store one for the nodes now live)."""
        await self.follow(leader)

    async def follow(self, leader: bool) -> None:
        """Read the plans stored since the last read; the leader then stores a new plan
        if membership moved. Raises StorageError (the plans read so far stay served)."""
        started_s = self._clock()
        rows = await self._db.plans_after(self._seq)
        if rows:
            read = await asyncio.to_thread(lambda: [_stored(row) for row in rows])
            self._plans = election.retained((*self._plans, *read), started_s)
            self._seq = max(self._seq, rows[-1].seq)
        self._fresh_until_s = election.fresh_until_s(started_s, self.delay_s)
        if leader:
            await self._publish()

    async def _publish(self) -> None:
        now = self._clock()
        live = self._live_nodes(now)
        newest = self._plans[-1] if self._plans else None
        if not election.needs_new_plan(newest, live):
            return
        plan, text = await asyncio.to_thread(self._compute, live)
        active = election.activation_s(now, newest is not None, self.delay_s)
        seq = await self._db.publish_plan(PlanRow(0, plan.version, text, now, active))
        if seq is not None:  # None: no longer the leader; the new one stores its own
            stored = election.StoredPlan(seq, plan, now, active)
            self._plans = election.retained((*self._plans, stored), now)
            self._seq = max(self._seq, seq)

    def _compute(self, live: tuple[PlanNode, ...]) -> tuple[ProbePlan, str]:
        plan = make_plan(live, self._options)
        return plan, plan_to_json(plan)

    async def close(self) -> None:
        """Nothing runs between follows."""


def _stored(row: PlanRow) -> election.StoredPlan:
    return election.StoredPlan(
        row.seq, plan_from_json(row.plan_json), row.computed_at_s, row.active_from_s
    )
