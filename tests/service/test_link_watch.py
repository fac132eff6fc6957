"""The link watch on real sockets: probes until the server accepts, then drops the
handshakes sent into the outage and keeps the connections that owe nothing (the web
engine's rule, `weblink.silent`, drops those too); a sync through a proxy that goes
dark and comes back notices the return, from a netopt server and from a web origin;
a slow web origin is probed once and waited for.

A real cut (packets lost, TCP's timers backing off, a connection's sent bytes left
unacknowledged) needs network namespaces: `tests/lab/test_sync_recovery_lab.py` and
the lab's fault campaign (`scripts/fault_campaign.py --only link-cut`) cut the lab's
border link, and the test checks that connections were dropped at the return. Here the "server"
is a port that refuses until a listener appears, and a proxy that goes dark (it stops
listening and forwarding) and comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from dataplane_helpers import (
    CPU,
    TOKEN,
    Proxy,
    check_tree,
    make_dataset,
    serve_with_middleware,
    start,
)

import netopt.cache.httpdir as httpdir
import netopt.cache.weblink as weblink
import netopt.dataplane.linkwatch as linkwatch
from netopt.cache.syncer import run_sync
from netopt.dataplane.client import ClientOptions, sync_url
from netopt.dataplane.linkwatch import MAX_PROBES, LinkWatch, TrackedSockets
from netopt.dataplane.sync import SyncOptions
from netopt.errors import NetworkError
from netopt.tcpinfo import TCP_ESTABLISHED, read_tcp_info
from tests.service.cache_helpers import listing_page, tree, web_origin
from tests.service.cache_helpers import request as web_request
from tests.service.coordinator_helpers import free_port

WAIT_BOUND_S = 10.0
"""Not a speed bound: how long a test waits for what must happen before it fails."""


async def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_BOUND_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _connected_pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setblocking(False)
    await loop.sock_connect(client, listener.getsockname())
    peer, _ = await loop.sock_accept(listener)
    return client, peer


async def _stuck_in_handshake(loop: asyncio.AbstractEventLoop) -> tuple[
    socket.socket, asyncio.Future[None], list[socket.socket]
]:  # fmt: skip
    """A socket whose SYN goes unanswered: a listener with a full backlog that never
    accepts drops further SYNs, as a cut link loses them."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    held = [full]
    for _ in range(8):
        sock = socket.socket()
        sock.setblocking(False)
        connecting = asyncio.ensure_future(loop.sock_connect(sock, full.getsockname()))
        await asyncio.sleep(0.05)
        held.append(sock)
        if not connecting.done() and read_tcp_info(sock).state != TCP_ESTABLISHED:
            return sock, connecting, held
    raise AssertionError("every connect to the full listener completed")


async def test_the_watch_probes_until_the_server_accepts_then_drops_the_dead() -> None:
    loop = asyncio.get_running_loop()
    server_port = free_port()  # nothing listens yet: refused, like a server restarting
    peers = socket.socket()
    peers.bind(("127.0.0.1", 0))
    peers.listen(8)
    peers.setblocking(False)
    tracked = TrackedSockets()
    watch = LinkWatch("127.0.0.1", server_port, tracked, lambda: None)
    accepted: list[socket.socket] = []
    listener: asyncio.Server | None = None
    feeding: asyncio.Task[None] | None = None
    idle, idle_peer = await _connected_pair(peers)
    busy, busy_peer = await _connected_pair(peers)
    syn, connecting, held = await _stuck_in_handshake(loop)
    for sock in (idle, busy, syn):
        tracked.add(sock)

    async def feed() -> None:  # the busy connection hears from its peer all along
        while True:
            await loop.sock_sendall(busy_peer, b"x")
            await asyncio.sleep(0.02)

    try:
        feeding = asyncio.ensure_future(feed())
        await asyncio.sleep(0.6)  # idle hears nothing from here on
        watch.failed(quiet_s=0.3)
        await asyncio.sleep(0.8)
        assert watch.probing  # refused: still probing
        assert watch.returns == 0
        assert idle.fileno() >= 0  # nothing dropped yet
        assert not connecting.done()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        listener = await asyncio.start_server(on_connect, "127.0.0.1", server_port)
        await _until(lambda: watch.returns == 1, "the watch to notice the server")
        assert not watch.probing
        assert watch.dropped == 1
        # The handshake stuck since before the probe fails now, not on the kernel's timer.
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(connecting, WAIT_BOUND_S)
        # The connection that kept hearing from its peer is kept, and so is the quiet one
        # that owes nothing (idle in a pool): both still carry data.
        assert read_tcp_info(busy).state == TCP_ESTABLISHED
        busy.setblocking(False)
        assert await asyncio.wait_for(loop.sock_recv(busy, 10), WAIT_BOUND_S)
        await loop.sock_sendall(idle_peer, b"still here")
        assert await asyncio.wait_for(loop.sock_recv(idle, 10), WAIT_BOUND_S) == b"still here"
        # A later failure watches again; the server answers the first probe: it was never
        # out of reach, so nothing returned and nothing is dropped.
        watch.failed(quiet_s=0.3)
        assert watch.probing
        await _until(lambda: not watch.probing, "the watch to end")
        assert watch.returns == 1
        assert watch.dropped == 1
    finally:
        await watch.close()
        if feeding is not None:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
        if listener is not None:
            listener.close()
        connecting.cancel()
        for sock in (idle, idle_peer, busy, busy_peer, syn, peers, *held, *accepted):
            sock.close()


async def test_probes_are_paced_bounded_and_end_with_the_watch(monkeypatch) -> None:
    """Above the I/O edge: probes that never connect (a link that stays cut)."""
    started: list[float] = []
    cancelled: list[float] = []

    async def never_connects(self: LinkWatch) -> bool:
        started.append(time.monotonic())
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(time.monotonic())
            raise
        return False

    monkeypatch.setattr(LinkWatch, "_connect_once", never_connects)
    watch = LinkWatch("127.0.0.1", 9, TrackedSockets(), lambda: None)
    watch.failed(quiet_s=2.0)
    watch.failed(quiet_s=2.0)  # a second failure does not start a second prober
    await asyncio.sleep(1.1)
    # One every PROBE_EVERY_S (0.25 s): at 0, 0.25, ..., 1.0 s.
    assert 4 <= len(started) <= 5
    gaps = [b - a for a, b in itertools.pairwise(started)]
    assert min(gaps) >= linkwatch.PROBE_EVERY_S * 0.9
    # However long the cut, at most MAX_PROBES wait at once.
    monkeypatch.setattr(linkwatch, "PROBE_EVERY_S", 0.005)
    await asyncio.sleep(0.3)
    assert len(started) == MAX_PROBES
    await watch.close()
    assert len(cancelled) == MAX_PROBES
    assert not watch.probing
    assert watch.returns == 0


async def test_refused_probes_do_not_spin(monkeypatch) -> None:
    """A server that refuses at once (restarting) is probed every PROBE_EVERY_S, no faster."""
    started: list[float] = []

    async def refused(self: LinkWatch) -> bool:
        started.append(time.monotonic())
        return False

    monkeypatch.setattr(LinkWatch, "_connect_once", refused)
    watch = LinkWatch("127.0.0.1", 9, TrackedSockets(), lambda: None)
    watch.failed(quiet_s=2.0)
    await asyncio.sleep(0.6)
    await watch.close()
    assert 2 <= len(started) <= 3


async def test_a_sync_through_a_proxy_that_goes_dark_notices_its_return(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    runner, port, _, _ = await start(tmp_path / "src")
    proxy = Proxy(port)
    await proxy.start()
    # 4 Mbit/s: the 1.3 MB dataset takes ~2 s, so the proxy goes dark mid-transfer.
    client = ClientOptions(
        token=TOKEN, connect_timeout_s=2, read_timeout_s=5, stall_timeout_s=0.4,
        rate_limit_bps=4e6,
    )  # fmt: skip
    options = SyncOptions(retry_window_s=30, backoff_initial_s=0.2, backoff_max_s=1.0)
    syncing = asyncio.ensure_future(sync_url(
        f"netopt://127.0.0.1:{proxy.port}/ds", tmp_path / "dst", client, client_cpu=CPU,
        sync_options=options, streams=4, zstd_level=0,
    ))  # fmt: skip
    try:
        await _until(lambda: proxy.sent_to_clients > 300_000 or syncing.done(), "300 kB")
        assert not syncing.done()
        proxy.go_dark()
        await asyncio.sleep(1.5)
        assert not syncing.done()
        await proxy.come_back()
        summary, _ = await asyncio.wait_for(syncing, 60)
        check_tree(tmp_path / "dst", files)
        assert summary.chunk_retries >= 1  # the dark proxy broke streams
        assert summary.link_returns >= 1  # and the sync noticed it answer again
        assert summary.to_dict()["link_returns"] == summary.link_returns
    finally:
        syncing.cancel()
        await asyncio.gather(syncing, return_exceptions=True)
        await proxy.close()
        await runner.cleanup()


async def test_a_server_that_accepts_and_fails_every_stream_is_not_asked_in_a_loop(
    tmp_path: Path,
) -> None:
    """Its port answers every probe at once: no outage, so the workers keep their
    backoff (a return would have them ask again at once, thousands of times a second)."""
    make_dataset(tmp_path / "src")
    streams_asked = [0]

    @web.middleware
    async def fail_streams(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.endswith("/stream") or "/chunks" in request.path:
            streams_asked[0] += 1
            assert request.transport is not None
            request.transport.close()  # the connection ends without an answer
            raise web.HTTPServiceUnavailable()
        return await handler(request)

    runner, port, _ = await serve_with_middleware(tmp_path / "src", fail_streams)
    client = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=5)
    options = SyncOptions(retry_window_s=1.5, backoff_initial_s=0.2, backoff_max_s=1.0)
    try:
        with pytest.raises(NetworkError):
            await asyncio.wait_for(sync_url(
                f"netopt://127.0.0.1:{port}/ds", tmp_path / "dst", client, client_cpu=CPU,
                sync_options=options, streams=2, zstd_level=0,
            ), 60)  # fmt: skip
    finally:
        await runner.cleanup()
    # 2 workers backing off 0.1-0.2 s, then doubling, for the 1.5 s window: about ten
    # requests (9 here). Had the first probe's connect ended their backoff, each would
    # ask again at its next look at the queue (every 50 ms): 60.
    assert 2 <= streams_asked[0] <= 30


async def test_a_stream_whose_answer_never_comes_is_a_stall(tmp_path: Path) -> None:
    """A stream asked for as a link is cut waits for headers that do not come: bounded by
    the stall timeout, not the session's read timeout (30 s here), so the sync asks
    again (and its link watch starts) within the window."""
    make_dataset(tmp_path / "src")
    streams_asked = [0]
    released = asyncio.Event()

    @web.middleware
    async def never_answer_streams(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.endswith("/stream"):
            streams_asked[0] += 1
            await released.wait()  # until the test ends
            raise web.HTTPServiceUnavailable()
        return await handler(request)

    runner, port, _ = await serve_with_middleware(tmp_path / "src", never_answer_streams)
    client = ClientOptions(token=TOKEN, read_timeout_s=30, stall_timeout_s=0.4)
    options = SyncOptions(retry_window_s=1.5, backoff_initial_s=0.05, backoff_max_s=0.1)
    started_s = time.monotonic()
    try:
        with pytest.raises(NetworkError, match="retry window"):
            await asyncio.wait_for(sync_url(
                f"netopt://127.0.0.1:{port}/ds", tmp_path / "dst", client, client_cpu=CPU,
                sync_options=options, streams=2, zstd_level=0,
            ), WAIT_BOUND_S)  # fmt: skip
        failed_after_s = time.monotonic() - started_s
    finally:
        released.set()
        await runner.cleanup()
    assert failed_after_s < client.read_timeout_s
    assert streams_asked[0] >= 4  # each stream given up after 0.4 s and asked again


async def test_wait_return_wakes_at_the_return_and_times_out_without_one() -> None:
    """`LinkWatch.wait_return`: a waiter is woken by the return itself (well before its
    timeout), and one with no return comes back False at its timeout."""
    server_port = free_port()
    watch = LinkWatch("127.0.0.1", server_port, TrackedSockets(), lambda: None)
    listener: asyncio.Server | None = None
    try:
        assert not await watch.wait_return(0, 0.05)  # nothing failed: no return
        watch.failed(quiet_s=0.3)
        waiting = asyncio.ensure_future(watch.wait_return(0, 3 * WAIT_BOUND_S))
        await asyncio.sleep(0.6)  # refused probes: no return yet
        assert not waiting.done()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        listener = await asyncio.start_server(on_connect, "127.0.0.1", server_port)
        assert await asyncio.wait_for(waiting, WAIT_BOUND_S)
        assert watch.returns == 1
        assert await watch.wait_return(0, 0.05)  # a return already past: at once
    finally:
        await watch.close()
        if listener is not None:
            listener.close()


@pytest.fixture
def web_links(monkeypatch: pytest.MonkeyPatch) -> list[weblink.WebLink]:
    """The `WebLink` of each web sync the test runs (the real one, kept for its counts)."""
    links: list[weblink.WebLink] = []

    class SeenWebLink(weblink.WebLink):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            links.append(self)

    monkeypatch.setattr(httpdir, "WebLink", SeenWebLink)
    return links


async def test_a_web_sync_through_a_proxy_that_goes_dark_notices_its_return(
    tmp_path: Path, web_links: list[weblink.WebLink]
) -> None:
    """A web origin's sync (`netopt.cache.weblink`) of a large file and `WEB_SMALL_FILES`
    small ones through a proxy that goes dark with many answers in flight: the stalled
    answers are dropped, their retries refused, the watch sees the proxy answer again,
    every file ends byte for byte, and the large one is resumed, not fetched again
    whole."""
    files = {"data.bin": os.urandom(WEB_FILE_BYTES)}
    files.update({f"s{i:03d}.bin": os.urandom(20_000 + 997 * i) for i in range(WEB_SMALL_FILES)})
    ranges: list[str | None] = []

    async def listing(request: web.Request) -> web.Response:
        return listing_page(files)

    async def file(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        data = files[name]
        asked = request.headers.get("Range")
        if name == "data.bin":
            ranges.append(asked)
        start = int(asked.removeprefix("bytes=").split("-")[0]) if asked else 0
        headers = {"ETag": '"v1"'}  # no Accept-Ranges: one GET, not parts
        if asked:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        resp = web.StreamResponse(status=206 if asked else 200, headers=headers)
        resp.content_length = len(data) - start
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            # ~5 MB/s an answer: many answers in flight at the cut, the large one mid-file
            for at in range(start, len(data), WEB_PIECE_BYTES):
                await resp.write(data[at : at + WEB_PIECE_BYTES])
                await asyncio.sleep(0.01)
            await resp.write_eof()
        return resp

    async with web_origin(listing, file) as url:
        proxy = Proxy(int(url.split(":")[2].split("/")[0]))
        await proxy.start()
        options = SyncOptions(retry_window_s=30, backoff_initial_s=0.2, backoff_max_s=1.0)
        via = f"http://127.0.0.1:{proxy.port}/ds/"
        syncing = asyncio.ensure_future(
            run_sync(web_request(via, tmp_path / "dst", tmp_path / "cache", sync_options=options))
        )
        try:
            await _until(lambda: proxy.sent_to_clients > 3_000_000 or syncing.done(), "3 MB")
            assert not syncing.done()
            proxy.go_dark()
            await asyncio.sleep(3.0)  # past the stall timeout (2 s on loopback)
            assert not syncing.done()
            await proxy.come_back()
            await asyncio.wait_for(syncing, WAIT_BOUND_S * 3)
        finally:
            syncing.cancel()
            await asyncio.gather(syncing, return_exceptions=True)
            await proxy.close()
    assert tree(tmp_path / "dst") == files
    (link,) = web_links
    assert link.retries > 1  # the stalled answers failed and were asked again
    assert link.watch.returns >= 1  # the watch saw the proxy answer again
    assert ranges[0] is None
    resumed = [int(a.removeprefix("bytes=").removesuffix("-")) for a in ranges[1:] if a]
    assert resumed
    assert 0 < resumed[-1] < WEB_FILE_BYTES  # resumed mid-file, not fetched again whole


WEB_FILE_BYTES = 12 << 20
WEB_SMALL_FILES = 400
"""More than the connections a web origin gets at once (128): some wait, some are in
flight at the cut."""
WEB_PIECE_BYTES = 64 << 10


async def test_the_web_rule_drops_a_quiet_connection_that_owes_nothing_at_the_return() -> None:
    """`weblink.silent` at a real return: a connection waiting for an answer that the
    outage holds (it owes nothing, hears nothing) is shut down, where `unheard` keeps
    it; one that kept hearing from its peer is kept."""
    loop = asyncio.get_running_loop()
    server_port = free_port()
    peers = socket.socket()
    peers.bind(("127.0.0.1", 0))
    peers.listen(8)
    peers.setblocking(False)
    tracked = TrackedSockets()
    watch = LinkWatch("127.0.0.1", server_port, tracked, lambda: None, weblink.silent)
    waiting, waiting_peer = await _connected_pair(peers)
    busy, busy_peer = await _connected_pair(peers)
    for sock in (waiting, busy):
        tracked.add(sock)
    listener: asyncio.Server | None = None

    async def feed() -> None:
        while True:
            await loop.sock_sendall(busy_peer, b"x")
            await asyncio.sleep(0.02)

    feeding = asyncio.ensure_future(feed())
    try:
        await asyncio.sleep(0.2)  # the waiting one has been quiet since before the suspicion
        watch.failed(quiet_s=0.0)  # an answer late to begin: suspect from now
        await asyncio.sleep(0.6)  # refused probes; the waiting one hears nothing

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        listener = await asyncio.start_server(on_connect, "127.0.0.1", server_port)
        assert await watch.wait_return(0, WAIT_BOUND_S)
        assert watch.dropped == 1
        assert await asyncio.wait_for(loop.sock_recv(waiting, 10), WAIT_BOUND_S) == b""
        assert read_tcp_info(busy).state == TCP_ESTABLISHED
        busy.setblocking(False)
        assert await asyncio.wait_for(loop.sock_recv(busy, 10), WAIT_BOUND_S)
    finally:
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
        await watch.close()
        if listener is not None:
            listener.close()
        for sock in (waiting, waiting_peer, busy, busy_peer, peers):
            sock.close()


async def test_a_slow_web_origin_is_probed_once_and_waited_for_not_asked_again(
    tmp_path: Path, web_links: list[weblink.WebLink]
) -> None:
    """An answer that begins only after the stall timeout (2 s on loopback) has the
    watch probe; the origin answers the probe at once (never out of reach), so nothing
    is dropped and the request is not asked again: its late answer is the one used."""
    data = os.urandom(100_000)
    gets = 0

    async def listing(request: web.Request) -> web.Response:
        return listing_page(["data.bin"])

    async def file(request: web.Request) -> web.StreamResponse:
        nonlocal gets
        gets += 1
        await asyncio.sleep(SLOW_ORIGIN_S)  # a slow origin: its answer begins late
        return web.Response(body=data, headers={"ETag": '"v1"'})

    async with web_origin(listing, file) as url:
        options = SyncOptions(retry_window_s=30, backoff_initial_s=0.2, backoff_max_s=1.0)
        await run_sync(web_request(url, tmp_path / "dst", tmp_path / "cache", sync_options=options))
    assert (tmp_path / "dst" / "data.bin").read_bytes() == data
    (link,) = web_links
    assert link.suspicions == 1
    assert link.watch.returns == 0
    assert link.watch.dropped == 0
    assert link.retries == 0
    assert gets == 1


SLOW_ORIGIN_S = 3.0
"""Past the stall timeout on loopback (`STALL_MIN_S`, 2 s)."""
