"""A manifest asked for as byte ranges: the server's ``Range`` support on the manifest
route, and the start-up prefetch fetching a large manifest as pieces over several
connections (`netopt.dataplane.manifestpieces`), against real aiohttp servers on
localhost: `netopt serve`'s own app, one that stalls a piece mid-body, and ones that lie
about their pieces. A lie ends the prefetch's fetch; the normal path then asks for the
whole manifest (and reports what is wrong, if anything)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from netopt.dataplane import prefetch
from netopt.dataplane.client import sync_url
from netopt.dataplane.manifestpieces import FIRST_PIECE_BYTES, MIN_STEAL_BYTES
from netopt.dataplane.manifestwire import RangeNotSatisfiable, byte_range, compress_manifest
from netopt.transfer.manifest import Manifest, manifest_from_dict
from tests.service.dataplane_helpers import (
    CPU,
    FAST,
    TOKEN,
    check_tree,
    serve_with_middleware,
    start,
)
from tests.service.test_dataplane_prefetch import CLIENT, _fresh_stats  # noqa: F401 (autouse)

AUTH = {"Authorization": f"Bearer {TOKEN}"}

FILES = 6000
"""Files of the many-file tree: its manifest is ~300 KB of zstd, about 25 first pieces."""


def _many_files(root: Path, count: int = FILES) -> dict[str, bytes]:
    files = {f"d{i // 500:02d}/f{i:05d}.txt": b"%d\n" % (i * 7919) for i in range(count)}
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


async def _get(port: int, headers: dict[str, str]) -> tuple[int, CIMultiDict[str], bytes]:
    async with (
        aiohttp.ClientSession(headers=AUTH, auto_decompress=False) as http,
        http.get(f"http://127.0.0.1:{port}/v1/datasets/ds/manifest", headers=headers) as resp,
    ):
        return resp.status, resp.headers.copy(), await resp.read()


async def test_the_manifest_route_serves_one_byte_range_of_either_body(tmp_path: Path) -> None:
    _many_files(tmp_path / "src", 300)
    runner, port, _, manifest = await start(tmp_path / "src")
    try:
        whole = compress_manifest(manifest.canonical_json)
        plain = manifest.canonical_json
        etag = f'"{manifest.manifest_id}"'
        for accept, body in (("zstd", whole), ("identity", plain)):
            status, headers, got = await _get(port, {"Accept-Encoding": accept})
            assert (status, got, headers["Accept-Ranges"]) == (200, body, "bytes")
            status, headers, got = await _get(
                port, {"Accept-Encoding": accept, "Range": "bytes=100-199"}
            )
            assert status == 206
            assert got == body[100:200]
            assert headers["Content-Range"] == f"bytes 100-199/{len(body)}"
            assert headers["ETag"] == etag
            # A range reaching past the end is clipped; a suffix is the last bytes.
            status, headers, got = await _get(
                port, {"Accept-Encoding": accept, "Range": f"bytes=10-{10 * len(body)}"}
            )
            assert (status, got) == (206, body[10:])
            status, _, got = await _get(port, {"Accept-Encoding": accept, "Range": "bytes=-50"})
            assert (status, got) == (206, body[-50:])
            # Past the end: 416 with the total.
            status, headers, _ = await _get(
                port, {"Accept-Encoding": accept, "Range": f"bytes={len(body)}-"}
            )
            assert (status, headers["Content-Range"]) == (416, f"bytes */{len(body)}")
            assert "Content-Encoding" not in headers  # no body, none encoded
            # Several ranges, or If-Range naming another version: the whole body.
            for extra in ({"Range": "bytes=0-1,5-6"}, {"Range": "bytes=0-9", "If-Range": '"x"'}):
                status, _, got = await _get(port, {"Accept-Encoding": accept, **extra})
                assert (status, got) == (200, body)
            status, _, got = await _get(
                port, {"Accept-Encoding": accept, "Range": "bytes=0-9", "If-Range": etag}
            )
            assert (status, got) == (206, body[:10])
    finally:
        await runner.cleanup()


async def _prefetch_manifest(port: int, wait_s: float = 10.0) -> tuple[object | None, float]:
    """Run the start-up prefetch of ``ds`` (no data sockets) until its manifest fetch
    ended; the manifest document it got (None if none) and the seconds it took."""
    started_s = time.monotonic()
    assert prefetch.start(f"netopt://127.0.0.1:{port}/ds", TOKEN, 0)
    pending = prefetch._pending
    assert pending is not None
    deadline_s = started_s + wait_s
    while time.monotonic() < deadline_s:
        with pending.lock:
            if "manifest" in pending.answers:
                return pending.answers["manifest"][0], time.monotonic() - started_s
        if not any(t.is_alive() for t in pending.fetchers["manifest"]):
            return None, time.monotonic() - started_s
        await asyncio.sleep(0.01)
    raise AssertionError(f"the prefetch's manifest fetch did not end within {wait_s} s")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Tamper = Callable[[web.Request, Handler, bytes, str], Awaitable[web.StreamResponse]]


async def _serve_tampered(root: Path, tamper: Tamper) -> tuple[web.AppRunner, int, Manifest]:
    """`netopt serve`'s app whose manifest requests go through ``tamper(request, handler,
    zstd_body, etag)`` (the real route is ``handler``)."""
    served: list[tuple[bytes, str]] = []  # the zstd body and ETag, once serving

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.endswith("/manifest"):
            return await tamper(request, handler, *served[0])
        return await handler(request)

    runner, port, dataset = await serve_with_middleware(root, middleware)
    manifest = dataset.manifest
    served.append((compress_manifest(manifest.canonical_json), f'"{manifest.manifest_id}"'))
    return runner, port, manifest


async def test_a_large_manifest_arrives_in_pieces_over_several_connections(tmp_path: Path) -> None:
    # 20,000 files: ~820 KB of manifest, shares of ~50 KB, so pieces can also be split
    # at the tail (a fifth of the lab's 100,000-file tree, whose 4.8 MB it was built for).
    _many_files(tmp_path / "src", 20_000)
    ranges: list[str] = []

    async def note(req: web.Request, handler: Handler, body: bytes, etag: str):
        ranges.append(req.headers.get("Range", ""))
        return await handler(req)

    runner, port, manifest = await _serve_tampered(tmp_path / "src", note)
    try:
        doc, _ = await _prefetch_manifest(port)
    finally:
        await runner.cleanup()
    assert doc is not None
    assert manifest_from_dict(doc) == manifest
    size = len(compress_manifest(manifest.canonical_json))
    assert size > prefetch.MANIFEST_CONNECTIONS * 2 * MIN_STEAL_BYTES  # shares worth splitting
    # Every request asked for a range; the first piece came, then a share per
    # connection; nothing asked blind past the end, and a few take-overs at most.
    assert all(r.startswith("bytes=") for r in ranges)
    assert prefetch.STATS["manifest_pieces"] > prefetch.MANIFEST_CONNECTIONS / 2
    assert len(ranges) <= 2 * prefetch.MANIFEST_CONNECTIONS + 2


async def test_a_piece_stalled_mid_body_is_finished_by_another_connection(tmp_path: Path) -> None:
    # The first share (the piece right after the first) sends half its bytes and then
    # nothing for 20 s, as a connection that lost a packet on a lossy link waits out
    # retransmission timeouts. An idle connection asks for a copy of the rest, which
    # comes first.
    _many_files(tmp_path / "src")
    stalled: list[str] = []
    release = asyncio.Event()

    async def stall(req: web.Request, handler: Handler, body: bytes, etag: str):
        asked = byte_range(req.headers.get("Range"), len(body))
        if stalled or asked is None or asked[0] != FIRST_PIECE_BYTES:
            return await handler(req)
        stalled.append(req.headers["Range"])
        start, end = asked
        resp = web.StreamResponse(status=206, headers={
            "ETag": etag, "Content-Encoding": "zstd",
            "Content-Range": f"bytes {start}-{end - 1}/{len(body)}",
        })  # fmt: skip
        resp.content_length = end - start
        await resp.prepare(req)
        await resp.write(body[start : start + (end - start) // 2])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(release.wait(), 20)
        return resp

    runner, port, manifest = await _serve_tampered(tmp_path / "src", stall)
    try:
        doc, took_s = await _prefetch_manifest(port)
    finally:
        release.set()
        await runner.cleanup()
    assert stalled
    assert doc is not None
    assert manifest_from_dict(doc) == manifest
    assert prefetch.STATS["manifest_takeovers"] >= 1
    assert took_s < 5.0, took_s


def _lie(kind: str) -> Tamper:
    """A server whose ranged manifest answers lie by ``kind`` (whole answers are true)."""
    served = 0

    async def lie(req: web.Request, handler: Handler, body: bytes, etag: str):
        nonlocal served
        try:
            asked = byte_range(req.headers.get("Range"), len(body))
        except RangeNotSatisfiable:
            asked = (len(body), len(body))
        if asked is None:
            return await handler(req)  # the normal path's whole manifest: true
        served += 1
        start, end = asked
        total = len(body)
        status, data = 206, body[start:end]
        if kind == "etag-per-answer":
            etag = f'"{served}"'
        elif kind == "shifted-start":
            start += 1
        elif kind == "huge-total":
            total = 1 << 40
        elif kind == "past-end-inside":
            status, data = 416, b""
        elif kind == "more-bytes-than-the-range":
            data = data + b"x" * 1000
        elif kind == "wrong-bytes":
            data = bytes(len(data))
        elif kind == "no-content-length":
            # Chunked, the piece then 1 MB more: never read past the piece.
            resp = web.StreamResponse(status=206, headers={
                "ETag": etag, "Content-Encoding": "zstd",
                "Content-Range": f"bytes {start}-{end - 1}/{total}",
            })  # fmt: skip
            await resp.prepare(req)
            await resp.write(data)
            with contextlib.suppress(ConnectionError):
                await resp.write(b"x" * (1 << 20))
            return resp
        if status == 416 or start >= total:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{total}"})
        return web.Response(status=206, body=data, headers={
            "ETag": etag, "Content-Encoding": "zstd",
            "Content-Range": f"bytes {start}-{min(end, total) - 1}/{total}",
        })  # fmt: skip

    return lie


@pytest.mark.parametrize(
    "kind",
    [
        "etag-per-answer",
        "shifted-start",
        "huge-total",
        "past-end-inside",
        "more-bytes-than-the-range",
        "wrong-bytes",
        "no-content-length",
    ],
)
async def test_lying_pieces_end_the_prefetch_and_the_sync_asks_for_the_whole(
    tmp_path: Path, kind: str
) -> None:
    files = _many_files(tmp_path / "src", 3000)
    runner, port, manifest = await _serve_tampered(tmp_path / "src", _lie(kind))
    try:
        doc, took_s = await _prefetch_manifest(port)
        # Nothing of the lie is taken; the prefetch gives up within its connections.
        assert doc is None
        assert took_s < 5.0, took_s
        prefetch.discard()
        # A real sync (its own prefetch lied to again) asks for the whole manifest.
        assert prefetch.start(f"netopt://127.0.0.1:{port}/ds", TOKEN, 2)
        summary, _ = await asyncio.wait_for(
            sync_url(f"netopt://127.0.0.1:{port}/ds", tmp_path / "dst", CLIENT,
                     client_cpu=CPU, sync_options=FAST, streams=2),
            timeout=30,
        )  # fmt: skip
    finally:
        await runner.cleanup()
    check_tree(tmp_path / "dst", files)
    assert summary.files_written == len(manifest.files)
    assert prefetch.STATS["meta_used"] == 0


async def test_pieces_that_break_while_one_stalls_do_not_hold_the_sync_up(
    tmp_path: Path,
) -> None:
    # The first share never answers (its connection would wait out its 10 s timeout);
    # the others carry another version's entity tag, which ends the pieces. The normal
    # path asks for the whole manifest at once, not once the stalled thread gives up.
    files = _many_files(tmp_path / "src", 3000)
    release = asyncio.Event()
    served = 0

    async def lie(req: web.Request, handler: Handler, body: bytes, etag: str):
        nonlocal served
        asked = byte_range(req.headers.get("Range"), len(body))
        if asked is None:
            return await handler(req)
        served += 1
        start, end = asked
        if start == FIRST_PIECE_BYTES and served > 1:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(release.wait(), 20)
        if start > FIRST_PIECE_BYTES:
            etag = '"another-version"'
        return web.Response(status=206, body=body[start:end], headers={
            "ETag": etag, "Content-Encoding": "zstd",
            "Content-Range": f"bytes {start}-{end - 1}/{len(body)}",
        })  # fmt: skip

    runner, port, manifest = await _serve_tampered(tmp_path / "src", lie)
    try:
        assert prefetch.start(f"netopt://127.0.0.1:{port}/ds", TOKEN, 2)
        started_s = time.monotonic()
        summary, _ = await asyncio.wait_for(
            sync_url(f"netopt://127.0.0.1:{port}/ds", tmp_path / "dst", CLIENT,
                     client_cpu=CPU, sync_options=FAST, streams=2),
            timeout=30,
        )  # fmt: skip
        took_s = time.monotonic() - started_s
    finally:
        release.set()
        await runner.cleanup()
    check_tree(tmp_path / "dst", files)
    assert summary.files_written == len(manifest.files)
    assert prefetch.STATS["meta_used"] == 0
    assert took_s < 5.0, took_s  # not `BODY_WAIT_S` (10 s) behind the stalled piece
