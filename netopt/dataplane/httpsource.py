"""`HttpChunkSource`: the `ChunkSource` over a netopt data-plane server, and its addresses.

One aiohttp session with up to ``streams`` connections, each socket asking the kernel
for the configured congestion control (bbr by default; a socket connected early by
`netopt.dataplane.prefetch` is used first), a stall timeout on every connection (a
few RTTs without a byte: the connection is dropped, see `stall_timeout_s`), an
optional token-bucket bandwidth limit, and aiohttp's exceptions turned into netopt's.
Chunks come one per request, in batches (one request, many frames) or over a
full-duplex stream (`open_stream`). Also here: the dataset URL
(``netopt://HOST:PORT/NAME``), the client's options and the dataset info the server
sends before any chunk moves. `netopt.dataplane.client` uses these to sync a URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import json
import re
import socket
import time
import types
from collections.abc import AsyncIterator, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from netopt.dataplane import prefetch, trace
from netopt.dataplane.chunkio import (
    Codec,
    RawChunk,
    decode_part,
    max_frame_bytes,
    part_bounds,
)
from netopt.dataplane.hedge import gather_hedged
from netopt.dataplane.lead import Lead
from netopt.dataplane.limits import (
    MAX_CHUNK_PARTS,
    MAX_INFO_BYTES,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_ENTRIES,
    BodyTooLarge,
    check_manifest_bounds,
    check_manifest_shape,
)
from netopt.dataplane.linkwatch import LinkWatch, TrackedSockets
from netopt.dataplane.manifestversions import (
    KnownManifests,
    NotModified,
    if_none_match,
    not_modified_id,
)
from netopt.dataplane.manifestwire import ACCEPT_ZSTD, decode_manifest_body
from netopt.dataplane.sockets import set_user_timeout, try_congestion_control
from netopt.dataplane.streaming import VERSION_HEADER, HttpChunkStream, map_errors, read_frame
from netopt.dataplane.sync import gc_paused
from netopt.dataplane.throttle import TokenBucket
from netopt.errors import (
    AuthenticationError,
    DatasetChangedError,
    NetoptError,
    NetworkError,
    ProtocolError,
    TlsError,
    ValidationError,
)
from netopt.names import is_dataset_name
from netopt.tlsconf import client_ssl, data_scheme, disconnect_hint
from netopt.transfer.adapt import LevelAdapter
from netopt.transfer.manifest import Manifest, manifest_from_dict
from netopt.transfer.planner import CpuProfile, SampleProfile
from netopt.transfer.profile import cpu_profile_from_dict

__all__ = [
    "MAX_CUT_CHECKS",
    "ClientOptions",
    "DatasetInfo",
    "DatasetUrl",
    "HttpChunkSource",
    "checked_dataset_url",
    "parse_dataset_url",
    "stall_timeout_s",
    "stream_versions_at_end",
    "watch_stalls",
]

_URL_RE = re.compile(r"^netopt://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})/([^/?#]+)$")
_READ_PIECE_BYTES = 64 * 1024
_READ_BUFFER_BYTES = 4 * 1024 * 1024
_ERROR_TEXT_BYTES = 200
_ACCEPT_ZSTD = {"Accept-Encoding": ACCEPT_ZSTD}
HANDSHAKE = "tcp handshake"
FIRST_BYTE = "request time to first byte"
_CONNECTING: contextvars.ContextVar[Any] = contextvars.ContextVar("netopt_connecting")
"""The trace context of the connection being created in this task: the socket factory
marks it when it hands over a socket the prefetch connected (no handshake happens then)."""
MAX_CUT_CHECKS = 8
"""Streams cut with chunks delivered whose version is asked for as they close (see
`HttpChunkSource.stream_closed`); past these the sync's end asks once, as it does for a
stream the network broke."""
END_LATE_RTTS = 2
END_LATE_MIN_S = 0.2
"""A closing stream whose end frame has not come ``END_LATE_RTTS`` round trips after its
last frame was read (at least ``END_LATE_MIN_S``) asks for the version instead (see
`HttpChunkSource.end_late_s`): the end frame normally follows the last frame within a
round trip."""
STALL_MIN_S = 2.0
STALL_MAX_S = 10.0
STALL_RTTS = 4
"""A connection that receives nothing for ``STALL_RTTS`` round trips (at least
``STALL_MIN_S``, at most ``STALL_MAX_S``) is taken for stalled."""


def stall_timeout_s(rtt_s: float | None) -> float:
    """Seconds without a byte after which a data connection is abandoned for a fresh one:
    a few RTTs, bounded; the upper bound while the RTT is unknown.

    After a link cut, TCP retransmits on a timer that doubles with each loss, so an
    old connection may wait many seconds after the link is back; a fresh one does not.
    """
    if rtt_s is None:
        return STALL_MAX_S
    return min(max(STALL_MIN_S, STALL_RTTS * rtt_s), STALL_MAX_S)


def watch_stalls(resp: aiohttp.ClientResponse, stall_s: float | None) -> None:
    """Arm stall detection on ``resp``'s connection, its headers just in: aiohttp fails
    the read once no byte has arrived for ``stall_s`` (its clock stops while this side
    is the slow one), and the kernel drops the connection once what this side sent
    stays unacknowledged that long. Nothing for an answer that has left its connection
    (its body came with its headers). ``stall_s`` None: no read times out (a lead's
    stream, idle once its lead is in until the manifest names its chunks)."""
    conn = resp.connection
    if conn is None or conn.protocol is None:
        return
    conn.protocol.read_timeout = stall_s
    conn.protocol.start_timeout()  # the headers just came: the clock starts now
    sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
    if sock is not None and stall_s is not None:
        set_user_timeout(sock, stall_s)


@dataclass(frozen=True)
class DatasetUrl:
    """Where a dataset is served."""

    host: str
    port: int
    name: str
    scheme: str | None = None
    """``http`` or ``https`` for a server named by its manifest URL; None for
    ``netopt://``, which speaks TLS exactly when the cluster CA is set (netopt.tlsconf)."""

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme or data_scheme()}://{host}:{self.port}"

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"netopt://{host}:{self.port}/{self.name}"


def parse_dataset_url(url: str) -> DatasetUrl:
    """Parse ``netopt://HOST:PORT/NAME``; ValidationError if it is anything else."""
    match = _URL_RE.match(url)
    if not match:
        raise ValidationError(f"{url!r} is not a dataset URL (expected netopt://HOST:PORT/NAME)")
    host, port_text, name = match.groups()
    return checked_dataset_url(url, host, port_text, name)


def checked_dataset_url(
    text: str, host: str, port_text: str, name: str, scheme: str | None = None
) -> DatasetUrl:
    """The `DatasetUrl` of the parts ``text`` was matched into (a host, bracketed when
    IPv6); ValidationError naming ``text`` for a port out of range or a name not allowed."""
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValidationError(f"{text!r}: port {port} is out of range")
    if not is_dataset_name(name):
        raise ValidationError(f"{text!r}: dataset name {name!r} is not allowed")
    return DatasetUrl(host.strip("[]"), port, name, scheme)


class _NotModifiedAnswer(Exception):
    """A 304 to a request that named versions in ``If-None-Match`` (`HttpChunkSource._get`)."""

    def __init__(self, etag: str | None) -> None:
        super().__init__(etag)
        self.etag = etag


@dataclass(frozen=True)
class ClientOptions:
    """How the client connects. ``congestion_control`` None keeps the node's default."""

    token: str | None = None
    streams: int = 8
    congestion_control: str | None = "bbr"
    rate_limit_bps: float | None = None
    connect_timeout_s: float = 3.0
    """One connect attempt (s). Short, so a sync retrying a dead server or link probes
    it with a fresh SYN this often rather than on TCP's backed-off SYN timer."""
    read_timeout_s: float = 60.0
    """Waiting for a response's headers (s)."""
    stall_timeout_s: float | None = None
    """Seconds a data connection may receive nothing (and sent data stay unacknowledged,
    ``TCP_USER_TIMEOUT``) before it is dropped; None: `stall_timeout_s` of the RTT."""
    max_manifest_entries: int = MAX_MANIFEST_ENTRIES
    """Files plus chunk references a manifest may list (its bytes: 128 per entry)."""
    known_manifests: KnownManifests | None = None
    """Versions of the dataset this client holds: named when the manifest is asked for,
    read back when the server answers that one of them is current (304)."""


@dataclass(frozen=True)
class DatasetInfo:
    """What the server says about a dataset before any chunk moves."""

    name: str
    manifest_id: str
    total_bytes: int
    files: int
    chunks: int
    sample: SampleProfile
    server_cpu: CpuProfile
    congestion_control: str | None
    rtt_ms: float
    rtt_source: str = FIRST_BYTE
    stream_levels: bool = False
    """The server's stream route takes a level per line (``NAME LEVEL``)."""
    chunk_parts: int = 0
    """The most parts the server's chunk route cuts a chunk into (0: it does not)."""
    stream_context: bool = False
    """The server's stream route compresses a stream's chunks in one zstd context
    (``ctx=1``, see `netopt.dataplane.streamctx`)."""
    stream_bundles: bool = False
    """The server's stream route sends small chunks ready together as one frame
    (``bundle=1``, with ``ctx=1``)."""
    stream_lead: bool = False
    """The server's stream route takes a lead: chunks named by their place in the
    version (``lead``, ``from``, ``count``; see `netopt.dataplane.leadplan`)."""


class HttpChunkSource:
    """`ChunkSource` over a netopt data-plane server. Use as ``async with``."""

    def __init__(
        self, url: DatasetUrl, options: ClientOptions, zstd_level: int | None = None
    ) -> None:
        self.url = url
        self.options = options
        self.zstd_level = zstd_level
        self.wire_bytes = 0
        self._stream_versions: list[str | None] = []
        self._cut_checks: list[tuple[float, asyncio.Task[str | None]]] = []
        """The versions asked for as streams that delivered chunks closed without an end
        frame (`stream_closed`), each with when it was asked; at most `MAX_CUT_CHECKS`."""
        self._other_routes = False
        self._answered = False
        """True once a request of this source got its answer's headers."""
        self._bucket = (
            TokenBucket(options.rate_limit_bps / 8) if options.rate_limit_bps is not None else None
        )
        self._session: aiohttp.ClientSession | None = None
        self.meta_wire_bytes = 0
        """Bytes the info and manifest requests took (see `fetch_info_and_manifest`)."""
        self.round_trips_s: dict[str, float] = {}
        """The shortest real round trip seen so far (s), by where it was seen: a TCP
        handshake that happened (`HANDSHAKE`, or the prefetch's own), a request's time
        from its headers sent to the response's (`FIRST_BYTE`)."""
        self.adapter: LevelAdapter | None = None
        """With one, each frame feeds it and the level follows the link (see
        `netopt.transfer.adapt`); None: the level stays as set."""
        self.owns_prefetch = False
        """True for the sync's main source: closing it closes the prefetch's untaken sockets."""
        self.chunk_parts = 0
        """The most parts `fetch_chunk_parts` may ask for (the server's ``chunk_parts``;
        0: the server has no part route, set once its info is known)."""
        self.stream_context = False
        """Ask streams for one zstd context each (the server's ``stream_context``, set
        once its info is known)."""
        self.stream_bundles = False
        """Ask streams with a context for bundles of small chunks (the server's
        ``stream_bundles``, set once its info is known)."""
        self.rtt_s: float | None = None
        """The round trip to the server (s) once measured (`fetch_info_and_manifest` sets
        it); until then the fastest handshake so far stands in."""
        self.warm_ready = 0
        """Connections the warm-up (`start_warm_up`) has opened so far."""
        self.lead: Lead | None = None
        """The lead streams started before the manifest was in (`start_lead`), until the
        sync takes them (`take_leads`) or this source closes."""
        self._warming: asyncio.Task[None] | None = None
        self._first_warm = asyncio.Event()
        self._first_warm_s = 0.0
        self._sockets = TrackedSockets()
        self.link_watch = LinkWatch(url.host, url.port, self._sockets, lambda: self.rtt_s)
        """Probes the server after a fetch fails; at its answer after an outage, drops the
        connections the outage left dead (`netopt.dataplane.linkwatch`)."""

    @property
    def stall_timeout_s(self) -> float:
        """Seconds a data connection may receive nothing before it is dropped."""
        if self.options.stall_timeout_s is not None:
            return self.options.stall_timeout_s
        rtt_s = self.rtt_s
        if rtt_s is None and self.round_trips_s:
            rtt_s = min(self.round_trips_s.values())
        return stall_timeout_s(rtt_s)

    @property
    def end_late_s(self) -> float | None:
        """How long a closing stream waits for its end frame before a version check stands
        in for it (`END_LATE_RTTS`); None while the round trip is unknown."""
        if self.rtt_s is None:
            return None
        return max(END_LATE_MIN_S, END_LATE_RTTS * self.rtt_s)

    def note_round_trip(self, seconds: float, source: str) -> None:
        """Keep ``seconds`` if it is the shortest round trip seen from ``source``."""
        if seconds > 0 and seconds < self.round_trips_s.get(source, float("inf")):
            self.round_trips_s[source] = seconds

    def round_trip(self) -> tuple[float, str] | None:
        """The shortest real round trip seen (s) and where; None before any."""
        if not self.round_trips_s:
            return None
        source = min(self.round_trips_s, key=self.round_trips_s.__getitem__)
        return self.round_trips_s[source], source

    def _socket_factory(self, addr_info: Any) -> socket.socket:
        family, type_, proto, _, _ = addr_info
        connected = prefetch.take_socket(self.url.host, self.url.port, family)
        if connected is not None:
            creating = _CONNECTING.get(None)
            if creating is not None:
                creating.adopted = True  # its "connect" is instant: not a round trip
            set_user_timeout(connected, self.stall_timeout_s)
            self._sockets.add(connected)
            return connected
        sock = socket.socket(family, type_, proto)
        if self.options.congestion_control is not None:
            try_congestion_control(sock, self.options.congestion_control)
        set_user_timeout(sock, self.stall_timeout_s)
        self._sockets.add(sock)
        return sock

    def fetch_failed(self) -> None:
        """A fetch (a stream, a batch, a chunk's parts) broke or stalled: watch for the
        server's answer (`link_watch`)."""
        self.link_watch.failed(self.stall_timeout_s)

    def link_returns(self) -> int:
        """How many times the server answered again, after an outage, once fetches failed."""
        return self.link_watch.returns

    def _watch_stalls(self, resp: aiohttp.ClientResponse) -> None:
        """Arm stall detection on ``resp``'s connection (`watch_stalls`): the stream then
        breaks, and the sync engine asks again on a fresh connection."""
        watch_stalls(resp, self.stall_timeout_s)

    async def _check_data_response(self, resp: aiohttp.ClientResponse, where: str) -> None:
        self._watch_stalls(resp)
        await self._check_status(resp, where)

    async def __aenter__(self) -> HttpChunkSource:
        tls = client_ssl(self.url.base, sends_token=bool(self.options.token))
        connector = aiohttp.TCPConnector(
            limit=max(1, self.options.streams),
            socket_factory=self._socket_factory,
            force_close=False,
            # Plain HTTP: no SSL context at all (loading the CA store costs tens of ms at
            # every start); TLS: the cluster CA's context, built once per process.
            ssl=tls if tls is not None else False,
        )
        headers = {"Authorization": f"Bearer {self.options.token}"} if self.options.token else {}
        timeout = aiohttp.ClientTimeout(
            sock_connect=self.options.connect_timeout_s, sock_read=self.options.read_timeout_s
        )
        tracing = aiohttp.TraceConfig()
        tracing.on_connection_create_start.append(self._connect_started)
        tracing.on_connection_create_end.append(self._connect_ended)
        tracing.on_request_headers_sent.append(self._headers_sent)
        tracing.on_request_end.append(self._response_started)
        # aiohttp stops reading a socket once 2 x read_bufsize bytes wait unread (64 KiB by
        # default): on a busy loop that throttles TCP. Let a few MiB queue up instead.
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=headers,
            timeout=timeout,
            auto_decompress=False,
            read_bufsize=_READ_BUFFER_BYTES,
            trace_configs=[tracing],
        )
        return self

    async def _connect_started(self, _s: object, ctx: Any, _p: object) -> None:
        ctx.connect_started_s = time.monotonic()
        ctx.adopted = False
        _CONNECTING.set(ctx)

    async def _connect_ended(self, _s: object, ctx: Any, _p: object) -> None:
        _CONNECTING.set(None)
        if not ctx.adopted:
            self.note_round_trip(time.monotonic() - ctx.connect_started_s, HANDSHAKE)

    async def _headers_sent(self, _s: object, ctx: Any, _p: object) -> None:
        ctx.headers_sent_s = time.monotonic()

    async def _response_started(self, _s: object, ctx: Any, _p: object) -> None:
        sent_s = getattr(ctx, "headers_sent_s", None)
        if sent_s is not None:
            self.note_round_trip(time.monotonic() - sent_s, FIRST_BYTE)

    async def warm_up(self, connections: int) -> None:
        """Open ``connections`` connections now, in parallel, so the first chunk requests
        do not wait for a handshake; each one opened counts in `warm_ready`. A connection
        is opened (TCP, then TLS where the URL says so) and left idle in the session's
        pool (`_open_idle`): no request, so it is ready a round trip sooner than one a
        request opens (a small sync's first chunk request waited for that round trip).
        Where this aiohttp cannot open one without a request, a health request opens it.
        Failures are left to the real requests."""

        async def one() -> None:
            with contextlib.suppress(NetworkError, ValidationError, AuthenticationError):
                if not await self._open_idle():
                    await self._get("/v1/health", MAX_INFO_BYTES)
                self.warm_ready += 1
                if not self._first_warm.is_set():
                    self._first_warm_s = time.monotonic()
                    self._first_warm.set()

        await asyncio.gather(*(one() for _ in range(connections)))

    async def _open_idle(self) -> bool:
        """Open one connection to the server through the session's connector (its socket
        factory, its TLS context, its pool key: the one a GET of this server has) and
        release it idle into the pool; True once it is open. False where aiohttp's
        connector or request cannot be used so (their signatures are aiohttp's own); a
        connection that fails raises NetworkError, as a request's would."""
        session = self._require_session()
        try:
            request = aiohttp.ClientRequest(
                "GET", URL(self.url.base + "/v1/health"),
                loop=asyncio.get_running_loop(), session=session,
            )  # fmt: skip
            opening = session.connector.connect(request, [], session.timeout)  # type: ignore[union-attr]
        except (TypeError, AttributeError):
            return False
        noted = types.SimpleNamespace()  # as aiohttp's trace hooks note a connection
        await self._connect_started(session, noted, None)
        try:
            connection = await opening
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            _CONNECTING.set(None)
            raise NetworkError(f"{self.url} is unreachable: {exc}") from exc
        await self._connect_ended(session, noted, None)
        connection.release()
        trace.count("warm_idle_connections")
        return True

    @property
    def warm_up_started(self) -> bool:
        """Whether `start_warm_up` ran."""
        return self._warming is not None

    def start_warm_up(self, connections: int) -> None:
        """`warm_up` in the background (see `warmed`); closing the source ends it."""
        self._warming = asyncio.ensure_future(self.warm_up(connections))

    async def warmed(self, grace_s: float) -> int:
        """Wait for the background warm-up until every connection is open, or until
        ``grace_s`` after the first one opened, and return how many are open
        (`warm_ready`). The connections of a warm-up open within tens of ms of each
        other, but one whose handshake lost a packet waits out a retransmission timeout
        (200 ms at least, 1 s for a SYN): on the lab's 1% loss one of 16 did in most
        syncs, and waiting for it held the whole sync up by 0.2-0.6 s. Such laggards go
        on opening in the background and join the pool when they answer."""
        task = self._warming
        if task is None:
            return self.warm_ready
        first = asyncio.ensure_future(self._first_warm.wait())
        try:
            await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            first.cancel()
        left_s = self._first_warm_s + grace_s - time.monotonic()
        if not task.done() and left_s > 0:
            await asyncio.wait({task}, timeout=left_s)
        return self.warm_ready

    def open_stream(self, lead: tuple[str, int, int, int] | None = None) -> HttpChunkStream:
        """A `ChunkStream` over the server's stream route (see `netopt.dataplane.streaming`);
        with an `adapter`, each name carries the level of the moment when it differs from
        the stream's (``NAME LEVEL``, a server advertising ``stream_levels`` only).
        ``lead``: the version, and the start, count and spacing of the chunks its answer
        begins with (see `netopt.dataplane.leadplan.lead_positions`)."""
        session = self._require_session()
        path = f"/v1/datasets/{self.url.name}/stream"
        params = {"level": str(self.zstd_level or 0)}
        if lead is not None:
            version, start, count, every = lead
            params.update(lead=version, count=str(count), every=str(every))
            params["from"] = str(start)
        if self.stream_context:
            params["ctx"] = "1"
            if self.stream_bundles:
                params["bundle"] = "1"
        # The server answers a stream's headers once it has read the first name (a round
        # trip; a fresh connection's handshakes are a few more): waiting longer than the
        # stall timeout (4 RTTs, at least 2 s) for them is a stall too. A stream asked for
        # as a link is cut then fails in seconds and the link watch starts, where the
        # session's 60 s read timeout (and a warm socket's 10 s user timeout) left it on
        # TCP's backed-off timer: data came 4.5 s after a 5 s cut's end on the lab.
        stream = _LevelledStream(
            self,
            session,
            self.url.base + path,
            params,
            f"{self.url} ({self.url.base}{path})",
            f"{self.url} is unreachable",
            self._check_data_response,
            self._read_exactly,
            self._count_wire if self._bucket is None else None,
            self.stall_timeout_s,
        )
        stream.end_late_s = self.end_late_s
        return stream

    def _count_wire(self, n_bytes: int) -> None:
        """Bytes a stream read off a response without `_read_exactly` (its buffered frames)."""
        self.wire_bytes += n_bytes

    def stream_closed(self, stream: HttpChunkStream) -> None:
        """Note what a closed stream that delivered chunks saw at its end.

        A stream the client cut (in the tail, where another stream's copy of its last
        chunk came first) names no version after its last chunk was read. The server
        had read every chunk it delivered before the client had it, so a version asked
        for once the last one was in stands in for the missing end frame
        (`version_check_after`). Asked in the tail, its answer is in before the sync
        ends, which then need not ask (a round trip) as it did. A stream the network
        broke leaves the question to the end, as before: asked now, it could wait on a
        link that is down, and the end would wait for it.
        """
        if not stream.frames_read:
            return
        if stream.end_version is not None:
            self._stream_versions.append(stream.end_version)
        elif stream.failed or self.version_check_after(stream) is None:
            self._stream_versions.append(None)  # the end asks

    def may_be_cut(self, stream: HttpChunkStream) -> None:
        """``stream`` waits for a chunk that another stream was asked for too (the tail's
        steal): whichever copy comes second is cut off, maybe this stream's. The version
        is asked for now, after its last frame: if it is cut, that answer covers it, and
        has had the steal's time to come in (asked as it is cut, the tail's last cut
        came a round trip before the end)."""
        if stream.frames_read:
            self.version_check_after(stream)

    def version_check_after(self, stream: HttpChunkStream) -> asyncio.Task[str | None] | None:
        """A version asked for after ``stream``'s last frame: one asked already for another
        stream, if asked after it; else one asked now. None when neither: `MAX_CUT_CHECKS`
        are asked already."""
        for asked_s, check in self._cut_checks:
            if asked_s >= stream.last_frame_s:
                trace.count("version_checks_shared")
                return check
        if len(self._cut_checks) >= MAX_CUT_CHECKS:
            return None
        trace.count("version_checks_at_cut")
        check = asyncio.ensure_future(self._version_now())
        self._cut_checks.append((time.monotonic(), check))
        return check

    async def _version_now(self) -> str | None:
        """The server's dataset version as of now; None when it cannot be asked."""
        try:
            return (await self.fetch_info()).manifest_id
        except NetoptError:
            return None

    async def version_at_end(self) -> str | None:
        """The dataset version the server named after the last chunk read
        (`stream_versions_at_end` of what the streams and chunk parts named, in the
        order they closed, and of the versions asked for as streams were cut); None
        when a chunk came by another route."""
        if self._other_routes:
            return None
        asked = [await check for _, check in self._cut_checks]  # in flight since the cut
        return stream_versions_at_end([*self._stream_versions, *asked])

    def asked(self, chunk_id: str, level: int) -> None:
        """``chunk_id`` was asked for at ``level`` (for the adapter's windows)."""
        if self.adapter is not None:
            self.adapter.asked(chunk_id, level)

    def arrived(self, chunk_id: str, raw: RawChunk, length_bytes: int) -> None:
        """``chunk_id``'s frame was read: the adapter may move the level for what is asked next."""
        if self.adapter is not None:
            level = self.adapter.arrived(
                chunk_id, raw.wire_bytes, length_bytes, time.monotonic(), time.thread_time
            )
            self.zstd_level = level or None

    def use_routes_of(self, info: DatasetInfo) -> None:
        """Ask as the server's ``info`` offers: chunks in parts, streams with one zstd
        context each, small chunks bundled."""
        self.chunk_parts = info.chunk_parts
        self.stream_context = info.stream_context
        self.stream_bundles = info.stream_bundles

    def start_lead(self, version: str, ranges: Sequence[tuple[int, int, int]]) -> None:
        """Open a stream for each ``(start, count, every)`` of ``version``'s chunk order
        (`netopt.dataplane.leadplan.lead_positions`) and read
        its answer meanwhile (`netopt.dataplane.lead`), at the level set now: before the
        manifest is in. Nothing under a rate limit (the bytes read ahead are not charged
        to it) or when a lead runs already."""
        if self.lead is not None or self._bucket is not None or not ranges:
            return
        self.lead = Lead(version, [(self.open_stream((version, *at)), at) for at in ranges])

    async def take_leads(
        self, manifest: Manifest, lengths: Mapping[str, int] | None = None
    ) -> list[tuple[HttpChunkStream, list[str]]]:
        """The lead's streams for the sync of ``manifest``, each with the chunks it was asked
        for (see `Lead.take`); none without a lead."""
        lead, self.lead = self.lead, None
        return await lead.take(manifest, lengths) if lead is not None else []

    async def __aexit__(self, *exc: object) -> None:
        if self.lead is not None:
            lead, self.lead = self.lead, None
            await lead.aclose()
        await self.link_watch.close()
        checks = [check for _, check in self._cut_checks]
        for check in checks:
            check.cancel()
        await asyncio.gather(*checks, return_exceptions=True)
        if self._warming is not None:  # ended, and its outcome taken (a failure included)
            self._warming.cancel()
            await asyncio.gather(self._warming, return_exceptions=True)
        if self.owns_prefetch:
            prefetch.discard()  # sockets the prefetch connected that no stream took
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _check_status(self, resp: aiohttp.ClientResponse, where: str) -> None:
        if resp.status in (401, 403):
            raise AuthenticationError(f"{self.url}: the server refused the token")
        if resp.status == 410:
            raise DatasetChangedError(f"{self.url}: the dataset changed on the server ({where})")
        if resp.status in (400, 404):
            # A few bytes of the reason: the body's size is the peer's to choose.
            head = await resp.content.read(_ERROR_TEXT_BYTES)
            text = head.decode("utf-8", "replace")
            raise ValidationError(f"{where}: {resp.status} {text}")
        if resp.status >= 300:
            raise NetworkError(f"{where}: HTTP {resp.status}")

    def _require_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("HttpChunkSource is used outside 'async with'")
        return self._session

    async def _read_exactly(self, resp: aiohttp.ClientResponse, n_bytes: int) -> bytes:
        """``n_bytes`` of a frame; TimeoutError once `stall_timeout_s` passes without a
        piece. `_watch_stalls` arms the same bound on the connection, but a response that
        aiohttp has detached from its connection keeps a reader that no socket timer
        reaches (seen: a stream waiting forever after a cut connection's chunks were
        asked again), so the read itself is bounded too."""
        parts: list[bytes] = []
        left = n_bytes
        stall_s = self.stall_timeout_s
        while left > 0:
            # What has arrived already is taken without a timer (two a frame cost more
            # than the read on a tree of small chunks); only a wait is bounded.
            piece = resp.content.read_nowait(min(left, _READ_PIECE_BYTES))
            if not piece:
                async with asyncio.timeout(stall_s):
                    piece = await resp.content.readexactly(min(left, _READ_PIECE_BYTES))
            if self._bucket is not None:
                await self._bucket.take(len(piece))
            parts.append(piece)
            left -= len(piece)
        self.wire_bytes += n_bytes
        return b"".join(parts)

    async def fetch_chunks(self, wanted: Sequence[tuple[str, int]]) -> AsyncIterator[RawChunk]:
        """Stream ``wanted`` chunks over one request (the server's batch route)."""
        session = self._require_session()
        path = f"/v1/datasets/{self.url.name}/batch"
        where = f"{self.url} ({self.url.base}{path})"
        self._other_routes = True  # no end frame on this route (see version_at_end)
        level = self.zstd_level or 0
        params = {"level": str(level)}
        body = {"chunks": [cid for cid, _ in wanted]}
        for cid, _ in wanted:
            self.asked(cid, level)
        asked_s = time.monotonic()
        trace.mark("first_request")
        try:
            async with session.post(self.url.base + path, params=params, json=body) as resp:
                await self._check_data_response(resp, where)
                for i, (expected_id, length) in enumerate(wanted):
                    raw = await read_frame(resp, self._read_exactly, expected_id, length, where)
                    if i == 0:
                        trace.add_seconds("request_to_first_chunk", time.monotonic() - asked_s)
                    self.arrived(expected_id, raw, length)
                    yield raw
        except (asyncio.IncompleteReadError, aiohttp.ClientError, TimeoutError) as exc:
            raise map_errors(exc, where, f"{self.url} is unreachable") from exc

    async def _get(
        self,
        path: str,
        max_bytes: int,
        params: dict[str, str] | None = None,
        headers_out: MutableMapping[str, str] | None = None,
        headers: dict[str, str] | None = None,
        on_read: Callable[[int], None] | None = None,
    ) -> tuple[bytearray, str]:
        """GET ``path`` (with ``headers`` added to the request's); the body as it came
        (never decompressed by aiohttp) and its X-Netopt-Codec header (``headers_out``,
        when given, receives all the response's headers). ``on_read`` is told each piece
        of the body read (also of one cut before its end). Errors become netopt's;
        BodyTooLarge when the body declares or holds more than ``max_bytes``, found
        before the excess is read."""
        session = self._require_session()
        where = f"{self.url} ({self.url.base}{path})"
        try:
            async with session.get(
                self.url.base + path, params=params, headers=headers, auto_decompress=False
            ) as resp:
                self._answered = True
                if resp.status == 304 and headers is not None and "If-None-Match" in headers:
                    raise _NotModifiedAnswer(resp.headers.get("ETag"))
                await self._check_data_response(resp, where)
                if headers_out is not None:
                    headers_out.update(resp.headers)
                declared = resp.content_length
                if declared is not None and declared > max_bytes:
                    raise BodyTooLarge(f"{where}: {declared} bytes, at most {max_bytes} expected")
                body = bytearray()
                async for piece in resp.content.iter_chunked(_READ_PIECE_BYTES):
                    if len(body) + len(piece) > max_bytes:
                        raise BodyTooLarge(f"{where}: over the {max_bytes} bytes expected")
                    if self._bucket is not None:
                        await self._bucket.take(len(piece))
                    body += piece
                    self.wire_bytes += len(piece)
                    if on_read is not None:
                        on_read(len(piece))
                return body, resp.headers.get("X-Netopt-Codec", "identity")
        except (aiohttp.ClientError, TimeoutError) as exc:
            if _closed_unanswered(exc, first=not self._answered):
                hint, refused = disconnect_hint(self.url.base)
                if refused:
                    raise TlsError(f"{self.url}: {hint}") from None
            raise map_errors(exc, where, f"{self.url} is unreachable") from exc

    async def _get_json(self, path: str, max_bytes: int) -> Any:
        body, _ = await self._get(path, max_bytes)
        return self.loads(body, path)

    def loads(self, body: bytes | bytearray, path: str) -> Any:
        """Parse a JSON answer; ProtocolError when it is not JSON, nests too deeply or
        holds an integer over Python's digit limit."""
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise ProtocolError(f"{self.url}: {path} did not return usable JSON") from exc

    async def fetch_info(self) -> DatasetInfo:
        """The dataset's info, with the shortest real round trip seen so far (a handshake
        that happened, a request's time to first byte: the info request's at least)."""
        path = f"/v1/datasets/{self.url.name}"
        trace.mark("info_request")
        start_s = time.monotonic()
        data = await self._get_json(path, MAX_INFO_BYTES)
        rtt_s, source = self.round_trip() or (time.monotonic() - start_s, "request round trip")
        return self.info_from_dict(data, rtt_s * 1000, source)

    def info_from_dict(self, data: Any, rtt_ms: float, rtt_source: str = FIRST_BYTE) -> DatasetInfo:
        """Validate the info document; ProtocolError when it is malformed."""
        try:
            sample = SampleProfile(
                {int(k): float(v) for k, v in data["sample"].items()}, int(data["total_bytes"])
            )
            return DatasetInfo(
                name=str(data["name"]),
                manifest_id=str(data["manifest_id"]),
                total_bytes=int(data["total_bytes"]),
                files=int(data["files"]),
                chunks=int(data["chunks"]),
                sample=sample,
                server_cpu=cpu_profile_from_dict(data["cpu"]),
                congestion_control=data.get("congestion_control"),
                rtt_ms=rtt_ms,
                rtt_source=rtt_source,
                stream_levels=data.get("stream_levels") is True,
                chunk_parts=_chunk_parts(data.get("chunk_parts")),
                stream_context=data.get("stream_context") is True,
                stream_bundles=data.get("stream_bundles") is True,
                stream_lead=data.get("stream_lead") is True,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"{self.url}: malformed dataset info: {exc}") from exc

    def manifest_limit_bytes(self) -> int:
        """The largest manifest body this client reads."""
        entries = self.options.max_manifest_entries
        return MAX_MANIFEST_BYTES * entries // MAX_MANIFEST_ENTRIES

    def manifest_from_doc(self, doc: Any) -> Manifest:
        """Validate a manifest document, its entry count and its chunk sizes included."""
        with gc_paused():
            manifest = manifest_from_dict(doc)
        check_manifest_bounds(manifest, self.options.max_manifest_entries)
        return manifest

    async def fetch_manifest(self, conditional: bool = True) -> Manifest:
        """The dataset's manifest, asked for as zstd and decoded into at most
        `manifest_limit_bytes` (see `netopt.dataplane.manifestwire`); BodyTooLarge over
        the bounds of `netopt.dataplane.limits`, ProtocolError for a body that is not
        a manifest in plain JSON or one zstd frame of it. With ``conditional`` and
        `ClientOptions.known_manifests`, names the versions held; when the server
        answers that one is current, that one is read back (`known_manifest`)."""
        path = f"/v1/datasets/{self.url.name}/manifest"
        limit = self.manifest_limit_bytes()
        headers: CIMultiDict[str] = CIMultiDict()
        asked = dict(_ACCEPT_ZSTD)
        known = self.options.known_manifests
        naming = if_none_match(known.ids) if known is not None and conditional else None
        if naming is not None:
            asked["If-None-Match"] = naming
        try:
            body, _ = await self._get(path, limit, headers_out=headers, headers=asked)
        except _NotModifiedAnswer as answer:
            where = f"{self.url} ({self.url.base}{path})"
            try:
                manifest_id = not_modified_id(answer.etag, known.ids if known else ())
            except ProtocolError as exc:
                raise ProtocolError(f"{where}: {exc}") from None
            return await self.known_manifest(NotModified(manifest_id))
        encoding = ", ".join(headers.getall("Content-Encoding", ())) or None
        where = f"{self.url} ({self.url.base}{path})"
        if encoding is None:
            raw: bytes | bytearray = body
        else:
            raw = await asyncio.to_thread(decode_manifest_body, body, encoding, limit, where)
        check_manifest_shape(raw, self.options.max_manifest_entries)
        return self.manifest_from_doc(self.loads(raw, path))

    async def known_manifest(self, answer: NotModified) -> Manifest:
        """The held version a 304 named (`ClientOptions.known_manifests`), checked as a
        fetched one is; fetched after all (unconditionally) when it cannot be read back
        (removed or changed since it was named)."""
        known = self.options.known_manifests
        held = None if known is None else await asyncio.to_thread(known.load, answer.manifest_id)
        if held is None:
            trace.count("manifest_not_modified_unreadable")
            return await self.fetch_manifest(conditional=False)
        check_manifest_bounds(held, self.options.max_manifest_entries)
        trace.count("manifest_not_modified")
        return held

    async def fetch_chunk(self, chunk_id: str, length_bytes: int) -> RawChunk:
        self._other_routes = True
        path = f"/v1/datasets/{self.url.name}/chunks/{chunk_id}"
        params = {"level": str(self.zstd_level or 0)}
        body, codec = await self._get(path, max_frame_bytes(length_bytes), params)
        if codec not in ("zstd", "identity"):
            raise ProtocolError(f"{self.url}: unknown chunk codec {codec!r}")
        return RawChunk(bytes(body), cast(Codec, codec), len(body))

    async def fetch_chunk_parts(
        self,
        chunk_id: str,
        length_bytes: int,
        parts: int,
        on_read: Callable[[int], None] | None = None,
    ) -> RawChunk:
        """``chunk_id`` fetched as ``parts`` slices in parallel (one request each over the
        pool's connections, the warm ones first), decoded and joined: unverified, as
        `fetch_chunk`'s. For a sync of fewer chunks than streams: each connection's slow
        start then carries a slice, not one connection the whole chunk. A part that is
        late against the others (a lost packet) is asked again (`gather_hedged`).

        Each part's response names the version current after its read (`VERSION_HEADER`),
        counted as a stream's end frame is (see `version_at_end`). ``on_read`` is told each
        piece of a body read, also of copies cut or failed. IntegrityError for a part that
        does not decode to its length; what `fetch_chunk` raises.
        """
        if not 1 < parts <= min(self.chunk_parts, MAX_CHUNK_PARTS):
            raise ValueError(f"{parts} parts: the server cuts a chunk into 2..{self.chunk_parts}")
        path = f"/v1/datasets/{self.url.name}/chunks/{chunk_id}"
        level = str(self.zstd_level or 0)
        trace.mark("first_request")
        read_bytes = 0  # by every copy of every part: a copy cut late read some too

        def read(n_bytes: int) -> None:
            nonlocal read_bytes
            read_bytes += n_bytes
            if on_read is not None:
                on_read(n_bytes)

        async def one(part: int) -> tuple[RawChunk, str | None]:
            start, end = part_bounds(length_bytes, part, parts)
            params = {"level": level, "part": str(part), "parts": str(parts)}
            headers: dict[str, str] = {}
            body, codec = await self._get(
                path, max_frame_bytes(end - start), params, headers, on_read=read
            )
            trace.mark("first_byte")
            if codec not in ("zstd", "identity"):
                raise ProtocolError(f"{self.url}: unknown chunk codec {codec!r}")
            return RawChunk(bytes(body), cast(Codec, codec), len(body)), headers.get(VERSION_HEADER)

        # A late part is asked again (`gather_hedged`: timed by the answers alone, so
        # decoded after); a part whose every copy failed fails the chunk, which is then
        # asked again whole.
        results = await gather_hedged(parts, one)
        trace.mark_last("last_byte")
        # Every part arrived: their versions count as streams' ends would.
        self._stream_versions.extend(version for _, version in results)

        def decoded(part: int, raw: RawChunk) -> bytes:
            start, end = part_bounds(length_bytes, part, parts)
            return decode_part(raw, chunk_id, end - start)

        pieces = await asyncio.gather(
            *(asyncio.to_thread(decoded, part, raw) for part, (raw, _) in enumerate(results))
        )
        data = b"".join(pieces)
        # The chunk's wire bytes: what every copy read, the copies cut included.
        hedged_bytes = read_bytes - sum(raw.wire_bytes for raw, _ in results)
        if hedged_bytes:
            trace.count("chunk_part_hedge_bytes", hedged_bytes)
        return RawChunk(data, "identity", read_bytes)


def stream_versions_at_end(named: Sequence[str | None]) -> str | None:
    """The version the server named after every chunk read, from the versions each
    stream (or chunk part) that delivered chunks named at its end (None: cut, broken,
    or an older server): that version when every one named the same; else None
    (nothing fetched, one cut or broken, two versions), and the sync asks. A stream cut
    in the tail is not covered by another's end: the server may have read its last
    chunks after that end frame was made (it reads a stream's chunks as its socket
    drains)."""
    if not named or None in named:
        return None
    return named[0] if len(set(named)) == 1 else None


def _closed_unanswered(exc: BaseException, *, first: bool) -> bool:
    """True when the server closed the connection without an answer: a disconnect, or,
    before the source's first answer, a reset (a TLS 1.3 server refusing a missing client
    certificate closes after the handshake; when the request was already sent, its close
    is a reset, which may overtake its alert)."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    return (
        first
        and isinstance(exc, aiohttp.ClientOSError)
        and not isinstance(exc, aiohttp.ClientConnectorError)
        and exc.errno == errno.ECONNRESET
    )


def _chunk_parts(value: object) -> int:
    """The info's ``chunk_parts``: a count within `MAX_CHUNK_PARTS`, else 0 (not offered)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 1:
        return min(value, MAX_CHUNK_PARTS)
    return 0


class _LevelledStream(HttpChunkStream):
    """A chunk stream whose names carry the source's current level when it differs from
    the one the stream opened with, and whose frames feed the source's adapter."""

    def __init__(self, source: HttpChunkSource, *args: Any) -> None:
        super().__init__(*args)
        self._source = source
        self._opened_level = source.zstd_level or 0

    def ask(self, chunk_id: str, length_bytes: int) -> None:
        # Looked at per name: a lead's stream opens before the adapter exists.
        per_line = self._source.adapter is not None
        level = (self._source.zstd_level or 0) if per_line else self._opened_level
        self._source.asked(chunk_id, level)
        if level == self._opened_level:
            super().ask(chunk_id, length_bytes)
            return
        self._put_name(chunk_id, length_bytes, b"%s %d\n" % (chunk_id.encode("ascii"), level))

    async def next(self, chunk_id: str, length_bytes: int) -> RawChunk:
        raw = await super().next(chunk_id, length_bytes)
        self._arrived(chunk_id, raw, length_bytes)
        return raw

    def _arrived(self, chunk_id: str, raw: RawChunk, length_bytes: int) -> None:
        """Feed the adapter, but not with a lead's frames: they were asked for before the
        level was planned, and most were read ahead in a burst (not at the link's pace)."""
        if self.frames_read > self.lead_chunks:
            self._source.arrived(chunk_id, raw, length_bytes)

    def _hold_stalls(self, resp: aiohttp.ClientResponse) -> None:
        watch_stalls(resp, None)

    def _watch_again(self, resp: aiohttp.ClientResponse) -> None:
        self._source._watch_stalls(resp)

    def may_be_cut(self) -> None:
        """The chunk this stream waits for was asked for elsewhere too (see
        `HttpChunkSource.may_be_cut`)."""
        self._source.may_be_cut(self)

    def end_is_late(self) -> asyncio.Future[str | None] | None:
        """Its end frame is late: the version asked for after its last frame stands in
        (`HttpChunkSource.version_check_after`)."""
        trace.count("stream_ends_late")
        return self._source.version_check_after(self)

    def next_buffered(self, chunk_id: str, length_bytes: int) -> RawChunk | None:
        raw = super().next_buffered(chunk_id, length_bytes)
        if raw is not None:
            self._arrived(chunk_id, raw, length_bytes)
        return raw

    async def aclose(self, *, complete: bool = True) -> None:
        try:
            await super().aclose(complete=complete)
        finally:
            self._source.stream_closed(self)
