"""LinkClock: the pure timing decisions behind the user-space link proxies."""

from __future__ import annotations

import itertools
import random

import pytest

from netopt.config.lab import LinkShape
from netopt.lab.emulator import DROP_LOSS, DROP_QUEUE, DirectionShape
from netopt.lab.userlink import LinkClock

MS = 1_000_000  # ns


def _clock(**kwargs: float) -> LinkClock:
    # 8 Mbit/s: one byte per microsecond, easy arithmetic.
    fields: dict[str, float] = {"rate_bps": 8e6, "delay_ns": 10 * MS, "queue_bytes": 10_000}
    return LinkClock(DirectionShape(**(fields | kwargs)))  # type: ignore[arg-type]


def test_bytes_wait_for_the_serializer_then_the_delay() -> None:
    clock = _clock()
    assert clock.send(0, 1000, 0.5) == 1 * MS + 10 * MS
    assert clock.send(0, 1000, 0.5) == 2 * MS + 10 * MS  # queued behind the first
    assert clock.backlog_bytes(0) == 2000
    assert clock.room_bytes(0) == 8000
    assert clock.backlog_bytes(1 * MS) == 1000
    # An idle link starts serialising at once.
    assert clock.send(50 * MS, 500, 0.5) == 50 * MS + MS // 2 + 10 * MS
    assert clock.room_bytes(100 * MS) == 10_000


def test_jitter_spreads_arrivals_but_never_reorders_them() -> None:
    clock = _clock(jitter_ns=8 * MS)
    rng = random.Random(3)
    arrivals = [clock.send(i * 100_000, 100, rng.random()) for i in range(500)]
    assert arrivals == sorted(arrivals)
    gaps = {b - a for a, b in itertools.pairwise(arrivals)}
    assert len(gaps) > 10  # jitter did something
    assert min(arrivals) >= 2 * MS  # delay 10 ms minus at most 8 ms of jitter


def test_datagrams_are_dropped_by_a_full_queue_or_by_loss() -> None:
    clock = _clock(loss_ratio=0.25)
    assert clock.offer_datagram(0, 6000, 0.9, 0.5) == 6 * MS + 10 * MS
    assert clock.offer_datagram(0, 6000, 0.9, 0.5) == DROP_QUEUE  # 12000 > 10000 bytes
    assert clock.backlog_bytes(0) == 6000  # a queue drop takes no link time
    assert clock.offer_datagram(0, 1000, 0.1, 0.5) == DROP_LOSS
    assert clock.backlog_bytes(0) == 7000  # a lost datagram used its link time
    assert clock.offer_datagram(0, 1000, 0.9, 0.5) == 8 * MS + 10 * MS


def test_a_shape_from_the_lab_config_becomes_a_clock() -> None:
    clock = LinkClock.from_link(LinkShape(rate_mbps=100, delay_ms=40, jitter_ms=2))
    assert clock.shape.delay_ns == 40 * MS
    assert clock.shape.jitter_ns == 2 * MS
    assert clock.ns_per_byte == pytest.approx(80.0)
    with pytest.raises(ValueError, match="rate_bps"):
        LinkClock.from_link(LinkShape(rate_mbps=0))
