"""The order a sync asks for its chunks in (`netopt.dataplane.fetchorder`): file order
from a starting point, and the tail largest first."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from netopt.dataplane.fetchorder import (
    SMALL_CHUNK_BYTES,
    TAIL_ROUNDS,
    fetch_order,
    tail_window_bytes,
)

MIB = 1024 * 1024


def _chunks(lengths: list[int]) -> tuple[list[str], dict[str, int]]:
    names = [f"c{i:05d}" for i in range(len(lengths))]
    return names, dict(zip(names, lengths, strict=True))


def test_the_tail_is_asked_largest_first_and_the_rest_in_file_order() -> None:
    rng = random.Random(3)
    names, lengths = _chunks([rng.randrange(256 * 1024, 3 * MIB) for _ in range(80)])
    order = fetch_order(names, lengths, 0.0, 20 * MIB)
    assert sorted(order) == sorted(names)
    # The shortest suffix of the file order that holds 20 MiB is the tail.
    covered, window = 0, 0
    while covered < 20 * MIB:
        window += 1
        covered += lengths[names[-window]]
    head, tail = order[:-window], order[-window:]
    assert head == names[:-window]
    assert set(tail) == set(names[-window:])
    assert [lengths[c] for c in tail] == sorted((lengths[c] for c in tail), reverse=True)
    assert lengths[order[-1]] == min(lengths[c] for c in names[-window:])


def test_the_start_is_rotated_before_the_tail_is_ordered() -> None:
    names, lengths = _chunks([MIB, 2 * MIB, 3 * MIB, MIB // 2, 4 * MIB, MIB, 2 * MIB, MIB])
    # Start half way: 4 5 6 7 0 1 2 3. The tail of at least 4 MiB is 1 2 3 (5.5 MiB),
    # asked largest first: 2 (3 MiB), 1 (2 MiB), 3 (0.5 MiB).
    order = fetch_order(names, lengths, 0.5, 4 * MIB)
    assert order == ["c00004", "c00005", "c00006", "c00007", "c00000", "c00002", "c00001", "c00003"]
    # Of at least 6 MiB: 0 1 2 3 (6.5 MiB).
    order = fetch_order(names, lengths, 0.5, 6 * MIB)
    assert order[4:] == ["c00002", "c00001", "c00000", "c00003"]


def test_no_tail_bytes_keeps_the_rotated_file_order() -> None:
    names, lengths = _chunks([3, 1, 2, 5, 4])
    assert fetch_order(names, lengths, 0.0, 0) == names
    assert fetch_order(names, lengths, 0.4, 0) == names[2:] + names[:2]
    assert fetch_order([], {}, 0.3, 10) == []


def test_the_window_grows_with_the_streams_and_what_each_keeps_asked() -> None:
    assert tail_window_bytes(8, 1536 * 1024) == TAIL_ROUNDS * 8 * 1536 * 1024
    assert tail_window_bytes(0, MIB) == TAIL_ROUNDS * MIB
    assert tail_window_bytes(4, -1) == 0


def test_without_streams_the_tail_keeps_file_order() -> None:
    # A region's shared sync (batches): each node keeps its own starting point to the end.
    assert tail_window_bytes(8, MIB, streamed=False) == 0
    names, lengths = _chunks([1 * MIB, 3 * MIB, 2 * MIB, 4 * MIB])
    rotated = names[2:] + names[:2]
    assert fetch_order(names, lengths, 0.5, tail_window_bytes(8, MIB, streamed=False)) == rotated
    over_streams = fetch_order(names, lengths, 0.5, tail_window_bytes(8, MIB))
    assert over_streams == [names[3], names[1], names[2], names[0]]  # largest first


@given(
    st.lists(st.integers(min_value=1, max_value=8 * MIB), max_size=60),
    st.floats(min_value=-1.0, max_value=2.0, allow_nan=False),
    st.integers(min_value=0, max_value=64 * MIB),
)
def test_every_chunk_is_asked_once_whatever_the_order(
    sizes: list[int], start_fraction: float, tail_bytes: int
) -> None:
    names, lengths = _chunks(sizes)
    order = fetch_order(names, lengths, start_fraction, tail_bytes)
    assert sorted(order) == names
    if len(order) > 1 and tail_bytes >= sum(sizes):  # the whole queue is the tail
        rotated = fetch_order(names, lengths, start_fraction, 0)
        large = [c for c in rotated if lengths[c] >= SMALL_CHUNK_BYTES]
        small = [c for c in rotated if lengths[c] < SMALL_CHUNK_BYTES]
        assert order == sorted(large, key=lambda c: -lengths[c]) + small


def test_small_chunks_keep_their_order_after_the_large_ones() -> None:
    # A tree's small files and a large file's chunks at the end of the queue: the large
    # chunks go first, largest first; the small ones keep file (directory) order.
    sizes = [3000, 2 * MIB, 1000, 4000, MIB, 70_000, 2000]
    names, lengths = _chunks(sizes)
    order = fetch_order(names, lengths, 0.0, 100 * MIB)
    assert order == ["c00001", "c00004", "c00005", "c00000", "c00002", "c00003", "c00006"]
