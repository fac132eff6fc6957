"""What a prober records: the raw series that :func:`netopt.measure.stats.summarise` reads."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

__all__ = [
    "SYSTEM_CLOCK",
    "Clock",
    "Method",
    "ProbeSeries",
    "ProbeTarget",
    "Reply",
    "SystemClock",
]

Method = Literal["udp", "tcp-connect"]
"""How RTT was measured: UDP probes, or TCP connects where UDP is blocked."""


class Clock(Protocol):
    """A clock in integer nanoseconds.

    It must be the clock the kernel stamps received datagrams with
    (``SO_TIMESTAMPNS``: CLOCK_REALTIME), since send and receive times of one
    probe are subtracted. Only differences over about a second matter, so no
    clock has to agree with another host's.
    """

    def now_ns(self) -> int:
        """Now, in nanoseconds."""
        ...


class SystemClock:
    """``time.time_ns``: the clock of the kernel's receive timestamps."""

    def now_ns(self) -> int:
        """Now, in nanoseconds since the epoch."""
        return time.time_ns()


SYSTEM_CLOCK = SystemClock()


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """A peer to measure: its reflector (UDP ``port``) and bulk sink (TCP ``tcp_port``)."""

    host: str
    port: int
    tcp_port: int | None = None

    @property
    def sink_port(self) -> int:
        """The TCP port of the bulk sink (the UDP port unless given)."""
        return self.port if self.tcp_port is None else self.tcp_port

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class Reply(NamedTuple):
    """One answer, in arrival order: its probe's ``seq``, arrival time and RTT.

    Immutable; a named tuple rather than a frozen dataclass because probers build
    one per reply, and this is several times cheaper to build.
    """

    seq: int
    received_at_s: float
    rtt_ms: float


@dataclass(frozen=True)
class ProbeSeries:
    """Everything one probe run saw.

    ``sent_at_s[seq]`` is when probe ``seq`` left (sender's monotonic clock, seconds);
    ``replies`` holds every authenticated answer in arrival order, duplicates included.
    A reply more than ``timeout_s`` after its probe is late and counts as lost.
    """

    method: Method
    sent_at_s: tuple[float, ...]
    replies: tuple[Reply, ...]
    timeout_s: float
    target: str = ""

    @property
    def probes_sent(self) -> int:
        """How many probes were sent."""
        return len(self.sent_at_s)

    @property
    def answered_seqs(self) -> frozenset[int]:
        """Sequence numbers that got at least one answer, late or not."""
        return frozenset(r.seq for r in self.replies)
