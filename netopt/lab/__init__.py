"""The lab: emulated multi-region clusters in network namespaces (``netopt lab``).

``Lab.start(topology)`` builds one namespace per node and per region router,
joins each region's nodes to its router and the routers to each other over
emulated links (netem where the kernel has it, a TUN packet relay otherwise),
and tears all of it down again. See :mod:`netopt.lab.lab`.
"""

from __future__ import annotations

from netopt.lab.addressing import LabPlan, ground_truth_rtt_ms, plan_lab
from netopt.lab.counters import DirectionCounters, LabCounters, LinkCounters
from netopt.lab.lab import Lab, reap_stale_labs

__all__ = [
    "DirectionCounters",
    "Lab",
    "LabCounters",
    "LabPlan",
    "LinkCounters",
    "ground_truth_rtt_ms",
    "plan_lab",
    "reap_stale_labs",
]
