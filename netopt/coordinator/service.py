"""The coordinator's domain: registry, liveness, ingest, plan and matrix queries.

HTTP handlers call these methods and serialise what they return; all policy is
here or in the pure modules (``plan``, ``matrix``). Time comes from an injected
clock, so liveness can be tested without sleeping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from netopt.cache.residency import residency_violation
from netopt.config import CoordinatorSettings, DatasetsSettings, load_settings
from netopt.coordinator.database import StoreRunner
from netopt.coordinator.plan import PlanNode, PlanOptions, ProbePlan
from netopt.coordinator.planners import ElectedPlanner, LocalPlanner, Planner
from netopt.coordinator.store import BatchToStore, IngestResult, StoredNode
from netopt.errors import NetoptError, NotFoundError, ResidencyError
from netopt.names import DATASET_NAME_RE, NODE_NAME_RE
from netopt.wire.fields import Reader
from netopt.wire.schema import Heartbeat, Registration, RequestInvalid, SummaryBatch

__all__ = ["Coordinator", "NodeState", "NotFoundError", "PlacementRequest", "node_state"]

NodeState = Literal["live", "stale", "left"]


def node_state(node: StoredNode, now_s: float, stale_after_s: float) -> NodeState:
    """``left`` after a deregistration, ``stale`` when the last heartbeat is too old."""
    if node.left_at_s is not None:
        return "left"
    return "stale" if now_s - node.last_seen_s > stale_after_s else "live"


@dataclass(frozen=True)
class PlacementRequest:
    """``POST /api/v1/placements``: may ``dataset``'s chunks go to ``node`` (or ``region``)?"""

    dataset: str
    node: str | None = None
    region: str | None = None

    @classmethod
    def from_dict(cls, data: object) -> PlacementRequest:
        """Parse the body; RequestInvalid unless it names a dataset and one of node/region."""
        r = Reader(data, keys=frozenset(("dataset", "node", "region")))
        dataset = r.string("dataset", max_len=128, pattern=DATASET_NAME_RE)
        if ".." in dataset:
            raise RequestInvalid("dataset", "must not contain '..'")
        node = r.string("node", max_len=63, pattern=NODE_NAME_RE, required=False)
        region = r.string("region", max_len=63, pattern=NODE_NAME_RE, required=False)
        if (node is None) == (region is None):
            raise RequestInvalid("node", "give exactly one of node or region")
        return cls(dataset, node, region)


class Coordinator:
    """Registry and link matrix over a :class:`StoreRunner`; one per application.

    The registry is cached in memory. On a store that several replicas share
    (``db.shared``) a node registered through another replica is read from the
    store when first named, and :meth:`refresh_registry` follows the others'
    changes; work that must happen once (:meth:`sweep`, computing the probe plan:
    :class:`~netopt.coordinator.planners.ElectedPlanner`) runs only while
    :attr:`leader`. ``follow_period_s`` is how often the app calls :meth:`follow_plan`.
    """

    def __init__(
        self,
        settings: CoordinatorSettings,
        db: StoreRunner,
        clock: Callable[[], float],
        follow_period_s: float = 2.0,
    ) -> None:
        self.settings = settings
        self.db = db
        self.clock = clock
        self.nodes: dict[str, StoredNode] = {}
        self._dirty: set[str] = set()
        self._generation = 0
        self._registry_cursor: int | None = None
        self.leader = False
        self.catalogue: DatasetsSettings | None = None
        if settings.datasets_file is not None:
            # ConfigError (naming the file) here stops the coordinator at startup.
            self.catalogue = load_settings(settings.datasets_file, "datasets")
        pp = settings.probe_plan
        self.plan_options = PlanOptions(
            per_node_budget=pp.per_node_budget,
            representatives_per_region_pair=pp.representatives_per_region_pair,
            bandwidth_interval_s=pp.bandwidth_interval_s,
            bandwidth_slot_s=pp.bandwidth_slot_s,
            bandwidth_tests=pp.bandwidth_tests,
        )
        self.planner: Planner = (
            ElectedPlanner(db, self.plan_options, clock, self._live_key, follow_period_s)
            if db.shared
            else LocalPlanner(
                self.plan_options, clock, self._live_key,
                lambda: self._generation, lambda: len(self.nodes),
            )
        )  # fmt: skip

    async def load(self) -> None:
        """Read the registry from the database (after a restart)."""
        rows, self._registry_cursor = await self.db.call(self.db.store.nodes_changed, None)
        self.nodes = {n.name: n for n in rows}
        self._generation += 1

    def _agent_info(self) -> dict[str, Any]:
        s = self.settings
        return {
            "stale_after_s": s.stale_after_s,
            "heartbeat_interval_s": round(s.stale_after_s / 3, 3),
            "max_request_bytes": s.max_request_bytes,
            "server_time_s": self.clock(),
        }

    async def register(self, reg: Registration, observed_host: str) -> dict[str, Any]:
        """Add or update a node; ``observed_host`` is used when it advertises no address."""
        now = self.clock()
        old = self.nodes.get(reg.node)
        node = StoredNode(
            name=reg.node,
            region=reg.region,
            host=reg.advertise_host or observed_host,
            registration=reg.to_dict(),
            registered_at_s=now if old is None else old.registered_at_s,
            last_seen_s=now,
            left_at_s=None,
            health={} if old is None else old.health,
        )
        await self.db.call(self.db.store.save_node, node)
        self.nodes[reg.node] = node
        self._dirty.discard(reg.node)
        self._generation += 1
        return {
            "node": node.name,
            "region": node.region,
            "host": node.host,
            "plan_version": self.plan().version,
            **self._agent_info(),
        }

    async def known(self, name: str) -> StoredNode:
        """The registry row of ``name``; NotFoundError when no replica registered it."""
        node = self.nodes.get(name)
        if node is None and self.db.shared:
            # Registered through another replica: the store knows it.
            node = await self.db.call(self.db.store.node, name)
            if node is not None:
                self.nodes[name] = node
                self._generation += 1
        if node is None:
            raise NotFoundError(f"node {name!r} is not registered; register first")
        return node

    async def refresh_registry(self) -> int:
        """Take the other replicas' registrations, departures and heartbeats from the store.

        Only the rows written since the last read come back (``nodes_changed``), so a
        quiet registry costs one small query, not a read of the fleet. A heartbeat
        this replica holds that is newer than the stored one is kept. Returns how
        many nodes changed; nothing to do on a store of one's own.
        """
        if not self.db.shared:
            return 0
        changed = 0
        rows, cursor = await self.db.call(self.db.store.nodes_changed, self._registry_cursor)
        self._registry_cursor = cursor
        for stored in rows:
            mine = self.nodes.get(stored.name)
            if mine == stored:
                continue
            if (
                mine is not None
                and stored.name in self._dirty
                and (mine.last_seen_s >= stored.last_seen_s and mine.left_at_s is None)
            ):
                continue  # our own newer heartbeat, flushed at the next flush
            if mine is None or (mine.left_at_s is None) != (stored.left_at_s is None):
                self._generation += 1  # membership moved
            self.nodes[stored.name] = stored
            changed += 1
        return changed

    async def elect(self) -> bool:
        """Ask the store whether this replica does the once-only work; sets :attr:`leader`.

        Raises StorageError (and stops leading) when the store cannot be reached.
        """
        try:
            self.leader = await self.db.elect()
        except NetoptError:
            self.leader = False
            raise
        return self.leader

    async def placement(self, req: PlacementRequest) -> dict[str, Any]:
        """Whether the catalogue lets ``req.dataset`` be placed on the node or region.

        Raises NotFoundError for an unregistered node and ResidencyError (naming the
        rule) when the dataset's residency excludes the region. A dataset missing
        from the catalogue (or no catalogue) is allowed, and the answer says so.
        """
        region = req.region if req.node is None else (await self.known(req.node)).region
        spec = None if self.catalogue is None else self.catalogue.get(req.dataset)
        reason = residency_violation(spec, region)
        if reason is not None:
            raise ResidencyError(f"refused: {reason}")
        answer: dict[str, Any] = {"allowed": True, "dataset": req.dataset, "region": region}
        if req.node is not None:
            answer["node"] = req.node
        if spec is None:
            answer["note"] = "dataset is not in the catalogue: no residency rule applies"
        else:
            answer["residency"] = None if spec.residency is None else list(spec.residency)
        return answer

    async def heartbeat(self, name: str, beat: Heartbeat) -> dict[str, Any]:
        """Mark the node alive (a node that had left is back); persisted in batches."""
        node = await self.known(name)
        now = self.clock()
        if node_state(node, now, self.settings.stale_after_s) != "live":
            self._generation += 1  # a stale or departed node rejoins the plan now
        self.nodes[name] = dataclasses.replace(
            node, last_seen_s=now, left_at_s=None, health=beat.to_dict()
        )
        if node.left_at_s is not None:
            await self.db.call(self.db.store.save_node, self.nodes[name])
        else:
            self._dirty.add(name)
        return {"node": name, "state": "live", "plan_version": self.plan().version,
                **self._agent_info()}  # fmt: skip

    async def leave(self, name: str) -> dict[str, Any]:
        """Deregister (graceful shutdown): the node drops out of the plan, stays listed."""
        node = dataclasses.replace(await self.known(name), left_at_s=self.clock())
        await self.db.call(self.db.store.save_node, node)
        self.nodes[name] = node
        self._generation += 1
        return {"node": name, "state": "left"}

    async def flush_heartbeats(self) -> int:
        """Write the last heartbeat of every node that sent one since the last flush."""
        names, self._dirty = self._dirty, set()
        updates = [(n, self.nodes[n].last_seen_s, self.nodes[n].health) for n in sorted(names)]
        if updates:
            await self.db.call(self.db.store.touch_nodes, updates)
        return len(updates)

    def _live_key(self, now: float) -> tuple[PlanNode, ...]:
        return tuple(
            PlanNode(n.name, n.region, n.host, int(n.registration.get("probe_port") or 7471),
                     n.registration.get("data_port"))
            for n in self.nodes.values()
            if node_state(n, now, self.settings.stale_after_s) == "live"
        )  # fmt: skip

    def plan(self) -> ProbePlan:
        """The fleet's plan this replica serves (see :mod:`netopt.coordinator.planners`)."""
        return self.planner.plan()

    async def start_plan(self) -> None:
        """The first plan, at start-up (after :meth:`load` and :meth:`elect`)."""
        await self.planner.start(self.leader)

    async def follow_plan(self) -> None:
        """Each follow period: the stored plan read, or (leading) a new one stored."""
        await self.planner.follow(self.leader)

    async def close(self) -> None:
        """Stop a plan computation in progress."""
        await self.planner.close()

    async def node_plan(self, name: str) -> dict[str, Any]:
        """One agent's plan; a node that is not live gets an empty plan."""
        await self.known(name)
        return self.plan().for_node(name).to_dict()

    async def ingest(self, name: str, batch: SummaryBatch) -> IngestResult:
        """Store a batch once; every summary must be measured by ``name`` (``src``)."""
        await self.known(name)
        for index, summary in enumerate(batch.summaries):
            if summary.src != name:
                raise RequestInvalid(
                    f"summaries[{index}].src", f"must be the reporting node {name!r}"
                )
        now = self.clock()
        return await self.db.ingest(
            BatchToStore(
                name, batch.batch_id, batch.summaries, now, now - self.settings.retention_s
            )
        )

    def node_views(self) -> list[dict[str, Any]]:
        """Every known node with its state (``live``/``stale``/``left``) and details."""
        now = self.clock()
        out = []
        for node in sorted(self.nodes.values(), key=lambda n: (n.region, n.name)):
            reg = node.registration
            out.append(
                {
                    "node": node.name,
                    "region": node.region,
                    "host": node.host,
                    "state": node_state(node, now, self.settings.stale_after_s),
                    "last_seen_s": node.last_seen_s,
                    "age_s": max(0.0, now - node.last_seen_s),
                    "registered_at_s": node.registered_at_s,
                    "netopt_version": reg.get("netopt_version"),
                    "cpu_count": reg.get("cpu_count"),
                    "nics": reg.get("nics", []),
                    "probe_port": reg.get("probe_port"),
                    "data_port": reg.get("data_port"),
                    "health": node.health,
                }
            )
        return out

    def state_counts(self) -> dict[str, int]:
        """How many nodes are live, stale and left."""
        counts = {"live": 0, "stale": 0, "left": 0}
        now = self.clock()
        for node in self.nodes.values():
            counts[node_state(node, now, self.settings.stale_after_s)] += 1
        return counts

    def _regions(self) -> dict[str, str]:
        return {n.name: n.region for n in self.nodes.values()}

    async def links(self, window_s: float) -> dict[str, Any]:
        """The node-pair matrix over the last ``window_s`` seconds."""
        now = self.clock()
        links, _ = await self.db.matrix(now - window_s, self._regions())
        return {"window_s": window_s, "now_s": now, "links": links}

    async def region_matrix(self, window_s: float) -> dict[str, Any]:
        """Region-pair aggregates over the last ``window_s`` seconds."""
        now = self.clock()
        regions = self._regions()
        _, pairs = await self.db.matrix(now - window_s, regions, with_regions=True)
        return {
            "window_s": window_s,
            "now_s": now,
            "regions": sorted(set(regions.values())),
            "pairs": pairs,
        }

    async def history(self, src: str, dst: str, window_s: float, limit: int) -> dict[str, Any]:
        """Recent summaries of ``src`` -> ``dst``, oldest first."""
        now = self.clock()
        points = await self.db.call(self.db.store.history, src, dst, now - window_s, limit)
        return {"src": src, "dst": dst, "window_s": window_s, "summaries": points}

    async def sweep(self) -> int:
        """Apply retention: delete data older than ``retention_s``; returns rows deleted.

        Only the leader sweeps (see :meth:`elect`); another replica returns 0.
        """
        if not self.leader:
            return 0
        return await self.db.call(self.db.store.sweep, self.clock() - self.settings.retention_s)
