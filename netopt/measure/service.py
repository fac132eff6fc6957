"""Run the measurement pieces together: serve (reflector + sink) and probe one link.

These are the ``run_*`` functions behind ``netopt probe``; the agent daemon can
use :class:`ProbeServer` and :func:`run_probe` as they are.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from netopt.config.services import ProbeSettings
from netopt.errors import NetworkError
from netopt.measure.bandwidth import BulkSink, measure_bandwidth
from netopt.measure.iperf import DEFAULT_IPERF3_PORT, IperfResult, run_iperf3
from netopt.measure.link import measure_link
from netopt.measure.reflector import DEFAULT_BATCH_S, Reflector
from netopt.measure.samples import SYSTEM_CLOCK, Clock, ProbeTarget
from netopt.measure.stats import LinkStats
from netopt.measure.throughput import BandwidthResult, choose_streams

__all__ = ["BandwidthOptions", "ProbeReport", "ProbeServer", "run_probe", "serve_until"]

_PORT_TRIES = 20


@dataclass
class ProbeServer:
    """A reflector (UDP) and a bulk sink (TCP) on the same port number."""

    reflector: Reflector
    sink: BulkSink

    @classmethod
    async def start(
        cls,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        batch_s: float = DEFAULT_BATCH_S,
    ) -> ProbeServer:
        """Bind both on ``host:port``; with port 0, a free number both protocols accept.

        ``batch_s`` is the reflector's timer grid (pass ``ProbeSettings.batch_s``
        so it wakes together with the prober). Raises NetworkError when the
        address cannot be bound.
        """
        for _ in range(_PORT_TRIES if port == 0 else 1):
            reflector = await Reflector.start(token, host, port, batch_s=batch_s)
            try:
                sink = await BulkSink.start(token, host, reflector.port)
            except NetworkError:
                reflector.close()
                if port != 0:
                    raise
                continue
            return cls(reflector, sink)
        raise NetworkError(f"found no port free for both UDP and TCP on {host}")

    @property
    def port(self) -> int:
        """The port number of both."""
        return self.reflector.port

    async def close(self) -> None:
        """Stop both."""
        self.reflector.close()
        await self.sink.close()

    def counters(self) -> dict[str, Any]:
        """Reflector and sink counters as JSON-able data."""
        return {"reflector": self.reflector.counters.to_dict(), "sink": vars(self.sink.counters)}


@dataclass(frozen=True)
class BandwidthOptions:
    """What bandwidth tests ``run_probe`` adds to the RTT/loss measurement."""

    bulk: bool = False
    streams: int | None = None
    congestion_control: Literal["bbr", "cubic", "reno", "default"] = "bbr"
    duration_s: float = 5.0
    max_streams: int = 16
    iperf3: bool = False
    iperf3_port: int = DEFAULT_IPERF3_PORT


@dataclass(frozen=True)
class ProbeReport:
    """Everything ``netopt probe TARGET`` measured."""

    link: LinkStats
    single: BandwidthResult | None = None
    multi: BandwidthResult | None = None
    streams_chosen: Literal["given", "rtt-and-loss"] | None = None
    iperf3: IperfResult | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able data; every numeric key carries its unit."""
        data = self.link.to_dict()
        baseline = self.link.rtt_ms.min if self.link.rtt_ms else None
        if self.single is not None:
            best = self.multi if self.multi is not None else self.single
            data["bandwidth"] = {
                "congestion_control": self.single.congestion_control,
                "single_stream_bps": self.single.goodput_bps,
                "aggregate_bps": best.goodput_bps,
                "streams": best.streams,
                "streams_chosen": self.streams_chosen,
                "tcp_efficiency_pct": best.tcp_efficiency_pct,
                "buffer_delay_pct": best.buffer_delay_pct(baseline),
                "single": self.single.to_dict(baseline),
                "multi": None if self.multi is None else self.multi.to_dict(baseline),
            }
        data["iperf3"] = None if self.iperf3 is None else self.iperf3.to_dict()
        return data


async def run_probe(
    target: ProbeTarget,
    settings: ProbeSettings,
    token: str,
    *,
    duration_s: float,
    bandwidth: BandwidthOptions | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> ProbeReport:
    """Measure RTT/jitter/loss for ``duration_s``, then the bandwidth tests asked for.

    The single-stream and N-stream tests run one after the other (never two
    throughput tests on one link at once); N comes from the measured RTT and loss
    unless given. Raises PeerUnreachableError when the target does not answer.
    """
    link = await measure_link(target, settings, token, clock, duration_s=duration_s)
    options = bandwidth or BandwidthOptions()
    single = multi = None
    chosen: Literal["given", "rtt-and-loss"] | None = None
    if options.bulk:
        common: dict[str, Any] = {
            "duration_s": options.duration_s,
            "congestion_control": options.congestion_control,
            "timeout_s": settings.timeout_s,
        }
        single = await measure_bandwidth(target, token, streams=1, **common)
        if options.streams is not None:
            streams, chosen = options.streams, "given"
        else:
            rtt_ms = link.rtt_ms.p50 if link.rtt_ms else 1.0
            streams = choose_streams(
                rtt_ms, link.loss_ratio, options.congestion_control, options.max_streams
            )
            chosen = "rtt-and-loss"
        if streams > 1:
            multi = await measure_bandwidth(target, token, streams=streams, **common)
    iperf = None
    if options.iperf3:
        iperf = await run_iperf3(
            target.host,
            options.iperf3_port,
            duration_s=options.duration_s,
            streams=options.streams or (multi.streams if multi else 1),
            congestion_control=options.congestion_control,
            timeout_s=settings.timeout_s,
        )
    return ProbeReport(link, single, multi, chosen, iperf)


async def serve_until(server: ProbeServer, stop: asyncio.Event) -> None:
    """Keep ``server`` running until ``stop`` is set, then close it."""
    try:
        await stop.wait()
    finally:
        await server.close()
