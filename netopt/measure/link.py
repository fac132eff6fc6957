"""Measure one link: the async entry point the CLI and the agent daemon share.

``await measure_link(target, settings, token, clock)`` probes the target's
reflector over UDP; if it never answers, it falls back to TCP connect RTT
(marked ``method="tcp-connect"``); if that fails too, PeerUnreachableError.
"""

from __future__ import annotations

from dataclasses import dataclass

from netopt.config.services import ProbeSettings
from netopt.errors import PeerUnreachableError
from netopt.measure.bandwidth import verify_sink
from netopt.measure.prober import Prober, UdpProber, probe_count
from netopt.measure.samples import SYSTEM_CLOCK, Clock, ProbeSeries, ProbeTarget
from netopt.measure.stats import LinkStats, summarise
from netopt.measure.tcp_rtt import TcpConnectProber

__all__ = ["AutoProber", "measure_link"]

PREFLIGHT_PROBES = 3
TCP_FALLBACK_MAX_RATE_PPS = 5.0


@dataclass
class AutoProber:
    """UDP probes if the reflector answers a short preflight, else TCP connects."""

    udp: UdpProber
    tcp: TcpConnectProber | None

    @classmethod
    def from_settings(
        cls,
        settings: ProbeSettings,
        token: str,
        duration_s: float,
        clock: Clock = SYSTEM_CLOCK,
        *,
        tcp_fallback: bool = True,
        seed: int | None = None,
    ) -> AutoProber:
        """Probers sized for ``duration_s`` of probing at the settings' rate."""
        udp = UdpProber(
            token=token,
            count=probe_count(duration_s, settings.rate_pps),
            rate_pps=settings.rate_pps,
            spacing=settings.spacing,
            padding_bytes=settings.padding_bytes,
            timeout_s=settings.timeout_s,
            clock=clock,
            seed=seed,
            batch_s=settings.batch_s,
        )
        tcp_rate_pps = min(settings.rate_pps, TCP_FALLBACK_MAX_RATE_PPS)
        tcp = TcpConnectProber(
            count=probe_count(duration_s, tcp_rate_pps),
            interval_s=1 / tcp_rate_pps,
            timeout_s=settings.timeout_s,
            clock=clock,
        )
        return cls(udp, tcp if tcp_fallback else None)

    async def probe(self, target: ProbeTarget) -> ProbeSeries:
        """Probe ``target``; PeerUnreachableError if neither UDP nor TCP gets an answer.

        Before falling back to TCP connects it checks that the peer's sink accepts
        the token (AuthenticationError if not), so a wrong token is never mistaken
        for blocked UDP.
        """
        preflight = UdpProber(
            token=self.udp.token,
            count=PREFLIGHT_PROBES,
            rate_pps=PREFLIGHT_PROBES / self.udp.timeout_s,
            spacing="fixed",
            timeout_s=self.udp.timeout_s,
            clock=self.udp.clock,
            stop_at_first_reply=True,
        )
        if (await preflight.probe(target)).replies:
            return await self.udp.probe(target)
        if self.tcp is None:
            raise PeerUnreachableError(
                f"{target}: no UDP answer within {self.udp.timeout_s:g} s "
                "(is `netopt probe serve` running there, with the same token?)"
            )
        try:
            await verify_sink(target, self.udp.token, self.udp.timeout_s)
            return await self.tcp.probe(target)
        except PeerUnreachableError as exc:
            raise PeerUnreachableError(
                f"{target}: no UDP answer within {self.udp.timeout_s:g} s, and {exc}"
            ) from None


async def measure_link(
    target: ProbeTarget,
    settings: ProbeSettings,
    token: str,
    clock: Clock = SYSTEM_CLOCK,
    *,
    duration_s: float | None = None,
    prober: Prober | None = None,
    outage_min_lost: int = 3,
) -> LinkStats:
    """Probe ``target`` for ``duration_s`` (default ``settings.window_s``) and summarise.

    ``prober`` replaces the default :class:`AutoProber` (tests pass a FakeProber).
    Raises PeerUnreachableError when no probe is answered in time.
    """
    if prober is None:
        prober = AutoProber.from_settings(
            settings, token, duration_s if duration_s is not None else settings.window_s, clock
        )
    series = await prober.probe(target)
    stats = summarise(series, outage_min_lost=outage_min_lost)
    if stats.probes_received == 0:
        raise PeerUnreachableError(
            f"{target}: none of {stats.probes_sent} {series.method} probes was answered "
            f"within {series.timeout_s:g} s"
        )
    return stats
