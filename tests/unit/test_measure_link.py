"""measure_link and the prober edge's pure parts, over FakeProber."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from netopt.config import ProbeSettings
from netopt.errors import PeerUnreachableError, ValidationError
from netopt.measure import FakeLink, FakeProber, ProbeTarget, measure_link
from netopt.measure.prober import probe_count, send_offsets_s

TARGET = ProbeTarget("198.18.0.2", 7471)
TOKEN = "0123456789abcdef0123"


async def test_measure_link_summarises_what_the_prober_saw() -> None:
    prober = FakeProber(FakeLink(rtt_ms=80, jitter_ms=2, loss_ratio=0.01), count=2000, seed=3)
    stats = await measure_link(TARGET, ProbeSettings(), TOKEN, prober=prober)
    assert prober.calls == 1
    assert stats.rtt_ms is not None
    assert 80 <= stats.rtt_ms.p50 <= 82
    low, high = stats.loss_ratio_ci95
    assert low <= 0.01 <= high
    assert stats.target == str(TARGET)


async def test_outage_in_the_model_is_reported() -> None:
    prober = FakeProber(FakeLink(rtt_ms=10, outages_s=((2.0, 5.0),)), count=200, rate_pps=20)
    stats = await measure_link(TARGET, ProbeSettings(), TOKEN, prober=prober)
    assert len(stats.outages) == 1
    assert stats.outages[0].duration_s == pytest.approx(3.0)
    assert stats.outages[0].start_s == pytest.approx(2.0)


async def test_duplicates_are_counted() -> None:
    prober = FakeProber(FakeLink(duplicate_ratio=0.5), count=200)
    stats = await measure_link(TARGET, ProbeSettings(), TOKEN, prober=prober)
    assert 50 < stats.duplicate_count < 150
    assert stats.loss_ratio == 0


async def test_nothing_answered_is_unreachable() -> None:
    with pytest.raises(PeerUnreachableError, match="none of 50"):
        await measure_link(
            TARGET, ProbeSettings(), TOKEN, prober=FakeProber(FakeLink(loss_ratio=1), count=50)
        )
    with pytest.raises(PeerUnreachableError):
        await measure_link(
            TARGET, ProbeSettings(), TOKEN, prober=FakeProber(FakeLink(), unreachable=True)
        )


def test_send_offsets() -> None:
    assert send_offsets_s(4, 10, "fixed") == pytest.approx([0, 0.1, 0.2, 0.3])
    poisson = send_offsets_s(5000, 100, "poisson", random.Random(1))
    gaps = [b - a for a, b in itertools.pairwise(poisson)]
    assert statistics.fmean(gaps) == pytest.approx(0.01, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.01, rel=0.1)  # exponential: sd = mean
    with pytest.raises(ValidationError):
        send_offsets_s(1, 0, "fixed")
    assert probe_count(10, 20) == 200
    assert probe_count(0.01, 1) == 1


def test_timer_grid_is_shared() -> None:
    from netopt.measure.udpsock import next_tick_s

    assert next_tick_s(0.0, 0.05) == pytest.approx(0.05)
    assert next_tick_s(1.01, 0.05) == pytest.approx(1.05)
    # Two callers a little apart land on the same instant: one wake-up for both.
    assert next_tick_s(1.011, 0.05) == next_tick_s(1.049, 0.05)
