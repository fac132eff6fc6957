"""What one TCP flow can carry: the window cap and the Mathis bound, in one place.

A flow never carries more than ``window / RTT``. A loss-based congestion control
(cubic, reno) is also held to the Mathis et al. bound ``MSS/RTT x C/sqrt(p)``
(``C = sqrt(3/2)``, about 1.22, for periodic loss with delayed ACKs off); BBR
does not back off on random loss, so only the window holds it. The doctor, the
stream-count choice, the NCCL cost model and the transfer planner all read these
(pure functions: numbers in, bit/s out). :func:`idle_restart_s` is what a flow loses
when it restarts from the initial window after idling (``tcp_slow_start_after_idle``).
"""

from __future__ import annotations

import math

__all__ = [
    "DEFAULT_MSS_BYTES",
    "INITIAL_WINDOW_BYTES",
    "LOSS_INSENSITIVE",
    "MATHIS_C",
    "idle_restart_s",
    "is_loss_based",
    "mathis_bound_bps",
    "tcp_flow_ceiling_bps",
    "window_cap_bps",
]

DEFAULT_MSS_BYTES = 1448
"""The MSS of a 1500-byte MTU with TCP timestamps."""
INITIAL_WINDOW_BYTES = 10 * DEFAULT_MSS_BYTES
"""Linux's initial congestion window (10 segments): where an idle connection restarts."""
MATHIS_C = 1.22
"""The constant of the Mathis bound, sqrt(3/2) for periodic loss with delayed ACKs off."""
LOSS_INSENSITIVE = frozenset({"bbr"})
"""Congestion controls that random loss does not slow down (no Mathis bound)."""


def is_loss_based(congestion_control: str) -> bool:
    """True for algorithms the Mathis bound holds (cubic, reno, ...), False for bbr."""
    return congestion_control not in LOSS_INSENSITIVE


def window_cap_bps(window_bytes: float, rtt_ms: float) -> float:
    """The most one flow with this window can carry at this RTT (bit/s; inf at 0 RTT)."""
    if rtt_ms <= 0:
        return math.inf
    return window_bytes * 8 / (rtt_ms / 1e3)


def mathis_bound_bps(rtt_ms: float, loss_ratio: float, mss_bytes: int = DEFAULT_MSS_BYTES) -> float:
    """Mathis et al.: a loss-based flow's ceiling, MSS/RTT x 1.22/sqrt(p), in bit/s.

    Infinite for no loss or no RTT (the formula then bounds nothing).
    """
    if rtt_ms <= 0 or loss_ratio <= 0:
        return math.inf
    return mss_bytes * 8 / (rtt_ms / 1e3) * MATHIS_C / math.sqrt(loss_ratio)


def tcp_flow_ceiling_bps(
    rtt_ms: float,
    loss_ratio: float,
    congestion_control: str,
    *,
    window_bytes: float,
    mss_bytes: int = DEFAULT_MSS_BYTES,
) -> float:
    """What one flow can carry: the window over the RTT, and for loss-based algorithms
    (cubic, reno) also the Mathis bound, in bit/s (inf when neither bounds it)."""
    window_bps = window_cap_bps(window_bytes, rtt_ms)
    if not is_loss_based(congestion_control):
        return window_bps
    return min(window_bps, mathis_bound_bps(rtt_ms, loss_ratio, mss_bytes))


def idle_restart_s(
    size_bytes: float,
    rtt_s: float,
    rate_bps: float,
    initial_window_bytes: float = INITIAL_WINDOW_BYTES,
) -> float:
    """Seconds a flow restarted from the initial window (``tcp_slow_start_after_idle=1``
    after one RTO idle) takes to send ``size_bytes`` beyond one already at ``rate_bps``.

    Slow start doubles the window each round trip: after ``k`` rounds it has sent
    ``IW (2^k - 1)``, and after ``K = ceil(log2(BDP / IW))`` rounds the window covers
    the BDP and the flow runs at the rate. A transfer that ends inside the ramp takes
    its ``k`` rounds; a longer one pays the ramp's ``K`` rounds less the ramp's bytes
    at the rate. 0 where the BDP is within the initial window.
    """
    rate_bytes_s = rate_bps / 8
    bdp = rate_bytes_s * rtt_s
    if size_bytes <= 0 or rtt_s <= 0 or bdp <= initial_window_bytes:
        return 0.0
    ramp_rounds = math.ceil(math.log2(bdp / initial_window_bytes))
    ramp_bytes = initial_window_bytes * float(2**ramp_rounds - 1)
    if size_bytes <= ramp_bytes:
        rounds = math.ceil(math.log2(size_bytes / initial_window_bytes + 1))
        return max(0.0, rounds * rtt_s - size_bytes / rate_bytes_s)
    return max(0.0, ramp_rounds * rtt_s - ramp_bytes / rate_bytes_s)
