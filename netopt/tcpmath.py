"""What one TCP flow can carry: the window cap and the Mathis bound, in one place.

A flow never carries more than ``window / RTT``. A loss-based congestion control
(cubic, reno) is also held to the Mathis et al. bound ``MSS/RTT x C/sqrt(p)``
(``C = sqrt(3/2)``, about 1.22, for periodic loss with delayed ACKs off); BBR
does not back off on random loss, so only the window holds it. The doctor, the
stream-count choice, the NCCL cost model and the transfer planner all read these
(pure functions: numbers in, bit/s out).
"""

from __future__ import annotations

import math

__all__ = [
    "DEFAULT_MSS_BYTES",
    "LOSS_INSENSITIVE",
    "MATHIS_C",
    "is_loss_based",
    "mathis_bound_bps",
    "tcp_flow_ceiling_bps",
    "window_cap_bps",
]

DEFAULT_MSS_BYTES = 1448
"""The MSS of a 1500-byte MTU with TCP timestamps."""
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
