"""A web origin's sync rides out a cut link as a netopt:// sync does: each request that
fails is asked again, at once when the link returns.

Before, a web origin's requests had only TCP's timers and the open's retry
(`netopt.cache.openretry`) against a cut. A response cut mid-body waited out TCP's
backed-off retransmission timer (60 s of read timeout before it failed), and a
failure ended the whole open: the listing was read again and every file asked again.
On the lab's 80 ms link, a real tree of 1,078 files behind nginx cut for 3, 10 and 30 s
once a quarter of it had crossed had 1 MB cross again 2.9, 2.0 and 17.7 s after the
link's return, and the sync cut for 30 s failed.

`WebLink` gives the web engine the netopt:// engine's parts
(`netopt.dataplane.httpsource`, `netopt.dataplane.linkwatch`), and one of its own:

- **stall detection**: a response that receives nothing for `stall_timeout_s` of the
  origin's round trip (measured from the connections' own TCP_INFO) fails, and a
  connection whose request stays unacknowledged that long is dropped by the kernel
  (``TCP_USER_TIMEOUT``);
- **a retry of the one request** that failed (`again`): a listing page, a file's
  download or one of its parts, resumed from the bytes the spool kept, with the sync's
  backoff, until the sync's retry window has passed since its first failure; then its
  error goes to the open's retry as before;
- **a link watch**: from the first failure the origin is probed with bare connects;
  at its first answer after an outage the connections the outage left dead are shut
  down, and every request waiting on a backoff goes again at once;
- **a suspicion**: an answer that has not begun after the stall time is not failed (a
  slow origin is waited for, up to the session's read timeout) but starts the watch.
  A request sent before the cut and acknowledged, its answer lost, owes nothing: no
  user timeout or `unheard` rule sees it, and the answer waits in the origin's
  backed-off retransmission. So the web engine's rule (`silent`) shuts, at a return,
  every connection that heard nothing since the outage began, owing or not.

Only failures to reach the origin are retried here (a refused, reset or stalled
connection, a body cut short). What the origin answered (an HTTP status, a file that
changed since it was listed, TLS refused) is for the open to judge.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, TypeVar

import aiohttp

from netopt.dataplane import trace
from netopt.dataplane.httpsource import stall_timeout_s, watch_stalls
from netopt.dataplane.linkwatch import LinkWatch, TrackedSockets
from netopt.dataplane.sockets import set_user_timeout
from netopt.dataplane.syncrun import backoff_delay_s
from netopt.dataplane.synctypes import SyncOptions
from netopt.tcpinfo import TCP_ESTABLISHED, TcpInfo

__all__ = ["WebLink", "failed_to_reach", "silent"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def silent(info: TcpInfo, quiet_s: float, made_before_probe: bool) -> bool:
    """A web origin's connection left dead by an outage (`netopt.dataplane.linkwatch.
    DeadRule`): it heard nothing from the origin for ``quiet_s`` (since the failures or
    the suspicion began), whether or not it owes anything. A request's answer, or the
    rest of it, then waits in the origin's backed-off retransmission, where `unheard`
    would keep the connection (the client owes nothing). An idle pooled connection goes
    too: a fresh one costs a round trip. A handshake goes as `unheard` says."""
    if info.state != TCP_ESTABLISHED:
        return made_before_probe
    return min(info.last_data_recv_ms, info.last_ack_recv_ms) / 1000 >= quiet_s


def _unsuspect(ctx: SimpleNamespace) -> None:
    """The request's answer began, or it failed: it is no longer suspect."""
    suspect: asyncio.TimerHandle | None = getattr(ctx, "suspect", None)
    if suspect is not None:
        suspect.cancel()


def failed_to_reach(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure to reach the origin (asked again by `WebLink.again`):
    a connection refused, reset, stalled or cut mid-body. Not TLS refused: that is the
    origin's answer."""
    if isinstance(exc, aiohttp.ClientSSLError):
        return False
    reach = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)
    return isinstance(exc, reach)


class WebLink:
    """One web origin's connections (see the module doc): the session's socket factory
    (`socket_factory`) and trace config (`trace_config`) arm them; `again` runs a
    request until it works or the retry window passes. Use within one event loop;
    `close` ends the watch."""

    def __init__(self, host: str, port: int, options: SyncOptions) -> None:
        self.options = options
        self.rtt_s: float | None = None
        """The shortest round trip the connections have measured (TCP_INFO), once one
        answered."""
        self.retries = 0
        """Requests asked again after a failure to reach the origin."""
        self.suspicions = 0
        """Watches started by an answer late to begin (`_suspect`)."""
        self._suspected_s = -float("inf")
        self._sockets = TrackedSockets()
        self.watch = LinkWatch(host, port, self._sockets, lambda: self.rtt_s, silent)

    @property
    def stall_s(self) -> float:
        """Seconds a connection may receive nothing (or have its request unacknowledged)."""
        return stall_timeout_s(self.rtt_s)

    def socket_factory(self, addr_info: Any) -> socket.socket:
        """aiohttp's ``TCPConnector(socket_factory=...)``: a socket the kernel drops when
        what it sent stays unacknowledged for `stall_s`, tracked for the watch."""
        family, type_, proto, _, _ = addr_info
        sock = socket.socket(family, type_, proto)
        set_user_timeout(sock, self.stall_s)
        self._sockets.add(sock)
        return sock

    def trace_config(self) -> aiohttp.TraceConfig:
        """A ``ClientSession(trace_configs=[...])`` entry: a request whose answer has not
        begun after `stall_s` has the watch probe (`_suspect`); an answer that began is
        armed (`_arm`)."""
        config = aiohttp.TraceConfig()
        config.on_request_headers_sent.append(self._request_sent)
        config.on_request_end.append(self._response_started)
        config.on_request_exception.append(self._request_failed)
        return config

    async def _request_sent(self, _s: object, ctx: SimpleNamespace, _p: object) -> None:
        # From the request on its connection: one waiting for a free connection is not
        # suspect. A redirect sends again: the first request's timer goes.
        _unsuspect(ctx)
        ctx.suspect = asyncio.get_running_loop().call_later(self.stall_s, self._suspect)

    async def _response_started(
        self, _s: object, ctx: SimpleNamespace, params: aiohttp.TraceRequestEndParams
    ) -> None:
        _unsuspect(ctx)
        self._arm(params.response)

    async def _request_failed(self, _s: object, ctx: SimpleNamespace, _p: object) -> None:
        _unsuspect(ctx)

    def _suspect(self) -> None:
        """An answer has not begun after `stall_s`: a slow origin, or an outage holding
        the request or its answer (the origin's retransmission of it backs off, and the
        client owes nothing a user timeout could notice). The watch probes: if the origin
        answers at once, nothing happens; after an outage, its return shuts the silent
        connections (`silent`) and the request is asked again at once. The request is not
        failed: a slow origin's answer is waited for (the session's read timeout)."""
        now_s = time.monotonic()
        if now_s - self._suspected_s < self.stall_s:
            return  # at most one watch a stall timeout for a slow origin's answers
        self._suspected_s = now_s
        self.suspicions += 1
        trace.count("web_suspicions")
        self.watch.failed(0.0)

    def _arm(self, resp: aiohttp.ClientResponse) -> None:
        """Its headers came: the round trip is measured once (TCP_INFO of the connections
        so far), and its body fails once nothing arrives for `stall_s`
        (`netopt.dataplane.httpsource.watch_stalls`, the netopt:// engine's own)."""
        if self.rtt_s is None:
            self.rtt_s = self._sockets.shortest_rtt_s()
        watch_stalls(resp, self.stall_s)

    async def again(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, asked again while it fails to reach the origin (`failed_to_reach`):
        after the sync's backoff, or at once when the watch sees the origin answer again,
        until `SyncOptions.retry_window_s` has passed since its first failure (then its
        error is raised)."""
        failures = 0
        first_failure_s: float | None = None
        while True:
            returns = self.watch.returns
            try:
                return await call()
            except Exception as exc:
                if not failed_to_reach(exc):
                    raise
                now_s = time.monotonic()
                first_failure_s = now_s if first_failure_s is None else first_failure_s
                if now_s - first_failure_s >= self.options.retry_window_s:
                    raise
                log.debug("asking again after %s: %s", type(exc).__name__, exc)
            self.retries += 1
            trace.count("web_retries")
            if self.watch.returns != returns:
                failures = 0  # it failed across a return: its connection was left dead
                continue
            failures += 1
            self.watch.failed(self.stall_s)
            delay_s = backoff_delay_s(self.options, failures)
            if await self.watch.wait_return(returns, delay_s):
                failures = 0

    async def close(self) -> None:
        await self.watch.close()
