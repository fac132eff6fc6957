"""`netopt.dataplane.manifestpieces`: which byte ranges of one body are asked for, held
and missing, and when an idle connection takes part of another's piece over; and
`manifestwire.byte_range`, the server's side of a ``Range`` header. Pure: times are
arguments."""

from __future__ import annotations

import os

import pytest

from netopt.dataplane.manifestpieces import (
    COPIES_MAX,
    FIRST_PIECE_BYTES,
    MIN_STEAL_BYTES,
    STALL_MIN_S,
    WAIT,
    Pieces,
    PiecesBroken,
    content_range,
    stalled_after_s,
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


def _asked(pieces: Pieces, now_s: float = 0.0) -> tuple[int, int, int]:
    asked = pieces.next_range(now_s, STALL_S)
    assert isinstance(asked, tuple), asked
    return asked


def _first_in(body: bytes, connections: int) -> Pieces:
    """Pieces of ``body`` whose first piece came whole (the total is known)."""
    pieces = Pieces(10_000_000, copy_first=False, connections=connections)
    _answer(pieces, _asked(pieces), body)
    return pieces


def _done(pieces: Pieces, body: bytes) -> None:
    assert pieces.done()
    assert pieces.body() == body


def test_the_first_piece_then_even_shares_of_the_rest() -> None:
    body = os.urandom(1_000_000)
    pieces = Pieces(10_000_000, copy_first=False, connections=4)
    first = _asked(pieces)
    assert first[:2] == (0, FIRST_PIECE_BYTES)
    # Until the total is known nothing else is asked: a server that ignores ranges
    # would send the whole body to every connection.
    assert pieces.next_range(0.0, STALL_S) is WAIT
    _answer(pieces, first, body)
    assert pieces.total_bytes == len(body)
    # The rest is shared out evenly over the 4 connections: one answer each.
    shares = [_asked(pieces, 0.1) for _ in range(4)]
    sizes = [end - start for start, end, _ in shares]
    assert sum(sizes) == len(body) - FIRST_PIECE_BYTES
    assert max(sizes) - min(sizes) <= 4
    for asked in shares:
        _answer(pieces, asked, body)
    _done(pieces, body)
    assert pieces.next_range(0.2, STALL_S) is None


def test_a_small_body_is_the_first_piece_clipped_and_an_empty_one_a_416() -> None:
    small = os.urandom(100)
    pieces = Pieces(10_000_000, copy_first=False, connections=3)
    assert not _answer(pieces, _asked(pieces), small)
    _done(pieces, small)
    assert pieces.next_range(0.0, STALL_S) is None
    empty = Pieces(10_000_000, copy_first=False, connections=3)
    empty.past_end(_asked(empty)[2], 0)  # 416: bytes */0
    _done(empty, b"")


def test_the_first_piece_is_asked_twice_and_the_first_copy_to_arrive_is_kept() -> None:
    body = os.urandom(5000)  # a small manifest: the first piece alone
    for copy_wins in (True, False):
        pieces = Pieces(10_000_000, connections=4)
        original, copy = _asked(pieces), _asked(pieces)
        assert original[:2] == copy[:2] == (0, FIRST_PIECE_BYTES)
        assert pieces.next_range(0.0, STALL_S) is WAIT
        first, second = (copy, original) if copy_wins else (original, copy)
        assert not _answer(pieces, first, body)
        _done(pieces, body)
        assert pieces.answered(second[2], _range(0, len(body), len(body)), ETAG, "zstd") == 0


def test_an_idle_connection_takes_over_half_of_a_large_piece() -> None:
    body = os.urandom(400_000)
    pieces = _first_in(body, connections=1)
    rest = _asked(pieces, 0.1)  # one connection: all the rest
    assert rest[1] == len(body)
    assert _answer(pieces, rest, body, read=100_000)  # 100 KB read so far: reads on
    thief = _asked(pieces, 0.2)
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
    _done(pieces, body)


def test_a_small_piece_is_never_split_below_the_least_take_over() -> None:
    body = os.urandom(FIRST_PIECE_BYTES + 2 * MIN_STEAL_BYTES - 1)
    pieces = _first_in(body, connections=1)
    _asked(pieces)
    assert pieces.next_range(0.1, STALL_S) is WAIT  # too small to split, not stalled


def test_a_stalled_piece_gets_a_copy_and_the_first_to_arrive_is_kept() -> None:
    body = os.urandom(5000)
    for copy_first in (True, False):
        pieces = Pieces(10_000_000, copy_first=False, connections=2)
        a = _asked(pieces)
        assert pieces.next_range(0.1, STALL_S) is WAIT
        copy = _asked(pieces, 0.3)
        assert copy[:2] == a[:2]  # its owner read nothing yet
        assert pieces.copies == 1
        assert pieces.next_range(0.4, STALL_S) is WAIT  # the copy has not stalled yet
        first, second = (copy, a) if copy_first else (a, copy)
        _answer(pieces, first, body)
        # The other arrives late: its ask is gone, it reads nothing more.
        late = pieces.answered(second[2], _range(0, len(body), len(body)), ETAG, "zstd")
        assert late == 0
        assert not pieces.received(second[2], body[:10], 1.0)
        _done(pieces, body)


def test_a_stall_is_two_round_trips_and_never_under_linux_s_least_timeout() -> None:
    assert stalled_after_s(0.14) == pytest.approx(0.28)
    assert stalled_after_s(0.0001) == STALL_MIN_S  # loopback
    assert stalled_after_s(None) == STALL_MIN_S


def test_a_copy_that_stalls_too_is_copied_in_turn() -> None:
    body = os.urandom(5000)
    pieces = Pieces(10_000_000, copy_first=False, connections=3)
    a = _asked(pieces)
    copy = _asked(pieces, 0.3)
    again = _asked(pieces, 0.6)  # the copy read nothing for 0.3 s either
    assert again[:2] == a[:2]
    assert pieces.next_range(0.7, STALL_S) is WAIT
    _answer(pieces, again, body)
    _done(pieces, body)
    # The two stalled asks are gone: what they bring later is not taken.
    for late in (a, copy):
        assert pieces.answered(late[2], _range(0, len(body), len(body)), ETAG, "zstd") == 0


def test_a_piece_is_asked_at_most_copies_max_times() -> None:
    # A server slow to answer (it builds a large body per request) looks stalled: the
    # copies stop at `COPIES_MAX` asks of the piece, however long it takes.
    pieces = Pieces(10_000_000, connections=16)
    asks = [_asked(pieces), _asked(pieces)]  # the first piece, twice
    asks += [_asked(pieces, 0.3 * n) for n in range(1, COPIES_MAX - 1)]
    assert len(asks) == COPIES_MAX
    assert all(a[:2] == (0, FIRST_PIECE_BYTES) for a in asks)
    for now_s in (10.0, 100.0):
        assert pieces.next_range(now_s, STALL_S) is WAIT


def test_a_copy_of_a_partly_read_piece_fetches_only_the_rest() -> None:
    body = os.urandom(FIRST_PIECE_BYTES + 1000)
    pieces = Pieces(10_000_000, copy_first=False, connections=2)
    a = _asked(pieces)
    assert _answer(pieces, a, body, read=5000)
    _answer(pieces, _asked(pieces, 0.1), body)  # the rest past the first piece
    copy = _asked(pieces, 0.3)
    assert copy[:2] == (5000, FIRST_PIECE_BYTES)
    # The copy comes first: the owner's 5,000 bytes are kept at once, without waiting
    # for its next block (which may be seconds away); that block finds it done.
    _answer(pieces, copy, body)
    _done(pieces, body)
    assert not pieces.received(a[2], body[5000:7000], 0.4)


def test_a_failed_owner_s_piece_is_asked_again_first() -> None:
    body = os.urandom(3 * FIRST_PIECE_BYTES)
    pieces = _first_in(body, connections=2)
    share = _asked(pieces)
    other = _asked(pieces)
    pieces.give_back(share[2])  # its connection broke before any byte
    again = _asked(pieces, 0.1)
    assert again[:2] == share[:2]
    assert again[2] != share[2]
    for asked in (again, other):
        _answer(pieces, asked, body)
    _done(pieces, body)


def test_what_a_failed_owner_read_is_kept_and_only_the_rest_asked_again() -> None:
    body = os.urandom(3 * FIRST_PIECE_BYTES)
    pieces = _first_in(body, connections=2)
    share = _asked(pieces)
    other = _asked(pieces)
    assert _answer(pieces, share, body, read=3000)
    pieces.give_back(share[2])
    rest = _asked(pieces, 0.1)
    assert rest[:2] == (share[0] + 3000, share[1])
    _answer(pieces, rest, body)
    _answer(pieces, other, body)
    _done(pieces, body)


def test_a_failed_original_stops_where_its_copy_starts() -> None:
    body = os.urandom(5000)
    pieces = Pieces(10_000_000, copy_first=False, connections=2)
    a = _asked(pieces)
    assert _answer(pieces, a, body, read=4000)
    copy = _asked(pieces, 0.3)
    pieces.give_back(a[2])  # its 4,000 bytes are kept; the copy fetches the rest
    assert pieces.next_range(0.4, 10.0) is WAIT
    _answer(pieces, copy, body)
    _done(pieces, body)


def test_a_failed_copy_is_dropped_and_its_original_may_be_copied_again() -> None:
    body = os.urandom(5000)
    pieces = Pieces(10_000_000, copy_first=False, connections=2)
    a = _asked(pieces)
    copy = _asked(pieces, 0.3)
    pieces.give_back(copy[2])
    again = _asked(pieces, 0.6)
    assert again[:2] == a[:2]
    assert again[2] not in (a[2], copy[2])
    _answer(pieces, a, body)
    _done(pieces, body)


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
    pieces = Pieces(1_000_000, copy_first=False, connections=1)
    _answer(pieces, _asked(pieces), body)
    start, end, ticket = _asked(pieces)
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
    pieces = Pieces(1_000_000, copy_first=False, connections=1)
    with pytest.raises(PiecesBroken, match="past the end"):
        pieces.past_end(_asked(pieces)[2], 5 * FIRST_PIECE_BYTES)


def test_a_block_past_a_piece_s_end_is_dropped() -> None:
    body = os.urandom(FIRST_PIECE_BYTES + 10)
    pieces = Pieces(1_000_000, copy_first=False, connections=1)
    a = _asked(pieces)
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


@pytest.mark.parametrize("header", ["bytes=0-", "bytes=-5", "bytes=0-0"])
def test_no_range_of_an_empty_body_is_satisfiable(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        byte_range(header, 0)
