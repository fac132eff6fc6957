"""When an agent talks to the coordinator: jittered retries and random phases.

Pure decisions over a caller's :class:`random.Random` (seed it in tests). A fleet
of agents that retry on doubling delays, or heartbeat and report on the phase
they started with, arrives at a restarted coordinator in step; these spread it.
"""

from __future__ import annotations

import random

__all__ = ["PERIOD_SPREAD_RATIO", "first_phase_s", "full_jitter_s", "jittered_period_s"]

PERIOD_SPREAD_RATIO = 0.1
"""Each period is the interval +-10 %: phases keep drifting apart, never into step."""


def full_jitter_s(attempt: int, rng: random.Random, *, base_s: float, cap_s: float) -> float:
    """The delay before retry ``attempt`` (0, 1, ...): uniform in 0..min(cap, base * 2**attempt).

    "Full jitter" (Brooker, AWS Architecture Blog, 2015): the ceiling doubles as
    plain exponential backoff does, but each agent picks anywhere below it, so a
    thousand agents that failed together retry spread over the whole ceiling.
    Raises ValueError for a negative attempt or non-positive base/cap.
    """
    if attempt < 0 or base_s <= 0 or cap_s <= 0:
        raise ValueError("attempt must be >= 0 and base_s, cap_s > 0")
    ceiling_s = cap_s if attempt >= 64 else min(cap_s, base_s * 2.0**attempt)
    return rng.uniform(0.0, ceiling_s)


def first_phase_s(interval_s: float, rng: random.Random) -> float:
    """The wait before the first run of a loop with period ``interval_s``: uniform 0..interval."""
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    return rng.uniform(0.0, interval_s)


def jittered_period_s(
    interval_s: float, rng: random.Random, spread_ratio: float = PERIOD_SPREAD_RATIO
) -> float:
    """One period of a loop: ``interval_s`` times a uniform 1 +- ``spread_ratio``."""
    if interval_s <= 0 or not 0 <= spread_ratio < 1:
        raise ValueError("interval_s must be > 0 and spread_ratio within 0..1")
    return interval_s * rng.uniform(1.0 - spread_ratio, 1.0 + spread_ratio)
