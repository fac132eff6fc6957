"""The coordinator's answers as typed values, read strictly where they enter a client.

A client parses what the coordinator sends with the same field readers the
coordinator uses for requests (`netopt.wire.fields.Reader`): types, ranges and
counts are checked, so an answer from a broken or hostile coordinator is a
`RequestInvalid` naming the field (the client turns it into a ProtocolError),
never a KeyError deep in the agent. Keys a newer coordinator adds are ignored.

Typed: one agent's probe plan (``GET /api/v1/agents/{node}/plan``:
`NodePlanAnswer`), the fleet's nodes (``GET /api/v1/nodes``: `NodesAnswer`) and
the link matrix (``GET /api/v1/links``: `LinksAnswer`). ``CoordinatorClient``'s
``plan``, ``nodes`` and ``links`` return them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from netopt.names import NODE_NAME_RE
from netopt.wire.fields import Reader
from netopt.wire.schema import MAX_NICS, MAX_RATE_BPS, MAX_RTT_MS, MAX_TIME_S, Nic

__all__ = [
    "MAX_LINKS",
    "MAX_NODES",
    "MAX_PLAN_ITEMS",
    "BandwidthFigures",
    "LatestFigures",
    "LinkView",
    "LinksAnswer",
    "NodePlanAnswer",
    "NodeView",
    "NodesAnswer",
    "PlannedProbe",
    "PlannedTest",
    "Spread",
    "WindowFigures",
]

MAX_PLAN_ITEMS = 4096
"""Probes or bandwidth tests one plan may list (the planner's budget is at most 1024)."""
MAX_HOST_CHARS = 255
MAX_VERSION_CHARS = 128
MAX_PERIOD_S = 1e9  # finite; the config bounds the cycle from below only
MAX_NODES = 100_000
"""Nodes one ``/api/v1/nodes`` answer may list."""
MAX_LINKS = 1_000_000
"""Node pairs one ``/api/v1/links`` answer may list (a thousand nodes probe far fewer)."""
MAX_COUNT = 2**53
NodeState = Literal["live", "stale", "left"]
NODE_STATES: tuple[str, ...] = ("live", "stale", "left")


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


def _name(r: Reader, key: str) -> str:
    value: str = r.string(key, max_len=64, pattern=NODE_NAME_RE)
    return value


def _optional_name(r: Reader, key: str) -> str | None:
    value: str | None = r.string(key, max_len=64, pattern=NODE_NAME_RE, required=False)
    return value


def _optional_float(r: Reader, key: str, le: float) -> float | None:
    value = r.number(key, ge=0, le=le, required=False)
    return None if value is None else float(value)


@dataclass(frozen=True)
class NodeView:
    """One node as the coordinator lists it: name, region, state, address, NICs, ports."""

    node: str
    region: str
    state: NodeState
    host: str | None = None
    nics: tuple[Nic, ...] = ()
    probe_port: int | None = None
    data_port: int | None = None
    netopt_version: str | None = None
    last_seen_s: float | None = None
    age_s: float | None = None
    cpu_count: int | None = None

    @classmethod
    def read(cls, r: Reader) -> NodeView:
        nics = tuple(
            Nic.read(Reader(item, where))
            for where, item in r.items("nics", max_items=MAX_NICS, required=False)
        )
        return cls(
            node=_name(r, "node"),
            region=_name(r, "region"),
            state=r.string("state", max_len=8, choices=NODE_STATES),
            host=r.string("host", max_len=MAX_HOST_CHARS, required=False),
            nics=nics,
            probe_port=r.integer("probe_port", ge=1, le=65535, required=False),
            data_port=r.integer("data_port", ge=1, le=65535, required=False),
            netopt_version=r.string("netopt_version", max_len=MAX_VERSION_CHARS, required=False),
            last_seen_s=_optional_float(r, "last_seen_s", MAX_TIME_S),
            age_s=_optional_float(r, "age_s", MAX_TIME_S),
            cpu_count=r.integer("cpu_count", ge=1, le=65536, required=False),
        )

    def addresses(self) -> tuple[str, ...]:
        """Where the node may be reached: its host, then its NICs' addresses (no prefix)."""
        found = [self.host] if self.host else []
        found += [a.split("/", 1)[0] for nic in self.nics for a in nic.addresses]
        return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class NodesAnswer:
    """``GET /api/v1/nodes``: every node the coordinator knows, with its state."""

    nodes: tuple[NodeView, ...]
    now_s: float | None = None
    stale_after_s: float | None = None

    @classmethod
    def from_dict(cls, data: object) -> NodesAnswer:
        """Read the answer; RequestInvalid (naming the field) for anything malformed."""
        r = Reader(data, "nodes answer")
        return cls(
            nodes=tuple(
                NodeView.read(Reader(item, where))
                for where, item in r.items("nodes", max_items=MAX_NODES)
            ),
            now_s=_optional_float(r, "now_s", MAX_TIME_S),
            stale_after_s=_optional_float(r, "stale_after_s", MAX_PERIOD_S),
        )

    def live(self) -> tuple[NodeView, ...]:
        """The nodes that have not left (live or stale)."""
        return tuple(n for n in self.nodes if n.state != "left")


@dataclass(frozen=True)
class Spread:
    """Percentiles of one figure over a window."""

    p50: float
    p90: float
    p99: float

    @classmethod
    def read(cls, r: Reader | None, le: float) -> Spread | None:
        if r is None:
            return None
        return cls(*(float(r.number(k, ge=0, le=le)) for k in ("p50", "p90", "p99")))


@dataclass(frozen=True)
class LatestFigures:
    """A pair's newest summary with probes (any figure may be absent)."""

    taken_at_s: float | None = None
    rtt_p50_ms: float | None = None
    rtt_p99_ms: float | None = None
    jitter_ms: float | None = None
    loss_ratio: float | None = None

    @classmethod
    def read(cls, r: Reader | None) -> LatestFigures | None:
        if r is None:
            return None
        return cls(
            _optional_float(r, "taken_at_s", MAX_TIME_S),
            _optional_float(r, "rtt_p50_ms", MAX_RTT_MS),
            _optional_float(r, "rtt_p99_ms", MAX_RTT_MS),
            _optional_float(r, "jitter_ms", MAX_RTT_MS),
            _optional_float(r, "loss_ratio", 1.0),
        )


@dataclass(frozen=True)
class WindowFigures:
    """A pair's figures over the whole window."""

    rtt_p50_ms: Spread | None = None
    rtt_min_ms: float | None = None
    jitter_ms: Spread | None = None
    loss_ratio: float | None = None
    probes_sent: int = 0

    @classmethod
    def read(cls, r: Reader | None) -> WindowFigures:
        if r is None:
            return cls()
        return cls(
            Spread.read(r.child("rtt_p50_ms", required=False), MAX_RTT_MS),
            _optional_float(r, "rtt_min_ms", MAX_RTT_MS),
            Spread.read(r.child("jitter_ms", required=False), MAX_RTT_MS),
            _optional_float(r, "loss_ratio", 1.0),
            r.integer("probes_sent", ge=0, le=MAX_COUNT, required=False) or 0,
        )


@dataclass(frozen=True)
class BandwidthFigures:
    """A pair's newest bulk-TCP / iperf3 rates, bits per second."""

    single_stream_bps: float | None = None
    aggregate_bps: float | None = None
    taken_at_s: float | None = None

    @classmethod
    def read(cls, r: Reader | None) -> BandwidthFigures:
        if r is None:
            return cls()
        return cls(
            _optional_float(r, "single_stream_bps", MAX_RATE_BPS),
            _optional_float(r, "aggregate_bps", MAX_RATE_BPS),
            _optional_float(r, "taken_at_s", MAX_TIME_S),
        )


@dataclass(frozen=True)
class LinkView:
    """One (src, dst) entry of the link matrix, as measured by ``src``."""

    src: str
    dst: str
    src_region: str | None = None
    dst_region: str | None = None
    summary_count: int = 0
    latest_at_s: float | None = None
    latest: LatestFigures | None = None
    window: WindowFigures = WindowFigures()
    bandwidth: BandwidthFigures = BandwidthFigures()

    @classmethod
    def read(cls, r: Reader) -> LinkView:
        return cls(
            src=_name(r, "src"),
            dst=_name(r, "dst"),
            src_region=_optional_name(r, "src_region"),
            dst_region=_optional_name(r, "dst_region"),
            summary_count=r.integer("summary_count", ge=0, le=MAX_COUNT, required=False) or 0,
            latest_at_s=_optional_float(r, "latest_at_s", MAX_TIME_S),
            latest=LatestFigures.read(r.child("latest", required=False)),
            window=WindowFigures.read(r.child("window", required=False)),
            bandwidth=BandwidthFigures.read(r.child("bandwidth", required=False)),
        )


@dataclass(frozen=True)
class LinksAnswer:
    """``GET /api/v1/links``: the node-pair matrix over the last ``window_s`` seconds."""

    links: tuple[LinkView, ...]
    window_s: float | None = None
    now_s: float | None = None

    @classmethod
    def from_dict(cls, data: object) -> LinksAnswer:
        """Read the answer; RequestInvalid (naming the field) for anything malformed."""
        r = Reader(data, "links answer")
        return cls(
            links=tuple(
                LinkView.read(Reader(item, where))
                for where, item in r.items("links", max_items=MAX_LINKS)
            ),
            window_s=_optional_float(r, "window_s", MAX_PERIOD_S),
            now_s=_optional_float(r, "now_s", MAX_TIME_S),
        )
