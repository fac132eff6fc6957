"""A :class:`~netopt.coordinator.plan.ProbePlan` as JSON text and back (pure).

The elected replica stores the plan it computed in the database
(``probe_plans.plan_json``) and every replica serves it from there, so the
text must give back the very plan: the same nodes, assignments, slots and
version. Compact arrays, not objects: a plan of a thousand nodes holds tens of
thousands of assignments.
"""

from __future__ import annotations

import json
from typing import Any

from netopt.coordinator.plan import BandwidthTest, PlanNode, ProbeAssignment, ProbePlan
from netopt.errors import StorageError

__all__ = ["plan_from_json", "plan_to_json"]

_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_KINDS = ("in-region", "cross-border")


def plan_to_json(plan: ProbePlan) -> str:
    """The plan as one JSON text (see :func:`plan_from_json`)."""
    return _ENCODE(
        {
            "version": plan.version,
            "cycle_s": plan.cycle_s,
            "slot_s": plan.slot_s,
            "nodes": [[n.name, n.region, n.host, n.probe_port, n.data_port] for n in plan.nodes],
            "probes": [[p.src, p.dst, p.kind] for p in plan.probes],
            "bandwidth": [[t.src, t.dst, t.slot, t.offset_s] for t in plan.bandwidth],
        }
    )


def plan_from_json(text: str) -> ProbePlan:
    """The plan :func:`plan_to_json` wrote; StorageError when the text is not one."""
    try:
        doc: Any = json.loads(text)
        nodes = tuple(
            PlanNode(str(name), str(region), str(host), int(port), _port(data))
            for name, region, host, port, data in doc["nodes"]
        )
        probes = tuple(
            ProbeAssignment(str(src), str(dst), _kind(kind)) for src, dst, kind in doc["probes"]
        )
        tests = tuple(
            BandwidthTest(str(src), str(dst), int(slot), float(offset))
            for src, dst, slot, offset in doc["bandwidth"]
        )
        plan = ProbePlan(
            str(doc["version"]), nodes, probes, tests, float(doc["cycle_s"]), float(doc["slot_s"])
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise StorageError(f"a stored probe plan is malformed: {exc}") from None
    names = {n.name for n in nodes}
    ends = [(p.src, p.dst) for p in probes] + [(t.src, t.dst) for t in tests]
    if any(src not in names or dst not in names for src, dst in ends):
        raise StorageError("a stored probe plan names a node it does not list")
    return plan


def _port(port: object) -> int | None:
    return None if port is None else int(str(port))


def _kind(kind: object) -> Any:
    if kind not in _KINDS:
        raise ValueError(f"unknown link kind {kind!r}")
    return kind
