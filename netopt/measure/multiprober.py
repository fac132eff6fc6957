"""One socket and one timer for probing many peers: the agent's continuous prober.

:class:`SharedProber` probes any number of peers from one UDP socket per address
family, driven by one timer on the shared grid (see
:func:`netopt.measure.udpsock.next_tick_s`): each tick it reads every queued reply
(kernel receive timestamps, as :class:`~netopt.measure.prober.UdpProber` does),
sends the probes due to every peer, and closes the windows that are complete.
Replies are told apart by their authenticated session id; every peer window has
its own random session, so windows stay independent and replays of an old window
count as bad packets.

Each peer is measured in back-to-back windows of ``count`` probes (one Poisson or
fixed-rate stream across window boundaries); a window ends ``timeout_s`` after its
last probe (sooner when every probe is answered) and is handed, as the same
:class:`ProbeSeries` a ``UdpProber`` run gives, to the peer's sink. ``await
prober.probe(target)`` measures one window, so a SharedProber is also a
:class:`~netopt.measure.prober.Prober`, and concurrent ``probe`` calls share the
socket and timer.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from netopt.config.services import ProbeSettings
from netopt.errors import PeerUnreachableError, ValidationError
from netopt.measure.packet import KIND_REPLY, PacketError, PacketKey, decode_fields, encode_request
from netopt.measure.prober import Spacing, probe_count, send_offsets_s
from netopt.measure.samples import SYSTEM_CLOCK, Clock, ProbeSeries, ProbeTarget, Reply
from netopt.measure.udpsock import next_tick_s, open_udp_socket, recv_batch

__all__ = ["PeerStream", "ProberCounters", "SharedProber", "WindowSink"]

log = logging.getLogger(__name__)

WindowSink = Callable[[ProbeTarget, ProbeSeries], None]
"""Called (synchronously, in the timer) with each finished window of a peer."""

_MAX_BURST = 4  # probes one tick may send to one peer back to back, on average
_MAX_REPLIES_PER_TICK = 128  # many peers: a shorter tick, so replies fit the socket buffer
_RCVBUF_BYTES = 1024 * 1024  # replies of all peers wait here between ticks


@dataclass
class ProberCounters:
    """What the shared prober sent, and what it did with each datagram it received."""

    sent: int = 0
    replies: int = 0
    malformed: int = 0
    truncated: int = 0
    oversized: int = 0
    unauthenticated: int = 0
    unexpected_kind: int = 0
    unknown_session: int = 0  # authentic, but no open window has that session (late or foreign)
    wrong_source: int = 0  # authentic, for an open window, but not from that peer's address
    bad_seq: int = 0  # authentic, for an open window, but a seq it never sent
    socket_errors: int = 0

    @property
    def rejected(self) -> int:
        """Datagrams dropped as bad (everything but the replies)."""
        total = sum(int(getattr(self, f.name)) for f in fields(self))
        return total - (self.sent + self.replies + self.socket_errors)

    def to_dict(self) -> dict[str, int]:
        """The counters as JSON-able data."""
        return {**vars(self), "rejected": self.rejected}


class _Window:
    """One window of one peer: its session, schedule, and what came back."""

    __slots__ = ("answered", "closes_at_s", "offsets_s", "replies", "sent_ns", "session", "start_s")

    def __init__(self, session: int, start_s: float, offsets_s: list[float]) -> None:
        self.session = session
        self.start_s = start_s
        self.offsets_s = offsets_s
        self.sent_ns: list[int] = []
        self.replies: list[Reply] = []
        self.answered: set[int] = set()
        self.closes_at_s = float("inf")


class PeerStream:
    """One peer being probed by a :class:`SharedProber` (the handle ``add`` returns)."""

    __slots__ = (
        "next_start_s",
        "open_windows",
        "rng",
        "sending",
        "sink",
        "sockaddr",
        "target",
        "windows_left",
    )

    def __init__(
        self,
        target: ProbeTarget,
        sockaddr: tuple[Any, ...],
        sink: WindowSink,
        windows_left: int | None,
        rng: random.Random,
        start_s: float,
    ) -> None:
        self.target = target
        self.sockaddr = sockaddr
        self.sink = sink
        self.windows_left = windows_left
        self.sending: _Window | None = None
        self.next_start_s = start_s
        self.open_windows = 0
        self.rng = rng

    @property
    def active(self) -> bool:
        """Whether more windows are to come."""
        return self.windows_left is None or self.windows_left > 0

    @property
    def done(self) -> bool:
        """No window to come and none open."""
        return not self.active and self.open_windows == 0


class SharedProber:
    """Probes many peers in windows of ``count`` probes at ``rate_pps`` each.

    Rate, spacing, padding, timeout and ``batch_s`` mean what they mean for
    :class:`~netopt.measure.prober.UdpProber`. The socket(s) and the timer start
    with the first peer and stop when no peer is left (or on :meth:`close`).
    """

    def __init__(
        self,
        token: str,
        count: int,
        rate_pps: float = 20.0,
        spacing: Spacing = "poisson",
        padding_bytes: int = 0,
        timeout_s: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
        seed: int | None = None,
        batch_s: float = 0.1,
    ) -> None:
        if count < 1 or rate_pps <= 0 or timeout_s <= 0:
            raise ValidationError(f"cannot probe {count} times at {rate_pps}/s, {timeout_s} s")
        self.count = count
        self.rate_pps = rate_pps
        self.spacing: Spacing = spacing
        self.padding_bytes = padding_bytes
        self.timeout_s = timeout_s
        self.clock = clock
        self.counters = ProberCounters()
        self._key = PacketKey(token)
        self._rng = random.Random(seed)
        self._tick_s = min(batch_s, _MAX_BURST / rate_pps) if batch_s > 0 else 1 / rate_pps
        self._peers: list[PeerStream] = []
        self._open: dict[int, tuple[PeerStream, _Window]] = {}
        self._socks: dict[int, socket.socket] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._ticking = False

    @classmethod
    def from_settings(
        cls, settings: ProbeSettings, token: str, clock: Clock = SYSTEM_CLOCK
    ) -> SharedProber:
        """A prober with windows of ``settings.window_s`` at the settings' rate."""
        return cls(
            token,
            count=probe_count(settings.window_s, settings.rate_pps),
            rate_pps=settings.rate_pps,
            spacing=settings.spacing,
            padding_bytes=settings.padding_bytes,
            timeout_s=settings.timeout_s,
            clock=clock,
            batch_s=settings.batch_s,
        )

    @property
    def peers(self) -> int:
        """How many peers are being probed."""
        return len(self._peers)

    @property
    def local_addresses(self) -> list[tuple[Any, ...]]:
        """The addresses its sockets are bound to (none before the first peer)."""
        return [sock.getsockname() for sock in self._socks.values()]

    def add(
        self, target: ProbeTarget, sink: WindowSink, *, windows: int | None = None
    ) -> PeerStream:
        """Start probing ``target`` (``windows`` windows, or until removed); call in a loop.

        The first probe leaves at the next tick. Raises PeerUnreachableError when
        the host cannot be resolved, NetworkError when no socket can be opened.
        """
        loop = asyncio.get_running_loop()
        try:
            infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_DGRAM)
        except OSError as exc:
            raise PeerUnreachableError(f"cannot resolve {target.host}: {exc}") from None
        family, _, _, _, sockaddr = infos[0]
        if family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(sockaddr[0], str):
            raise PeerUnreachableError(f"{target.host} is not an IP host")
        if family not in self._socks:
            wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"  # noqa: S104 - replies only
            self._socks[family] = open_udp_socket(local=(wildcard, 0), rcvbuf_bytes=_RCVBUF_BYTES)
        seed = self._rng.getrandbits(64)
        stream = PeerStream(target, sockaddr, sink, windows, random.Random(seed), loop.time())
        self._peers.append(stream)
        if self._timer is None and not self._ticking:
            self._schedule(loop)
        return stream

    def remove(self, stream: PeerStream) -> None:
        """Stop probing ``stream``'s peer now; its unfinished windows are dropped (idempotent)."""
        stream.windows_left = 0
        stream.sending = None
        stream.open_windows = 0
        for session, (owner, _) in list(self._open.items()):
            if owner is stream:
                del self._open[session]
        if stream in self._peers:
            self._peers.remove(stream)
        if not self._peers:
            self.close()

    async def probe(self, target: ProbeTarget) -> ProbeSeries:
        """One window to ``target`` (the Prober protocol); concurrent calls share the socket.

        Raises PeerUnreachableError when the host cannot be resolved.
        """
        done: asyncio.Future[ProbeSeries] = asyncio.get_running_loop().create_future()

        def sink(_: ProbeTarget, series: ProbeSeries) -> None:
            if not done.done():
                done.set_result(series)

        stream = self.add(target, sink, windows=1)
        try:
            return await done
        finally:
            self.remove(stream)

    def close(self) -> None:
        """Stop the timer and close the sockets; open windows are dropped (idempotent)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
        self._open.clear()
        for stream in self._peers:
            stream.windows_left = 0
        self._peers.clear()

    async def __aenter__(self) -> SharedProber:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the tick

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        tick_s = min(
            self._tick_s, _MAX_REPLIES_PER_TICK / (max(1, len(self._peers)) * self.rate_pps)
        )
        self._timer = loop.call_at(next_tick_s(loop.time(), tick_s), self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._ticking = True
        try:
            self._run_tick(loop.time())
        finally:
            self._ticking = False
        self._peers = [p for p in self._peers if not p.done]
        if not self._peers:
            self.close()
        elif self._timer is None:
            self._schedule(loop)

    def _run_tick(self, now_s: float) -> None:
        for sock in self._socks.values():
            batch, errors = recv_batch(sock, self.clock)
            self.counters.socket_errors += errors
            for data, addr, rx_ns in batch:
                self._take(data, addr, rx_ns)
        for stream in self._peers:
            self._send_due(stream, now_s)
        finished = [
            (session, owner, window)
            for session, (owner, window) in self._open.items()
            if now_s >= window.closes_at_s
            or (window.closes_at_s < float("inf") and len(window.answered) >= self.count)
        ]
        for session, owner, window in finished:
            if self._open.pop(session, None) is not None:
                owner.open_windows -= 1
                self._finish(owner, window)

    def _take(self, data: bytes, addr: tuple[str, int], t4_ns: int) -> None:
        counters = self.counters
        try:
            kind, session, seq, _, _, refl_rx_ns, refl_tx_ns = decode_fields(data, self._key)
        except PacketError as exc:
            setattr(counters, exc.reason, getattr(counters, exc.reason) + 1)
            return
        if kind != KIND_REPLY:
            counters.unexpected_kind += 1
            return
        entry = self._open.get(session)
        if entry is None:
            counters.unknown_session += 1
            return
        owner, window = entry
        if addr[1] != owner.sockaddr[1] or addr[0] != owner.sockaddr[0]:
            counters.wrong_source += 1
            return
        if seq >= len(window.sent_ns):
            counters.bad_seq += 1
            return
        counters.replies += 1
        turnaround_ns = max(0, refl_tx_ns - refl_rx_ns)
        rtt_ms = max(0, t4_ns - window.sent_ns[seq] - turnaround_ns) / 1e6
        window.replies.append(Reply(seq, t4_ns / 1e9, rtt_ms))
        window.answered.add(seq)

    def _send_due(self, stream: PeerStream, now_s: float) -> None:
        window = stream.sending
        if window is None:
            if not stream.active or now_s < stream.next_start_s:
                return
            if stream.windows_left is not None:
                stream.windows_left -= 1
            offsets = send_offsets_s(self.count, self.rate_pps, self.spacing, stream.rng)
            session = secrets.randbits(64)
            window = _Window(session, stream.next_start_s, offsets)
            stream.sending = window
            stream.open_windows += 1
            self._open[session] = (stream, window)
        sock = self._socks[socket.AF_INET6 if len(stream.sockaddr) == 4 else socket.AF_INET]
        offsets = window.offsets_s
        seq = len(window.sent_ns)
        while seq < len(offsets) and window.start_s + offsets[seq] <= now_s:
            t1_ns = self.clock.now_ns()
            window.sent_ns.append(t1_ns)
            data = encode_request(window.session, seq, t1_ns, self.padding_bytes, self._key)
            try:
                sock.sendto(data, stream.sockaddr)
            except OSError:
                # A full buffer or an ICMP error reported here: the probe is lost.
                self.counters.socket_errors += 1
            self.counters.sent += 1
            seq += 1
        if seq >= len(offsets):
            window.closes_at_s = now_s + self.timeout_s
            stream.sending = None
            if self.spacing == "fixed":
                gap_s = 1 / self.rate_pps
            else:
                gap_s = stream.rng.expovariate(self.rate_pps)
            stream.next_start_s = window.start_s + offsets[-1] + gap_s

    def _finish(self, stream: PeerStream, window: _Window) -> None:
        series = ProbeSeries(
            method="udp",
            sent_at_s=tuple(t / 1e9 for t in window.sent_ns),
            replies=tuple(window.replies),
            timeout_s=self.timeout_s,
            target=str(stream.target),
        )
        try:
            stream.sink(stream.target, series)
        except Exception:
            log.exception("the window sink for %s failed", stream.target)
