"""The client side of the server's stream route: one request per connection, chunks named as
they are needed.

A `ChunkStream` sends chunk names in its request body while the frames of the
names sent earlier come back, so a connection never idles between batches
(no request round trip, no restart from idle) and the sync engine decides which
connection fetches a chunk only a chunk or two before it is needed: all
connections finish within about a chunk of each other.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import aiohttp

from netopt.dataplane import trace
from netopt.dataplane.chunkio import (
    FRAME_HEADER,
    STREAM_CODECS,
    Codec,
    RawChunk,
    max_frame_bytes,
    parse_frame_header,
)
from netopt.dataplane.streamctx import (
    BUNDLE_HEAD,
    BUNDLE_MAX_BYTES,
    BUNDLE_MAX_CHUNKS,
    CONTEXT_MAX_CHUNK_BYTES,
    ContextDecoder,
    ContextError,
    fits_bundle,
)
from netopt.errors import NetworkError, PeerUnreachableError, ProtocolError, TlsError
from netopt.tlsconf import data_scheme, disconnect_hint, explain_tls_failure

__all__ = [
    "VERSION_HEADER",
    "ChunkStream",
    "HttpChunkStream",
    "StreamingSource",
    "end_frame",
    "fail_reads_on_close",
    "map_errors",
    "parse_end_frame",
    "read_frame",
]

VERSION_HEADER = "X-Netopt-Version"
"""The header of a chunk part's response naming the dataset version current after the
part was read: for a part what `end_frame` is for a stream."""

END_MARK = b"NETOPT-END "
_END_FRAME = re.compile(rb"NETOPT-END ([0-9a-f]{64})\n")


def end_frame(manifest_id: str) -> bytes:
    """What a server's stream response ends with once the client's names ended: the
    dataset version current *after* every chunk of the stream was read. A client that
    does not know it discards it with the rest of the response's end."""
    return END_MARK + manifest_id.encode("ascii") + b"\n"


def parse_end_frame(tail: bytes) -> str | None:
    """The version an end frame names; None for anything else (an older server)."""
    match = _END_FRAME.fullmatch(tail)
    return match[1].decode("ascii") if match else None


class ChunkStream(Protocol):
    """Chunks asked for one by one over one connection; frames come back in order."""

    def ask(self, chunk_id: str, length_bytes: int) -> None:
        """Name the next chunk to send, ``length_bytes`` long (returns at once)."""
        ...

    def end(self) -> None:
        """Name nothing more: the server ends its response after the frames asked for
        (returns at once; idempotent). `ask` after it is an error."""
        ...

    async def next(self, chunk_id: str, length_bytes: int) -> RawChunk:
        """The frame of the oldest chunk asked for and not yet read (``chunk_id``).

        Unverified. NetworkError when the stream breaks, ProtocolError for a frame
        that is not the one expected.
        """
        ...

    async def aclose(self, *, complete: bool = True) -> None:
        """End the request. With ``complete`` (every frame asked for was read) the
        connection goes back to the pool; otherwise it is dropped."""
        ...


class StreamingSource(Protocol):
    """A `ChunkSource` that can also open chunk streams."""

    def open_stream(self) -> ChunkStream:
        """A new stream (its connection opens on the first `ChunkStream.next`)."""
        ...


ReadExactly = Callable[[aiohttp.ClientResponse, int], Awaitable[bytes]]
CheckStatus = Callable[[aiohttp.ClientResponse, str], Awaitable[None]]


class HttpChunkStream:
    """`ChunkStream` over ``POST .../stream``: a chunked request body of names, frames back."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        params: dict[str, str],
        where: str,
        unreachable: str,
        check_status: CheckStatus,
        read_exactly: ReadExactly,
        count_buffered: Callable[[int], None] | None = None,
        answer_timeout_s: float | None = None,
    ) -> None:
        self._session = session
        self._answer_timeout_s = answer_timeout_s
        """The longest wait for the answer's headers once the request is sent (its
        connect included); None: the session's timeouts only."""
        self._url = url
        self._params = params
        self._where = where
        self._unreachable = unreachable
        self._check_status = check_status
        self._read_exactly = read_exactly
        self._names: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._ctx: Any = None
        self._resp: aiohttp.ClientResponse | None = None
        self._ended = False
        self._broken = False
        self._context = ContextDecoder() if params.get("ctx") == "1" else None
        self._bundles = self._context is not None and params.get("bundle") == "1"
        self._asked: deque[tuple[str, int]] = deque()
        """Names and lengths asked for whose frames have not been read, in order: what a
        bundle's chunks are (the server only says how many)."""
        self._unpacked: deque[tuple[str, RawChunk]] = deque()
        """Chunks of a bundle decoded and not yet handed out (all verified)."""
        self._count_buffered = count_buffered
        self._carry = b""
        self._carry_at = 0
        """Bytes taken off the response by `next_buffered` and not yet consumed (from
        ``_carry_at`` on): the next frames, whole or in part."""
        self.frames_read = 0
        """Frames read whole off this stream."""
        self.end_late_s: float | None = None
        """After this long waiting for its end frame, a closing stream asks for a stand-in
        (`end_is_late`); None: it waits `END_WAIT_S` for the frame."""
        self.last_frame_s = 0.0
        """When the last of them was handed out (``time.monotonic``; 0.0: none yet): the
        server had read it before then."""
        self.failed = False
        """A read failed on the network (the link or the server broke the stream), as
        opposed to a stream the client cut or ended."""
        self.end_version: str | None = None
        """The version the server's end frame named (a stream closed complete); else None."""
        self._pulled: list[bytes] = []
        self.pull_limit_bytes = 0
        """The most bytes `pull` holds (it may be raised while `pull` runs)."""
        self.pulled_bytes = 0
        """Bytes `pull` read off the answer ahead of any `next` (a lead's, before its names
        are known): they become the carry when `adopt` names them."""
        self.lead_chunks = 0
        """Chunks `adopt` named: the stream's first frames, asked for by the lead."""
        self._watch_later = False

    async def _body(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._names.get()
            parts: list[bytes] = []
            while item is not None:
                parts.append(item)
                if self._names.empty():
                    break
                item = self._names.get_nowait()
            if parts:
                yield b"".join(parts)
            if item is None:
                return

    def ask(self, chunk_id: str, length_bytes: int) -> None:
        self._put_name(chunk_id, length_bytes, chunk_id.encode("ascii") + b"\n")

    def _put_name(self, chunk_id: str, length_bytes: int, line: bytes) -> None:
        if self._ended:
            raise RuntimeError("ask() after the stream ended")
        self._asked.append((chunk_id, length_bytes))
        self._names.put_nowait(line)

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self._names.put_nowait(None)

    async def next(self, chunk_id: str, length_bytes: int) -> RawChunk:
        try:
            unpacked = self._take_unpacked(chunk_id)
            if unpacked is not None:
                return unpacked
            if self._resp is None:
                await self._open()
            assert self._resp is not None
            bound = self._bundle_bound if self._bundles else None
            raw = await read_frame(
                self._resp, self._read, chunk_id, length_bytes, self._where, bound
            )
            if raw.codec == "zstd-bundle":
                raw = await self._unbundle(raw)
            elif raw.codec in STREAM_CODECS:
                raw = await self._decode_in_context(raw, chunk_id, length_bytes)
            self._read_asked(chunk_id)
            self.frames_read += 1
            return raw
        except (asyncio.IncompleteReadError, aiohttp.ClientError, TimeoutError) as exc:
            self._broken = self.failed = True
            raise map_errors(exc, self._where, self._unreachable) from exc
        except BaseException:
            self._broken = True
            raise

    @property
    def answered(self) -> bool:
        """The answer's status line and headers are in (and were a success)."""
        return self._resp is not None and not self._broken

    async def _open(self) -> None:
        """Send the request (its body: the names as they are asked) and take the answer's
        status line and headers."""
        trace.mark("first_request")
        # A lead's request names its chunks in its query and its body is empty until the
        # manifest is in; aiohttp holds a request's headers back until its body's first
        # bytes, so a lead asks for "100 Continue": its headers then go out at once.
        self._ctx = self._session.post(
            self._url, params=self._params, data=self._body(), expect100="lead" in self._params
        )
        async with asyncio.timeout(self._answer_timeout_s):
            self._resp = await self._ctx.__aenter__()
        trace.mark("first_answer")  # the first stream's status line and headers
        fail_reads_on_close(self._resp)
        await self._check_status(self._resp, self._where)

    async def pull(self) -> bool:
        """Open the stream and read its answer into memory, unparsed, until
        `pull_limit_bytes` are held (then True: another call may read on, once the limit
        is raised) or it ends (False): a lead stream (its request names chunks by their
        place in a version, `netopt.dataplane.leadplan`) before its names are known.
        `adopt` hands what was read to `next`. Raises what `next` raises for the request
        and its reads; safe to cancel (nothing read is lost)."""
        try:
            if self._resp is None:
                await self._open()
            assert self._resp is not None
            # Nothing comes once the lead is in, until the manifest names its chunks and
            # more are asked for: that is no stall.
            self._hold_stalls(self._resp)
            while self.pulled_bytes < self.pull_limit_bytes:
                more = await self._resp.content.readany()
                if not more:
                    return False
                self._pulled.append(more)
                self.pulled_bytes += len(more)
            return True
        except (asyncio.IncompleteReadError, aiohttp.ClientError, TimeoutError) as exc:
            self._broken = self.failed = True
            raise map_errors(exc, self._where, self._unreachable) from exc

    def adopt(self, names: Sequence[tuple[str, int]]) -> None:
        """The chunks (names and lengths) the request's lead stands for, now known, in
        order: the frames `pull` read, and those still to come, are theirs first. Before
        anything is asked on the stream."""
        if self._asked or self.frames_read:
            raise RuntimeError("adopt() after the stream was asked for chunks")
        self._asked.extend(names)
        self.lead_chunks = len(names)
        self._carry, self._carry_at = b"".join(self._pulled), 0
        self._pulled = []
        self._watch_later = True

    def _hold_stalls(self, resp: aiohttp.ClientResponse) -> None:
        """No read of ``resp`` times out from now on (see `pull`); here: nothing to do
        (a source that arms stall detection overrides this)."""

    def _watch_again(self, resp: aiohttp.ClientResponse) -> None:
        """Arm stall detection on ``resp`` again (see `adopt`); here: nothing to do."""

    def _reading_on(self, resp: aiohttp.ClientResponse) -> None:
        """This stream reads ``resp`` itself (not what `pull` held): after `adopt`, stall
        detection comes back now. Armed at `adopt`, its clock would run while the sync
        works through the frames held, with ``resp`` paused (its buffer full): no byte
        would come, and the stream would be taken for stalled."""
        if self._watch_later:
            self._watch_later = False
            self._watch_again(resp)

    async def _read(self, resp: aiohttp.ClientResponse, n_bytes: int) -> bytes:
        """``n_bytes`` of the response: what `next_buffered` took off it first, then the
        source's bounded read."""
        left = len(self._carry) - self._carry_at
        if not left:
            self._reading_on(resp)
            return await self._read_exactly(resp, n_bytes)
        at = self._carry_at
        if left >= n_bytes:
            self._carry_at = at + n_bytes
            self._consumed(n_bytes)
            return self._carry[at : at + n_bytes]
        head = self._carry[at:]
        self._carry, self._carry_at = b"", 0
        self._consumed(left)
        self._reading_on(resp)
        return head + await self._read_exactly(resp, n_bytes - left)

    def _consumed(self, n_bytes: int) -> None:
        if self._count_buffered is not None:
            self._count_buffered(n_bytes)

    def _take_unpacked(self, chunk_id: str) -> RawChunk | None:
        """The next chunk of a bundle read already, which must be ``chunk_id``; None when
        there is none."""
        if not self._unpacked:
            return None
        got_id, raw = self._unpacked.popleft()
        if got_id != chunk_id:
            raise RuntimeError(f"frames read out of order: {chunk_id[:16]} before {got_id[:16]}")
        self._read_asked(chunk_id)
        self.frames_read += 1
        return raw

    def _read_asked(self, chunk_id: str) -> None:
        """``chunk_id``, the oldest name asked for, has been handed out."""
        if not self._asked or self._asked[0][0] != chunk_id:
            raise RuntimeError(f"chunk {chunk_id[:16]} read before it was asked for, or twice")
        self._asked.popleft()
        self.last_frame_s = time.monotonic()

    def _bundle_chunks(self, count: int) -> list[tuple[str, int]]:
        """The ``count`` chunks a bundle starting at the oldest name asked for carries;
        ContextError (a bad copy of the first, the end of the stream) for a count this
        stream cannot have been sent."""
        if not 2 <= count <= min(BUNDLE_MAX_CHUNKS, len(self._asked)):
            raise ContextError(
                f"{self._where}: a bundle of {count} chunks where {len(self._asked)} were "
                f"asked for (at most {BUNDLE_MAX_CHUNKS})"
            )
        chunks = [self._asked[i] for i in range(count)]
        bundle_bytes = 0
        for index, (_, length) in enumerate(chunks):
            # The rule the server bundles by: a few hundred KiB decoded at most.
            if not fits_bundle(bundle_bytes, index, length):
                raise ContextError(
                    f"{self._where}: a bundle of {count} chunks that may not share one "
                    f"(at most {BUNDLE_MAX_BYTES} bytes of chunks under "
                    f"{CONTEXT_MAX_CHUNK_BYTES} bytes each)"
                )
            bundle_bytes += length
        return chunks

    def _bundle_head(self, payload: bytes) -> tuple[list[tuple[str, int]], bool]:
        """A bundle's chunks and whether it starts a context, from its payload's head."""
        count, new = BUNDLE_HEAD.unpack_from(payload)
        if new not in (0, 1):
            raise ProtocolError(f"{self._where}: a bundle head with a bad flag {new}")
        return self._bundle_chunks(count), bool(new)

    def _bundle_bound(self, count: int) -> int:
        """The largest payload a bundle of ``count`` chunks may have (head included)."""
        chunks = self._bundle_chunks(count)
        return BUNDLE_HEAD.size + max_frame_bytes(sum(length for _, length in chunks))

    async def _unbundle(self, raw: RawChunk) -> RawChunk:
        """A ``zstd-bundle`` frame decoded in the stream's context (on the loop when small,
        see `_INLINE_DECODE_BYTES`): its first chunk; the others wait in ``_unpacked``."""
        chunks, new = self._bundle_head(raw.payload)
        if sum(length for _, length in chunks) <= _INLINE_DECODE_BYTES:
            return self._unbundle_now(raw, chunks, new)
        pieces = await asyncio.to_thread(self._decode_bundle, raw, chunks, new)
        return self._unpack(chunks, pieces, raw.wire_bytes)

    def _unbundle_now(self, raw: RawChunk, chunks: list[tuple[str, int]], new: bool) -> RawChunk:
        """`_unbundle` of a small bundle, on the loop."""
        return self._unpack(chunks, self._decode_bundle(raw, chunks, new), raw.wire_bytes)

    def _decode_bundle(
        self, raw: RawChunk, chunks: list[tuple[str, int]], new: bool
    ) -> list[bytes]:
        """The verified chunks of a bundle. Only a stream that asked for bundles gets one
        (`read_frame` and `_frame_from_carry` refuse them else), so it has a context."""
        assert self._context is not None
        body = memoryview(raw.payload)[BUNDLE_HEAD.size :]
        return self._context.decode_bundle(body, new, chunks)

    def _unpack(
        self, chunks: list[tuple[str, int]], pieces: list[bytes], wire_bytes: int
    ) -> RawChunk:
        """The first of a bundle's verified ``pieces``; the rest queued. Each is charged
        its share of the bundle's ``wire_bytes`` by length (the first also the rest)."""
        total_bytes = max(1, sum(length for _, length in chunks))
        shares = [wire_bytes * length // total_bytes for _, length in chunks]
        shares[0] += wire_bytes - sum(shares)
        for (chunk_id, _), piece, share in zip(chunks[1:], pieces[1:], shares[1:], strict=True):
            self._unpacked.append((chunk_id, RawChunk(piece, "identity", share, verified=True)))
        return RawChunk(pieces[0], "identity", shares[0], verified=True)

    def next_buffered(self, chunk_id: str, length_bytes: int) -> RawChunk | None:
        """Like `next`, without waiting: the frame of ``chunk_id`` when all of it has
        arrived already, else None (nothing consumed). A tree of small chunks then reads
        the frames that came in together in one loop turn (`netopt.dataplane.streamwork`).

        Only for a chunk of at most `_INLINE_DECODE_BYTES` (a larger one decodes on a
        thread: `next`) on a stream opened with ``count_buffered`` (the source has no
        rate limit to charge the bytes to); ProtocolError and a stream's failures as
        `next`."""
        resp = self._resp
        if (
            resp is None
            or self._count_buffered is None
            or self._broken
            or length_bytes > _INLINE_DECODE_BYTES
        ):
            return None
        try:
            unpacked = self._take_unpacked(chunk_id)
            if unpacked is not None:
                return unpacked
            return self._frame_from_carry(resp, chunk_id, length_bytes)
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._broken = self.failed = True
            raise map_errors(exc, self._where, self._unreachable) from exc
        except BaseException:
            self._broken = True
            raise

    def _frame_from_carry(
        self, resp: aiohttp.ClientResponse, chunk_id: str, length_bytes: int
    ) -> RawChunk | None:
        header_bytes = FRAME_HEADER.size
        if len(self._carry) - self._carry_at < header_bytes and not self._take_arrived(resp):
            return None
        if len(self._carry) - self._carry_at < header_bytes:
            return None
        at = self._carry_at
        header = self._carry[at : at + header_bytes]
        codec, payload_bytes = _check_header(header, chunk_id, length_bytes, self._where)
        if codec == "zstd-bundle":
            if not self._bundles or payload_bytes < BUNDLE_HEAD.size:
                raise ProtocolError(f"{self._where}: unexpected frame for {chunk_id[:16]}")
            head_end = at + header_bytes + BUNDLE_HEAD.size
            if head_end > len(self._carry):
                return None  # the next turn's read brings it
            count, _ = BUNDLE_HEAD.unpack_from(self._carry, at + header_bytes)
            if payload_bytes > self._bundle_bound(count):
                raise ProtocolError(f"{self._where}: unexpected frame for {chunk_id[:16]}")
            if sum(length for _, length in self._bundle_chunks(count)) > _INLINE_DECODE_BYTES:
                return None  # decoded on a thread: `next`
        elif payload_bytes > max_frame_bytes(length_bytes):
            raise ProtocolError(f"{self._where}: unexpected frame for {chunk_id[:16]}")
        end = at + header_bytes + payload_bytes
        if end > len(self._carry):
            if not self._take_arrived(resp):
                return None
            at, end = 0, header_bytes + payload_bytes
            if end > len(self._carry):
                return None
        payload = self._carry[at + header_bytes : end]
        self._carry_at = end
        self._consumed(end - at)
        trace.mark_last("last_byte")
        raw = RawChunk(payload, codec, end - at)
        if codec == "zstd-bundle":  # at most _INLINE_DECODE_BYTES (checked above)
            raw = self._unbundle_now(raw, *self._bundle_head(raw.payload))
        elif codec in STREAM_CODECS:
            raw = self._decode_inline(raw, chunk_id, length_bytes)
        self._read_asked(chunk_id)
        self.frames_read += 1
        return raw

    def _take_arrived(self, resp: aiohttp.ClientResponse) -> bool:
        """Append what the response holds now to the carry (at most aiohttp's buffer:
        its flow control pauses the socket beyond that); False when nothing was there."""
        self._reading_on(resp)
        more = resp.content.read_nowait(-1)
        if not more:
            return False
        self._carry = self._carry[self._carry_at :] + more
        self._carry_at = 0
        return True

    def _decode_inline(self, raw: RawChunk, chunk_id: str, length_bytes: int) -> RawChunk:
        """A small stream-context frame decoded on the loop (see `_decode_in_context`)."""
        if self._context is None:
            raise ProtocolError(f"{self._where}: a stream-context frame on a stream without one")
        data = self._context.decode(
            raw.payload, raw.codec == "zstd-stream-new", chunk_id, length_bytes
        )
        return RawChunk(data, "identity", raw.wire_bytes, verified=True)

    async def _decode_in_context(self, raw: RawChunk, chunk_id: str, length_bytes: int) -> RawChunk:
        """A stream-context frame decoded (in the stream's order) and verified: an
        ``identity`` chunk. ContextError (a bad copy; the stream is cut) when it does not
        decode to the chunk; ProtocolError when this stream never asked for a context."""
        if self._context is None:
            raise ProtocolError(f"{self._where}: a stream-context frame on a stream without one")
        if length_bytes <= _INLINE_DECODE_BYTES:
            # Microseconds of work: a thread hand-off would cost more (trees of small files).
            return self._decode_inline(raw, chunk_id, length_bytes)
        new = raw.codec == "zstd-stream-new"
        data = await asyncio.to_thread(
            self._context.decode, raw.payload, new, chunk_id, length_bytes
        )
        return RawChunk(data, "identity", raw.wire_bytes, verified=True)

    def end_is_late(self) -> asyncio.Future[str | None] | None:
        """Called once when this stream's end frame is `end_late_s` late: a version check
        asked after its last frame, to stand in for the end frame (see `_end_of`); None
        (here) where none can be asked."""
        return None

    async def _end_of(self, resp: aiohttp.ClientResponse) -> bytes | None:
        """The rest of ``resp`` after its last frame (`_drain`; its end frame), read within
        `END_WAIT_S`; None when it was longer than `_DRAIN_MAX_BYTES`, or when a version
        check asked after the last frame (`end_is_late`, once the end is `end_late_s`
        late) answered first: the end frame is then not needed, and the stream is dropped.
        A lost packet held the end of a stream whose every frame was in for 1.76 s on the
        lab's 140 ms link (a retransmission timeout backed off), and the sync with it."""
        draining = asyncio.ensure_future(_drain(resp, _DRAIN_MAX_BYTES))
        try:
            async with asyncio.timeout(END_WAIT_S):
                if self.end_late_s is not None:
                    await asyncio.wait({draining}, timeout=self.end_late_s)
                    stand_in = None if draining.done() else self.end_is_late()
                    if stand_in is not None and await _answered_first(stand_in, draining):
                        trace.count("stream_ends_stood_in")
                        self._broken = True  # its end is not read: the connection is dropped
                        return None
                return await draining
        finally:
            if not draining.done():
                draining.cancel()
            await asyncio.gather(draining, return_exceptions=True)

    async def aclose(self, *, complete: bool = True) -> None:
        self.end()
        if not complete:
            self._broken = True
        resp, ctx = self._resp, self._ctx
        self._resp = self._ctx = None
        if resp is None:
            return
        try:
            if not self._broken:
                # Read the end of the response so the connection goes back to the pool:
                # a few bytes at most (the frames asked for were all read).
                with trace.timed("stream_end_wait"):
                    tail = await self._end_of(resp)
                if tail is not None:  # the end frame may be in the carry already
                    tail = self._carry[self._carry_at :] + tail
                self.end_version = parse_end_frame(tail) if tail is not None else None
        except (aiohttp.ClientError, TimeoutError, asyncio.IncompleteReadError):
            resp.close()
        finally:
            if self._broken:
                resp.close()
            try:
                # Waits for aiohttp's task writing the names: it fails when the connection
                # was cut under the body's end (see `fail_reads_on_close`), a break the
                # reads have seen already or that came after the response's end.
                await ctx.__aexit__(None, None, None)
            except (aiohttp.ClientError, OSError):
                resp.close()


async def _answered_first(check: asyncio.Future[str | None], other: asyncio.Future[Any]) -> bool:
    """Whether ``check`` named a version (not None) before ``other`` ended."""
    await asyncio.wait({check, other}, return_when=asyncio.FIRST_COMPLETED)
    if other.done() or check.cancelled() or check.exception() is not None:
        return False
    return check.result() is not None


_DRAIN_MAX_BYTES = 64 * 1024
END_WAIT_S = 5.0
"""The longest a closing stream waits for the rest of its response (its end frame)."""
_INLINE_DECODE_BYTES = 64 * 1024
"""Stream-context chunks up to this long are decoded on the loop, longer ones in a thread."""


def fail_reads_on_close(resp: aiohttp.ClientResponse) -> None:
    """Make a close of ``resp``'s connection fail ``resp``'s reads, the one waiting and
    every later one, unless the whole body had already arrived.

    aiohttp writes a request body in a task of its own. A stream's body ends while its
    response is still read (`HttpChunkStream.end`); when the peer's FIN was read in the
    same loop turn, that task's last write (the chunked end) finds the transport
    closing and raises, and aiohttp's task closes the connection itself
    (``Connection.close``): the protocol forgets the response's payload and drops its
    stall timer before the connection-lost callback, which would have failed that
    payload, runs. The payload then gets neither data nor an error, and a read of it
    waits forever. A connection's release callbacks run on that close (and on every
    other close or release), so this one fails the payload first.
    """
    conn = resp.connection
    content = resp.content

    def closed() -> None:
        if not content.is_eof() and content.exception() is None:
            content.set_exception(
                aiohttp.ClientConnectionError("the connection closed under the response")
            )

    if conn is None or conn.protocol is None:
        closed()  # already let go of before this response was handed over
        return
    conn.add_callback(closed)


async def _drain(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes | None:
    """Read ``resp`` to its end and return what was left; a response that goes on past
    ``max_bytes`` is closed instead (its connection is not reused) and None returned."""
    left = max_bytes
    parts: list[bytes] = []
    while piece := await resp.content.read(min(left, 16 * 1024) or 1):
        parts.append(piece)
        left -= len(piece)
        if left <= 0:
            resp.close()
            return None
    return b"".join(parts)


async def read_frame(
    resp: aiohttp.ClientResponse,
    read_exactly: Callable[[aiohttp.ClientResponse, int], Awaitable[bytes]],
    chunk_id: str,
    length_bytes: int,
    where: str,
    bundle_bound: Callable[[int], int] | None = None,
) -> RawChunk:
    """Read the next frame of a batch or stream response, which must be ``chunk_id``'s
    (``length_bytes`` long before compression) or, with ``bundle_bound`` (a stream asked
    for bundles), a bundle starting with it: ``bundle_bound(count)`` is the largest
    payload one of ``count`` chunks may have. Raises ProtocolError for a bad or
    unexpected frame, and what ``read_exactly`` raises."""
    header = await read_exactly(resp, FRAME_HEADER.size)
    trace.mark("first_byte")
    codec, payload_bytes = _check_header(header, chunk_id, length_bytes, where)
    if codec == "zstd-bundle":
        if bundle_bound is None or payload_bytes < BUNDLE_HEAD.size:
            raise ProtocolError(f"{where}: unexpected frame for {chunk_id[:16]}")
        head = await read_exactly(resp, BUNDLE_HEAD.size)
        if payload_bytes > bundle_bound(BUNDLE_HEAD.unpack(head)[0]):
            raise ProtocolError(f"{where}: unexpected frame for {chunk_id[:16]}")
        payload = head + await read_exactly(resp, payload_bytes - BUNDLE_HEAD.size)
    elif payload_bytes > max_frame_bytes(length_bytes):
        raise ProtocolError(f"{where}: unexpected frame for {chunk_id[:16]}")
    else:
        payload = await read_exactly(resp, payload_bytes)
    trace.mark_last("last_byte")
    return RawChunk(payload, codec, payload_bytes + FRAME_HEADER.size)


def _check_header(header: bytes, chunk_id: str, length_bytes: int, where: str) -> tuple[Codec, int]:
    """(codec, payload length) of a frame header that must name ``chunk_id``."""
    try:
        got_id, codec, payload_bytes = parse_frame_header(header)
    except ValueError as exc:
        raise ProtocolError(f"{where}: bad frame header: {exc}") from exc
    if got_id != chunk_id:
        raise ProtocolError(f"{where}: unexpected frame for {chunk_id[:16]}")
    return codec, payload_bytes


def map_errors(exc: BaseException, where: str, unreachable: str) -> BaseException:
    """aiohttp's and asyncio's exceptions as netopt's (others unchanged)."""
    tls_cause = explain_tls_failure(exc)
    if tls_cause is not None:
        return TlsError(f"{unreachable}: {tls_cause}")
    if isinstance(exc, asyncio.IncompleteReadError):
        return NetworkError(f"{where}: the stream ended early")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return PeerUnreachableError(f"{unreachable}: {exc}")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        # Retried like any disconnect (a restarting server); the first request of a
        # source stops at a sure TLS refusal (HttpChunkSource._get).
        hint, _ = disconnect_hint(f"{data_scheme()}://")
        return NetworkError(f"{where}: the server closed the connection unanswered ({hint})")
    if isinstance(exc, aiohttp.ClientError | TimeoutError):
        return NetworkError(f"{where}: {type(exc).__name__}: {exc}")
    return exc
