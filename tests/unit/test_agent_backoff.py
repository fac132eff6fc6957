"""Jittered retries and random phases: the pure decisions, over seeded RNGs."""

from __future__ import annotations

import random

import pytest

from netopt.agent.backoff import first_phase_s, full_jitter_s, jittered_period_s


def test_full_jitter_stays_under_a_doubling_ceiling_capped() -> None:
    rng = random.Random(7)
    for attempt in range(80):
        ceiling_s = min(30.0, 1.0 * 2.0**attempt)
        for _ in range(50):
            assert 0.0 <= full_jitter_s(attempt, rng, base_s=1.0, cap_s=30.0) <= ceiling_s


def test_full_jitter_spreads_a_fleet_over_the_whole_ceiling() -> None:
    """1,000 agents failing together at attempt 5 retry over 0..30 s, not at one instant."""
    delays = sorted(
        full_jitter_s(5, random.Random(seed), base_s=1.0, cap_s=30.0) for seed in range(1000)
    )
    assert delays[0] < 1.0
    assert delays[-1] > 29.0
    # Roughly uniform: each 3 s tenth of the ceiling holds 100 +- 40 of them.
    for tenth in range(10):
        inside = [d for d in delays if 3.0 * tenth <= d < 3.0 * (tenth + 1)]
        assert 60 <= len(inside) <= 140


def test_same_seed_same_delays() -> None:
    first = [full_jitter_s(a, random.Random(3), base_s=0.5, cap_s=8.0) for a in range(10)]
    again = [full_jitter_s(a, random.Random(3), base_s=0.5, cap_s=8.0) for a in range(10)]
    assert first == again


def test_phase_and_period_bounds() -> None:
    rng = random.Random(11)
    phases = [first_phase_s(10.0, rng) for _ in range(1000)]
    assert all(0.0 <= p <= 10.0 for p in phases)
    assert min(phases) < 0.5
    assert max(phases) > 9.5
    periods = [jittered_period_s(10.0, rng) for _ in range(1000)]
    assert all(9.0 <= p <= 11.0 for p in periods)
    assert min(periods) < 9.1
    assert max(periods) > 10.9


def test_refuses_nonsense() -> None:
    rng = random.Random(0)
    with pytest.raises(ValueError, match="attempt"):
        full_jitter_s(-1, rng, base_s=1.0, cap_s=2.0)
    with pytest.raises(ValueError, match="base_s"):
        full_jitter_s(0, rng, base_s=0.0, cap_s=2.0)
    with pytest.raises(ValueError, match="interval_s"):
        first_phase_s(0.0, rng)
    with pytest.raises(ValueError, match="spread_ratio"):
        jittered_period_s(1.0, rng, spread_ratio=1.0)
