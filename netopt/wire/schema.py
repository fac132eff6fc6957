"""The coordinator's wire types: what agents send, shared by both sides.

Agents build these frozen dataclasses and send ``to_dict()``; the coordinator
reads request bodies with ``from_dict()``, which validates types, ranges,
lengths and unknown keys and raises :class:`RequestInvalid` (HTTP 400) naming the
field. Every numeric key carries its unit.

A link summary is compatible with ``netopt.measure.stats.LinkStats.to_dict()``:
``LinkSummary.from_dict({**stats.to_dict(), "src": me, "dst": peer,
"taken_at_s": now_s, "window_s": window_s})`` accepts it (``target`` and
``duration_s`` are kept as given).
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast

from netopt.names import IFNAME_RE, NODE_NAME_RE
from netopt.wire.fields import Reader, RequestInvalid, check_number

__all__ = [
    "BATCH_ID_RE",
    "MAX_SUMMARIES_PER_BATCH",
    "METHODS",
    "Heartbeat",
    "LinkSummary",
    "Method",
    "Nic",
    "OutageRecord",
    "Registration",
    "RequestInvalid",
    "RttFigures",
    "SummaryBatch",
    "check_node_name",
]

Method = Literal["udp", "tcp-connect", "bulk-tcp", "iperf3"]
METHODS: tuple[str, ...] = ("udp", "tcp-connect", "bulk-tcp", "iperf3")
BANDWIDTH_METHODS = ("bulk-tcp", "iperf3")

MAX_SUMMARIES_PER_BATCH = 1000
MAX_NICS = 32
MAX_ADDRESSES_PER_NIC = 16
MAX_OUTAGES = 256
MAX_TIME_S = 2.0**34  # unix seconds, year ~2514: rejects ms-for-s mistakes
MAX_RTT_MS = 3_600_000.0
MAX_RATE_BPS = 1e13
MAX_WINDOW_S = 86_400.0
MAX_PROBES = 100_000_000
MAX_NIC_MBPS = 10_000_000.0
NAME_MAX_LEN = 63

BATCH_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
VERSION_RE = re.compile(r"[A-Za-z0-9.+_-]{1,32}")
CC_RE = re.compile(r"[a-z0-9_]{1,16}")
TARGET_MAX_LEN = 256
RTT_KEYS = frozenset(("min", "mean", "p50", "p90", "p99", "max"))
OUTAGE_KEYS = frozenset(("start_s", "duration_s", "lost_count", "ongoing"))
SUMMARY_KEYS = frozenset(
    ("src", "dst", "taken_at_s", "window_s", "method", "probes_sent", "probes_received",
     "rtt_ms", "jitter_ms", "delay_variation_ms", "loss_ratio", "loss_ratio_ci95",
     "reordered_count", "duplicate_count", "late_count", "outages", "single_stream_bps",
     "aggregate_bps", "streams", "congestion_control", "target", "duration_s")
)  # fmt: skip


def check_node_name(value: str, field: str = "node") -> str:
    """``value`` if it is a node/region name (lowercase host name, <= 63 chars)."""
    if not NODE_NAME_RE.fullmatch(value):
        raise RequestInvalid(field, f"{value[:40]!r} is not a valid name (lowercase a-z0-9-)")
    return value


def _name(reader: Reader, key: str) -> str:
    return cast(str, reader.string(key, max_len=NAME_MAX_LEN, pattern=NODE_NAME_RE))


@dataclass(frozen=True)
class Nic:
    """One network interface of a node: its name, addresses (``ip`` or ``ip/prefix``,
    as ``ip -j addr`` shows them), speed, MTU, and whether it offers RDMA.

    The one NIC type: an agent's registration carries it (`to_wire` / `from_dict`:
    name, addresses, speed, MTU; ``rdma`` is no part of the registration's wire
    format), the coordinator's ``/api/v1/nodes`` answer returns it (`read`), and the
    NCCL tuner reads it (``netopt.nccl.model`` re-exports it; a links file's
    ``config.links.NicSpec`` becomes one in ``nccl.from_links``, the one edge).
    """

    name: str
    addresses: tuple[str, ...] = ()
    speed_mbps: float | None = None
    mtu: int = 1500
    rdma: bool = False

    def interfaces(self) -> tuple[ipaddress.IPv4Interface | ipaddress.IPv6Interface, ...]:
        """The addresses parsed; a bare address counts as a host route (/32, /128)."""
        return tuple(ipaddress.ip_interface(a) for a in self.addresses)

    def families(self) -> frozenset[int]:
        """IP versions (4, 6) with a usable address: not loopback, not link-local."""
        return frozenset(
            i.version for i in self.interfaces() if not (i.is_loopback or i.is_link_local)
        )

    def to_wire(self) -> dict[str, Any]:
        """The NIC as a registration sends it: name, addresses, speed, MTU."""
        return {
            "name": self.name,
            "addresses": list(self.addresses),
            "speed_mbps": self.speed_mbps,
            "mtu": self.mtu,
        }

    @classmethod
    def from_dict(cls, data: object, path: str) -> Nic:
        """A registration's NIC: unknown keys are refused."""
        r = Reader(data, path)
        nic = cls.read(r)
        r.done()
        return nic

    @classmethod
    def read(cls, r: Reader) -> Nic:
        """The NIC's fields from ``r`` (unknown keys left to the caller: an answer ignores
        what a newer coordinator adds, a request refuses it)."""
        name = r.string("name", max_len=15, pattern=IFNAME_RE)
        addresses = []
        for where, item in r.items("addresses", max_items=MAX_ADDRESSES_PER_NIC, required=False):
            if not isinstance(item, str) or len(item) > 64:
                raise RequestInvalid(where, "expected an IP address string")
            try:
                addresses.append(str(ipaddress.ip_interface(item)))
            except ValueError:
                raise RequestInvalid(where, f"{item[:64]!r} is not an IP address") from None
        speed = r.number("speed_mbps", ge=0, le=MAX_NIC_MBPS, required=False)
        mtu = r.integer("mtu", ge=68, le=65536, required=False)
        return cls(name, tuple(addresses), speed, mtu=1500 if mtu is None else mtu)


@dataclass(frozen=True)
class Registration:
    """``POST /api/v1/agents/register``: who the agent is and where it answers probes.

    ``advertise_host`` is the address peers should probe; when absent the
    coordinator uses the address the registration came from.
    """

    node: str
    region: str
    netopt_version: str
    cpu_count: int
    nics: tuple[Nic, ...] = ()
    advertise_host: str | None = None
    probe_port: int = 7471
    data_port: int | None = None

    @classmethod
    def from_dict(cls, data: object) -> Registration:
        r = Reader(data)
        node, region = _name(r, "node"), _name(r, "region")
        version = r.string("netopt_version", max_len=32, pattern=VERSION_RE)
        cpu_count = r.integer("cpu_count", ge=1, le=65536)
        nics = tuple(Nic.from_dict(v, p) for p, v in r.items("nics", max_items=MAX_NICS))
        host = r.string("advertise_host", max_len=64, required=False)
        if host is not None:
            try:
                host = str(ipaddress.ip_address(host))
            except ValueError:
                raise RequestInvalid("advertise_host", "is not an IP address") from None
        probe_port = r.integer("probe_port", ge=1, le=65535, required=False)
        data_port = r.integer("data_port", ge=1, le=65535, required=False)
        r.done()
        return cls(node, region, version, cpu_count, nics, host, probe_port or 7471, data_port)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able request body."""
        data = asdict(self)
        data["nics"] = [n.to_wire() for n in self.nics]
        return data


@dataclass(frozen=True)
class Heartbeat:
    """``POST /api/v1/agents/{node}/heartbeat``: optional health figures of the agent."""

    uptime_s: float | None = None
    spool_bytes: int | None = None
    spool_dropped_count: int | None = None

    @classmethod
    def from_dict(cls, data: object) -> Heartbeat:
        r = Reader({} if data is None else data)
        uptime = r.number("uptime_s", ge=0, le=MAX_TIME_S, required=False)
        spool = r.integer("spool_bytes", ge=0, le=2**53, required=False)
        dropped = r.integer("spool_dropped_count", ge=0, le=2**53, required=False)
        r.done()
        return cls(uptime, spool, dropped)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able request body."""
        return asdict(self)


@dataclass(frozen=True)
class RttFigures:
    """Round-trip times of one window, in milliseconds (ordered min <= p50 <= ... <= max)."""

    min: float
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def from_reader(cls, r: Reader) -> RttFigures:
        values = {k: r.number(k, ge=0, le=MAX_RTT_MS) for k in ("min", "mean", "p50", "p90")}
        values["p99"] = r.number("p99", ge=0, le=MAX_RTT_MS)
        values["max"] = r.number("max", ge=0, le=MAX_RTT_MS)
        r.done()
        chain = ("min", "p50", "p90", "p99", "max")
        for low, high in itertools.pairwise(chain):
            if values[low] > values[high] * (1 + 1e-9):
                raise RequestInvalid(f"{r.path}.{low}", f"is greater than {high}")
        if not values["min"] * (1 - 1e-9) <= values["mean"] <= values["max"] * (1 + 1e-9):
            raise RequestInvalid(f"{r.path}.mean", "is outside min..max")
        return cls(**values)


@dataclass(frozen=True)
class OutageRecord:
    """A run of lost probes: start (relative to the window start) and duration, seconds."""

    start_s: float
    duration_s: float
    lost_count: int | None = None
    ongoing: bool = False


@dataclass(frozen=True)
class LinkSummary:
    """One link's figures over one measurement window, as measured by ``src``.

    ``taken_at_s`` is the unix time at the end of the window. Probe methods
    (``udp``, ``tcp-connect``) carry RTT/loss; bandwidth methods (``bulk-tcp``,
    ``iperf3``) carry ``single_stream_bps`` and/or ``aggregate_bps``.
    """

    src: str
    dst: str
    taken_at_s: float
    window_s: float
    method: Method
    probes_sent: int = 0
    probes_received: int = 0
    rtt_ms: RttFigures | None = None
    jitter_ms: float | None = None
    delay_variation_ms: tuple[float, float, float] | None = None  # p50, p90, p99
    loss_ratio: float | None = None
    loss_ratio_ci95: tuple[float, float] | None = None
    reordered_count: int = 0
    duplicate_count: int = 0
    late_count: int = 0
    outages: tuple[OutageRecord, ...] = ()
    single_stream_bps: float | None = None
    aggregate_bps: float | None = None
    streams: int | None = None
    congestion_control: str | None = None
    target: str | None = None
    duration_s: float | None = None

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> LinkSummary:
        """Validate one summary; RequestInvalid names the field that is wrong."""
        r = Reader(data, path, SUMMARY_KEYS)
        src, dst = _name(r, "src"), _name(r, "dst")
        if src == dst:
            raise RequestInvalid(f"{r.path}.dst" if path else "dst", "equals src")
        taken_at_s = r.number("taken_at_s", ge=0, le=MAX_TIME_S)
        window_s = r.number("window_s", ge=0.001, le=MAX_WINDOW_S)
        method = r.string("method", max_len=16, choices=METHODS)
        sent = r.integer("probes_sent", ge=0, le=MAX_PROBES, required=False) or 0
        received = r.integer("probes_received", ge=0, le=MAX_PROBES, required=False) or 0
        rtt_reader = r.child("rtt_ms", required=False, keys=RTT_KEYS)
        rtt = None if rtt_reader is None else RttFigures.from_reader(rtt_reader)
        jitter = r.number("jitter_ms", ge=0, le=MAX_RTT_MS, required=False)
        pdv = _pdv(r.child("delay_variation_ms", required=False))
        loss = r.number("loss_ratio", ge=0, le=1, required=False)
        ci = _interval(r, "loss_ratio_ci95")
        counts = [
            r.integer(k, ge=0, le=MAX_PROBES, required=False) or 0
            for k in ("reordered_count", "duplicate_count", "late_count")
        ]
        outages = tuple(
            _outage(v, p) for p, v in r.items("outages", max_items=MAX_OUTAGES, required=False)
        )
        single = r.number("single_stream_bps", ge=0, le=MAX_RATE_BPS, required=False)
        aggregate = r.number("aggregate_bps", ge=0, le=MAX_RATE_BPS, required=False)
        streams = r.integer("streams", ge=1, le=1024, required=False)
        cc = r.string("congestion_control", max_len=16, pattern=CC_RE, required=False)
        target = r.string("target", max_len=TARGET_MAX_LEN, required=False)
        duration = r.number("duration_s", ge=0, le=MAX_WINDOW_S, required=False)
        r.done()
        here = f"{r.path}." if r.path else ""
        if received > sent:
            raise RequestInvalid(here + "probes_received", "is greater than probes_sent")
        if method in BANDWIDTH_METHODS and single is None and aggregate is None:
            raise RequestInvalid(here + "aggregate_bps", f"a {method} summary needs a rate")
        if method not in BANDWIDTH_METHODS and (sent == 0 or loss is None):
            raise RequestInvalid(here + "probes_sent", f"a {method} summary needs probes and loss")
        if ci is not None and loss is not None and not ci[0] - 1e-9 <= loss <= ci[1] + 1e-9:
            raise RequestInvalid(here + "loss_ratio_ci95", "does not contain loss_ratio")
        return cls(
            src, dst, taken_at_s, window_s, cast(Method, method), sent, received, rtt, jitter,
            pdv, loss, ci, counts[0], counts[1], counts[2], outages, single, aggregate, streams,
            cc, target, duration,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """JSON-able data (the inverse of :meth:`from_dict`)."""
        rtt, pdv, ci = self.rtt_ms, self.delay_variation_ms, self.loss_ratio_ci95
        # Written out rather than dataclasses.asdict: this runs for every stored summary.
        return {
            "src": self.src,
            "dst": self.dst,
            "taken_at_s": self.taken_at_s,
            "window_s": self.window_s,
            "method": self.method,
            "probes_sent": self.probes_sent,
            "probes_received": self.probes_received,
            "rtt_ms": None
            if rtt is None
            else {"min": rtt.min, "mean": rtt.mean, "p50": rtt.p50, "p90": rtt.p90,
                  "p99": rtt.p99, "max": rtt.max},
            "jitter_ms": self.jitter_ms,
            "delay_variation_ms": None
            if pdv is None
            else {"p50": pdv[0], "p90": pdv[1], "p99": pdv[2]},
            "loss_ratio": self.loss_ratio,
            "loss_ratio_ci95": None if ci is None else [ci[0], ci[1]],
            "reordered_count": self.reordered_count,
            "duplicate_count": self.duplicate_count,
            "late_count": self.late_count,
            "outages": [
                {"start_s": o.start_s, "duration_s": o.duration_s, "lost_count": o.lost_count,
                 "ongoing": o.ongoing}
                for o in self.outages
            ],
            "single_stream_bps": self.single_stream_bps,
            "aggregate_bps": self.aggregate_bps,
            "streams": self.streams,
            "congestion_control": self.congestion_control,
            "target": self.target,
            "duration_s": self.duration_s,
        }  # fmt: skip


def _pdv(r: Reader | None) -> tuple[float, float, float] | None:
    if r is None:
        return None
    values = tuple(r.number(k, ge=0, le=MAX_RTT_MS) for k in ("p50", "p90", "p99"))
    r.done()
    return cast(tuple[float, float, float], values)


def _interval(r: Reader, key: str) -> tuple[float, float] | None:
    bounds = [check_number(v, p, 0, 1) for p, v in r.items(key, max_items=2, required=False)]
    if not bounds and r.data.get(key) is None:
        return None
    where = f"{r.path}.{key}" if r.path else key
    if len(bounds) != 2 or bounds[0] > bounds[1]:
        raise RequestInvalid(where, "expected [low, high] with low <= high")
    return (bounds[0], bounds[1])


def _outage(data: object, path: str) -> OutageRecord:
    r = Reader(data, path, OUTAGE_KEYS)
    start = r.number("start_s", ge=0, le=MAX_WINDOW_S)
    duration = r.number("duration_s", ge=0, le=MAX_WINDOW_S)
    lost = r.integer("lost_count", ge=0, le=MAX_PROBES, required=False)
    ongoing = r.boolean("ongoing", default=False)
    r.done()
    return OutageRecord(start, duration, lost, ongoing)


@dataclass(frozen=True)
class SummaryBatch:
    """``POST /api/v1/agents/{node}/summaries``: summaries sent together under one id.

    ``batch_id`` is chosen by the agent and unique per agent (for example a
    spool sequence number); a batch sent again under the same id is acknowledged
    as a duplicate and not stored twice.
    """

    batch_id: str
    summaries: tuple[LinkSummary, ...]

    @classmethod
    def from_dict(cls, data: object, max_summaries: int = MAX_SUMMARIES_PER_BATCH) -> SummaryBatch:
        r = Reader(data)
        batch_id = cast(str, r.string("batch_id", max_len=64, pattern=BATCH_ID_RE))
        summaries = tuple(
            LinkSummary.from_dict(v, p) for p, v in r.items("summaries", max_items=max_summaries)
        )
        r.done()
        return cls(batch_id, summaries)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able request body."""
        return {"batch_id": self.batch_id, "summaries": [s.to_dict() for s in self.summaries]}
