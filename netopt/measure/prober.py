"""Probers: the I/O edge that turns a target into a :class:`ProbeSeries`.

``Prober`` is the protocol (``await prober.probe(target) -> ProbeSeries``);
:class:`UdpProber` sends authenticated probes to a reflector at a fixed or
Poisson-spaced rate; :class:`FakeProber` makes a series from a link model, for
unit tests of the logic above the edge.
"""

from __future__ import annotations

import asyncio
import math
import random
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from netopt.errors import PeerUnreachableError, ValidationError
from netopt.measure.packet import KIND_REPLY, PacketError, PacketKey, decode_fields, encode_request
from netopt.measure.samples import SYSTEM_CLOCK, Clock, ProbeSeries, ProbeTarget, Reply
from netopt.measure.udpsock import next_tick_s, open_udp_socket, recv_batch

__all__ = ["FakeLink", "FakeProber", "Prober", "UdpProber", "probe_count", "send_offsets_s"]

Spacing = Literal["fixed", "poisson"]
_MAX_BURST = 4  # probes one tick may send back to back, on average


class Prober(Protocol):
    """Measures one target and returns the raw series."""

    async def probe(self, target: ProbeTarget) -> ProbeSeries:
        """Probe ``target``; raises PeerUnreachableError when it cannot even be addressed."""
        ...


def send_offsets_s(
    count: int, rate_pps: float, spacing: Spacing, rng: random.Random | None = None
) -> list[float]:
    """When each of ``count`` probes leaves, in seconds after the first.

    ``fixed`` spaces them ``1/rate_pps`` apart; ``poisson`` draws exponential gaps
    with that mean (RFC 2330 sampling: no phase lock with periodic events).
    Raises ValidationError for a non-positive rate or a negative count.
    """
    if rate_pps <= 0 or count < 0:
        raise ValidationError(f"cannot send {count} probes at {rate_pps} per second")
    if spacing == "fixed":
        return [seq / rate_pps for seq in range(count)]
    draw = rng or random.Random()
    offsets: list[float] = []
    at_s = 0.0
    for _ in range(count):
        offsets.append(at_s)
        at_s += draw.expovariate(rate_pps)
    return offsets


class _Session:
    """One probe run's state: what was sent, what came back."""

    def __init__(self, key: PacketKey, session: int) -> None:
        self.key = key
        self.session = session
        self.sent_ns: list[int] = []
        self.replies: list[Reply] = []
        self.answered: set[int] = set()
        self.rejected = 0
        self.socket_errors = 0

    def take(self, data: bytes, t4_ns: int) -> None:
        try:
            kind, session, seq, _, _, refl_rx_ns, refl_tx_ns = decode_fields(data, self.key)
        except PacketError:
            self.rejected += 1
            return
        if kind != KIND_REPLY or session != self.session or seq >= len(self.sent_ns):
            self.rejected += 1
            return
        turnaround_ns = max(0, refl_tx_ns - refl_rx_ns)
        rtt_ms = max(0, t4_ns - self.sent_ns[seq] - turnaround_ns) / 1e6
        self.replies.append(Reply(seq, t4_ns / 1e9, rtt_ms))
        self.answered.add(seq)


@dataclass
class UdpProber:
    """Sends ``count`` authenticated probes to a reflector and collects the replies.

    Rate, spacing, padding and timeout come from the arguments (see
    ``ProbeSettings``). Sends and reads happen on a timer grid of
    ``min(batch_s, 4/rate_pps)`` shared with everything else in the process (a
    probe leaves at the first tick at or after its scheduled time; its actual
    send time is recorded); replies carry kernel receive timestamps. After the
    last probe it waits up to ``timeout_s`` for stragglers, less when every probe
    is answered.
    """

    token: str
    count: int
    rate_pps: float = 20.0
    spacing: Spacing = "poisson"
    padding_bytes: int = 0
    timeout_s: float = 2.0
    clock: Clock = SYSTEM_CLOCK
    seed: int | None = None
    stop_at_first_reply: bool = False
    batch_s: float = 0.1

    async def probe(self, target: ProbeTarget) -> ProbeSeries:
        """Probe ``target``'s reflector. Raises PeerUnreachableError if it cannot be addressed."""
        loop = asyncio.get_running_loop()
        key = PacketKey(self.token)
        state = _Session(key, secrets.randbits(64))
        offsets = send_offsets_s(self.count, self.rate_pps, self.spacing, random.Random(self.seed))
        tick_s = (
            min(self.batch_s, _MAX_BURST / self.rate_pps) if self.batch_s > 0 else 1 / self.rate_pps
        )
        sock = open_udp_socket(remote=(target.host, target.port))
        try:
            await self._run(loop, sock, state, offsets, tick_s)
        finally:
            sock.close()
        return ProbeSeries(
            method="udp",
            sent_at_s=tuple(t / 1e9 for t in state.sent_ns),
            replies=tuple(state.replies),
            timeout_s=self.timeout_s,
            target=str(target),
        )

    async def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        state: _Session,
        offsets: Sequence[float],
        tick_s: float,
    ) -> None:
        start_s = loop.time()
        seq = 0
        deadline_s = math.inf
        while True:
            now_s = loop.time()
            batch, errors = recv_batch(sock, self.clock)
            state.socket_errors += errors
            for data, _, rx_ns in batch:
                state.take(data, rx_ns)
            if self.stop_at_first_reply and state.answered:
                return
            while seq < len(offsets) and start_s + offsets[seq] <= now_s:
                self._send(sock, state, seq)
                seq += 1
            if seq >= len(offsets):
                deadline_s = min(deadline_s, now_s + self.timeout_s)
                if len(state.answered) >= len(offsets) or now_s >= deadline_s:
                    return
            await asyncio.sleep(max(0.0, next_tick_s(now_s, tick_s) - loop.time()))

    def _send(self, sock: socket.socket, state: _Session, seq: int) -> None:
        t1_ns = self.clock.now_ns()
        state.sent_ns.append(t1_ns)
        try:
            sock.send(encode_request(state.session, seq, t1_ns, self.padding_bytes, state.key))
        except OSError:
            # A full buffer or an ICMP error reported here: the probe is lost.
            state.socket_errors += 1


@dataclass(frozen=True)
class FakeLink:
    """A link model for :class:`FakeProber`: base RTT, uniform jitter, random loss, outages.

    ``outages_s`` holds (start, end) windows, in seconds after the first probe,
    during which every probe is lost.
    """

    rtt_ms: float = 10.0
    jitter_ms: float = 0.0
    loss_ratio: float = 0.0
    outages_s: tuple[tuple[float, float], ...] = ()
    duplicate_ratio: float = 0.0


@dataclass
class FakeProber:
    """A deterministic in-memory prober: ``count`` probes at ``rate_pps`` over a FakeLink."""

    link: FakeLink
    count: int = 100
    rate_pps: float = 20.0
    timeout_s: float = 2.0
    seed: int = 0
    unreachable: bool = False
    calls: int = 0

    async def probe(self, target: ProbeTarget) -> ProbeSeries:
        """The series the model gives; raises PeerUnreachableError if ``unreachable``."""
        self.calls += 1
        if self.unreachable:
            raise PeerUnreachableError(f"{target} is unreachable (fake)")
        rng = random.Random(self.seed)
        sent = [seq / self.rate_pps for seq in range(self.count)]
        replies: list[Reply] = []
        for seq, at_s in enumerate(sent):
            if any(start <= at_s < end for start, end in self.link.outages_s):
                continue
            if rng.random() < self.link.loss_ratio:
                continue
            rtt_ms = self.link.rtt_ms + rng.uniform(0, self.link.jitter_ms)
            replies.append(Reply(seq, at_s + rtt_ms / 1e3, rtt_ms))
            if rng.random() < self.link.duplicate_ratio:
                replies.append(Reply(seq, at_s + rtt_ms / 1e3 + 1e-4, rtt_ms))
        replies.sort(key=lambda r: r.received_at_s)
        return ProbeSeries("udp", tuple(sent), tuple(replies), self.timeout_s, str(target))


def probe_count(duration_s: float, rate_pps: float) -> int:
    """How many probes ``duration_s`` at ``rate_pps`` takes (at least one)."""
    return max(1, math.ceil(duration_s * rate_pps))
