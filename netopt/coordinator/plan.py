"""Who probes whom, and when bandwidth tests run: a pure function of the live nodes.

``make_plan(nodes, options) -> ProbePlan``

- Inside a region: full mesh, each unordered pair probed once (by the end with
  fewer probes so far). When a region is larger than the per-node budget
  allows, pairs are taken by increasing distance on the ring of sorted names,
  which keeps every node's degree within budget and the region connected.
- Across regions: for every region pair, ``representatives`` nodes on each side,
  chosen by rendezvous hashing (so a join or leave moves few assignments), all
  pairs between them. Cross-border links are placed first: they are few and
  they are what the NCCL tuner and the transfer planner most need.
- Budget: a node takes part (as prober or as reflector) in at most
  ``per_node_budget`` links.
- Bandwidth tests: one per planned link per cycle, in time slots so that no
  node is in two tests at once (which also means no link carries two tests at
  once). Slots come from a greedy edge colouring; the cycle is
  ``max(bandwidth_interval_s, slots * slot_s)`` long and anchored at unix time 0,
  so a test runs at every ``k * cycle_s + offset_s``.
"""

from __future__ import annotations

import functools
import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "BandwidthTest",
    "NodePlan",
    "PlanNode",
    "PlanOptions",
    "ProbeAssignment",
    "ProbePlan",
    "make_plan",
]

LinkKind = Literal["in-region", "cross-border"]


@dataclass(frozen=True)
class PlanNode:
    """A live node as the planner sees it."""

    name: str
    region: str
    host: str
    probe_port: int = 7471
    data_port: int | None = None


@dataclass(frozen=True)
class PlanOptions:
    """Knobs of the planner (from ``CoordinatorSettings.probe_plan``)."""

    per_node_budget: int = 32
    representatives_per_region_pair: int = 2
    bandwidth_interval_s: float = 600.0
    bandwidth_slot_s: float = 15.0
    bandwidth_tests: bool = True
    """False: plan no bandwidth tests (bulk TCP would disturb what runs on the links)."""


@dataclass(frozen=True)
class ProbeAssignment:
    """``src`` probes ``dst`` (RTT, jitter, loss) continuously."""

    src: str
    dst: str
    kind: LinkKind


@dataclass(frozen=True)
class BandwidthTest:
    """``src`` sends to ``dst`` for at most ``slot_s`` starting at cycle offset ``offset_s``."""

    src: str
    dst: str
    slot: int
    offset_s: float


@dataclass(frozen=True)
class ProbePlan:
    """The whole fleet's plan; ``version`` changes whenever any assignment does."""

    version: str
    nodes: tuple[PlanNode, ...]
    probes: tuple[ProbeAssignment, ...]
    bandwidth: tuple[BandwidthTest, ...]
    cycle_s: float
    slot_s: float

    @functools.cached_property
    def _nodes_by_name(self) -> dict[str, PlanNode]:
        return {n.name: n for n in self.nodes}

    @functools.cached_property
    def _by_node(self) -> dict[str, tuple[list[ProbeAssignment], list[BandwidthTest]]]:
        index: dict[str, tuple[list[ProbeAssignment], list[BandwidthTest]]] = defaultdict(
            lambda: ([], [])
        )
        for probe in self.probes:
            index[probe.src][0].append(probe)
        for test in self.bandwidth:
            index[test.src][1].append(test)
        return dict(index)

    def for_node(self, name: str) -> NodePlan:
        """What ``name`` must do: the peers it probes and its bandwidth tests as sender."""
        by_name = self._nodes_by_name
        probes, tests = self._by_node.get(name, ([], []))
        return NodePlan(
            node=name,
            version=self.version,
            peers=tuple(by_name[p.dst] for p in probes),
            kinds=tuple(p.kind for p in probes),
            bandwidth=tuple((by_name[t.dst], t.offset_s) for t in tests),
            cycle_s=self.cycle_s,
            slot_s=self.slot_s,
        )


@dataclass(frozen=True)
class NodePlan:
    """One agent's part of a :class:`ProbePlan` (what ``GET /agents/{node}/plan`` returns)."""

    node: str
    version: str
    peers: tuple[PlanNode, ...]
    kinds: tuple[LinkKind, ...]
    bandwidth: tuple[tuple[PlanNode, float], ...]
    cycle_s: float
    slot_s: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-able response body."""
        return {
            "node": self.node,
            "plan_version": self.version,
            "probes": [
                {**_peer(peer), "kind": kind}
                for peer, kind in zip(self.peers, self.kinds, strict=True)
            ],
            "bandwidth_cycle_s": self.cycle_s,
            "bandwidth_slot_s": self.slot_s,
            "bandwidth_tests": [{**_peer(p), "offset_s": off} for p, off in self.bandwidth],
        }


def _peer(node: PlanNode) -> dict[str, Any]:
    return {
        "node": node.name,
        "region": node.region,
        "host": node.host,
        "probe_port": node.probe_port,
        "data_port": node.data_port,
    }


def _rank(key: str, name: str) -> bytes:
    return hashlib.blake2b(f"{key}|{name}".encode(), digest_size=8).digest()


def make_plan(nodes: Iterable[PlanNode], options: PlanOptions) -> ProbePlan:
    """Plan probes and bandwidth slots for ``nodes`` (duplicates by name: the last wins).

    Deterministic: the same nodes and options give the same plan and version.
    """
    members = sorted({n.name: n for n in nodes}.values(), key=lambda n: n.name)
    budget = {n.name: options.per_node_budget for n in members}
    regions: dict[str, list[str]] = defaultdict(list)
    for node in members:
        regions[node.region].append(node.name)
    pairs: list[tuple[str, str, LinkKind]] = []
    names = sorted(regions)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            pairs.extend(_cross(regions[first], regions[second], first, second, budget, options))
    for region in names:
        pairs.extend(_mesh(regions[region], budget))
    probes = _orient(pairs)
    tests, slots = _schedule([(p.src, p.dst) for p in probes], options.bandwidth_slot_s)
    if not options.bandwidth_tests:
        tests, slots = (), 0
    cycle_s = max(options.bandwidth_interval_s, slots * options.bandwidth_slot_s)
    digest = hashlib.blake2b(digest_size=8)
    for node in members:
        digest.update(repr(node).encode())
    for probe in probes:
        digest.update(f"{probe.src}>{probe.dst};".encode())
    digest.update(f"{cycle_s}:{options.bandwidth_slot_s}:{options.bandwidth_tests}".encode())
    return ProbePlan(
        digest.hexdigest(), tuple(members), probes, tests, cycle_s, options.bandwidth_slot_s
    )


def _cross(
    first: Sequence[str],
    second: Sequence[str],
    first_region: str,
    second_region: str,
    budget: dict[str, int],
    options: PlanOptions,
) -> list[tuple[str, str, LinkKind]]:
    key = f"{first_region}/{second_region}"
    want = options.representatives_per_region_pair
    left = sorted(first, key=lambda n: _rank(key, n))
    right = sorted(second, key=lambda n: _rank(key, n))
    chosen_left = [n for n in left if budget[n] > 0][:want]
    chosen_right = [n for n in right if budget[n] > 0][:want]
    pairs: list[tuple[str, str, LinkKind]] = []
    for a in chosen_left:
        for b in chosen_right:
            if budget[a] > 0 and budget[b] > 0:
                budget[a] -= 1
                budget[b] -= 1
                pairs.append((a, b, "cross-border"))
    return pairs


def _mesh(members: Sequence[str], budget: dict[str, int]) -> list[tuple[str, str, LinkKind]]:
    count = len(members)
    pairs: list[tuple[str, str, LinkKind]] = []
    for distance in range(1, count // 2 + 1):
        if sum(1 for n in members if budget[n] > 0) < 2:
            break
        # At distance count/2 (even count) pair i and i+d are the same pair twice.
        stop = count // 2 if 2 * distance == count else count
        for i in range(stop):
            a, b = members[i], members[(i + distance) % count]
            if budget[a] > 0 and budget[b] > 0:
                budget[a] -= 1
                budget[b] -= 1
                pairs.append((min(a, b), max(a, b), "in-region"))
    return pairs


def _orient(pairs: Sequence[tuple[str, str, LinkKind]]) -> tuple[ProbeAssignment, ...]:
    """Give each pair a prober: the end that probes fewer links so far (ties: smaller name)."""
    load: dict[str, int] = defaultdict(int)
    out: list[ProbeAssignment] = []
    for a, b, kind in pairs:
        src, dst = (a, b) if (load[a], a) <= (load[b], b) else (b, a)
        load[src] += 1
        out.append(ProbeAssignment(src, dst, kind))
    return tuple(sorted(out, key=lambda p: (p.src, p.dst)))


def _schedule(
    links: Sequence[tuple[str, str]], slot_s: float
) -> tuple[tuple[BandwidthTest, ...], int]:
    """Greedy edge colouring: each link gets the first slot where neither end is busy."""
    busy: dict[str, int] = defaultdict(int)  # bit k set: the node is busy in slot k
    tests: list[BandwidthTest] = []
    slots = 0
    # Most constrained links first: those touching the busiest nodes.
    degree: dict[str, int] = defaultdict(int)
    for a, b in links:
        degree[a] += 1
        degree[b] += 1
    order = sorted(links, key=lambda link: (-(degree[link[0]] + degree[link[1]]), link))
    for src, dst in order:
        taken = busy[src] | busy[dst]
        free = ~taken & (taken + 1)  # lowest clear bit of `taken`
        slot = free.bit_length() - 1
        busy[src] |= free
        busy[dst] |= free
        slots = max(slots, slot + 1)
        tests.append(BandwidthTest(src, dst, slot, slot * slot_s))
    tests.sort(key=lambda t: (t.slot, t.src, t.dst))
    return tuple(tests), slots
