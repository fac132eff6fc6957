"""User-space link emulation on loopback: TCP and UDP proxies with delay, rate and loss.

Without CAP_NET_ADMIN there is no netem and no TUN device, so the unprivileged
demo cannot shape packets. The nearest real thing is a proxy: it listens on
127.0.0.1 and forwards to a target, holding each chunk of bytes (TCP) or each
datagram (UDP) back as a link would. One direction of a link is a
:class:`~netopt.lab.emulator.DirectionShaper`, the same clock the lab's TUN relay
runs (pure; the clock and random draws are arguments):

- a serializer at ``rate_bps``: a chunk's last byte leaves when the link is
  free plus its size over the rate; ``queue_bytes`` bound what may wait for it;
- a one-way delay (plus uniform ``±jitter``) after that; arrivals keep order;
- random loss, for datagrams only: TCP cannot lose bytes above the socket API,
  so a TCP stream gets delay and rate, and a full queue stops the proxy reading
  from its source (TCP back-pressure) instead of dropping.

:class:`UserLink` is one proxy (a TCP listener and a UDP socket on the same port
number) in the running event loop; :class:`UserLinks` runs a set of them in a
background thread for synchronous callers. Counters are payload bytes (no
TCP/UDP/IP headers), counted when handed on to the far side.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import random
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from netopt.config.lab import LinkShape
from netopt.errors import LabError
from netopt.lab.emulator import DirectionShaper
from netopt.lab.userlink_proxy import ProxyStats, TcpProxy, UdpProxy

__all__ = [
    "DirectionTotals",
    "ProxyCounters",
    "UserLink",
    "UserLinks",
]

_T = TypeVar("_T")


@dataclass(frozen=True)
class DirectionTotals:
    """What one direction of a proxy handed on and dropped (payload bytes)."""

    tcp_bytes: int = 0
    udp_bytes: int = 0
    udp_datagrams: int = 0
    udp_drops_loss: int = 0
    udp_drops_queue: int = 0

    @property
    def bytes(self) -> int:
        """TCP and UDP payload bytes together."""
        return self.tcp_bytes + self.udp_bytes

    @property
    def udp_drops(self) -> int:
        """Datagrams dropped, whatever the cause."""
        return self.udp_drops_loss + self.udp_drops_queue


@dataclass(frozen=True)
class ProxyCounters:
    """A proxy's counters: ``forward`` is client -> target, ``backward`` target -> client."""

    tcp_connections: int
    tcp_open: int
    tcp_connect_failures: int
    udp_peers: int
    forward: DirectionTotals
    backward: DirectionTotals

    @property
    def bytes(self) -> int:
        """Payload bytes carried, both directions."""
        return self.forward.bytes + self.backward.bytes


def _totals(stats: ProxyStats, forward: bool) -> DirectionTotals:
    d = stats.forward if forward else stats.backward
    return DirectionTotals(d.tcp_bytes, d.udp_bytes, d.udp_datagrams, d.drops_loss, d.drops_queue)


class UserLink:
    """One proxy: ``127.0.0.1:port`` (TCP and UDP) forwarded to ``target`` through a link.

    Create with :meth:`open` inside a running event loop; :meth:`close` stops it.
    """

    def __init__(self, tcp: TcpProxy, udp: UdpProxy | None, stats: ProxyStats) -> None:
        self._tcp = tcp
        self._udp = udp
        self._stats = stats

    @classmethod
    async def open(
        cls,
        target_host: str,
        target_port: int,
        shape: LinkShape,
        *,
        listen_host: str = "127.0.0.1",
        seed: int = 1,
        udp: bool = True,
        forward: DirectionShaper | None = None,
        backward: DirectionShaper | None = None,
    ) -> UserLink:
        """Listen on a free port of ``listen_host`` (the same number for TCP and UDP).

        ``forward``/``backward`` share a link direction with other proxies (default:
        clocks of this proxy's own, from ``shape``). Raises ValueError for an
        impossible shape and LabError when no port can be bound.
        """
        forward = forward or DirectionShaper.from_link(shape)
        backward = backward or DirectionShaper.from_link(shape)
        rng = random.Random(seed)
        stats = ProxyStats()
        target = (target_host, target_port)
        for _ in range(50):
            tcp = await TcpProxy.start(listen_host, 0, target, forward, backward, rng, stats)
            if not udp:
                return cls(tcp, None, stats)
            try:
                udp_proxy = UdpProxy.start(listen_host, tcp.port, target, forward, backward, rng,
                                           stats)  # fmt: skip
            except OSError as exc:
                await tcp.close()
                if exc.errno != errno.EADDRINUSE:
                    raise LabError(f"user link: cannot bind UDP {listen_host}: {exc}") from exc
                continue
            return cls(tcp, udp_proxy, stats)
        raise LabError(f"user link: no port on {listen_host} free for both TCP and UDP")

    @property
    def port(self) -> int:
        """The port clients connect to (TCP) or send to (UDP)."""
        return self._tcp.port

    def counters(self) -> ProxyCounters:
        """A snapshot of the counters (call from the proxy's event loop thread)."""
        s = self._stats
        return ProxyCounters(
            tcp_connections=s.tcp_connections,
            tcp_open=s.tcp_open,
            tcp_connect_failures=s.tcp_connect_failures,
            udp_peers=s.udp_peers,
            forward=_totals(s, forward=True),
            backward=_totals(s, forward=False),
        )

    async def close(self) -> None:
        """Close the listeners, every proxied connection and every UDP socket."""
        if self._udp is not None:
            self._udp.close()
        await self._tcp.close()


class UserLinks:
    """A set of :class:`UserLink` proxies in a background thread with its own event loop.

    Use as a context manager (or call :meth:`close`). Proxies added with the same
    ``link`` (a ``(src_label, dst_label)`` pair such as ``("hk", "us")``) share
    that link's clocks: they compete for one link's rate, as on one wire.
    """

    def __init__(self, *, seed: int = 1, listen_host: str = "127.0.0.1") -> None:
        self._seed = seed
        self._listen_host = listen_host
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="netopt-userlinks", daemon=True
        )
        self._thread.start()
        self._links: dict[int, UserLink] = {}
        self._clocks: dict[tuple[str, str], DirectionShaper] = {}
        self._closed = False

    def _call(self, coro: Coroutine[Any, Any, _T], timeout_s: float = 30.0) -> _T:
        if self._closed:
            coro.close()
            raise LabError("user links are closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _clock(self, key: tuple[str, str], shape: LinkShape) -> DirectionShaper:
        if key not in self._clocks:
            self._clocks[key] = DirectionShaper.from_link(shape)
        return self._clocks[key]

    def add(
        self,
        target_host: str,
        target_port: int,
        shape: LinkShape,
        *,
        link: tuple[str, str] | None = None,
        udp: bool = True,
    ) -> int:
        """Start a proxy to ``target_host:target_port``; returns its port on the listen host.

        With ``link=(a, b)`` traffic to the target uses direction ``a -> b`` of that
        shared link (the first proxy's ``shape`` makes it) and replies ``b -> a``.
        Raises ValueError for an impossible shape, LabError when it cannot bind.
        """
        forward = backward = None
        if link is not None:
            forward = self._clock(link, shape)
            backward = self._clock((link[1], link[0]), shape)
        seed = self._seed * 1_000_003 + len(self._links)
        proxy = self._call(
            UserLink.open(target_host, target_port, shape, listen_host=self._listen_host,
                          seed=seed, udp=udp, forward=forward, backward=backward)
        )  # fmt: skip
        self._links[proxy.port] = proxy
        return proxy.port

    def counters(self, port: int) -> ProxyCounters:
        """Counters of the proxy on ``port``; KeyError for an unknown port."""
        proxy = self._links[port]

        async def snapshot() -> ProxyCounters:
            return proxy.counters()

        return self._call(snapshot())

    @property
    def ports(self) -> tuple[int, ...]:
        """Every proxy's port, in the order they were added."""
        return tuple(self._links)

    def close(self) -> None:
        """Stop every proxy and the loop thread; idempotent."""
        if self._closed:
            return

        async def close_all() -> None:
            await asyncio.gather(*(proxy.close() for proxy in self._links.values()))

        try:
            self._call(close_all())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                with contextlib.suppress(RuntimeError):
                    self._loop.close()

    def __enter__(self) -> UserLinks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
