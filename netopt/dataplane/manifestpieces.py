"""One response body fetched as byte ranges over several connections at once.

On a long link a large manifest is held back by one connection's slow start, not by
the link: on the lab's 140 ms, 80 Mbit/s, 1 % loss link a 100k-file tree's manifest
(4.8 MB of zstd) took 2.4-3.0 s over one connection, a 7,947-file tree's (415 KB)
~1.3 s. Asked as pieces over ``n`` connections, each in its own slow start, the first
round trip carries ``n`` pieces.

The rule, as aria2c splits a download:

- The server's total is unknown until its first answer, and so is whether it serves
  ranges at all: only the first piece (`FIRST_PIECE_BYTES`: a fresh connection's
  first flight carries it with its headers) is asked, on two connections at once,
  and the first copy to arrive is kept. A small manifest is that piece alone (clipped
  at the total), and on a lossy link a request that loses a packet waits out a
  retransmission timeout (on the lab's 140 ms, 1 % loss link a lone first piece came
  two round trips late in about one sync in five). A server that ignores ranges
  answers those two with the whole body, as before pieces: asking every connection
  blind would have made it build and send the body 16 times.
- Once the total is known, the rest is shared out evenly: each connection's next
  piece is an equal share (`Pieces.share_bytes`), one response in which its window
  keeps growing, not a round trip per piece.
- A connection with nothing left to ask takes over the second half of what remains
  of the piece with the most bytes still to come, if that is at least
  `MIN_STEAL_BYTES`; else all that remains of a piece whose owner read nothing for
  a while (a lost packet on a lossy link stalls a piece a retransmission timeout,
  ~0.4 s at 140 ms). The owner stops reading at the new end (and drops its
  connection, whose answer it did not read to the end).

Every piece must carry the same total, entity tag and content coding, and exactly the
bytes it names; anything else ends the whole fetch (`PiecesBroken`): the caller then
asks for the body the ordinary way, which reports what is wrong. Not thread-safe: the
caller holds one lock around every call. Stdlib only: `netopt.dataplane.prefetch`
runs this in its threads before aiohttp is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "COPIES_MAX",
    "FIRST_PIECE_BYTES",
    "MIN_STEAL_BYTES",
    "WAIT",
    "Pieces",
    "PiecesBroken",
    "Wait",
    "content_range",
    "is_decimal",
    "stalled_after_s",
]

FIRST_PIECE_BYTES = 12 * 1024
"""A first piece: a fresh connection's first flight (10 segments, ~14 KB) carries it
with the response's headers and TLS record overhead."""

COPIES_MAX = 3
"""The most asks of one piece in all (the first, a copy, a copy of that). A server slow
to answer (not a lost packet) looks stalled too: each copy costs it the whole work
again (a server that builds a large manifest per request, and ignores ranges, was
asked 16 times before this bound)."""

STALL_RTTS = 2.0
STALL_MIN_S = 0.2
STALL_UNKNOWN_RTT_S = 0.1
"""`stalled_after_s`: a lost packet costs a piece's owner a retransmission timeout
(~0.4 s at 140 ms; Linux's least is 0.2 s), fast retransmit about one round trip."""

MIN_STEAL_BYTES = 16 * 1024
"""The least a connection takes over from another's piece (half its remaining bytes)."""


class PiecesBroken(ValueError):
    """The pieces do not make one body: the fetch ends, the body is asked for whole."""


def content_range(header: str | None) -> tuple[int, int, int] | tuple[None, None, int]:
    """``(start, end, total)`` of a ``Content-Range: bytes A-B/N`` value (``end`` is
    ``B + 1``), or ``(None, None, N)`` for ``bytes */N`` (a 416's). PiecesBroken for
    anything else, a total unknown (``*``), or a range that does not fit its total."""
    if header is None:
        raise PiecesBroken("a ranged answer without Content-Range")
    unit, _, rest = header.strip().partition(" ")
    span, slash, total_text = rest.strip().partition("/")
    if unit.lower() != "bytes" or not slash or not is_decimal(total_text):
        raise PiecesBroken(f"Content-Range {header[:80]!r} is not bytes A-B/N")
    total = int(total_text)
    if span == "*":
        return None, None, total
    first, dash, last = span.partition("-")
    if not dash or not is_decimal(first) or not is_decimal(last):
        raise PiecesBroken(f"Content-Range {header[:80]!r} is not bytes A-B/N")
    start, end = int(first), int(last) + 1
    if not start < end <= total:
        raise PiecesBroken(f"Content-Range {header[:80]!r} does not fit its total")
    return start, end, total


def is_decimal(text: str) -> bool:
    """1 to 19 ASCII digits (a byte position or count in a range header: never a huge
    integer, never a non-ASCII digit that ``int`` would take)."""
    return 0 < len(text) <= 19 and text.isascii() and text.isdigit()


def stalled_after_s(rtt_s: float | None) -> float:
    """How long a piece's owner reads nothing before an idle connection asks for a copy
    of its rest: `STALL_RTTS` round trips (`STALL_UNKNOWN_RTT_S` before one is known),
    at least `STALL_MIN_S`."""
    return max(STALL_MIN_S, STALL_RTTS * (STALL_UNKNOWN_RTT_S if rtt_s is None else rtt_s))


@dataclass
class _Ask:
    start: int
    asked_end: int
    """The end of the range asked for (what the answer's Content-Range names)."""
    end: int
    """Where the owner stops: ``asked_end``, or less once another connection took the
    rest over (or the total clipped it)."""
    moved_at_s: float
    """When the owner last read some of it (or asked for it)."""
    data: bytearray = field(default_factory=bytearray)
    """What its owner has read of it so far."""
    owned: bool = True
    """False once its owner failed: the next `Pieces.next_range` hands it out again."""
    copy_of: int | None = None
    """The ask whose stalled rest this one copies (the first of the two to arrive wins)."""
    copied_by: int | None = None
    """The ask copying this one's rest."""
    generation: int = 0
    """0 for a piece asked first, 1 for a copy of it, 2 for a copy of that..."""

    @property
    def got(self) -> int:
        return len(self.data)

    def alone(self) -> bool:
        """Neither a copy nor copied: it may be split or copied."""
        return self.copy_of is None and self.copied_by is None


class Wait:
    """`Pieces.next_range`'s answer while pieces are coming and none is worth taking over."""


WAIT = Wait()


@dataclass
class Pieces:
    """Which ranges of one body are asked for, held and missing. An ask is known by the
    ticket `next_range` gave it. Times are arguments (``now_s``)."""

    max_total_bytes: int
    connections: int = 1
    copy_first: bool = True
    """Whether the second ask copies the first piece (else it waits for the total)."""
    total_bytes: int | None = None
    etag: str | None = None
    encoding: str | None = None
    held: dict[int, bytes] = field(default_factory=dict)
    """Pieces in hand by start offset."""
    asks: dict[int, _Ask] = field(default_factory=dict)
    """Pieces asked for and not in hand, by ticket."""
    next_start: int = 0
    """Where the bytes not asked for yet begin."""
    share_bytes: int = FIRST_PIECE_BYTES
    """A share: an even part of the bytes past the first piece, once the total is known."""
    held_bytes: int = 0
    steals: int = 0
    """Pieces split for an idle connection."""
    copies: int = 0
    """Copies asked of stalled pieces (the first piece's second ask is not counted)."""
    _tickets: int = 0

    def _ask(
        self, start: int, end: int, now_s: float, copy_of: int | None = None
    ) -> tuple[int, int, int]:
        self._tickets += 1
        generation = 0
        if copy_of is not None and copy_of in self.asks:
            self.asks[copy_of].copied_by = self._tickets
            generation = self.asks[copy_of].generation + 1
        self.asks[self._tickets] = _Ask(
            start, end, end, now_s, copy_of=copy_of, generation=generation
        )
        return start, end, self._tickets

    def next_range(
        self, now_s: float, stalled_after_s: float
    ) -> tuple[int, int, int] | Wait | None:
        """What a connection asks for next, as ``(start, end, ticket)``: a piece whose
        owner failed; else, until the total is known, the first piece (twice); else the
        next share of the bytes not asked for; else the second
        half of what remains of the piece with the most still to come (its owner stops
        at that half), if that is `MIN_STEAL_BYTES` or more; else a copy of what remains
        of a piece whose owner read nothing for ``stalled_after_s`` (the first of the
        two to arrive is kept; a copy that stalls too may be copied in turn). `WAIT`
        while pieces are coming and none of that applies; None when nothing is left to
        ask for."""
        for ticket, ask in self.asks.items():
            if not ask.owned:
                del self.asks[ticket]
                return self._ask(ask.start, ask.end, now_s)
        total = self.total_bytes
        if total is None and self._tickets == 0:
            self.next_start = FIRST_PIECE_BYTES
            return self._ask(0, FIRST_PIECE_BYTES, now_s)
        if total is None and self.copy_first and self._tickets == 1 and 1 in self.asks:
            # The second ask copies the first piece: a small manifest is that piece alone
            # (the info's copies are for the same reason, `prefetch.META_COPIES`).
            return self._ask(0, FIRST_PIECE_BYTES, now_s, copy_of=1)
        if total is not None and self.next_start < total:
            start = self.next_start
            end = min(start + self.share_bytes, total)
            self.next_start = end
            return self._ask(start, end, now_s)
        if not self.asks:
            return None if total is not None else WAIT
        alone = [(a.end - a.start - a.got, t) for t, a in self.asks.items() if a.alone()]
        left, ticket = max(alone, default=(0, 0))
        if left >= 2 * MIN_STEAL_BYTES:
            ask = self.asks[ticket]
            cut = ask.start + ask.got + left // 2
            end, ask.end = ask.end, cut
            self.steals += 1
            return self._ask(cut, end, now_s)
        stalled = [
            (a.moved_at_s, t)
            for t, a in self.asks.items()
            if now_s - a.moved_at_s >= stalled_after_s
            and a.copied_by is None
            and a.generation < COPIES_MAX - 1
            and a.end > a.start + a.got
        ]
        if not stalled:
            return WAIT
        ticket = min(stalled)[1]
        ask = self.asks[ticket]
        self.copies += 1
        return self._ask(ask.start + ask.got, ask.end, now_s, ticket)

    def give_back(self, ticket: int) -> None:
        """The owner of ask ``ticket`` failed: what it read is kept, and the rest is
        handed out again by the next `next_range`, before new bytes (a failed copy is
        dropped with its own copies: its original goes on)."""
        ask = self.asks.get(ticket)
        if ask is None:
            return
        if ask.copy_of is not None:
            # Dropped with the copies of it (each starts where the one before had read
            # to: without it, they would not join up with its original).
            self._drop(ticket)
            original = self.asks.get(ask.copy_of)
            if original is not None:
                original.copied_by = None
            return
        if ask.copied_by is not None and ask.copied_by in self.asks:
            copy = self.asks[ask.copied_by]
            copy.copy_of = None  # it fetches the rest on its own now
            self._end_at(ticket, copy.start)
            if ticket not in self.asks:
                return
        rest_start, end = ask.start + ask.got, ask.end
        ask.end = rest_start
        self._hold(ticket)
        if rest_start < end:
            self._tickets += 1
            self.asks[self._tickets] = _Ask(rest_start, end, end, float("-inf"), owned=False)

    def _drop(self, ticket: int) -> None:
        """Forget ask ``ticket`` and its copies, and theirs (their owners stop at their
        next block)."""
        dropped = self.asks.pop(ticket, None)
        while dropped is not None and dropped.copied_by is not None:
            dropped = self.asks.pop(dropped.copied_by, None)

    def _end_at(self, ticket: int, end: int) -> None:
        """Ask ``ticket`` now ends at ``end`` (another ask fetches the rest), unlinked
        from its copy; in hand at once if its owner has read that far."""
        ask = self.asks.get(ticket)
        if ask is None:
            return
        ask.end, ask.copied_by = min(ask.end, end), None
        del ask.data[ask.end - ask.start :]
        if ask.got >= ask.end - ask.start:
            self._hold(ticket)  # its owner stops at its next block

    def _hold(self, ticket: int) -> None:
        """Ask ``ticket``'s bytes are all in: keep them; drop its copy, or cut its
        original short where it starts."""
        ask = self.asks[ticket]
        self._drop(ticket)
        if ask.copy_of is not None:
            self._end_at(ask.copy_of, ask.start)
        if ask.end > ask.start:
            self.held[ask.start] = bytes(ask.data)
            self.held_bytes += ask.got

    def answered(
        self,
        ticket: int,
        content_range_header: str | None,
        etag: str | None,
        encoding: str | None,
    ) -> int:
        """Check the headers of the answer to ask ``ticket`` and return how many bytes
        its body holds (the asked range, clipped at the total). PiecesBroken unless it
        names exactly that range of the same body as every other piece."""
        got_start, got_end, total = content_range(content_range_header)
        self._learn(total)
        if not etag:
            raise PiecesBroken("a piece without an entity tag")
        if self.etag is None:
            self.etag, self.encoding = etag, encoding
        elif (etag, encoding) != (self.etag, self.encoding):
            raise PiecesBroken("pieces of two versions of the body (entity tag or coding differ)")
        ask = self.asks.get(ticket)
        if ask is None:
            return 0  # taken over by another connection meanwhile
        if got_start != ask.start or got_end != min(ask.asked_end, total):
            raise PiecesBroken(
                f"an answer with bytes {got_start}-{(got_end or 1) - 1} of {total} "
                f"to a piece asked at byte {ask.start}"
            )
        return got_end - got_start

    def received(self, ticket: int, block: bytes, now_s: float) -> bool:
        """Hand in the next ``block`` the owner of ask ``ticket`` read of its answer;
        False once the owner is to stop: the piece is in hand (bytes past where it now
        ends are dropped: another ask fetches them), or another ask took all of it."""
        ask = self.asks.get(ticket)
        if ask is None:
            return False
        ask.data += block[: ask.end - ask.start - ask.got]
        ask.moved_at_s = now_s
        if ask.got < ask.end - ask.start:
            return True
        self._hold(ticket)
        return False

    def past_end(self, ticket: int, total_bytes: int) -> None:
        """Ask ``ticket`` was answered 416: the body has ``total_bytes``."""
        self._learn(total_bytes)
        ask = self.asks.pop(ticket, None)
        if ask is not None and ask.start < total_bytes:
            raise PiecesBroken(
                f"a piece at byte {ask.start} of {total_bytes} was refused as past the end"
            )

    def _learn(self, total: int) -> None:
        if total > self.max_total_bytes:
            raise PiecesBroken(f"a body of {total} bytes, at most {self.max_total_bytes} expected")
        if self.total_bytes is not None:
            if total != self.total_bytes:
                raise PiecesBroken(f"pieces of a body of {self.total_bytes} and of {total} bytes")
            return
        self.total_bytes = total
        for ticket in [t for t, ask in self.asks.items() if ask.start >= total]:
            del self.asks[ticket]  # past the end (an empty body): answered 416, never with data
        for ask in self.asks.values():
            ask.end = min(ask.end, total)
        self.next_start = min(self.next_start, total)
        left = total - self.next_start
        self.share_bytes = max(FIRST_PIECE_BYTES, -(-left // max(1, self.connections)))

    def done(self) -> bool:
        """Every byte of the body is in hand."""
        return self.total_bytes is not None and self.held_bytes == self.total_bytes

    def body(self) -> bytes:
        """The whole body (once `done`)."""
        if not self.done():
            raise PiecesBroken("the body is not whole yet")
        return b"".join(self.held[start] for start in sorted(self.held))
