"""The agent daemon: register, follow the probe plan, measure, report.

``await Agent(settings, token).run(stop)`` runs until ``stop`` is set, then
flushes what it measured (briefly), leaves the coordinator and closes its
servers. Loops, each a task:

- registration (with jittered backoff) and heartbeats; a changed
  ``plan_version`` in a heartbeat answer triggers a plan fetch. Heartbeats and
  reports start at a random phase and run on jittered periods (``backoff.py``),
  so a fleet never arrives at a restarted coordinator in step;
- probing of every planned peer, one window after another, over one shared
  socket and timer (see ``probing.py``);
- bandwidth tests in the time slots the coordinator assigned (so no node runs
  two at once and no link carries two);
- the reporter, which spools and replays summaries (see ``reporter.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from netopt import __version__
from netopt.agent.backoff import first_phase_s, full_jitter_s, jittered_period_s
from netopt.agent.host import cpu_count, local_nics
from netopt.agent.http import create_app
from netopt.agent.metrics import AgentMetrics, SyncTotalsCollector
from netopt.agent.probing import PeerProbing
from netopt.agent.reporter import NeedsRegistration, Reporter
from netopt.agent.spool import Spool
from netopt.agent.summaries import bandwidth_summary, probe_summary
from netopt.agent.trainjobs import TrainJobsCollector
from netopt.config.services import AgentSettings
from netopt.errors import AuthenticationError, NetoptError, NetworkError
from netopt.measure.bandwidth import measure_bandwidth
from netopt.measure.prober import probe_count
from netopt.measure.samples import ProbeTarget
from netopt.measure.service import ProbeServer
from netopt.measure.stats import LinkStats
from netopt.measure.throughput import choose_streams
from netopt.tlsconf import (
    certificate_watch,
    client_ssl,
    listener_context,
    section_client_tls,
    use_client_tls,
)
from netopt.webshell import start_site
from netopt.wire.answers import NodePlanAnswer, PlannedProbe
from netopt.wire.client import CoordinatorClient
from netopt.wire.schema import Heartbeat, LinkSummary, OutageRecord, Registration

__all__ = ["Agent", "PlannedPeer", "run_agent"]

log = logging.getLogger(__name__)

RETRY_MIN_S = 1.0
RETRY_MAX_S = 30.0
FINAL_FLUSH_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class PlannedPeer:
    """A peer from the coordinator's plan."""

    node: str
    host: str
    probe_port: int

    @classmethod
    def of(cls, probe: PlannedProbe) -> PlannedPeer:
        """The peer of a checked plan entry."""
        return cls(probe.node, probe.host, probe.probe_port)

    @property
    def target(self) -> ProbeTarget:
        return ProbeTarget(self.host, self.probe_port)


def unreachable_summary(
    src: str, dst: str, target: str, window_s: float, rate_pps: float, taken_at_s: float
) -> LinkSummary:
    """A window in which the peer answered nothing: all probes lost, one outage."""
    sent = probe_count(window_s, rate_pps)
    return LinkSummary(
        src=src,
        dst=dst,
        taken_at_s=taken_at_s,
        window_s=window_s,
        method="udp",
        probes_sent=sent,
        probes_received=0,
        loss_ratio=1.0,
        loss_ratio_ci95=(1.0 - 3.0 / sent if sent >= 3 else 0.0, 1.0),
        outages=(OutageRecord(0.0, window_s, sent, True),),
        target=target,
        duration_s=window_s,
    )


class Agent:
    """One node's agent. ``wall_clock`` gives unix time and ``rng`` draws the retry
    delays and loop phases (tests may replace both; the default is seeded from the OS)."""

    def __init__(
        self,
        settings: AgentSettings,
        token: str,
        *,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.token = token
        self.wall_clock = wall_clock
        self.rng = rng if rng is not None else random.Random()  # timing only, not secrets
        self.metrics = AgentMetrics()
        self.metrics.registry.register(SyncTotalsCollector(settings.cache.dir))
        self.metrics.registry.register(TrainJobsCollector(Path(settings.train_dir)))
        self.spool = Spool(settings.spool.dir, settings.spool.max_bytes)
        self.reporter = Reporter(settings.node, self.spool, self.metrics)
        self.started_at_s = time.monotonic()
        self.plan_version: str | None = None
        self.registered = asyncio.Event()
        self.probe_server: ProbeServer | None = None
        self.http_port: int | None = None
        self.background: set[asyncio.Task[object]] = set()  # e.g. doctor port listeners
        self.probing: PeerProbing[PlannedPeer] = PeerProbing(
            settings.probe, token, self._record_window, self._record_unreachable
        )
        self._bandwidth: list[tuple[PlannedPeer, float]] = []
        self._cycle_s = 0.0
        self._slot_s = 0.0
        self._last_stats: dict[str, tuple[float, float]] = {}

    # ------------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        """Serve, measure and report until ``stop`` is set; then shut down cleanly."""
        s = self.settings
        tls = listener_context(s.tls, s.listen.host, f"agent {s.node} tls")
        # The agent's own clients (reporter, peers' data planes) follow its tls: section.
        use_client_tls(section_client_tls(s.tls, f"agent {s.node}: tls"))
        client_ssl(s.coordinator_url, sends_token=True)  # refused before anything starts
        self.probe_server = await ProbeServer.start(
            self.token, s.listen.host, s.probe.port, batch_s=s.probe.batch_s
        )
        runner = web.AppRunner(create_app(self), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await start_site(runner, host=s.listen.host, port=s.listen.port, ssl_context=tls)
        except OSError as exc:
            await runner.cleanup()
            await self.probe_server.close()
            raise NetworkError(
                f"cannot listen on {s.listen.url_host}:{s.listen.port}: {exc.strerror}"
            ) from exc
        self.http_port = int(runner.addresses[0][1])
        log.info(
            "agent %s (%s): probes on %s:%d, http on %s:%d",
            s.node, s.region, s.listen.host, self.probe_server.port, s.listen.host, self.http_port,
        )  # fmt: skip
        client = CoordinatorClient(s.coordinator_url, self.token)
        loops = [
            self._spawn(self._control_loop(client)),
            self._spawn(self._report_loop(client)),
            self._spawn(self._bandwidth_loop()),
            self._spawn(certificate_watch(tls, s.tls, f"agent {s.node}")),
        ]
        try:
            await stop.wait()
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self.probing.close()
            await self._goodbye(client)
            await client.close()
            await runner.cleanup()
            await self.probe_server.close()
            log.warning(
                "agent %s stopped: %d summaries measured, %d acknowledged, "
                "%d batches still spooled, %d batches dropped",
                s.node, self.reporter.produced, self.reporter.acknowledged,
                len(self.spool), self.spool.dropped_batches,
            )  # fmt: skip

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.create_task(coro)

    async def _goodbye(self, client: CoordinatorClient) -> None:
        with contextlib.suppress(NetoptError, TimeoutError):
            async with asyncio.timeout(FINAL_FLUSH_TIMEOUT_S):
                await self.reporter.spool_pending()
                if self.registered.is_set():
                    await self.reporter.flush(client)
                    await client.leave(self.settings.node)

    # ------------------------------------------------------------ control plane

    def registration(self) -> Registration:
        s = self.settings
        assert self.probe_server is not None
        return Registration(
            node=s.node,
            region=s.region,
            netopt_version=__version__,
            cpu_count=cpu_count(),
            nics=local_nics()[:64],
            advertise_host=s.advertise_host or _advertisable(s.listen.host),
            probe_port=self.probe_server.port,
            data_port=self.http_port,
        )

    async def _register(self, client: CoordinatorClient) -> None:
        attempt = 0
        while True:
            delay_s = full_jitter_s(attempt, self.rng, base_s=RETRY_MIN_S, cap_s=RETRY_MAX_S)
            try:
                # registration() lists NICs with `ip`: a subprocess, so off the loop
                answer = await client.register(await asyncio.to_thread(self.registration))
            except AuthenticationError:
                log.error("the coordinator refused this agent's token; fix token/token_file")
            except NetoptError as exc:
                log.warning("registration failed (retrying in %.1f s): %s", delay_s, exc)
            else:
                log.info("registered with %s", self.settings.coordinator_url)
                self.registered.set()
                await self._follow_plan(client, str(answer.get("plan_version", "")))
                return
            await asyncio.sleep(delay_s)
            attempt += 1

    async def _control_loop(self, client: CoordinatorClient) -> None:
        await self._register(client)
        interval_s = self.settings.heartbeat_interval_s
        await asyncio.sleep(first_phase_s(interval_s, self.rng))
        while True:
            beat = Heartbeat(
                uptime_s=time.monotonic() - self.started_at_s,
                spool_bytes=self.spool.size_bytes,
                spool_dropped_count=self.spool.dropped_batches,
            )
            try:
                answer = await client.heartbeat(self.settings.node, beat)
                await self._follow_plan(client, str(answer.get("plan_version", "")))
            except NetoptError as exc:
                if getattr(exc, "status", None) == 404:
                    self.registered.clear()
                    await self._register(client)
                else:
                    log.warning("heartbeat failed: %s", exc)
            await asyncio.sleep(jittered_period_s(interval_s, self.rng))

    async def _follow_plan(self, client: CoordinatorClient, version: str) -> None:
        if version and version == self.plan_version:
            return
        plan = await client.plan(self.settings.node)
        self.apply_plan(plan)

    def apply_plan(self, plan: NodePlanAnswer) -> None:
        """Start probing new peers, stop probing dropped ones, take the bandwidth slots."""
        self.plan_version = plan.plan_version
        wanted = {PlannedPeer.of(p) for p in plan.probes}
        self.probing.set_peers(wanted)
        self._cycle_s = plan.bandwidth_cycle_s
        self._slot_s = plan.bandwidth_slot_s
        self._bandwidth = [(PlannedPeer.of(t.peer), t.offset_s) for t in plan.bandwidth_tests]
        self.metrics.peers.set(len(wanted))
        log.info(
            "plan %s: %d peers, %d bandwidth tests",
            self.plan_version,
            len(wanted),
            len(self._bandwidth),
        )

    # -------------------------------------------------------------- measurement

    def _record_window(self, peer: PlannedPeer, stats: LinkStats) -> None:
        """One measured window of ``peer``: report it and update the metrics."""
        self.reporter.add(probe_summary(self.settings.node, peer.node, stats, self.wall_clock()))
        if stats.rtt_ms is not None:
            self.metrics.rtt_p50_seconds.labels(peer.node).set(stats.rtt_ms.p50 / 1000.0)
            self._last_stats[peer.node] = (stats.rtt_ms.p50, stats.loss_ratio)
        self.metrics.loss_ratio.labels(peer.node).set(stats.loss_ratio)
        self.metrics.loss_ratio_upper.labels(peer.node).set(stats.loss_ratio_ci95[1])

    def _record_unreachable(self, peer: PlannedPeer, reason: str) -> None:
        """A window in which ``peer`` answered nothing: reported as a full-loss window."""
        s = self.settings
        log.info("peer %s unreachable: %s", peer.node, reason)
        self.reporter.add(
            unreachable_summary(
                s.node,
                peer.node,
                str(peer.target),
                s.probe.window_s,
                s.probe.rate_pps,
                self.wall_clock(),
            )
        )
        self.metrics.loss_ratio.labels(peer.node).set(1.0)
        self.metrics.loss_ratio_upper.labels(peer.node).set(1.0)

    async def _bandwidth_loop(self) -> None:
        while True:
            if not self._bandwidth or self._cycle_s <= 0:
                await asyncio.sleep(1.0)
                continue
            now_s = self.wall_clock()
            cycle_start_s = math.floor(now_s / self._cycle_s) * self._cycle_s
            upcoming = sorted(
                (
                    cycle_start_s
                    + offset
                    + (self._cycle_s if cycle_start_s + offset < now_s else 0),
                    peer,
                )
                for peer, offset in self._bandwidth
            )
            at_s, peer = upcoming[0]
            await asyncio.sleep(max(0.0, at_s - now_s))
            await self.bandwidth_test(peer)

    async def bandwidth_test(self, peer: PlannedPeer) -> LinkSummary | None:
        """One bounded bulk-TCP test (1 stream, then N) to ``peer``, inside one slot."""
        probe = self.settings.probe
        budget_s = probe.bandwidth_duration_s if self._slot_s <= 0 else self._slot_s * 0.8
        each_s = max(1.0, min(probe.bandwidth_duration_s, budget_s / 2))
        cc = "default" if probe.congestion_control == "default" else probe.congestion_control
        # Without figures yet, assume a long lossy path: more streams, never more than allowed.
        rtt_ms, loss_ratio = self._last_stats.get(peer.node, (100.0, 0.01))
        streams = choose_streams(rtt_ms, loss_ratio, cc, probe.max_streams)
        try:
            single = await measure_bandwidth(
                peer.target, self.token, streams=1, duration_s=each_s, congestion_control=cc
            )
            multi = None
            if streams > 1:
                multi = await measure_bandwidth(
                    peer.target, self.token, streams=streams, duration_s=each_s,
                    congestion_control=cc,
                )  # fmt: skip
        except NetoptError as exc:
            log.warning("bandwidth test to %s failed: %s", peer.node, exc)
            return None
        summary = bandwidth_summary(self.settings.node, peer.node, single, multi, self.wall_clock())
        self.reporter.add(summary)
        self.metrics.goodput_bits_per_second.labels(peer.node).set(summary.aggregate_bps or 0.0)
        return summary

    # ---------------------------------------------------------------- reporting

    async def _report_loop(self, client: CoordinatorClient) -> None:
        interval_s = self.settings.report_interval_s
        await asyncio.sleep(first_phase_s(interval_s, self.rng))
        while True:
            await self._report_once(client)
            await asyncio.sleep(jittered_period_s(interval_s, self.rng))

    async def _report_once(self, client: CoordinatorClient) -> None:
        await self.reporter.spool_pending()
        if not self.registered.is_set():
            return
        try:
            await self.reporter.flush(client)
        except NeedsRegistration:
            self.registered.clear()
            await self._register(client)
        except NetoptError as exc:
            log.warning("report failed: %s", exc)


def _advertisable(host: str) -> str | None:
    """The listen address if peers can use it; None (the coordinator then uses the
    address the registration came from) for wildcard and name addresses."""
    return None if host in ("0.0.0.0", "::", "localhost") else host  # noqa: S104


def run_agent(settings: AgentSettings, token: str) -> int:
    """Blocking entry point: run the agent until SIGTERM/SIGINT; returns the exit code."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Agent(settings, token).run(stop)

    asyncio.run(main())
    return 0
