"""Start a sync's first round trips while the interpreter is still importing.

``netopt sync netopt://HOST:PORT/NAME`` spends ~0.6 s importing (aiohttp alone ~0.25 s,
most of it loading the CA store for SSL contexts) before it asks for anything; then
the dataset's info and manifest and the data connections' handshakes take about three
round trips. On an 80 ms link that is ~0.85 s before the first chunk byte.

The CLI calls `start` before it imports the sync machinery. Threads (stdlib only: the
blocking socket calls release the GIL while imports run) connect the first data
sockets and fetch the info and the manifest meanwhile: the info as `META_COPIES` copies,
the manifest as byte ranges over `MANIFEST_CONNECTIONS` connections
(`netopt.dataplane.manifestpieces`; a large manifest is held back by one connection's
slow start, not by the link). Later, `take_meta` hands the
answers to `netopt.dataplane.client.fetch_info_and_manifest`, and `take_socket` the
connected sockets to its connection factory. Under TLS (a cluster CA set) the info and
manifest come over TLS, verified with the normal path's client context, and the data
sockets are plain TCP over which the engine runs its TLS handshake (a TLS session cannot
move from a thread's socket into asyncio). Whatever is missing, late or failed is
done the normal way, which also reports any error: a prefetch never decides anything,
and its answers go through the same validation as the normal path's.
"""

from __future__ import annotations

import errno
import json
import socket
import ssl
import struct
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from netopt.dataplane import trace
from netopt.dataplane.limits import (
    MAX_INFO_BYTES,
    MAX_MANIFEST_BYTES,
    check_manifest_shape,
)
from netopt.dataplane.manifestpieces import (
    Pieces,
    PiecesBroken,
    Wait,
    content_range,
    stalled_after_s,
)
from netopt.dataplane.manifestversions import NotModified, if_none_match, not_modified_id
from netopt.dataplane.sockets import try_congestion_control
from netopt.errors import ConfigError, ProtocolError
from netopt.tlsconf import client_context, current_client_tls, is_loopback

if TYPE_CHECKING:
    import http.client

# asyncio and http.client are imported where used: `start` runs before them.

__all__ = [
    "HANDSHAKE_SOURCE",
    "STATS",
    "WARM_CONNECTIONS",
    "MetaAnswer",
    "discard",
    "handshake_rtt_s",
    "late_meta",
    "peek_info",
    "prefetching",
    "sockets_need_tls",
    "start",
    "take_meta",
    "take_socket",
]

HANDSHAKE_SOURCE = "tcp handshake (start-up prefetch)"
_TCP_INFO = getattr(socket, "TCP_INFO", 11)
_TCPI_RTT_OFFSET = 68
"""``tcpi_rtt`` (microseconds) in Linux's ``struct tcp_info``."""

WARM_CONNECTIONS = 32
"""Connections opened during set-up when the stream count is not known yet. A small
sync's chunk is cut into one part per warm connection (`streamwork.parts_per_chunk`), each
in its own slow start: on the 140 ms lab link a 1 MB text dataset (~300 KB of zstd) took
3 round trips over 4 connections (~75 KB each: 14.5 + 29 + 58 KB), 2 over 8, and about
one over 16 (~19 KB each: a fresh window of 10 segments, grown by the TLS handshake's
few, carries it in one flight): request to last byte 0.47-0.5 s over 8, 0.31 s over 16.
Once the connections were opened without a request (`HttpChunkSource.warm_up`), 16 parts
of ~19 KB no longer fit the first window (no answer had grown it): 32 (~9 KB each) took
the sync's median request to last byte from 0.60 and 0.43 s to 0.42 and 0.35 s, and its
median wall clock from 1.28 and 1.07 s to 1.08 and 0.99 s (two interleaved pairs of 12
runs). Each is one more TLS handshake for both ends, during the set-up's wait for the
manifest."""

STATS: Counter[str] = Counter()
"""Process-wide counts: ``meta_used``, ``sockets_used``, ``sockets_discarded``; of
manifests fetched whole as pieces, ``manifest_pieces`` and ``manifest_takeovers``
(pieces another connection took over, `netopt.dataplane.manifestpieces`)."""

TAKE_WAIT_S = 0.3
"""How long `take_meta` waits for answers still in flight before the normal path runs."""

TLS_EXTRA_ROUND_TRIPS = 2
TLS_UNKNOWN_RTT_S = 0.1
TLS_EXTRA_WAIT_MAX_S = 1.0
"""Under TLS `take_meta` waits `TLS_EXTRA_ROUND_TRIPS` more handshake round trips (the
shortest seen, `TLS_UNKNOWN_RTT_S` before any), at most `TLS_EXTRA_WAIT_MAX_S`."""

META_COPIES = 2
"""The info request goes out this many times at once, each copy
on a connection of its own; the first copy whose answer starts is read, the others
close once they see it. A request under TLS is ~8 packets each way on a fresh
connection: on the lab's 1% loss one of the two requests lost one in 6 of 20 syncs and
waited out a retransmission timeout (0.4 s at 140 ms; 1 s for a SYN). Two copies both
losing one is about 20 times rarer."""

MANIFEST_CONNECTIONS = 16
"""Connections the manifest is fetched over as byte ranges (`fetch_pieces`). On the lab's
140 ms, 80 Mbit/s, 1 % loss link, a 100k-file tree's 4.8 MB manifest (four runs each):
one connection 2.37-2.64 s, 8 connections 2.16-2.56 s, 16 2.01-2.32 s, 24 1.93-2.31 s;
a 7,947-file tree's 415 KB one went from ~1.3 s to ~1.0 s (first pieces asked blind on
every connection; as shipped, the first piece twice and then shares: 1.97-2.21 s and
0.93-1.09 s). A small manifest uses two of them (its first piece, asked twice); the
others only connect."""

PIECE_POLL_S = 0.01
"""How often a connection with nothing to ask looks again (a piece may stall)."""

PIECE_READ_BYTES = 64 * 1024
"""A piece is read in blocks of at most this (each noted: another connection may take
over the rest)."""

BODY_WAIT_S = 10.0
"""How long `take_meta` waits, past `TAKE_WAIT_S`, for an answer whose body is arriving
(its 200 headers came): asking again would send the same bytes again over a cold
connection (a large manifest on a long link takes seconds), and the normal path's
hedge would add a third copy. Each read of the body still times out on its own."""


@dataclass(frozen=True)
class MetaAnswer:
    """The prefetched info and manifest documents (unvalidated JSON)."""

    info: Any
    manifest: Any
    rtt_s: float
    """The shortest real round trip the prefetch saw: a TCP handshake of its own (the
    kernel's figure where it has one) or a request's time to its response headers."""
    wire_bytes: int
    rtt_source: str = HANDSHAKE_SOURCE


class _Connected(socket.socket):
    """A socket whose handshake is already done: asyncio's ``sock_connect`` calls
    ``connect`` once more, which the kernel answers with EISCONN."""

    def connect(self, address: Any) -> None:
        try:
            super().connect(address)
        except OSError as exc:
            if exc.errno != errno.EISCONN:
                raise


@dataclass
class _Prefetch:
    host: str
    port: int
    name: str
    token: str | None
    timeout_s: float
    context: ssl.SSLContext | None = None
    """The cluster CA's client context: the info and manifest come over TLS, verified as
    the normal path verifies them (the data sockets are plain TCP: the engine's own TLS
    handshake runs over them)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)
    fetchers: dict[str, list[threading.Thread]] = field(default_factory=dict)
    """Each answer's copies (`META_COPIES`) in flight or done, by key."""
    answers: dict[str, tuple[Any, float, int]] = field(default_factory=dict)
    receiving: set[str] = field(default_factory=set)
    """Answers whose 200 headers came and whose body is being read (by one copy)."""
    sockets: list[socket.socket] = field(default_factory=list)
    gave_up: set[str] = field(default_factory=set)
    """Answers that will not come, whatever threads are still running (`_failed`)."""
    pieces: Pieces | None = None
    """The manifest's byte ranges (`fetch_pieces`); None once whole, broken or not used."""
    piece_first_byte_s: float = float("inf")
    """The shortest time from asking for a piece to its answer's headers."""
    handshakes_s: list[float] = field(default_factory=list)
    """Round trips of the handshakes this prefetch made itself (data sockets and requests)."""
    known: Callable[[str], Sequence[str]] | None = None
    """The versions of a dataset the client holds (by name; `known_ids`)."""
    _known_ids: tuple[str, ...] | None = None
    closed: bool = False

    def _connected(self) -> http.client.HTTPConnection:
        """A new connection to the server, connected (TLS under a cluster CA), its
        handshake noted."""
        import http.client

        conn: http.client.HTTPConnection
        if self.context is not None:
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout_s, context=self.context
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        start_s = time.monotonic()
        try:
            conn.connect()
        except BaseException:
            conn.close()
            raise
        # Over TLS the connect took the TLS handshake's round trips too: only the
        # kernel's figure of the TCP handshake counts then.
        self._handshake(conn.sock, time.monotonic() - start_s, self.context is None)
        return conn

    def known_ids(self) -> tuple[str, ...]:
        """The versions the manifest requests name (``If-None-Match``), listed by the first
        threads to ask and kept once (a directory listing: not before `start` returns): a 304
        naming one of them answers the manifest (`NotModified`)."""
        with self.lock:
            if self._known_ids is not None:
                return self._known_ids
        listed = tuple(self.known(self.name)) if self.known else ()  # not under the lock
        with self.lock:
            if self._known_ids is None:
                self._known_ids = listed
            return self._known_ids

    def _headers(self, key: str) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if key == "manifest":
            headers["Accept-Encoding"] = "zstd"  # manifestwire.ACCEPT_ZSTD
            naming = if_none_match(self.known_ids())
            if naming is not None:
                headers["If-None-Match"] = naming
        return headers

    def fetch(self, key: str, path: str, max_bytes: int) -> None:
        """One copy of the request for ``key`` (`META_COPIES`), read whole."""
        import http.client

        try:
            conn = self._connected()
        except (OSError, ValueError):  # (a host name IDNA refuses is a ValueError)
            return  # the normal path asks again and reports what is wrong
        try:
            asked_s = time.monotonic()
            conn.request("GET", path, headers=self._headers(key))
            resp = conn.getresponse()
            self._whole(key, resp, time.monotonic() - asked_s, max_bytes)
        # (ssl.SSLError and certificate failures are OSErrors)
        except (OSError, ValueError, RecursionError, http.client.HTTPException, ProtocolError):
            pass  # the normal path asks again and reports what is wrong
        finally:
            conn.close()

    def _whole(
        self, key: str, resp: http.client.HTTPResponse, first_byte_s: float, max_bytes: int
    ) -> None:
        """Read a whole answer for ``key`` unless another connection is reading one."""
        if resp.status == 200:
            with self.lock:
                if key in self.receiving or key in self.answers:
                    return  # another copy is reading it
                self.receiving.add(key)
        # Never more than the normal path would read: over that, it asks and refuses.
        if resp.length is not None and resp.length > max_bytes:
            return
        body = resp.read(max_bytes + 1)
        if resp.status == 200 and len(body) <= max_bytes:
            self._decoded(key, body, resp.getheader("Content-Encoding"), first_byte_s, max_bytes)
        elif resp.status == 200:
            with self.lock:
                self.receiving.discard(key)  # refused: a copy still coming may do

    def _decoded(
        self,
        key: str,
        body: bytes,
        content_encoding: str | None,
        first_byte_s: float,
        max_bytes: int,
    ) -> None:
        """Store ``key``'s answer from its whole ``body`` (ValueError, ProtocolError)."""
        text: bytes | bytearray = body
        if key == "manifest":
            text = _manifest_json(body, content_encoding, max_bytes)
        doc = json.loads(text)
        trace.mark(f"{key}_decoded")
        with self.lock:
            self.answers[key] = (doc, first_byte_s, len(body))

    def fetch_pieces(self, path: str, max_bytes: int) -> None:
        """One of `MANIFEST_CONNECTIONS` connections fetching the manifest as byte ranges
        (`netopt.dataplane.manifestpieces`): asks for the next piece until none is left.
        A server that ignores ``Range`` answers with the whole manifest, read as
        `fetch` reads it. Anything unexpected ends this connection's part (its piece
        goes to another); pieces that do not make one body end the whole fetch (the
        normal path then asks)."""
        import http.client

        try:
            conn = self._connected()
        except (OSError, ValueError):
            return
        asked: tuple[int, int, int] | Wait | None = None
        try:
            while True:
                with self.lock:
                    if self.closed or self.pieces is None or "manifest" in self.answers:
                        return
                    asked = self.pieces.next_range(
                        time.monotonic(), stalled_after_s(min(self.handshakes_s, default=None))
                    )
                if isinstance(asked, Wait):
                    time.sleep(PIECE_POLL_S)
                    continue
                if asked is None:
                    with self.lock:
                        if self.pieces is not None and not self.pieces.done():
                            raise PiecesBroken("nothing left to ask, and the body is not whole")
                    return
                if not self._piece(conn, path, asked, max_bytes):
                    return
                asked = None
        except PiecesBroken:
            self._give_up_pieces()
        except (OSError, ValueError, RecursionError, http.client.HTTPException, ProtocolError):
            pass
        finally:
            conn.close()
            if isinstance(asked, tuple):
                with self.lock:
                    if self.pieces is not None:
                        self.pieces.give_back(asked[2])

    def _piece(
        self,
        conn: http.client.HTTPConnection,
        path: str,
        asked: tuple[int, int, int],
        max_bytes: int,
    ) -> bool:
        """Ask for one piece over ``conn`` and read it (up to where another connection
        took the rest over); False when this connection is done: a whole answer, one it
        did not read to the end, or one it cannot use. PiecesBroken."""
        start, end, ticket = asked
        headers = self._headers("manifest")
        headers["Range"] = f"bytes={start}-{end - 1}"
        asked_s = time.monotonic()
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        first_byte_s = time.monotonic() - asked_s
        if resp.status == 200:  # ranges ignored: the whole manifest
            with self.lock:
                self.pieces = None  # the connections waiting for a total stop
            self._whole("manifest", resp, first_byte_s, max_bytes)
            return False
        if resp.status == 304 and self.known_ids():
            self._not_modified(resp, first_byte_s)
            return False
        if resp.status == 416:
            resp.read(MAX_INFO_BYTES)
            _, _, total = content_range(resp.getheader("Content-Range"))
            with self.lock:
                if self.pieces is not None:
                    self.pieces.past_end(ticket, total)
            return True
        if resp.status != 206:
            return False
        with self.lock:
            if self.pieces is None:
                return False
            length = self.pieces.answered(
                ticket,
                resp.getheader("Content-Range"),
                resp.getheader("ETag"),
                resp.getheader("Content-Encoding"),
            )
            self.receiving.add("manifest")
            self.piece_first_byte_s = min(self.piece_first_byte_s, first_byte_s)
        if length == 0 or resp.length != length:
            return False  # taken over meanwhile, or a body not of the range's length
        read = 0
        more = True
        while more and read < length:
            block = resp.read1(min(PIECE_READ_BYTES, length - read))
            if not block:
                return False  # cut short: what it read is kept, the rest asked again
            read += len(block)
            with self.lock:
                pieces = self._pieces()
                if pieces is None:
                    return False
                more = pieces.received(ticket, block, time.monotonic())
                body = self._whole_body(pieces)
            if body is not None:
                try:
                    self._decoded("manifest", *body, self.piece_first_byte_s, max_bytes)
                except BaseException:
                    self._give_up_pieces()
                    raise
                return False
        if read < length:
            return False  # another connection took the rest over: this answer is not read
        # Nothing is left (its Content-Length was the piece's): the connection is reusable.
        return not resp.read(1)

    def _not_modified(self, resp: http.client.HTTPResponse, first_byte_s: float) -> None:
        """A 304 to a piece: the current version is one the client holds (the manifest's
        answer, `NotModified`); one naming a version it did not offer ends the pieces
        (the normal path asks again and reports it)."""
        resp.read(MAX_INFO_BYTES)
        try:
            answer = NotModified(not_modified_id(resp.getheader("ETag"), self.known_ids()))
        except ProtocolError:
            self._give_up_pieces()
            raise
        trace.mark("manifest_not_modified")
        with self.lock:
            self.pieces = None
            self.answers.setdefault("manifest", (answer, first_byte_s, 0))

    def _whole_body(self, pieces: Pieces) -> tuple[bytes, str | None] | None:
        """The manifest's body and coding once every piece is in, for one connection to
        decode (the others stop); None before (called under the lock)."""
        if not pieces.done() or "manifest" in self.answers:
            return None
        self.pieces = None
        STATS["manifest_pieces"] += len(pieces.held)
        STATS["manifest_takeovers"] += pieces.steals + pieces.copies
        trace.mark("manifest_pieces_in")
        return pieces.body(), pieces.encoding

    def _give_up_pieces(self) -> None:
        """The pieces will not make the manifest: the other connections stop, and the
        normal path need not wait for them (`_failed`)."""
        with self.lock:
            self.pieces = None
            self.receiving.discard("manifest")
            self.gave_up.add("manifest")

    def _pieces(self) -> Pieces | None:
        """`pieces` as it is now (another connection may have ended the fetch)."""
        return self.pieces

    def _handshake(
        self, sock: socket.socket | None, elapsed_s: float, elapsed_is_rtt: bool = True
    ) -> None:
        """Note one handshake: the kernel's RTT of it where it has one (a thread's clock
        also counts the wait for the interpreter lock while imports run); without one,
        ``elapsed_s`` when it is a single round trip (not after a TLS handshake)."""
        rtt_s = elapsed_s if elapsed_is_rtt else None
        if sock is not None:
            try:
                raw = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCPI_RTT_OFFSET + 4)
                kernel_us = struct.unpack_from("I", raw, _TCPI_RTT_OFFSET)[0]
            except (OSError, struct.error):
                kernel_us = 0
            if 0 < kernel_us <= elapsed_s * 1e6:
                rtt_s = kernel_us / 1e6
        if rtt_s is None:
            return
        with self.lock:
            self.handshakes_s.append(rtt_s)

    def connect(self, congestion_control: str | None) -> None:
        try:
            family, type_, proto, _, address = socket.getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM
            )[0]
            sock = socket.socket(family, type_, proto)
        except OSError:
            return
        try:
            if congestion_control is not None:
                try_congestion_control(sock, congestion_control)
            sock.settimeout(self.timeout_s)
            start_s = time.monotonic()
            sock.connect(address)
            self._handshake(sock, time.monotonic() - start_s)
        except OSError:
            sock.close()
            return
        with self.lock:
            if self.closed:
                sock.close()
            else:
                self.sockets.append(sock)


def _manifest_json(body: bytes, content_encoding: str | None, max_bytes: int) -> bytes | bytearray:
    """The manifest JSON of a response, decoded as the normal path decodes it (bounded,
    see `netopt.dataplane.manifestwire`) and its shape checked; ProtocolError."""
    text: bytes | bytearray = body
    if content_encoding is not None:
        # Imported here, in the thread: zstandard is not loaded before `start` returns.
        from netopt.dataplane.manifestwire import decode_manifest_body

        text = decode_manifest_body(body, content_encoding, max_bytes, "prefetched manifest")
    check_manifest_shape(text)
    return text


_pending: _Prefetch | None = None


def start(
    url: str,
    token: str | None,
    sockets: int,
    congestion_control: str | None = "bbr",
    timeout_s: float = 10.0,
    known: Callable[[str], Sequence[str]] | None = None,
) -> bool:
    """Begin fetching ``netopt://HOST:PORT/NAME``'s info and manifest and connecting
    ``sockets`` data sockets, in daemon threads; the manifest requests name the
    versions ``known(NAME)`` lists (held by the client: `_Prefetch.known_ids`). False (nothing
    started) for anything that is not such a URL; never raises."""
    global _pending
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return False
    name = parts.path.strip("/")
    if parts.scheme != "netopt" or not host or port is None or not name or "/" in name:
        return False
    tls = current_client_tls()
    context = None
    if tls.enabled:
        try:
            context = client_context(tls)
        except (ConfigError, OSError, ValueError):
            return False  # a CA or key file that does not load: the normal path says so
    elif token and not is_loopback(host) and not tls.insecure:
        # A token the plaintext rule would refuse: the normal path refuses it, with the
        # reason, before any byte is sent.
        return False
    discard()
    trace.mark("prefetch_start")
    pre = _Prefetch(host, port, name, token, timeout_s, context, known=known)
    pre.pieces = Pieces(MAX_MANIFEST_BYTES, MANIFEST_CONNECTIONS)
    quoted = urllib.parse.quote(name, safe="")
    meta = [
        ("info", f"/v1/datasets/{quoted}", MAX_INFO_BYTES),
        ("manifest", f"/v1/datasets/{quoted}/manifest", MAX_MANIFEST_BYTES),
    ]
    jobs: list[tuple[Any, tuple[Any, ...]]] = [(pre.fetch, meta[0])] * META_COPIES
    jobs += [(pre.fetch_pieces, meta[1][1:])] * MANIFEST_CONNECTIONS
    jobs += [(pre.connect, (congestion_control,))] * max(0, sockets)
    for target, args in jobs:
        thread = threading.Thread(target=target, args=args, name="netopt-prefetch", daemon=True)
        thread.start()
        pre.threads.append(thread)
        if target == pre.fetch:
            pre.fetchers.setdefault(args[0], []).append(thread)
        elif target == pre.fetch_pieces:
            pre.fetchers.setdefault("manifest", []).append(thread)
    _pending = pre
    return True


def _matching(host: str, port: int, name: str | None = None) -> _Prefetch | None:
    pre = _pending
    if pre is None or pre.host != host or pre.port != port:
        return None
    return pre if name is None or pre.name == name else None


async def take_meta(host: str, port: int, name: str, token: str | None) -> MetaAnswer | None:
    """The prefetched info and manifest of ``name`` at ``host:port``, fetched with
    ``token``; None when there was no such prefetch, it failed, or it is not done
    within `TAKE_WAIT_S` (`BODY_WAIT_S` for one whose body is arriving). Each answer is
    handed out once."""
    import asyncio

    pre = _matching(host, port, name)
    if pre is None or pre.token != token:
        return None
    deadline_s = time.monotonic() + TAKE_WAIT_S
    if pre.context is not None:
        # Over TLS each answer waits for a TLS handshake too (1-2 round trips more than
        # plain HTTP): asking again now would cost more than waiting for what is coming.
        with pre.lock:
            rtt_s = min(pre.handshakes_s, default=TLS_UNKNOWN_RTT_S)
        deadline_s += min(TLS_EXTRA_ROUND_TRIPS * rtt_s, TLS_EXTRA_WAIT_MAX_S)
    while _missing(pre) and not _failed(pre):
        left_s = deadline_s - time.monotonic()
        if left_s <= 0:
            break
        await asyncio.sleep(min(LATE_POLL_S, left_s))
    body_deadline_s = time.monotonic() + BODY_WAIT_S
    while not _failed(pre) and time.monotonic() < body_deadline_s:
        missing = _missing(pre)
        with pre.lock:
            arriving = missing <= pre.receiving
        if not missing or not arriving:
            break
        await asyncio.sleep(LATE_POLL_S)
    return _answer(pre, host, port)


def prefetching(host: str, port: int, name: str, token: str | None) -> bool:
    """True when a prefetch of ``name`` at ``host:port`` with ``token`` was started."""
    pre = _matching(host, port, name)
    return pre is not None and pre.token == token


def peek_info(host: str, port: int, name: str, token: str | None) -> tuple[Any, float] | None:
    """The prefetched info document of ``name`` at ``host:port`` (unvalidated JSON) and its
    request's time to first byte (s), once it is in; None before, or without such a
    prefetch. Not handed out: `take_meta` still hands it out with the manifest. For a
    lead (`netopt.dataplane.lead`), which starts as soon as the info names the version."""
    pre = _matching(host, port, name)
    if pre is None or pre.token != token:
        return None
    with pre.lock:
        got = pre.answers.get("info")
    return (got[0], got[1]) if got is not None else None


LATE_POLL_S = 0.005
"""How often `late_meta` looks for the prefetch's answers."""


async def late_meta(host: str, port: int, name: str, token: str | None) -> MetaAnswer | None:
    """What `take_meta` hands out, once both answers are in however late; None as soon as
    either fetch ended without its answer (or there was no such prefetch). For the
    normal path to race after `take_meta` gave up: a request of the prefetch that lost
    a packet on a lossy link waits out a retransmission timeout (~0.4 s at 140 ms) and
    is then still ahead of asking again over fresh connections (three round trips under
    TLS). Bounded by the prefetch's own timeouts: its threads end within them."""
    import asyncio

    pre = _matching(host, port, name)
    if pre is None or pre.token != token:
        return None
    while _missing(pre):
        if _failed(pre):
            return None
        await asyncio.sleep(LATE_POLL_S)
    return _answer(pre, host, port)


def _missing(pre: _Prefetch) -> set[str]:
    """The answers not in yet."""
    with pre.lock:
        return {key for key in ("info", "manifest") if key not in pre.answers}


def _failed(pre: _Prefetch) -> bool:
    """True once every copy of an answer still missing has ended: it will not come."""
    ended = {key for key, copies in pre.fetchers.items() if not any(t.is_alive() for t in copies)}
    # Looked at after the threads: a copy that ended stored its answer before.
    given_up = ended | pre.gave_up | ({"info", "manifest"} - set(pre.fetchers))
    return bool(_missing(pre) & given_up)


def _answer(pre: _Prefetch, host: str, port: int) -> MetaAnswer | None:
    """Both prefetched answers, handed out once; None unless both are there."""
    with pre.lock:
        if "info" not in pre.answers or "manifest" not in pre.answers:
            return None  # left for `late_meta`
        info = pre.answers.pop("info")
        manifest = pre.answers.pop("manifest")
    STATS["meta_used"] += 1
    trace.count("prefetched_meta")
    handshake_s = handshake_rtt_s(host, port)
    first_byte_s = min(info[1], manifest[1])
    if handshake_s is not None and handshake_s <= first_byte_s:
        rtt_s, source = handshake_s, HANDSHAKE_SOURCE
    else:
        rtt_s, source = first_byte_s, "request time to first byte (start-up prefetch)"
    return MetaAnswer(info[0], manifest[0], rtt_s, info[2] + manifest[2], source)


def sockets_need_tls(host: str, port: int) -> bool:
    """True when a prefetch to ``host:port`` connected (or is connecting) data sockets
    under TLS: their TLS handshakes are still to be made, by the engine."""
    pre = _matching(host, port)
    if pre is None or pre.context is None:
        return False
    return len(pre.threads) > sum(len(copies) for copies in pre.fetchers.values())


def handshake_rtt_s(host: str, port: int) -> float | None:
    """The shortest handshake the prefetch to ``host:port`` made so far (s), or None."""
    pre = _matching(host, port)
    if pre is None:
        return None
    with pre.lock:
        return min(pre.handshakes_s, default=None)


def take_socket(host: str, port: int, family: int) -> socket.socket | None:
    """A data socket to ``host:port`` already connected by the prefetch, or None.

    The socket is blocking as the prefetch left it; asyncio makes it non-blocking, and
    its ``connect`` (which asyncio calls again) accepts the finished handshake."""
    pre = _matching(host, port)
    if pre is None:
        return None
    with pre.lock:
        for i, sock in enumerate(pre.sockets):
            if sock.family == family:
                del pre.sockets[i]
                STATS["sockets_used"] += 1
                trace.count("prefetched_sockets")
                return _Connected(sock.family, sock.type, sock.proto, fileno=sock.detach())
    return None


def discard() -> None:
    """Close the sockets no one took and forget the prefetch."""
    global _pending
    pre, _pending = _pending, None
    if pre is None:
        return
    with pre.lock:
        pre.closed = True
        leftover, pre.sockets = pre.sockets, []
    STATS["sockets_discarded"] += len(leftover)
    for sock in leftover:
        sock.close()
