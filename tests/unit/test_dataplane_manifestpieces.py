"""`netopt.dataplane.manifestpieces`: which byte ranges of one body are asked for, held
and missing, and when an idle connection takes part of another's piece over; and
`manifestwire.byte_range`, the server's side of a ``Range`` header. Pure: times are
arguments."""

from __future__ import annotations

import os

import pytest

from netopt.dataplane.manifestpieces import (
    FIRST_PIECE_BYTES,
    MIN_STEAL_BYTES,
    WAIT,
    Pieces,
    PiecesBroken,
    content_range,
)
from netopt.dataplane.manifestwire import RangeNotSatisfiable, byte_range

ETAG = '"v1"'
STALL_S = 0.2


def _range(start: int, end: int, total: int) -> str:
    return f"bytes {start}-{end - 1}/{total}"


def _answer(
    pieces: Pieces,
    asked: tuple[int, int, int],
    body: bytes,
    read: int | None = None,
    now_s: float = 0.0,
) -> bool:
    """Answer ``asked`` from ``body`` as a server would and hand in ``read`` bytes of it
    (all by default); whether its owner is to read on."""
    start, end, ticket = asked
    end = min(end, len(body))
    length = pieces.answered(ticket, _range(start, end, len(body)), ETAG, "zstd")
    assert length == end - start
    return pieces.received(ticket, body[start : start + (length if read is None else read)], now_s)


def _second_piece_in(body: bytes) -> tuple[Pieces, tuple[int, int, int]]:
    """Two connections' first pieces of ``body`` (a first piece and 1,000 bytes more)
    asked, the second in: the pieces and the first one's ask (its owner read nothing)."""
    pieces = Pieces(10_000_000, copy_first=False, connections=2)
    a = pieces.next_range(0.0, STALL_S)
    b = pieces.next_range(0.0, STALL_S)
    assert isinstance(a, tuple)
    assert isinstance(b, tuple)
    _answer(pieces, b, body)
    return pieces, a


def test_a_body_comes_whole_from_blind_first_pieces_then_even_shares() -> None:
    body = os.urandom(1_000_000)
    pieces = Pieces(10_000_000, copy_first=False, connections=4)
    first = [pieces.next_range(0.0, STALL_S) for _ in range(4)]
    # Blind, in order from byte 0, one first flight each.
    assert [a[:2] for a in first if isinstance(a, tuple)] == [
        (i * FIRST_PIECE_BYTES, (i + 1) * FIRST_PIECE_BYTES) for i in range(4)
    ]
    for asked in first:
        assert isinstance(asked, tuple)
        _answer(pieces, asked, body)
    assert pieces.total_bytes == len(body)
    # The rest is shared out evenly over the 4 connections: one answer each.
    shares = [pieces.next_range(0.1, STALL_S) for _ in range(4)]
    assert all(isinstance(s, tuple) for s in shares)
    sizes = [s[1] - s[0] for s in shares if isinstance(s, tuple)]
    assert sum(sizes) == len(body) - 4 * FIRST_PIECE_BYTES
    assert max(sizes) - min(sizes) <= 4
    for asked in shares:
        assert isinstance(asked, tuple)
        _answer(pieces, asked, body)
    assert pieces.done()
    assert pieces.body() == body
    assert pieces.next_range(0.2, STALL_S) is None


def test_blind_pieces_past_the_end_learn_the_total_from_a_416() -> None:
    body = os.urandom(FIRST_PIECE_BYTES + 100)
    pieces = Pieces(10_000_000, copy_first=False, connections=3)
    asks = [pieces.next_range(0.0, STALL_S) for _ in range(3)]
    assert all(isinstance(a, tuple) for a in asks)
    third = asks[2]
    assert isinstance(third, tuple)
    pieces.past_end(third[2], len(body))  # 416: bytes */TOTAL
    assert pieces.total_bytes == len(body)
    second = asks[1]
    assert isinstance(second, tuple)
    # The second piece is clipped at the total: 100 bytes.
    assert not _answer(pieces, second, body)
    assert len(pieces.held[FIRST_PIECE_BYTES]) == 100
    first = asks[0]
    assert isinstance(first, tuple)
    _answer(pieces, first, body)
    assert pieces.done()
    assert pieces.body() == body


def test_the_first_piece_is_asked_twice_and_the_first_copy_to_arrive_is_kept() -> None:
    body = os.urandom(5000)  # a small manifest: the first piece alone
    for copy_wins in (True, False):
        pieces = Pieces(10_000_000, connections=4)
        asks = [pieces.next_range(0.0, STALL_S) for _ in range(4)]
        assert [a[:2] for a in asks if isinstance(a, tuple)] == [
            (0, FIRST_PIECE_BYTES),
            (0, FIRST_PIECE_BYTES),
            (FIRST_PIECE_BYTES, 2 * FIRST_PIECE_BYTES),
            (2 * FIRST_PIECE_BYTES, 3 * FIRST_PIECE_BYTES),
        ]
        original, copy, past, further = asks
        assert isinstance(original, tuple)
        assert isinstance(copy, tuple)
        assert isinstance(past, tuple)
        assert isinstance(further, tuple)
        pieces.past_end(past[2], len(body))
        pieces.past_end(further[2], len(body))
        first, second = (copy, original) if copy_wins else (original, copy)
        assert not _answer(pieces, first, body)
        assert pieces.done()
        assert pieces.body() == body
        assert pieces.answered(second[2], _range(0, len(body), len(body)), ETAG, "zstd") == 0


def test_an_idle_connection_takes_over_half_of_a_large_piece() -> None:
    body = os.urandom(400_000)
    pieces = Pieces(10_000_000, copy_first=False, connections=1)
    head = pieces.next_range(0.0, STALL_S)
    assert isinstance(head, tuple)
    _answer(pieces, head, body)
    rest = pieces.next_range(0.1, STALL_S)  # one connection: all the rest
    assert isinstance(rest, tuple)
    assert rest[1] == len(body)
    assert _answer(pieces, rest, body, read=100_000)  # 100 KB read so far: reads on
    thief = pieces.next_range(0.2, STALL_S)
    assert isinstance(thief, tuple)
    left = rest[1] - rest[0] - 100_000
    assert thief[0] == rest[0] + 100_000 + left // 2
    assert thief[1] == len(body)
    assert pieces.steals == 1
    # The owner's next block reaches past where it now stops: the bytes past are
    # dropped and it stops.
    more = body[rest[0] + 100_000 : rest[0] + 250_000]
    assert not pieces.received(rest[2], more, 0.3)
    assert not pieces.done()
    assert not _answer(pieces, thief, body)
    assert pieces.done()
    assert pieces.body() == body


def test_a_small_piece_is_never_split_below_the_least_take_over() -> None:
    body = os.urandom(FIRST_PIECE_BYTES + 2 * MIN_STEAL_BYTES - 1)
    pieces = Pieces(10_000_000, copy_first=False, connections=1)
    head = pieces.next_range(0.0, STALL_S)
    assert isinstance(head, tuple)
    _answer(pieces, head, body)
    rest = pieces.next_range(0.0, STALL_S)
    assert isinstance(rest, tuple)
    assert pieces.next_range(0.1, STALL_S) is WAIT  # too small to split, not stalled


def test_a_stalled_piece_gets_a_copy_and_the_first_to_arrive_is_kept() -> None:
    body = os.urandom(FIRST_PIECE_BYTES + 1000)
    for copy_first in (True, False):
        pieces, a = _second_piece_in(body)
        assert pieces.next_range(0.1, STALL_S) is WAIT
        copy = pieces.next_range(0.3, STALL_S)
        assert isinstance(copy, tuple)
        assert copy[:2] == a[:2]  # its owner read nothing yet
        assert pieces.copies == 1
        assert pieces.next_range(0.4, STALL_S) is WAIT  # the copy has not stalled yet
        first, second = (copy, a) if copy_first else (a, copy)
        _answer(pieces, first, body)
        # The other arrives late: its ask is gone, it reads nothing more.
        late = pieces.answered(second[2], _range(0, FIRST_PIECE_BYTES, len(body)), ETAG, "zstd")
        assert late == 0
        assert not pieces.received(second[2], body[:10], 1.0)
        assert pieces.done()
        assert pieces.body() == body


def test_a_copy_that_stalls_too_is_copied_in_turn() -> None:
    body = os.urandom(FIRST_PIECE_BYTES + 1000)
    pieces, a = _second_piece_in(body)
    copy = pieces.next_range(0.3, STALL_S)
    assert isinstance(copy, tuple)
    again = pieces.next_range(0.6, STALL_S)  # the copy read nothing for 0.3 s either
    assert isinstance(again, tuple)
    assert again[:2] == a[:2]
    assert pieces.next_range(0.7, STALL_S) is WAIT
    _answer(pieces, again, body)
    assert pieces.done()
    assert pieces.body() == body
    # The two stalled asks are gone: what they bring later is not taken.
    for late in (a, copy):
        assert pieces.answered(late[2], _range(0, FIRST_PIECE_BYTES, len(body)), ETAG, "zstd") == 0


def test_a_copy_of_a_partly_read_piece_fetches_only_the_rest() -> None:
    body = os.urandom(FIRST_PIECE_BYTES + 1000)
    pieces, a = _second_piece_in(body)
    assert _answer(pieces, a, body, read=5000)
    copy = pieces.next_range(0.3, STALL_S)
    assert isinstance(copy, tuple)
    assert copy[:2] == (5000, FIRST_PIECE_BYTES)
    # The copy comes first: the owner's 5,000 bytes are kept at once, without waiting
    # for its next block (which may be seconds away); that block finds it done.
    _answer(pieces, copy, body)
    assert pieces.done()
    assert pieces.body() == body
    assert not pieces.received(a[2], body[5000:7000], 0.4)


def test_a_failed_owner_s_piece_is_asked_again_first() -> None:
    body = os.urandom(3 * FIRST_PIECE_BYTES)
    pieces = Pieces(10_000_000, copy_first=False, connections=3)
    asks = [pieces.next_range(0.0, STALL_S) for _ in range(3)]
    first = asks[0]
    assert isinstance(first, tuple)
    pieces.give_back(first[2])  # its connection broke before any byte
    again = pieces.next_range(0.1, STALL_S)
    assert isinstance(again, tuple)
    assert again[:2] == first[:2]
    assert again[2] != first[2]
    for asked in (again, asks[1], asks[2]):
        assert isinstance(asked, tuple)
        _answer(pieces, asked, body)
    assert pieces.done()
    assert pieces.body() == body


def test_what_a_failed_owner_read_is_kept_and_only_the_rest_asked_again() -> None:
    body = os.urandom(2 * FIRST_PIECE_BYTES)
    pieces = Pieces(10_000_000, copy_first=False, connections=2)
    a = pieces.next_range(0.0, STALL_S)
    b = pieces.next_range(0.0, STALL_S)
    assert isinstance(a, tuple)
    assert isinstance(b, tuple)
    assert _answer(pieces, a, body, read=3000)
    pieces.give_back(a[2])
    rest = pieces.next_range(0.1, STALL_S)
    assert isinstance(rest, tuple)
    assert rest[:2] == (3000, FIRST_PIECE_BYTES)
    _answer(pieces, rest, body)
    _answer(pieces, b, body)
    assert pieces.done()
    assert pieces.body() == body


def test_a_failed_original_stops_where_its_copy_starts() -> None:
    body = os.urandom(FIRST_PIECE_BYTES + 1000)
    pieces, a = _second_piece_in(body)
    assert _answer(pieces, a, body, read=4000)
    copy = pieces.next_range(0.3, STALL_S)
    assert isinstance(copy, tuple)
    pieces.give_back(a[2])  # its 4,000 bytes are kept; the copy fetches the rest
    assert pieces.next_range(0.4, 10.0) is WAIT
    _answer(pieces, copy, body)
    assert pieces.done()
    assert pieces.body() == body


def test_a_failed_copy_is_dropped_and_its_original_may_be_copied_again() -> None:
    body = os.urandom(FIRST_PIECE_BYTES + 1000)
    pieces, a = _second_piece_in(body)
    copy = pieces.next_range(0.3, STALL_S)
    assert isinstance(copy, tuple)
    pieces.give_back(copy[2])
    again = pieces.next_range(0.6, STALL_S)
    assert isinstance(again, tuple)
    assert again[:2] == a[:2]
    assert again[2] not in (a[2], copy[2])
    _answer(pieces, a, body)
    assert pieces.done()
    assert pieces.body() == body


@pytest.mark.parametrize(
    ("lie", "message"),
    [
        ("etag", "two versions"),
        ("coding", "two versions"),
        ("no-etag", "without an entity tag"),
        ("start", "asked at byte"),
        ("short-end", "asked at byte"),
        ("total", "of a body of"),
        ("huge", "at most"),
        ("unit", "is not bytes"),
        ("unknown-total", "is not bytes"),
        ("beyond-total", "does not fit"),
    ],
)
def test_a_piece_that_lies_breaks_the_fetch(lie: str, message: str) -> None:
    body = os.urandom(3 * FIRST_PIECE_BYTES)
    pieces = Pieces(1_000_000, copy_first=False, connections=2)
    a = pieces.next_range(0.0, STALL_S)
    b = pieces.next_range(0.0, STALL_S)
    assert isinstance(a, tuple)
    assert isinstance(b, tuple)
    _answer(pieces, a, body)
    start, end, ticket = b
    total = len(body)
    headers = {
        "etag": (_range(start, end, total), '"v2"', "zstd"),
        "coding": (_range(start, end, total), ETAG, None),
        "no-etag": (_range(start, end, total), None, "zstd"),
        "start": (_range(start + 1, end, total), ETAG, "zstd"),
        "short-end": (_range(start, end - 1, total), ETAG, "zstd"),
        "total": (_range(start, end, total + 1), ETAG, "zstd"),
        "huge": (_range(start, end, 10**15), ETAG, "zstd"),
        "unit": (f"items {start}-{end - 1}/{total}", ETAG, "zstd"),
        "unknown-total": (f"bytes {start}-{end - 1}/*", ETAG, "zstd"),
        "beyond-total": (f"bytes {start}-{total + 5}/{total}", ETAG, "zstd"),
    }[lie]
    with pytest.raises(PiecesBroken, match=message):
        pieces.answered(ticket, *headers)


def test_a_416_for_a_piece_inside_the_body_breaks_the_fetch() -> None:
    pieces = Pieces(1_000_000, copy_first=False, connections=2)
    pieces.next_range(0.0, STALL_S)
    b = pieces.next_range(0.0, STALL_S)
    assert isinstance(b, tuple)
    with pytest.raises(PiecesBroken, match="past the end"):
        pieces.past_end(b[2], 5 * FIRST_PIECE_BYTES)


def test_a_block_past_a_piece_s_end_is_dropped() -> None:
    body = os.urandom(FIRST_PIECE_BYTES + 10)
    pieces = Pieces(1_000_000, copy_first=False, connections=1)
    a = pieces.next_range(0.0, STALL_S)
    assert isinstance(a, tuple)
    pieces.answered(a[2], _range(0, FIRST_PIECE_BYTES, len(body)), ETAG, "zstd")
    assert not pieces.received(a[2], body + b"x" * 100, 0.1)
    with pytest.raises(PiecesBroken, match="not whole"):
        pieces.body()
    assert pieces.held == {0: body[:FIRST_PIECE_BYTES]}


def test_content_range_parses_only_what_it_should() -> None:
    assert content_range("bytes 0-99/1000") == (0, 100, 1000)
    assert content_range("bytes */1000") == (None, None, 1000)
    for bad in (None, "", "bytes 0-99", "bytes -5-99/1000", "bytes 10-5/1000", "bytes 0-1/x",
                "bytes ٠-1/5", "bytes 0-" + "9" * 30 + "/1000"):  # fmt: skip
        with pytest.raises(PiecesBroken):
            content_range(bad)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-99", (0, 100)),
        ("bytes=100-", (100, 1000)),
        ("bytes=900-5000", (900, 1000)),  # clipped at the end
        ("bytes=-100", (900, 1000)),  # the last 100 bytes
        ("bytes=-5000", (0, 1000)),
        ("BYTES = 0-0", (0, 1)),
        ("bytes=0-1,5-6", None),  # several ranges: the whole body
        ("items=0-5", None),
        ("bytes=5-1", None),  # not a valid range: ignored
        ("bytes=x-5", None),
        ("bytes=-", None),
        ("bytes=" + "9" * 30 + "-", None),
        ("bytes=١-5", None),  # a non-ASCII digit
    ],
)
def test_byte_range_follows_rfc_9110(header: str | None, expected: tuple[int, int] | None) -> None:
    assert byte_range(header, 1000) == expected


@pytest.mark.parametrize("header", ["bytes=1000-", "bytes=5000-6000", "bytes=-0"])
def test_a_range_past_the_end_is_not_satisfiable(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        byte_range(header, 1000)
