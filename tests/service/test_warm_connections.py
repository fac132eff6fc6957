"""A source's warm-up opens its connections (TCP, then TLS) without a request and leaves
them idle in its pool, so the first chunk requests find them open a round trip sooner
than a health request per connection allowed; one whose handshake is late holds nothing
up and joins the pool when it opens. A real TLS data plane on loopback, behind a real TCP
relay that holds one connection's handshake back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from netopt.dataplane.httpsource import (
    ClientOptions,
    DatasetUrl,
    HttpChunkSource,
    parse_dataset_url,
)
from netopt.dataplane.server import ServeSettings, add_dataplane, load_dataset, start_server
from netopt.tlsca import issue_server_files
from netopt.tlsconf import ClientTls, ServerTls, server_context, use_client_tls
from netopt.webshell import ListenerLimits
from tests.service.dataplane_helpers import CPU, TOKEN, make_dataset

WARM = 16
HELD_S = 10.0
"""The longest the relay holds a connection back (the test releases it sooner)."""


def _url(port: int) -> DatasetUrl:
    return parse_dataset_url(f"netopt://127.0.0.1:{port}/ds")


@asynccontextmanager
async def _tls_data_plane(
    tmp_path: Path, routes: list[str], limits: ListenerLimits | None = None
) -> AsyncIterator[int]:
    """The data plane over TLS on 127.0.0.1 (under ``limits``), noting each request's
    path; its port. The client side trusts its throwaway CA for the test's context."""
    files = issue_server_files(tmp_path / "tls", "node", ips=["127.0.0.1"])
    make_dataset(tmp_path / "src")

    @web.middleware
    async def record(request: web.Request, handler: web.Handler) -> web.StreamResponse:
        routes.append(request.path)
        return await handler(request)

    app = web.Application(middlewares=[record])
    dataset = load_dataset(tmp_path / "src", "ds", 64 * 1024)
    add_dataplane(app, ServeSettings(token=TOKEN, worker_threads=2), {"ds": dataset}, CPU)
    context = server_context(ServerTls(str(files.cert), str(files.key)))
    runner, port = await start_server(app, "127.0.0.1", 0, limits, ssl_context=context)
    use_client_tls(ClientTls(ca_file=str(files.ca_cert), where="the test"))
    try:
        yield port
    finally:
        use_client_tls(ClientTls())
        await runner.cleanup()


@asynccontextmanager
async def _relay(
    upstream_port: int, held: Callable[[int], bool], release: asyncio.Event
) -> AsyncIterator[tuple[int, list[int]]]:
    """A TCP relay to ``upstream_port`` on 127.0.0.1: its port and the numbers of the
    connections it forwarded (from 1, in the order it accepted them). A connection
    ``held(number)`` is forwarded only once ``release`` is set: its TLS handshake waits,
    as one whose packet was lost does."""
    forwarded: list[int] = []
    accepted = 0
    pipes: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        writers.append(writer)
        accepted += 1
        number = accepted
        if held(number):
            await asyncio.wait_for(release.wait(), HELD_S)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        writers.append(up_writer)
        forwarded.append(number)
        for task in (pipe(reader, up_writer), pipe(up_reader, writer)):
            pipes.add(asyncio.ensure_future(task))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], forwarded
    finally:
        server.close()
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        for writer in writers:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        await server.wait_closed()


async def test_warm_connections_open_without_a_request_and_a_late_one_holds_nothing_up(
    tmp_path: Path,
) -> None:
    routes: list[str] = []
    release = asyncio.Event()
    async with (
        _tls_data_plane(tmp_path, routes) as port,
        _relay(port, lambda n: n == 2, release) as (relay_port, forwarded),
    ):
        options = ClientOptions(token=TOKEN, streams=WARM)
        async with HttpChunkSource(_url(relay_port), options) as source:
            source.start_warm_up(WARM)
            async with asyncio.timeout(5):
                ready = await source.warmed(grace_s=0.5)
            # Every connection but the held one is open, and none carried a request.
            assert ready == WARM - 1
            assert routes == []
            assert sorted(forwarded) == [n for n in range(1, WARM + 1) if n != 2]
            # A request goes over one of them: no connection is opened for it.
            info = await source.fetch_info()
            assert info.name == "ds"
            assert routes == ["/v1/datasets/ds"]
            assert len(forwarded) == WARM - 1
            # The held one opens once its handshake goes through, and joins the pool.
            release.set()
            async with asyncio.timeout(5):
                assert await source.warmed(grace_s=HELD_S) == WARM  # the warm-up's end
            assert sorted(forwarded) == list(range(1, WARM + 1))
            # WARM requests at once: each over a pooled connection, none opened anew.
            infos = await asyncio.gather(*(source.fetch_info() for _ in range(WARM)))
            assert {i.manifest_id for i in infos} == {info.manifest_id}
            assert len(forwarded) == WARM
            assert routes.count("/v1/datasets/ds") == WARM + 1


async def test_where_aiohttp_cannot_open_one_idle_a_health_request_opens_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # aiohttp's request class is aiohttp's own: a signature it no longer takes falls back
    # to the request that opened them before, and the connections still open.
    def no_such_signature(*_: object, **__: object) -> None:
        raise TypeError("unexpected keyword argument")

    monkeypatch.setattr(aiohttp, "ClientRequest", no_such_signature)
    routes: list[str] = []
    async with _tls_data_plane(tmp_path, routes) as port:
        options = ClientOptions(token=TOKEN, streams=4)
        async with HttpChunkSource(_url(port), options) as source:
            source.start_warm_up(4)
            async with asyncio.timeout(5):
                assert await source.warmed(grace_s=HELD_S) == 4
    assert routes == ["/v1/health"] * 4


async def test_warm_connections_the_server_closed_unused_are_opened_again(
    tmp_path: Path,
) -> None:
    # A server closes a connection that sends no request in time (`netopt serve` after
    # 15 s): a sync that reaches its chunks later finds its warm connections closed, and
    # its requests open new ones; none fails.
    routes: list[str] = []
    limits = ListenerLimits(header_timeout_s=0.3)
    async with (
        _tls_data_plane(tmp_path, routes, limits) as port,
        _relay(port, lambda _: False, asyncio.Event()) as (relay_port, forwarded),
    ):
        options = ClientOptions(token=TOKEN, streams=4)
        async with HttpChunkSource(_url(relay_port), options) as source:
            source.start_warm_up(4)
            async with asyncio.timeout(5):
                assert await source.warmed(grace_s=HELD_S) == 4
            assert len(forwarded) == 4
            await asyncio.sleep(1.0)  # the server's deadline passes: it closes all four
            infos = await asyncio.gather(*(source.fetch_info() for _ in range(4)))
            again = await source.fetch_info()
            # Four new connections carried the requests (the closed ones were not used).
            assert len(forwarded) == 8
    assert {i.manifest_id for i in infos} == {again.manifest_id}
    assert routes == ["/v1/datasets/ds"] * 5
