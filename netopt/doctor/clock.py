"""Clock offset between nodes from STAMP-style probe timestamps.

A probe carries the sender's send time ``t1``; the reflector stamps arrival
``t2`` and departure ``t3``; the sender stamps the reply's arrival ``t4``.
With symmetric paths the peer's clock is ahead of ours by
``((t2 - t1) + (t3 - t4)) / 2``; the samples with the lowest RTT have the least
queueing asymmetry, so the estimate uses those. It matters for merged logs and
one-way delay figures, not for training throughput itself.
"""

from __future__ import annotations

import contextlib
import secrets
import select
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from netopt.doctor.findings import Finding
from netopt.measure.packet import (
    KIND_REPLY,
    KIND_REQUEST,
    PacketError,
    PacketKey,
    ProbePacket,
    decode,
    encode,
)
from netopt.measure.samples import SYSTEM_CLOCK, Clock
from netopt.measure.udpsock import open_udp_socket, recv_batch

__all__ = [
    "ClockOffset",
    "StampSample",
    "check_clock",
    "estimate_offset",
    "measure_stamps",
]

MAX_PROBES = 50
OFFSET_WARN_MS = 10.0
OFFSET_BAD_MS = 100.0


@dataclass(frozen=True)
class StampSample:
    """One answered probe's four timestamps (ns; t1/t4 our clock, t2/t3 the peer's)."""

    t1_ns: int
    t2_ns: int
    t3_ns: int
    t4_ns: int

    @property
    def rtt_ns(self) -> int:
        """Round trip less the reflector's own time."""
        return (self.t4_ns - self.t1_ns) - (self.t3_ns - self.t2_ns)

    @property
    def offset_ns(self) -> float:
        """How far the peer's clock is ahead of ours, assuming symmetric paths."""
        return ((self.t2_ns - self.t1_ns) + (self.t3_ns - self.t4_ns)) / 2


@dataclass(frozen=True)
class ClockOffset:
    """Estimated offset (peer minus us) with its uncertainty (half the best RTT)."""

    peer: str
    offset_ms: float
    best_rtt_ms: float
    samples_used: int

    @property
    def uncertainty_ms(self) -> float:
        """The estimate is off by at most half the RTT (fully asymmetric path)."""
        return self.best_rtt_ms / 2


def estimate_offset(
    peer: str, samples: Sequence[StampSample], best_fraction: float = 0.25
) -> ClockOffset | None:
    """Median offset of the lowest-RTT ``best_fraction`` of samples (pure; None if none)."""
    if not samples:
        return None
    ordered = sorted(samples, key=lambda s: s.rtt_ns)
    best = ordered[: max(1, int(len(ordered) * best_fraction))]
    return ClockOffset(
        peer=peer,
        offset_ms=statistics.median(s.offset_ns for s in best) / 1e6,
        best_rtt_ms=best[0].rtt_ns / 1e6,
        samples_used=len(best),
    )


def measure_stamps(
    host: str,
    port: int,
    token: str,
    count: int = 20,
    interval_s: float = 0.02,
    timeout_s: float = 1.0,
    clock: Clock = SYSTEM_CLOCK,
) -> list[StampSample]:
    """Send ``count`` (<= MAX_PROBES) probes to a netopt reflector and collect timestamps.

    Takes at most ``count * interval_s + timeout_s`` seconds. Raises
    PeerUnreachableError when ``host`` cannot be addressed.
    """
    key = PacketKey(token)
    session = secrets.randbits(64)
    sent: dict[int, int] = {}
    samples: list[StampSample] = []
    count = min(count, MAX_PROBES)
    sock = open_udp_socket(remote=(host, port))
    try:
        deadline_s = time.monotonic() + count * interval_s + timeout_s
        next_send_s = time.monotonic()
        seq = 0
        while time.monotonic() < deadline_s and len(samples) < count:
            now_s = time.monotonic()
            if seq < count and now_s >= next_send_s:
                t1_ns = clock.now_ns()
                sent[seq] = t1_ns
                # An ICMP error or a full buffer: this probe is lost.
                with contextlib.suppress(OSError):
                    sock.send(encode(ProbePacket(KIND_REQUEST, session, seq, t1_ns), key))
                seq += 1
                next_send_s = now_s + interval_s
            wait_s = max(0.0, min(next_send_s if seq < count else deadline_s, deadline_s) - now_s)
            select.select([sock], [], [], wait_s)
            batch, _errors = recv_batch(sock, clock)
            for data, _addr, rx_ns in batch:
                try:
                    reply = decode(data, key)
                except PacketError:
                    continue
                if reply.kind == KIND_REPLY and reply.session == session and reply.seq in sent:
                    t1 = sent.pop(reply.seq)
                    samples.append(StampSample(t1, reply.refl_rx_ns, reply.refl_tx_ns, rx_ns))
    finally:
        sock.close()
    return samples


def check_clock(offset: ClockOffset) -> Finding | None:
    """A finding when the peer's clock is off by more than 10 ms (beyond the uncertainty)."""
    error_ms = abs(offset.offset_ms) - offset.uncertainty_ms
    if error_ms < OFFSET_WARN_MS:
        return None
    return Finding(
        check="clock",
        impact=15 if error_ms >= OFFSET_BAD_MS else 8,
        title=f"clock of {offset.peer} is off by {offset.offset_ms:+.1f} ms",
        subject=offset.peer,
        evidence=f"{offset.samples_used} best-RTT probe(s): offset {offset.offset_ms:+.2f} ms "
        f"+/- {offset.uncertainty_ms:.2f} ms (RTT {offset.best_rtt_ms:.2f} ms); logs from "
        "the two nodes interleave wrongly and one-way delays are skewed",
        fix="run chrony on both nodes against the same NTP servers: systemctl enable --now "
        "chrony; check with chronyc tracking",
    )
