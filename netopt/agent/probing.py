"""The agent's continuous probing of its planned peers.

Every peer is probed over one :class:`~netopt.measure.multiprober.SharedProber`
(one socket and one timer for all of them), in back-to-back windows of
``probe.window_s``. A peer whose window gets no answer at all is reported
unreachable and moves to a fallback loop of its own, which runs what ``netopt
probe`` runs (:func:`~netopt.measure.link.measure_link`: a short UDP preflight,
then TCP connect RTT where UDP is blocked) until UDP answers again; then it
rejoins the shared prober.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

from netopt.config.services import ProbeSettings
from netopt.errors import NetworkError, PeerUnreachableError
from netopt.measure.link import measure_link
from netopt.measure.multiprober import PeerStream, SharedProber
from netopt.measure.samples import ProbeSeries, ProbeTarget
from netopt.measure.stats import LinkStats, summarise

__all__ = ["PeerProbing", "ProbedPeer"]

log = logging.getLogger(__name__)

FALLBACK_RETRY_MAX_S = 5.0


class ProbedPeer(Hashable, Protocol):
    """Anything hashable with a probe target (the daemon's PlannedPeer)."""

    @property
    def target(self) -> ProbeTarget:
        """Where its reflector listens."""
        ...


PeerT = TypeVar("PeerT", bound=ProbedPeer)


class PeerProbing(Generic[PeerT]):
    """Probes a changing set of peers; results go to ``on_stats`` / ``on_unreachable``.

    ``on_stats(peer, stats)`` gets every window with at least one answer;
    ``on_unreachable(peer, reason)`` every window (or fallback attempt) without.
    Both are called from the event loop and should not block.
    """

    def __init__(
        self,
        settings: ProbeSettings,
        token: str,
        on_stats: Callable[[PeerT, LinkStats], None],
        on_unreachable: Callable[[PeerT, str], None],
    ) -> None:
        self.settings = settings
        self.token = token
        self.on_stats = on_stats
        self.on_unreachable = on_unreachable
        self.prober = SharedProber.from_settings(settings, token)
        self._shared: dict[PeerT, PeerStream] = {}
        self._fallback: dict[PeerT, asyncio.Task[None]] = {}

    @property
    def peers(self) -> int:
        """How many peers are being probed (shared or fallback)."""
        return len(self._shared) + len(self._fallback)

    @property
    def fallback_peers(self) -> int:
        """How many peers are in the fallback loop (unreachable or UDP blocked)."""
        return len(self._fallback)

    def set_peers(self, wanted: set[PeerT]) -> None:
        """Probe exactly ``wanted`` from now on (call in the event loop)."""
        for peer in [p for p in self._shared if p not in wanted]:
            self.prober.remove(self._shared.pop(peer))
        for peer in [p for p in self._fallback if p not in wanted]:
            self._fallback.pop(peer).cancel()
        for peer in wanted:
            if peer not in self._shared and peer not in self._fallback:
                self._start_shared(peer)

    async def close(self) -> None:
        """Stop probing every peer."""
        tasks = list(self._fallback.values())
        self._fallback.clear()
        self._shared.clear()
        self.prober.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start_shared(self, peer: PeerT) -> None:
        try:
            self._shared[peer] = self.prober.add(
                peer.target, functools.partial(self._on_window, peer)
            )
        except (PeerUnreachableError, NetworkError) as exc:
            log.info("cannot probe %s over the shared prober: %s", peer.target, exc)
            self._start_fallback(peer)

    def _start_fallback(self, peer: PeerT) -> None:
        self._fallback[peer] = asyncio.get_running_loop().create_task(self._fallback_loop(peer))

    def _on_window(self, peer: PeerT, _: ProbeTarget, series: ProbeSeries) -> None:
        stats = summarise(series)
        if stats.probes_received > 0:
            self.on_stats(peer, stats)
            return
        self.on_unreachable(
            peer,
            f"{series.target}: none of {stats.probes_sent} udp probes was answered "
            f"within {series.timeout_s:g} s",
        )
        stream = self._shared.pop(peer, None)
        if stream is not None:
            self.prober.remove(stream)
            self._start_fallback(peer)

    async def _fallback_loop(self, peer: PeerT) -> None:
        retry_s = min(self.settings.window_s, FALLBACK_RETRY_MAX_S)
        while True:
            try:
                stats = await measure_link(peer.target, self.settings, self.token)
            except PeerUnreachableError as exc:
                self.on_unreachable(peer, str(exc))
                await asyncio.sleep(retry_s)
                continue
            except NetworkError as exc:
                log.warning("probing %s failed: %s", peer.target, exc)
                await asyncio.sleep(retry_s)
                continue
            self.on_stats(peer, stats)
            if stats.method == "udp":
                with contextlib.suppress(KeyError):
                    del self._fallback[peer]
                self._start_shared(peer)
                return
