"""The server's stream route over real localhost sockets, and the client's batch fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from dataplane_helpers import CPU, FAST, TOKEN, check_tree, make_dataset

from netopt.dataplane.chunkio import decode_chunk
from netopt.dataplane.client import ClientOptions, HttpChunkSource, parse_dataset_url, sync_url
from netopt.dataplane.server import (
    ServeSettings,
    ServeStats,
    add_dataplane,
    auth_middleware,
    load_dataset,
    start_server,
)
from netopt.errors import ValidationError

CLIENT = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=5)


@web.middleware
async def _no_stream_route(request: web.Request, handler):  # type: ignore[no-untyped-def]
    if request.path.endswith("/stream"):
        raise web.HTTPNotFound()
    return await handler(request)


async def _serve(root: Path, *, with_stream: bool = True):  # type: ignore[no-untyped-def]
    dataset = load_dataset(root, "ds", 64 * 1024)
    stats = ServeStats()
    middlewares = [auth_middleware] if with_stream else [_no_stream_route, auth_middleware]
    app = web.Application(middlewares=middlewares)
    add_dataplane(app, ServeSettings(token=TOKEN, worker_threads=2), {"ds": dataset}, CPU, stats)
    runner, port = await start_server(app, "127.0.0.1", 0)
    return runner, port, stats, dataset.manifest


async def test_stream_sends_frames_in_the_order_asked(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await _serve(tmp_path / "src")
    lengths = manifest.unique_chunks()
    wanted = list(lengths)[::-1][:5]
    try:
        url = parse_dataset_url(f"netopt://127.0.0.1:{port}/ds")
        async with HttpChunkSource(url, CLIENT, zstd_level=3) as source:
            stream = source.open_stream()
            stream.ask(wanted[0], lengths[wanted[0]])
            stream.ask(wanted[1], lengths[wanted[1]])
            got = [await stream.next(wanted[0], lengths[wanted[0]])]
            for cid in wanted[2:]:  # names sent while frames are still arriving
                stream.ask(cid, lengths[cid])
            for cid in wanted[1:]:
                got.append(await stream.next(cid, lengths[cid]))
            await stream.aclose()
            for cid, raw in zip(wanted, got, strict=True):
                assert len(decode_chunk(raw, cid, lengths[cid])) == lengths[cid]
            # The connection was handed back whole: a second stream on the same session works.
            again = source.open_stream()
            again.ask(wanted[0], lengths[wanted[0]])
            raw = await again.next(wanted[0], lengths[wanted[0]])
            await again.aclose()
            assert len(decode_chunk(raw, wanted[0], lengths[wanted[0]])) == lengths[wanted[0]]
        assert sum(stats.chunk_requests.values()) == len(wanted) + 1
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("name", "status"), [("zz" * 32, "400"), ("0" * 64, "404"), ("../etc/passwd", "400")]
)
async def test_stream_refuses_bad_or_unknown_first_name(
    tmp_path: Path, name: str, status: str
) -> None:
    make_dataset(tmp_path / "src")
    runner, port, stats, _ = await _serve(tmp_path / "src")
    try:
        url = parse_dataset_url(f"netopt://127.0.0.1:{port}/ds")
        async with HttpChunkSource(url, CLIENT) as source:
            stream = source.open_stream()
            stream.ask(name, 1024)
            with pytest.raises(ValidationError, match=status):
                await stream.next(name, 1024)
            await stream.aclose()
        assert not stats.chunk_requests
    finally:
        await runner.cleanup()


async def test_sync_falls_back_to_batches_without_the_stream_route(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await _serve(tmp_path / "src", with_stream=False)
    try:
        summary, _ = await sync_url(
            f"netopt://127.0.0.1:{port}/ds",
            tmp_path / "dst",
            CLIENT,
            client_cpu=CPU,
            sync_options=FAST,
            streams=3,
        )
        check_tree(tmp_path / "dst", files)
        assert summary.chunks_fetched == len(manifest.unique_chunks())
        assert sum(stats.chunk_requests.values()) == len(manifest.unique_chunks())
    finally:
        await runner.cleanup()


async def test_a_read_cut_for_a_copy_that_arrived_elsewhere_leaves_the_source_usable(
    tmp_path: Path,
) -> None:
    # The tail's cut (`streamwork._unless_arrived_elsewhere`) on a real stream: the other
    # copy "arrives" while this stream's frame is awaited; the read is cancelled, the
    # stream dropped, and the same source then serves the chunk whole on a fresh stream.
    import asyncio
    from types import SimpleNamespace

    from netopt.dataplane.streamwork import _unless_arrived_elsewhere

    make_dataset(tmp_path / "src")
    runner, port, _, manifest = await _serve(tmp_path / "src")
    lengths = manifest.unique_chunks()
    cid = max(lengths, key=lengths.__getitem__)
    arrived = asyncio.Event()
    run = SimpleNamespace(stolen={cid: arrived}, lengths=lengths)
    try:
        url = parse_dataset_url(f"netopt://127.0.0.1:{port}/ds")
        async with HttpChunkSource(url, CLIENT, zstd_level=3) as source:
            stream = source.open_stream()
            stream.ask(cid, lengths[cid])
            asyncio.get_running_loop().call_soon(arrived.set)
            got = await _unless_arrived_elsewhere(run, stream, cid)  # type: ignore[arg-type]
            assert got is None
            await stream.aclose(complete=False)
            again = source.open_stream()
            again.ask(cid, lengths[cid])
            raw = await again.next(cid, lengths[cid])
            await again.aclose()
            assert len(decode_chunk(raw, cid, lengths[cid])) == lengths[cid]
            # Set before the read begins: no read at all.
            assert await _unless_arrived_elsewhere(run, source.open_stream(), cid) is None  # type: ignore[arg-type]
    finally:
        await runner.cleanup()
