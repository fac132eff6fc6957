"""The coordinator's answers as typed values, read strictly where they enter a client.

A client parses what the coordinator sends with the same field readers the
coordinator uses for requests (`netopt.wire.fields.Reader`): types, ranges and
counts are checked, so an answer from a broken or hostile coordinator is a
`RequestInvalid` naming the field (the client turns it into a ProtocolError),
never a KeyError deep in the agent. Keys a newer coordinator adds are ignored.

Typed so far: one agent's probe plan (``GET /api/v1/agents/{node}/plan``). The
fleet's nodes and links are still read as documents by their callers.
"""

from __future__ import annotations

from dataclasses import dataclass

from netopt.names import NODE_NAME_RE
from netopt.wire.fields import Reader

__all__ = ["MAX_PLAN_ITEMS", "NodePlanAnswer", "PlannedProbe", "PlannedTest"]

MAX_PLAN_ITEMS = 4096
"""Probes or bandwidth tests one plan may list (the planner's budget is at most 1024)."""
MAX_HOST_CHARS = 255
MAX_VERSION_CHARS = 128
MAX_PERIOD_S = 1e9  # finite; the config bounds the cycle from below only


@dataclass(frozen=True)
class PlannedProbe:
    """A peer this node probes: its name, region, address and ports."""

    node: str
    region: str
    host: str
    probe_port: int
    data_port: int | None = None

    @classmethod
    def read(cls, r: Reader) -> PlannedProbe:
        return cls(
            node=r.string("node", max_len=64, pattern=NODE_NAME_RE),
            region=r.string("region", max_len=64, pattern=NODE_NAME_RE),
            host=r.string("host", max_len=MAX_HOST_CHARS),
            probe_port=r.integer("probe_port", ge=1, le=65535),
            data_port=r.integer("data_port", ge=1, le=65535, required=False),
        )


@dataclass(frozen=True)
class PlannedTest:
    """A bandwidth test this node sends to ``peer``, ``offset_s`` into each cycle."""

    peer: PlannedProbe
    offset_s: float


@dataclass(frozen=True)
class NodePlanAnswer:
    """One agent's plan: whom it probes and its bandwidth tests as sender."""

    node: str
    plan_version: str
    probes: tuple[PlannedProbe, ...]
    bandwidth_cycle_s: float
    bandwidth_slot_s: float
    bandwidth_tests: tuple[PlannedTest, ...]

    @classmethod
    def from_dict(cls, data: object) -> NodePlanAnswer:
        """Read the answer; RequestInvalid (naming the field) for anything malformed."""
        r = Reader(data, "plan")
        probes = tuple(
            PlannedProbe.read(Reader(item, where))
            for where, item in r.items("probes", max_items=MAX_PLAN_ITEMS)
        )
        tests = []
        for where, item in r.items("bandwidth_tests", max_items=MAX_PLAN_ITEMS):
            t = Reader(item, where)
            offset_s = float(t.number("offset_s", ge=0, le=MAX_PERIOD_S))
            tests.append(PlannedTest(PlannedProbe.read(t), offset_s))
        return cls(
            node=r.string("node", max_len=64, pattern=NODE_NAME_RE),
            plan_version=r.string("plan_version", max_len=MAX_VERSION_CHARS),
            probes=probes,
            bandwidth_cycle_s=float(r.number("bandwidth_cycle_s", ge=0, le=MAX_PERIOD_S)),
            bandwidth_slot_s=float(r.number("bandwidth_slot_s", ge=0, le=MAX_PERIOD_S)),
            bandwidth_tests=tuple(tests),
        )
