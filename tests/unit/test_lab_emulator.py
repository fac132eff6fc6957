"""The link emulator's per-packet decisions, with the clock and dice passed in."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netopt.config.lab import LinkShape
from netopt.lab.emulator import (
    DROP_LINK_DOWN,
    DROP_LOSS,
    DROP_QUEUE,
    DirectionShape,
    DirectionShaper,
    serialization_ns,
)

MS = 1_000_000
NO_LOSS = 0.99  # a loss draw that never drops (loss_ratio < 0.99 here)


def shaper(**kwargs: float) -> DirectionShaper:
    fields = {"rate_bps": 8_000_000.0, "queue_bytes": 100_000}
    fields.update(kwargs)
    return DirectionShaper(DirectionShape(**fields))  # type: ignore[arg-type]


def test_serialization_time_at_the_rate() -> None:
    # 1000 bytes at 8 Mbit/s take exactly 1 ms.
    assert serialization_ns(1000, 8_000_000) == MS
    assert serialization_ns(1, 3) == 2_666_666_667  # rounded up


def test_a_lone_packet_arrives_after_serialization_plus_delay() -> None:
    s = shaper(delay_ns=40 * MS)
    assert s.offer(0, 1000, NO_LOSS, 0.5) == 41 * MS


def test_back_to_back_packets_are_spaced_by_their_serialization() -> None:
    s = shaper()
    arrivals = [s.offer(0, 1000, NO_LOSS, 0.5) for _ in range(5)]
    assert arrivals == [MS, 2 * MS, 3 * MS, 4 * MS, 5 * MS]
    assert s.backlog_bytes(0) == 5000
    # An idle link starts afresh: no credit is saved up.
    assert s.offer(100 * MS, 1000, NO_LOSS, 0.5) == 101 * MS


def test_full_queue_tail_drops() -> None:
    s = shaper(queue_bytes=3000)
    results = [s.offer(0, 1000, NO_LOSS, 0.5) for _ in range(5)]
    assert results[:3] == [MS, 2 * MS, 3 * MS]
    assert results[3:] == [DROP_QUEUE, DROP_QUEUE]
    assert s.stats.drops_queue == 2
    # Once the serializer has drained a packet, there is room again.
    assert s.offer(MS, 1000, NO_LOSS, 0.5) == 4 * MS


def test_loss_uses_the_draw_and_still_costs_link_time() -> None:
    s = shaper(loss_ratio=0.1)
    assert s.offer(0, 1000, 0.05, 0.5) == DROP_LOSS
    assert s.offer(0, 1000, 0.5, 0.5) == 2 * MS
    assert s.stats.drops_loss == 1


def test_cut_link_drops_everything_until_restored() -> None:
    s = shaper()
    s.up = False
    assert s.offer(0, 1000, NO_LOSS, 0.5) == DROP_LINK_DOWN
    assert s.stats.drops_link_down == 1
    s.up = True
    assert s.offer(0, 1000, NO_LOSS, 0.5) == MS


def test_delivered_counts_packets_and_bytes() -> None:
    s = shaper()
    s.delivered(1500)
    s.delivered(40)
    assert s.stats.to_dict() == {
        "packets": 2,
        "bytes": 1540,
        "drops_loss": 0,
        "drops_queue": 0,
        "drops_link_down": 0,
    }


def test_jitter_spreads_but_never_reorders() -> None:
    s = shaper(delay_ns=10 * MS, jitter_ns=5 * MS, rate_bps=1e9)
    first = s.offer(0, 100, NO_LOSS, 0.999)  # +5 ms
    second = s.offer(0, 100, NO_LOSS, 0.0)  # -5 ms, but may not overtake
    assert first == pytest.approx(15 * MS, abs=20_000)
    assert second == first


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5 * MS),
            st.integers(20, 1500),
            st.floats(0, 1, exclude_max=True),
            st.floats(0, 1, exclude_max=True),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_arrivals_are_ordered_and_never_early(
    packets: list[tuple[int, int, float, float]],
) -> None:
    s = shaper(delay_ns=3 * MS, jitter_ns=2 * MS, loss_ratio=0.2, queue_bytes=6000)
    now = 0
    last = 0
    for gap, size, loss_draw, jitter_draw in packets:
        now += gap
        arrival = s.offer(now, size, loss_draw, jitter_draw)
        if arrival < 0:
            continue
        assert arrival >= now + serialization_ns(size, 8e6) + 1 * MS - 1
        assert arrival >= last
        last = arrival
    assert s.backlog_bytes(now) <= 6000


def test_random_loss_rate_matches_the_ratio() -> None:
    s = shaper(loss_ratio=0.05, rate_bps=1e12)
    rng = random.Random(3)
    for i in range(20_000):
        s.offer(i * MS, 100, rng.random(), rng.random())
    assert 0.045 < s.stats.drops_loss / 20_000 < 0.055


def test_from_link_converts_units() -> None:
    shape = DirectionShape.from_link(
        LinkShape(rate_mbps=100, delay_ms=40, jitter_ms=2, loss_ratio=0.01, queue_ms=50)
    )
    assert shape.rate_bps == 100e6
    assert (shape.delay_ns, shape.jitter_ns) == (40 * MS, 2 * MS)
    assert shape.loss_ratio == pytest.approx(0.01)
    assert shape.queue_bytes == 625_000


def test_from_link_half_hop_keeps_the_end_to_end_figures() -> None:
    link = LinkShape(rate_mbps=100, delay_ms=10, loss_ratio=0.19)
    hop = DirectionShape.from_link(link, fraction=0.5)
    assert hop.delay_ns == 5 * MS
    assert 1 - (1 - hop.loss_ratio) ** 2 == pytest.approx(0.19)
    with pytest.raises(ValueError, match="fraction"):
        DirectionShape.from_link(link, fraction=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate_bps": 0}, "rate_bps"),
        ({"rate_bps": 1e6, "loss_ratio": 1.0}, "loss_ratio"),
        ({"rate_bps": 1e6, "delay_ns": 1, "jitter_ns": 2}, "jitter_ns"),
        ({"rate_bps": 1e6, "queue_bytes": 0}, "queue_bytes"),
    ],
)
def test_shape_refuses_nonsense(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DirectionShape(**kwargs)  # type: ignore[arg-type]


# The user-space proxies of the unprivileged demo (netopt.lab.userlink) run the same
# shaper: TCP stream chunks through `send` (no queue limit, no loss), datagrams `offer`.


def _clock(**kwargs: float) -> DirectionShaper:
    # 8 Mbit/s: one byte per microsecond, easy arithmetic.
    fields: dict[str, float] = {"rate_bps": 8e6, "delay_ns": 10 * MS, "queue_bytes": 10_000}
    return DirectionShaper(DirectionShape(**(fields | kwargs)))  # type: ignore[arg-type]


def test_stream_bytes_wait_for_the_serializer_then_the_delay() -> None:
    clock = _clock()
    assert clock.send(0, 1000, 0.5) == 1 * MS + 10 * MS
    assert clock.send(0, 1000, 0.5) == 2 * MS + 10 * MS  # queued behind the first
    assert clock.backlog_bytes(0) == 2000
    assert clock.room_bytes(0) == 8000
    assert clock.backlog_bytes(1 * MS) == 1000
    # An idle link starts serialising at once.
    assert clock.send(50 * MS, 500, 0.5) == 50 * MS + MS // 2 + 10 * MS
    assert clock.room_bytes(100 * MS) == 10_000


def test_jitter_spreads_stream_arrivals_but_never_reorders_them() -> None:
    clock = _clock(jitter_ns=8 * MS)
    rng = random.Random(3)
    arrivals = [clock.send(i * 100_000, 100, rng.random()) for i in range(500)]
    assert arrivals == sorted(arrivals)
    gaps = {b - a for a, b in itertools.pairwise(arrivals)}
    assert len(gaps) > 10  # jitter did something
    assert min(arrivals) >= 2 * MS  # delay 10 ms minus at most 8 ms of jitter


def test_proxied_datagrams_are_dropped_by_a_full_queue_or_by_loss() -> None:
    clock = _clock(loss_ratio=0.25)
    assert clock.offer(0, 6000, 0.9, 0.5) == 6 * MS + 10 * MS
    assert clock.offer(0, 6000, 0.9, 0.5) == DROP_QUEUE  # 12000 > 10000 bytes
    assert clock.backlog_bytes(0) == 6000  # a queue drop takes no link time
    assert clock.offer(0, 1000, 0.1, 0.5) == DROP_LOSS
    assert clock.backlog_bytes(0) == 7000  # a lost datagram used its link time
    assert clock.offer(0, 1000, 0.9, 0.5) == 8 * MS + 10 * MS


def test_a_shape_from_the_lab_config_becomes_a_user_space_proxys_shaper() -> None:
    clock = DirectionShaper.from_link(LinkShape(rate_mbps=100, delay_ms=40, jitter_ms=2))
    assert clock.shape.delay_ns == 40 * MS
    assert clock.shape.jitter_ns == 2 * MS
    assert clock.ns_per_byte == pytest.approx(80.0)
    with pytest.raises(ValueError, match="rate_bps"):
        DirectionShaper.from_link(LinkShape(rate_mbps=0))
