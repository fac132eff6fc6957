"""The server's stream route over real localhost sockets, and the client's batch fallback."""

from __future__ import annotations

import asyncio
import contextlib
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


@contextlib.asynccontextmanager
async def _counting_source(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A source on a served dataset whose info requests (GET /v1/datasets/ds) are
    counted as they come: (source, manifest, an event set at the first, their list)."""
    info_asked = asyncio.Event()
    info_requests: list[str] = []

    @web.middleware
    async def count_info(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.method == "GET" and request.path == "/v1/datasets/ds":
            info_requests.append(request.path)
            info_asked.set()
        return await handler(request)

    make_dataset(tmp_path / "src")
    dataset = load_dataset(tmp_path / "src", "ds", 64 * 1024)
    app = web.Application(middlewares=[count_info, auth_middleware])
    settings = ServeSettings(token=TOKEN, worker_threads=2)
    add_dataplane(app, settings, {"ds": dataset}, CPU, ServeStats())
    runner, port = await start_server(app, "127.0.0.1", 0)
    try:
        url = parse_dataset_url(f"netopt://127.0.0.1:{port}/ds")
        async with HttpChunkSource(url, CLIENT, zstd_level=3) as source:
            yield source, dataset.manifest, info_asked, info_requests
    finally:
        await runner.cleanup()


async def _one_frame_read(source: HttpChunkSource, lengths: dict[str, int], cids: list[str]):  # type: ignore[no-untyped-def]
    """A stream that asked for ``cids`` and read the first one's frame only."""
    stream = source.open_stream()
    for cid in cids:
        stream.ask(cid, lengths[cid])
    await stream.next(cids[0], lengths[cids[0]])
    return stream


async def test_a_stream_cut_after_its_chunks_asks_the_version_as_it_closes(tmp_path: Path) -> None:
    # A stream cut in the tail names no version at its end. The version is asked for as
    # it closes (its chunks were read by then), so the sync's end has the answer already
    # and asks nothing more; before, the end asked then, a round trip after the last byte.
    async with _counting_source(tmp_path) as (source, manifest, info_asked, info_requests):
        lengths = manifest.unique_chunks()
        wanted = list(lengths)[:3]
        whole = source.open_stream()  # ends with its end frame: no question
        whole.ask(wanted[0], lengths[wanted[0]])
        await whole.next(wanted[0], lengths[wanted[0]])
        whole.end()
        await whole.aclose()
        assert info_requests == []
        cut = await _one_frame_read(source, lengths, wanted)
        await cut.aclose(complete=False)  # two chunks asked and not read: cut
        await asyncio.wait_for(info_asked.wait(), 5)  # asked at the cut, not at the end
        assert await source.version_at_end() == manifest.manifest_id
        assert len(info_requests) == 1  # the end asked nothing more
        # A stream that delivered nothing is not asked about.
        idle = source.open_stream()
        idle.ask(wanted[1], lengths[wanted[1]])
        await idle.aclose(complete=False)
        assert await source.version_at_end() == manifest.manifest_id
        assert len(info_requests) == 1


async def test_cut_streams_past_the_bound_leave_the_question_to_the_end(tmp_path: Path) -> None:
    from netopt.dataplane.httpsource import MAX_CUT_CHECKS

    async with _counting_source(tmp_path) as (source, manifest, _, info_requests):
        lengths = manifest.unique_chunks()
        for _ in range(MAX_CUT_CHECKS + 1):
            stream = await _one_frame_read(source, lengths, list(lengths)[:2])
            await stream.aclose(complete=False)
        assert await source.version_at_end() is None  # the ninth: the end asks
        assert len(info_requests) == MAX_CUT_CHECKS


async def test_one_version_asked_covers_every_stream_cut_after_their_last_frames(
    tmp_path: Path,
) -> None:
    async with _counting_source(tmp_path) as (source, manifest, _, info_requests):
        lengths = manifest.unique_chunks()
        three = list(lengths)[:3]
        streams = [await _one_frame_read(source, lengths, three)]
        streams.append(await _one_frame_read(source, lengths, three))
        await streams[0].aclose(complete=False)  # asks: after both streams' last frames
        await streams[1].aclose(complete=False)  # covered by that question
        # Its frame comes after the question: asked again.
        late = await _one_frame_read(source, lengths, three[:2])
        await late.aclose(complete=False)
        assert await source.version_at_end() == manifest.manifest_id
        assert len(info_requests) == 2


async def test_a_stream_that_may_be_cut_has_its_version_asked_before_the_cut(
    tmp_path: Path,
) -> None:
    # The tail's steal: the stream waits for a chunk another stream was asked for too.
    # The version is asked then; when the stream is cut later, that answer covers it.
    async with _counting_source(tmp_path) as (source, manifest, info_asked, info_requests):
        lengths = manifest.unique_chunks()
        stream = await _one_frame_read(source, lengths, list(lengths)[:2])
        stream.may_be_cut()  # type: ignore[attr-defined]
        await asyncio.wait_for(info_asked.wait(), 5)  # asked before any cut
        stream.may_be_cut()  # type: ignore[attr-defined]  # covered: not asked twice
        await stream.aclose(complete=False)  # the other copy came first
        assert await source.version_at_end() == manifest.manifest_id
        assert len(info_requests) == 1
