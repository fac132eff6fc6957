"""The pure decisions of a download in parts: which bytes no kept part holds, how they
are cut at first, and which half a connection that is done takes over."""

from __future__ import annotations

import itertools

import netopt.cache.spool as spool
from netopt.cache.spool import PART_BYTES, TAKE_MIN_BYTES, missing_spans, split_spans

MIB = 1 << 20


def test_missing_spans_are_the_runs_no_kept_part_holds() -> None:
    assert missing_spans([], 10) == [(0, 10)]
    assert missing_spans([(0, 10)], 10) == []
    # Overlapping parts (two splits of one version) count once; gaps before, between, after.
    assert missing_spans([(2, 3), (4, 4), (9, 1)], 12) == [(0, 2), (8, 9), (10, 12)]
    assert missing_spans([(0, 6), (3, 2)], 8) == [(6, 8)]


def test_a_fresh_file_is_cut_in_equal_parts_of_a_mebibyte_or_more() -> None:
    size = 100 * 1000 * 1000
    parts = split_spans([(0, size)], 16)
    assert len(parts) == 16
    assert parts[0][0] == 0
    assert parts[-1][1] == size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))
    assert max(e - f for f, e in parts) - min(e - f for f, e in parts) <= 1
    # A small file: no part under PART_BYTES.
    small = split_spans([(0, 3 * MIB + 5)], 16)
    assert len(small) == 3
    assert min(e - f for f, e in small) >= PART_BYTES


def test_gaps_share_the_connections_by_their_length() -> None:
    parts = split_spans([(0, 2 * MIB), (10 * MIB, 18 * MIB)], 5)
    assert [p for p in parts if p[1] <= 2 * MIB] == [(0, 2 * MIB)]
    assert len(parts) == 5
    assert sum(e - f for f, e in parts) == 10 * MIB
    # A gap under PART_BYTES is one part.
    assert split_spans([(5, 100)], 16) == [(5, 100)]


def test_a_done_connection_takes_the_second_half_of_the_most_left() -> None:
    slow = spool._Span(0, 100_000, 4 * MIB)
    nearly = spool._Span(4 * MIB, 8 * MIB - TAKE_MIN_BYTES, 8 * MIB)
    active = [nearly, slow]
    taken = spool._take_half(active)
    assert taken is not None
    left = 4 * MIB - 100_000
    assert (taken.first, taken.next, taken.end) == (100_000 + left // 2,) * 2 + (4 * MIB,)
    assert slow.end == taken.first  # the slow one now stops there
    assert nearly.end == 8 * MIB


def test_nothing_is_taken_under_two_halves_of_the_minimum() -> None:
    span = spool._Span(0, 0, 2 * TAKE_MIN_BYTES - 1)
    assert spool._take_half([span]) is None
    assert span.end == 2 * TAKE_MIN_BYTES - 1
    assert spool._take_half([]) is None
