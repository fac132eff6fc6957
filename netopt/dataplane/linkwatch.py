"""Notice a cut link's return at once, and drop the connections the cut left dead.

After a link cut the sync's connections wait out TCP's timers: the requests its
streams sent again, on pooled connections as dead as theirs or on fresh ones, sit in
a retransmission (or SYN) backoff that doubles each time. On the lab's 80 ms link cut
for 10 s the first packet after the restore left 1.3 s after it, and 1 MB had crossed
only 2.1-2.4 s after it. A `LinkWatch` probes the server with a bare TCP connect every
`PROBE_EVERY_S` from the first failure of a fetch until one connects. After probes
that were refused or unanswered, that connect shows the way is open again: every
connection waiting on a retransmission (what it sent unacknowledged, nothing heard
from the server since the failures began) or on a SYN sent into the cut (`unheard`)
is shut down, so whatever waits on one fails at once, and the workers try again on
fresh connections without their backoff (`netopt.dataplane.syncrun.SyncRun.back_off`).
A server that restarts is noticed the same way: its refusals keep the probes going
until it accepts. A first probe that connects at once shows no outage (a slow or
failing server): nothing is dropped and the workers keep their backoff, so a server
that accepts and fails every request is not asked again in a loop.

The probes are bounded: one starts every `PROBE_EVERY_S`, each gives up after
`probe_timeout_s` (under the kernel's first SYN retransmission, so one SYN each), at
most `MAX_PROBES` at a time, and they stop at the first connect or when the sync ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import weakref
from collections.abc import Callable

from netopt.dataplane import trace
from netopt.errors import ProtocolError
from netopt.tcpinfo import TCP_ESTABLISHED, TcpInfo, read_tcp_info

__all__ = [
    "MAX_PROBES",
    "PROBE_EVERY_S",
    "DeadRule",
    "LinkWatch",
    "TrackedSockets",
    "probe_timeout_s",
    "unheard",
]

log = logging.getLogger(__name__)

PROBE_EVERY_S = 0.25
"""How often a probe starts while a failure is unresolved: the link's return is noticed
within this and a round trip."""
PROBE_TIMEOUT_MIN_S = 0.9
"""A probe's shortest wait for its handshake: under the kernel's first SYN retransmission
(1 s), so each probe sends one SYN and a later probe, not a backed-off retry, sends the
next."""
PROBE_RTTS = 3
"""A probe waits at least this many round trips (a link slower than ~300 ms)."""
MAX_PROBES = 8
"""Probes waiting for their handshake at once, at most."""


def probe_timeout_s(rtt_s: float | None) -> float:
    """How long one probe waits for its handshake on a link of round trip ``rtt_s``."""
    return PROBE_TIMEOUT_MIN_S if rtt_s is None else max(PROBE_TIMEOUT_MIN_S, PROBE_RTTS * rtt_s)


DeadRule = Callable[[TcpInfo, float, bool], bool]
"""Whether a connection (its TCP_INFO) is left dead by the outage that a probe's connect
ends: ``(info, quiet_s, made_before_probe)`` as `unheard` takes them."""


def unheard(info: TcpInfo, quiet_s: float, made_before_probe: bool) -> bool:
    """Whether a connection (``info``) is left dead by a cut that the link's return ends:
    it sent what its peer has not acknowledged, and nothing (data or an acknowledgement)
    came from the peer for ``quiet_s``, the time since the failures began (its next
    retransmission waits on TCP's backed-off timer); or it is still in its handshake and
    was made before the probe that connected (``made_before_probe``: its SYN went into
    the cut, and its next is on the same timer). A connection that owes nothing is left
    alone, however quiet: an idle one in the pool, or one whose reader is the slow side
    (its data waits in a buffer); a handshake started after that probe is left to finish."""
    if info.state != TCP_ESTABLISHED:
        return made_before_probe
    if not info.unacked:
        return False
    return min(info.last_data_recv_ms, info.last_ack_recv_ms) / 1000 >= quiet_s


class TrackedSockets:
    """The sockets one source made (weakly held: a closed one drops out), each with when
    it was made, so that those a cut left dead can be found (`drop_unheard`)."""

    def __init__(self) -> None:
        self._made_s: weakref.WeakKeyDictionary[socket.socket, float] = weakref.WeakKeyDictionary()

    def add(self, sock: socket.socket) -> None:
        self._made_s[sock] = time.monotonic()

    def shortest_rtt_s(self) -> float | None:
        """The shortest round trip an open, established socket has measured (TCP_INFO's
        minimum where the kernel gives one); None before any has."""
        shortest_us = 0
        for sock in list(self._made_s):
            if sock.fileno() < 0:
                continue
            try:
                info = read_tcp_info(sock)
            except ProtocolError:
                continue
            rtt_us = info.min_rtt_us or info.rtt_us
            if (
                info.state == TCP_ESTABLISHED
                and rtt_us
                and (not shortest_us or rtt_us < shortest_us)
            ):
                shortest_us = rtt_us
        return shortest_us / 1e6 if shortest_us else None

    def drop_unheard(self, quiet_s: float, probe_started_s: float, dead: DeadRule = unheard) -> int:
        """Shut down every open socket that ``dead`` (`unheard` unless told) says the cut
        left dead: a read on it then ends and a connect fails, now rather than on TCP's
        timers. Returns how many."""
        dropped = 0
        for sock, made_s in list(self._made_s.items()):
            if sock.fileno() < 0:
                continue
            try:
                info = read_tcp_info(sock)
            except ProtocolError:
                continue  # closed meanwhile, or not TCP
            if dead(info, quiet_s, made_s < probe_started_s):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                dropped += 1
        return dropped


class LinkWatch:
    """Probes a server while a fetch's failure is unresolved; at the first connect after
    an outage (a probe refused or unanswered first), shuts down the sockets of
    ``tracked`` that ``dead`` (`unheard` unless told) says the outage left dead and
    counts a return (`returns`).
    A first probe that connects ends the watch with no return: the server was never out
    of reach. Use within one event loop; `close` ends the probing."""

    def __init__(
        self,
        host: str,
        port: int,
        tracked: TrackedSockets,
        rtt_s: Callable[[], float | None],
        dead: DeadRule = unheard,
    ) -> None:
        self.host = host
        self.port = port
        self.tracked = tracked
        self._rtt_s = rtt_s
        self._dead = dead
        self.returns = 0
        """Link returns noticed so far (a worker compares it before and after a wait)."""
        self.dropped = 0
        """Sockets shut down at those returns."""
        self._since_s: float | None = None
        self._returned: asyncio.Event | None = None
        """Set at the next return (then replaced); made by the first `wait_return`."""
        self._task: asyncio.Task[None] | None = None
        self._address: tuple[int, tuple[object, ...]] | None = None

    @property
    def probing(self) -> bool:
        return self._task is not None and not self._task.done()

    def failed(self, quiet_s: float) -> None:
        """A fetch failed after hearing nothing for up to ``quiet_s``: the failures began
        that long ago at the latest; probe until the server accepts a connection."""
        began_s = time.monotonic() - quiet_s
        self._since_s = began_s if self._since_s is None else min(self._since_s, began_s)
        if not self.probing:
            self._task = asyncio.get_running_loop().create_task(self._probe())

    async def wait_return(self, returns: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a return past the first ``returns``; whether one
        came."""
        if self.returns == returns:
            if self._returned is None:
                self._returned = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._returned.wait()
        return self.returns != returns

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _probe(self) -> None:
        trace.count("link_watches")
        pending: dict[asyncio.Task[bool], float] = {}
        next_s = time.monotonic()
        connected_s: float | None = None
        outage = False
        try:
            while connected_s is None:
                now_s = time.monotonic()
                if now_s >= next_s and len(pending) < MAX_PROBES:
                    pending[asyncio.ensure_future(self._connect_once())] = now_s
                    next_s = now_s + PROBE_EVERY_S
                # Full: wait for one to end; else until the next one is due.
                wait_s = None if len(pending) >= MAX_PROBES else max(0.0, next_s - time.monotonic())
                if not pending:  # the last ones were refused at once (a server restarting)
                    await asyncio.sleep(wait_s or 0.0)
                    continue
                done, _ = await asyncio.wait(
                    pending, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    started_s = pending.pop(task)
                    if not task.result():
                        outage = True
                    elif connected_s is None or started_s < connected_s:
                        connected_s = started_s
            # An earlier probe still waiting saw the outage too.
            outage = outage or any(started_s < connected_s for started_s in pending.values())
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        since_s = self._since_s if self._since_s is not None else connected_s
        self._since_s = None
        if not outage:
            # The server answered the first probe: it was never out of reach (a slow or
            # failing server, not a cut). Nothing returned: the workers keep their backoff,
            # so a server that accepts and then fails every request is not asked in a loop.
            trace.count("link_watches_without_outage")
            return
        dropped = self.tracked.drop_unheard(time.monotonic() - since_s, connected_s, self._dead)
        self.returns += 1
        self.dropped += dropped
        returned, self._returned = self._returned, None
        if returned is not None:
            returned.set()
        trace.count("link_returns")
        trace.count("link_return_drops", dropped)
        log.debug("the server answers again: %d dead connections dropped", dropped)

    async def _connect_once(self) -> bool:
        """One bare TCP connect to the server, closed at once; True if it connected."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(probe_timeout_s(self._rtt_s())):
                if self._address is None:
                    found = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
                    self._address = (found[0][0], found[0][4])
                family, address = self._address
                sock = socket.socket(family, socket.SOCK_STREAM)
                try:
                    sock.setblocking(False)
                    await loop.sock_connect(sock, address)
                finally:
                    sock.close()
        except (OSError, TimeoutError):
            return False
        return True
