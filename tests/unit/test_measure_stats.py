"""summarise(): RTT percentiles, RFC 3550 jitter, Wilson loss interval, reorder, outages."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netopt.measure.samples import ProbeSeries, Reply
from netopt.measure.stats import (
    find_outages,
    rfc3550_jitter_ms,
    summarise,
    wilson_interval,
)


def series(
    n: int, replies: list[Reply], interval_s: float = 0.1, timeout_s: float = 1.0
) -> ProbeSeries:
    return ProbeSeries("udp", tuple(i * interval_s for i in range(n)), tuple(replies), timeout_s)


def answered(n: int, rtt_ms: float = 10.0, skip: frozenset[int] = frozenset()) -> list[Reply]:
    return [Reply(i, i * 0.1 + rtt_ms / 1e3, rtt_ms) for i in range(n) if i not in skip]


def test_rtt_summary_of_known_values() -> None:
    rtts = [float(v) for v in range(1, 101)]
    replies = [Reply(i, i * 0.1 + r / 1e3, r) for i, r in enumerate(rtts)]
    stats = summarise(series(100, replies))
    assert stats.rtt_ms is not None
    assert stats.rtt_ms.min == 1
    assert stats.rtt_ms.max == 100
    assert stats.rtt_ms.mean == pytest.approx(50.5)
    assert stats.rtt_ms.p50 == pytest.approx(50.5)
    assert stats.rtt_ms.p90 == pytest.approx(90.1)
    assert stats.rtt_ms.p99 == pytest.approx(99.01)
    assert stats.delay_variation_ms is not None
    assert stats.delay_variation_ms.p50 == pytest.approx(49.5)
    assert stats.loss_ratio == 0
    assert stats.loss_ratio_ci95[0] == 0


def test_rfc3550_jitter_follows_the_recurrence() -> None:
    # Alternating 10/12 ms: |D| = 2 every step; J_n = 2 * (1 - (15/16)^n).
    rtts = [10.0 if i % 2 == 0 else 12.0 for i in range(50)]
    assert rfc3550_jitter_ms(rtts) == pytest.approx(2 * (1 - (15 / 16) ** 49))
    assert rfc3550_jitter_ms([5.0] * 10) == 0
    assert rfc3550_jitter_ms([]) == 0


def test_wilson_interval_matches_the_formula() -> None:
    low, high = wilson_interval(10, 1000)
    assert (low, high) == pytest.approx((0.005441, 0.018301), abs=1e-5)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 50)[0] == 0.0
    assert wilson_interval(50, 50)[1] == 1.0
    with pytest.raises(ValueError, match="failures"):
        wilson_interval(5, 4)


@given(st.integers(1, 5000), st.data())
def test_wilson_interval_holds_the_observed_ratio(trials: int, data: st.DataObject) -> None:
    failures = data.draw(st.integers(0, trials))
    low, high = wilson_interval(failures, trials)
    assert 0 <= low <= failures / trials <= high <= 1


def test_loss_duplicates_reordering_and_late() -> None:
    replies = [
        Reply(0, 0.01, 10.0),
        Reply(2, 0.21, 10.0),
        Reply(1, 0.215, 115.0),  # arrives after seq 2: reordered
        Reply(2, 0.22, 10.0),  # duplicate
        Reply(4, 2.0, 1600.0),  # later than the 1 s timeout: lost and late
        Reply(5, 0.51, 10.0),
    ]
    stats = summarise(series(6, replies))
    assert stats.probes_sent == 6
    assert stats.probes_received == 4
    assert stats.loss_ratio == pytest.approx(2 / 6)
    assert stats.reordered_count == 1
    assert stats.duplicate_count == 1
    assert stats.late_count == 1
    assert stats.rtt_ms is not None
    assert stats.rtt_ms.max == 115.0
    low, high = stats.loss_ratio_ci95
    assert low < 2 / 6 < high


def test_replies_for_unknown_seqs_are_ignored() -> None:
    stats = summarise(series(2, [Reply(0, 0.01, 10.0), Reply(7, 0.02, 1.0)]))
    assert stats.probes_received == 1
    assert stats.loss_ratio == 0.5


def test_outage_is_a_run_of_losses_with_start_and_duration() -> None:
    lost = frozenset(range(30, 60))  # 3 s at 10 probes/s
    stats = summarise(series(100, answered(100, skip=lost | {5, 80, 81})))
    assert len(stats.outages) == 1
    outage = stats.outages[0]
    assert outage.start_s == pytest.approx(3.0)
    assert outage.duration_s == pytest.approx(3.0)
    assert outage.lost_count == 30
    assert not outage.ongoing


def test_outage_reaching_the_end_is_ongoing() -> None:
    outages = find_outages([0.0, 1.0, 2.0, 3.0, 4.0], [False, False, True, True, True])
    assert len(outages) == 1
    assert outages[0].ongoing
    assert outages[0].duration_s == pytest.approx(3.0)
    assert find_outages([0.0, 1.0], [True, True], min_lost=3) == ()
    assert find_outages([], []) == ()


def test_nothing_answered() -> None:
    stats = summarise(series(10, []))
    assert stats.rtt_ms is None
    assert stats.jitter_ms is None
    assert stats.loss_ratio == 1.0
    assert stats.loss_ratio_ci95[1] == 1.0
    assert stats.to_dict()["rtt_ms"] is None


def test_to_dict_has_units_in_numeric_keys() -> None:
    data = summarise(series(10, answered(10))).to_dict()
    assert data["rtt_ms"]["p50"] == pytest.approx(10.0)
    numeric = [k for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    units = ("_ms", "_s", "_ratio", "_count", "probes_sent", "probes_received")
    assert all(k.endswith(units) for k in numeric), numeric


@given(st.lists(st.booleans(), min_size=1, max_size=300))
def test_loss_ratio_counts_every_unanswered_probe(lost_flags: list[bool]) -> None:
    n = len(lost_flags)
    skip = frozenset(i for i, lost in enumerate(lost_flags) if lost)
    stats = summarise(series(n, answered(n, skip=skip)))
    assert stats.loss_ratio == pytest.approx(len(skip) / n)
    assert stats.probes_received == n - len(skip)
    assert sum(o.lost_count for o in stats.outages) <= len(skip)
    assert math.isclose(stats.loss_ratio, 1 - stats.probes_received / n)
