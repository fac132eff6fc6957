"""Link measurement: UDP probes (STAMP/TWAMP-light), statistics, TCP fallback, bandwidth.

The engine the agent daemon and ``netopt probe`` share:

- ``await measure_link(target, settings, token, clock) -> LinkStats``
- ``SharedProber(token, count, ...)``: one socket and one timer for many peers;
  ``add(target, sink)`` for back-to-back windows, ``await probe(target)`` for one
- ``await Reflector.start(token, host, port)`` / ``reflector.close()``
- ``await BulkSink.start(token, host, port)`` / ``await sink.close()``
- ``await measure_bandwidth(target, token, streams=N, duration_s=S, congestion_control=CC)``
- ``summarise(series) -> LinkStats`` and ``choose_streams(...)``: pure decisions.
"""

from __future__ import annotations

from netopt.measure.bandwidth import BulkSink, SinkCounters, measure_bandwidth, run_bulk_test
from netopt.measure.link import AutoProber, measure_link
from netopt.measure.multiprober import PeerStream, ProberCounters, SharedProber
from netopt.measure.packet import PacketError, PacketKey, ReplayWindow
from netopt.measure.prober import FakeLink, FakeProber, Prober, UdpProber
from netopt.measure.reflector import Reflector, ReflectorCounters
from netopt.measure.samples import SYSTEM_CLOCK, Clock, ProbeSeries, ProbeTarget, Reply
from netopt.measure.stats import LinkStats, Outage, summarise
from netopt.measure.tcp_rtt import TcpConnectProber
from netopt.measure.throughput import BandwidthResult, StreamResult, choose_streams

__all__ = [
    "SYSTEM_CLOCK",
    "AutoProber",
    "BandwidthResult",
    "BulkSink",
    "Clock",
    "FakeLink",
    "FakeProber",
    "LinkStats",
    "Outage",
    "PacketError",
    "PacketKey",
    "PeerStream",
    "ProbeSeries",
    "ProbeTarget",
    "Prober",
    "ProberCounters",
    "Reflector",
    "ReflectorCounters",
    "ReplayWindow",
    "Reply",
    "SharedProber",
    "SinkCounters",
    "StreamResult",
    "TcpConnectProber",
    "UdpProber",
    "choose_streams",
    "measure_bandwidth",
    "measure_link",
    "run_bulk_test",
    "summarise",
]
