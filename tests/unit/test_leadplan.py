"""Which chunks a lead stands for (`netopt.dataplane.leadplan`): the one rule both ends
count them by, and how a sync deals its lead to its streams."""

from __future__ import annotations

import pytest

from netopt.dataplane.leadplan import (
    LEAD_BLOCK_CHUNKS,
    LEAD_MAX_BYTES,
    LEAD_MAX_CHUNKS,
    LEAD_MIN_BYTES,
    LEAD_MIN_CHUNKS,
    lead_positions,
    lead_ranges,
)

BLOCK = LEAD_BLOCK_CHUNKS


def test_positions_are_runs_of_a_block_every_so_often() -> None:
    got = list(lead_positions(10_000, BLOCK, 3 * BLOCK, 4 * BLOCK))
    want = [*range(BLOCK, 2 * BLOCK), *range(5 * BLOCK, 6 * BLOCK), *range(9 * BLOCK, 10 * BLOCK)]
    assert got == want


def test_positions_stop_at_the_end_of_the_order() -> None:
    total = 2 * BLOCK + 10
    assert list(lead_positions(total, 0, 10 * BLOCK, 2 * BLOCK)) == [
        *range(BLOCK),
        *range(2 * BLOCK, total),
    ]
    assert list(lead_positions(total, total - 1, 5, BLOCK)) == [total - 1]


@pytest.mark.parametrize(
    ("total", "start", "count", "every"),
    [
        (100, 100, 1, BLOCK),  # from past the end
        (100, -1, 1, BLOCK),
        (100, 0, 0, BLOCK),  # counts none
        (100, 0, LEAD_MAX_CHUNKS + 1, BLOCK),
        (100, 0, 10, BLOCK - 1),  # runs that would overlap
        (100, 0, 10, LEAD_MAX_CHUNKS + 1),
    ],
)
def test_positions_refuse_a_lead_that_stands_for_nothing_or_overlaps(
    total: int, start: int, count: int, every: int
) -> None:
    with pytest.raises(ValueError, match="a lead"):
        lead_positions(total, start, count, every)  # at the call, before any position


def test_ranges_deal_the_first_bytes_to_the_streams_in_turn() -> None:
    chunks, total_bytes, streams = 100_000, 256 * 1024 * 1024, 8
    ranges = lead_ranges(chunks, total_bytes, streams)
    assert len(ranges) == streams
    lead_chunks = LEAD_MAX_BYTES * chunks // total_bytes
    every = streams * BLOCK
    assert ranges == [(i * BLOCK, lead_chunks // streams, every) for i in range(streams)]
    positions = [p for r in ranges for p in lead_positions(chunks, *r)]
    # Each position once, and together the first ones of the order, but for the last
    # few runs' rounding.
    assert len(positions) == len(set(positions)) == streams * (lead_chunks // streams)
    assert max(positions) < lead_chunks + every


def test_ranges_take_at_most_half_of_a_small_dataset() -> None:
    chunks, total_bytes = 1_000, LEAD_MIN_BYTES
    ranges = lead_ranges(chunks, total_bytes, 4)
    assert sum(count for _, count, _ in ranges) == 4 * (chunks // 2 // 4)


@pytest.mark.parametrize(
    ("chunks", "total_bytes", "streams"),
    [
        (LEAD_MIN_CHUNKS - 1, 1 << 30, 8),  # a few large chunks: parts, not a lead
        (10_000, LEAD_MIN_BYTES - 1, 8),  # small: its manifest comes in a round trip
        (10_000, 1 << 30, 0),
    ],
)
def test_no_lead_for_a_small_dataset(chunks: int, total_bytes: int, streams: int) -> None:
    assert lead_ranges(chunks, total_bytes, streams) == []
