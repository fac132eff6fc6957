"""The data-plane server: a dataset's manifest and its content-addressed chunks over HTTP.

Routes (all under ``/v1``; every dataset route needs ``Authorization: Bearer
TOKEN`` unless the server was started without a token):

    GET /v1/health                              {"ok": true}
    GET /v1/datasets/{name}                     info: size, counts, sample and codec profile
    GET /v1/datasets/{name}/manifest            the manifest (canonical JSON; one zstd frame,
                                                Content-Encoding: zstd, when the request's
                                                Accept-Encoding names zstd; ETag: its id)
    GET /v1/datasets/{name}/chunks/{id}?level=N one chunk, zstd level N (0: raw)
    POST /v1/datasets/{name}/batch?level=N      body {"chunks": [id, ...]}: a stream of
                                                frames (`chunkio.FRAME_HEADER` + payload)
    POST /v1/datasets/{name}/stream?level=N     body: chunk names, one per line, sent
         [&ctx=1[&bundle=1]]                    while the frames come back (full duplex);
                                                ctx=1: the stream's chunks share one zstd
                                                context (`netopt.dataplane.streamctx`);
                                                bundle=1: small chunks ready together
                                                leave as one frame, flushed once

The batch route keeps a connection busy for many chunks (no idle round trip
between them, no slow-start restart), and compresses the next few chunks while
the current one is being sent. The stream route goes further: one request per
connection for a whole sync, the client naming each next chunk while earlier
ones are still arriving, so a connection never idles between batches and the
client can hand the last chunks to whichever connection is free.

A chunk response carries ``X-Netopt-Codec: zstd|identity``. Chunks are found
through an index built from the manifest, never from a path in the request, and
names are checked before lookup, so a request cannot reach outside the dataset.
Reading, hashing and compressing run in a thread pool sized to the cores.

This module assembles the app (`create_app`, `add_dataplane`: the route table, the
thread pool) and starts it (`start_server`). The handlers and the app state are in
`netopt.dataplane.handlers`, dataset loading in `netopt.dataplane.served`; their public
names are re-exported here.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from netopt.dataplane.batchrun import ThreadBatcher
from netopt.dataplane.handlers import (
    BATCHER,
    CPU,
    DATASETS,
    EXECUTOR,
    LOOKUP,
    MANIFESTS,
    PART_CACHE,
    SETTINGS,
    STATS,
    ServeSettings,
    ServeStats,
    auth_middleware,
    dataset_batch,
    dataset_chunk,
    dataset_info,
    dataset_lookup,
    dataset_manifest,
    dataset_stream,
    health,
)
from netopt.dataplane.manifestcache import DATASETS_KEPT, EncodedManifest, ManifestEncodings
from netopt.dataplane.partcache import PartCache
from netopt.dataplane.served import DatasetView, ServedDataset, load_dataset
from netopt.dataplane.sockets import try_congestion_control
from netopt.errors import ValidationError
from netopt.transfer.planner import CpuProfile
from netopt.webshell import ListenerLimits, RequestObserver, service_shell, start_site

__all__ = [
    "DATASETS",
    "MAX_REQUEST_BYTES",
    "STATS",
    "DatasetView",
    "ServeSettings",
    "ServeStats",
    "ServedDataset",
    "add_dataplane",
    "auth_middleware",
    "create_app",
    "load_dataset",
    "start_server",
]

MAX_REQUEST_BYTES = 1024**2
"""A request body's limit (a batch names at most a few thousand chunks; aiohttp's default)."""


async def _executor_ctx(app: web.Application) -> AsyncIterator[None]:
    workers = max(1, app[SETTINGS].worker_threads)
    executor = ThreadPoolExecutor(max_workers=workers)
    app[EXECUTOR] = executor
    app[BATCHER] = ThreadBatcher(executor, workers)
    yield
    executor.shutdown(wait=True, cancel_futures=True)


def add_dataplane(
    app: web.Application,
    settings: ServeSettings,
    datasets: Mapping[str, DatasetView],
    cpu_profile: CpuProfile,
    stats: ServeStats | None = None,
) -> None:
    """Add the data-plane routes to ``app`` (whose middlewares must include
    `auth_middleware`); the agent serves its cache to peers this way."""
    app[SETTINGS] = settings
    app[DATASETS] = datasets
    app[LOOKUP] = dataset_lookup(datasets)
    app[CPU] = cpu_profile
    app[STATS] = stats or ServeStats()
    app[MANIFESTS] = ManifestEncodings()
    app[PART_CACHE] = PartCache()
    app.cleanup_ctx.append(_executor_ctx)
    app.add_routes(
        [
            web.get("/v1/health", health),
            web.get("/v1/datasets/{name}", dataset_info),
            web.get("/v1/datasets/{name}/manifest", dataset_manifest),
            web.get("/v1/datasets/{name}/chunks/{chunk_id}", dataset_chunk),
            web.post("/v1/datasets/{name}/batch", dataset_batch),
            web.post("/v1/datasets/{name}/stream", dataset_stream),
        ]
    )


async def _encode_ahead_ctx(app: web.Application) -> AsyncIterator[None]:
    """Encode each served dataset's manifest as the server starts (`MANIFESTS`, in the
    pool), so the first client's manifest request does not wait for it (a 100k-file
    tree: about 2 s of the server's CPU, paid while that client waited)."""
    loop = asyncio.get_running_loop()
    executor = app[EXECUTOR]
    encodings = app[MANIFESTS]
    started: list[asyncio.Future[EncodedManifest]] = []
    for name, found in list(app[DATASETS].items())[:DATASETS_KEPT]:
        future = asyncio.ensure_future(
            encodings.get(name, found.manifest, lambda fn: loop.run_in_executor(executor, fn))
        )
        # A failure is the first request's to report (it encodes again); none is lost.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        started.append(future)
    yield
    for encoding in started:
        encoding.cancel()


def create_app(
    settings: ServeSettings,
    datasets: Mapping[str, DatasetView],
    cpu_profile: CpuProfile,
    stats: ServeStats | None = None,
    observer: RequestObserver | None = None,
) -> web.Application:
    """The data-plane application serving ``datasets`` (name -> dataset); ``observer``
    counts its requests (`netopt.dataplane.servemetrics`).

    ``datasets`` is kept as given, so a live mapping (an agent's cache) serves
    datasets that appear after the start.
    """
    shell = service_shell("data plane", max_request_bytes=MAX_REQUEST_BYTES, observer=observer)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[shell, auth_middleware])
    add_dataplane(app, settings, datasets, cpu_profile, stats)
    app.cleanup_ctx.append(_encode_ahead_ctx)  # after the executor's: it needs the pool
    return app


def _listen_socket(host: str, port: int, congestion_control: str | None) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if congestion_control is not None:
            # Accepted sockets inherit a congestion control set on the listener; the
            # server is the sender, so its choice is the one that matters.
            try_congestion_control(sock, congestion_control)
        sock.bind((host, port))
        sock.listen(256)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def start_server(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    limits: ListenerLimits | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``host:port`` (0: any free port) under ``limits`` (default: the
    `ListenerLimits` defaults), over TLS with ``ssl_context``; return the runner and the port.

    Raises ValidationError (exit code 2) when the address cannot be bound.
    """
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    try:
        sock = _listen_socket(host, port, app[SETTINGS].congestion_control)
    except OSError as exc:
        await runner.cleanup()
        raise ValidationError(f"cannot listen on {host}:{port}: {exc}") from exc
    await start_site(
        runner,
        limits,
        sock=sock,
        access_log=logging.getLogger("aiohttp.access"),
        ssl_context=ssl_context,
    )
    bound_port: int = sock.getsockname()[1]
    return runner, bound_port
