"""The manifest on the wire: zstd when asked, plain otherwise, encoded once per version,
decoded bounded.

Servers are real aiohttp apps on localhost: `netopt serve`'s own app, and hostile
ones that answer the manifest route with bombs, lies and garbage. The client is
`HttpChunkSource.fetch_manifest` (and a real ``netopt sync`` process for the bomb,
whose start-up prefetch decodes the manifest too).
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import aiohttp
import pytest
import zstandard
from aiohttp import web

from netopt.dataplane import prefetch
from netopt.dataplane.httpsource import ClientOptions, HttpChunkSource, parse_dataset_url
from netopt.dataplane.limits import MANIFEST_BYTES_PER_ENTRY, MAX_MANIFEST_BYTES, BodyTooLarge
from netopt.dataplane.manifestcache import ManifestEncodings
from netopt.dataplane.origin import LiveDataset
from netopt.dataplane.server import MANIFESTS, ServeSettings, create_app, start_server
from netopt.errors import ProtocolError
from netopt.transfer.manifest import Manifest, build_manifest, manifest_from_dict
from tests.service.dataplane_helpers import (
    CHUNK_BYTES,
    CPU,
    TOKEN,
    make_dataset,
    serve_routes,
    start,
)

REPO = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ZSTD_MAGIC = bytes.fromhex("28b52ffd")
RLE_BLOCK_BYTES = 128 * 1024


def _small_files(root: Path, count: int) -> None:
    """``count`` files of 40-90 bytes in 50 directories: a file and a chunk each."""
    for i in range(count):
        path = root / f"d{i % 50:02d}" / f"f{i:05d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"file %d " % i + os.urandom(16).hex().encode() * (1 + i % 2))


def _rle_frame(total_bytes: int, declared_bytes: int | None = None) -> bytes:
    """A hand-made zstd frame of zeros: 4 bytes per 128 KiB RLE block (a 1 GiB frame is
    32 KB), its content size declared as ``declared_bytes`` or not at all."""
    if declared_bytes is None:
        header = ZSTD_MAGIC + bytes([0x00, 0x38])  # no content size, 128 KiB window
    else:
        header = ZSTD_MAGIC + bytes([0xC0, 0x38]) + declared_bytes.to_bytes(8, "little")
    blocks = total_bytes // RLE_BLOCK_BYTES
    return header + b"".join(
        ((RLE_BLOCK_BYTES << 3) | (1 << 1) | (i == blocks - 1)).to_bytes(3, "little") + b"\0"
        for i in range(blocks)
    )


async def _fetch(port: int, max_entries: int | None = None) -> tuple[Manifest, int]:
    """The manifest through the client, and the bytes it took on the wire."""
    options = ClientOptions(token=TOKEN)
    if max_entries is not None:
        options = ClientOptions(token=TOKEN, max_manifest_entries=max_entries)
    async with HttpChunkSource(parse_dataset_url(f"netopt://127.0.0.1:{port}/ds"), options) as src:
        manifest = await src.fetch_manifest()
        return manifest, src.wire_bytes


async def test_a_10k_entry_manifest_travels_compressed_and_arrives_whole(tmp_path: Path) -> None:
    _small_files(tmp_path / "src", 5000)
    runner, port, _, served = await start(tmp_path / "src")
    try:
        entries = len(served.files) + sum(len(f.chunks) for f in served.files)
        assert entries == 10_000
        manifest, wire_bytes = await _fetch(port)
        assert manifest == served
        assert manifest.manifest_id == served.manifest_id
        plain_bytes = len(served.canonical_json)
        # Compressed on the wire: paths and sizes repeat, chunk names are hex.
        assert wire_bytes < plain_bytes / 1.8, (wire_bytes, plain_bytes)
        # What the route sent, as it was sent: one zstd frame of the canonical JSON.
        async with aiohttp.ClientSession(headers=AUTH, auto_decompress=False) as http_:
            url = f"http://127.0.0.1:{port}/v1/datasets/ds/manifest"
            async with http_.get(url, headers={"Accept-Encoding": "gzip, zstd"}) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Encoding"] == "zstd"
                assert resp.headers["ETag"] == f'"{served.manifest_id}"'
                assert "X-Netopt-Version" not in resp.headers  # a chunk part's header only
                body = await resp.read()
        assert len(body) == wire_bytes
        assert zstandard.ZstdDecompressor().decompress(body) == served.canonical_json
    finally:
        await runner.cleanup()


async def test_without_zstd_in_accept_encoding_the_manifest_is_plain_json(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port, _, served = await start(tmp_path / "src")
    try:
        url = f"http://127.0.0.1:{port}/v1/datasets/ds/manifest"
        async with aiohttp.ClientSession(headers=AUTH, auto_decompress=False) as http_:
            # No Accept-Encoding at all, aiohttp's default (gzip, deflate), zstd refused.
            for accept in (None, "gzip, deflate", "zstd;q=0"):
                headers = {"Accept-Encoding": accept} if accept else {}
                skip = () if accept else ("Accept-Encoding",)
                async with http_.get(url, headers=headers, skip_auto_headers=skip) as resp:
                    assert resp.status == 200, accept
                    assert "Content-Encoding" not in resp.headers, accept
                    assert resp.content_type == "application/json"
                    body = await resp.read()
                    etag = resp.headers["ETag"]
                assert body == served.canonical_json, accept
            # The version the client has: nothing to send.
            async with http_.get(url, headers={"If-None-Match": etag}) as resp:
                assert resp.status == 304
                assert await resp.read() == b""
        # A client as plain as curl (http.client sends Accept-Encoding: identity).
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            await asyncio.to_thread(conn.request, "GET", "/v1/datasets/ds/manifest", None, AUTH)
            resp_ = await asyncio.to_thread(conn.getresponse)
            assert resp_.status == 200
            assert resp_.getheader("Content-Encoding") is None
            assert await asyncio.to_thread(resp_.read) == served.canonical_json
        finally:
            conn.close()
    finally:
        await runner.cleanup()


async def _hostile(body: bytes, encoding: str | None) -> tuple[web.AppRunner, int]:
    """A server whose manifest route answers ``body`` with ``encoding``, whatever was asked."""

    async def manifest(_: web.Request) -> web.Response:
        headers = {"Content-Encoding": encoding} if encoding else {}
        return web.Response(body=body, content_type="application/json", headers=headers)

    return await serve_routes([web.get("/v1/datasets/{name}/manifest", manifest)])


def _valid_json(tmp_path: Path) -> bytes:
    make_dataset(tmp_path / "src")
    return build_manifest(tmp_path / "src", "ds", CHUNK_BYTES).canonical_json


SMALL_ENTRIES = 1000
"""A client cap of 1,000 entries: 128,000 bytes of manifest."""
SMALL_CAP_BYTES = SMALL_ENTRIES * MANIFEST_BYTES_PER_ENTRY

HOSTILE = {
    # A 1 GiB frame of zeros in 32 KB, its size not declared.
    "bomb": (lambda ok: _rle_frame(1 << 30), "zstd", BodyTooLarge, "decodes to more"),
    # A frame that says it holds 1 TiB: refused from its header.
    "declares-too-much": (
        lambda ok: _rle_frame(RLE_BLOCK_BYTES, 1 << 40),
        "zstd",
        BodyTooLarge,
        "declares 1099511627776 bytes",
    ),
    "declares-less-than-it-holds": (
        lambda ok: _rle_frame(4 * RLE_BLOCK_BYTES, 1000),
        "zstd",
        ProtocolError,
        "malformed",
    ),
    "garbage": (lambda ok: os.urandom(5000), "zstd", ProtocolError, "not a zstd frame"),
    "truncated": (
        lambda ok: zstandard.ZstdCompressor().compress(ok)[:-7],
        "zstd",
        ProtocolError,
        "malformed",
    ),
    "trailing-bytes": (
        lambda ok: zstandard.ZstdCompressor().compress(ok) + b"{}",
        "zstd",
        ProtocolError,
        "malformed",
    ),
    "gzip-not-asked-for": (lambda ok: gzip.compress(ok), "gzip", ProtocolError, "not asked for"),
    "two-encodings": (
        lambda ok: zstandard.ZstdCompressor().compress(ok),
        "zstd, gzip",
        ProtocolError,
        "not asked for",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_a_hostile_manifest_encoding_is_refused_within_the_cap(
    tmp_path: Path, case: str
) -> None:
    make_body, encoding, error, message = HOSTILE[case]
    body = make_body(_valid_json(tmp_path))
    runner, port = await _hostile(body, encoding)
    try:
        tracemalloc.start()
        try:
            with pytest.raises(error, match=message):
                await _fetch(port, SMALL_ENTRIES)
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        await runner.cleanup()
    # Never more than the cap and the body: a bomb of 1 GiB or a claim of 1 TiB
    # allocates none of it (the body and the cap are 128 KB each here).
    assert peak_bytes < 4 * 1024 * 1024, peak_bytes


async def test_the_valid_frame_the_hostile_cases_tamper_with_is_accepted(tmp_path: Path) -> None:
    """The cases above fail for what was done to the frame, not for the frame itself."""
    valid = _valid_json(tmp_path)
    runner, port = await _hostile(zstandard.ZstdCompressor().compress(valid), "zstd")
    try:
        manifest, _ = await _fetch(port, SMALL_ENTRIES)
    finally:
        await runner.cleanup()
    assert manifest.canonical_json == valid


async def _real_answer(port: int, path: str) -> bytes:
    """The real server's answer to ``path`` (a hostile server passes it on)."""
    async with (
        aiohttp.ClientSession(headers=AUTH) as http_,
        http_.get(f"http://127.0.0.1:{port}{path}") as resp,
    ):
        return await resp.read()


async def test_netopt_sync_against_a_manifest_bomb_fails_cleanly(tmp_path: Path) -> None:
    """A real ``netopt sync`` (its start-up prefetch decodes the manifest too) against a
    server whose manifest is a 1 GiB bomb, over the default 128 MB cap: exit 1, a
    one-line reason, no traceback, nothing written."""
    make_dataset(tmp_path / "src")
    real, real_port, _, _ = await start(tmp_path / "src")
    bomb = _rle_frame(1 << 30)

    async def proxy_info(request: web.Request) -> web.Response:
        body = await _real_answer(real_port, request.path)
        return web.Response(body=body, content_type="application/json")

    async def manifest(_: web.Request) -> web.Response:
        return web.Response(body=bomb, headers={"Content-Encoding": "zstd"})

    runner, port = await serve_routes(
        [
            web.get("/v1/health", proxy_info),
            web.get("/v1/datasets/{name}", proxy_info),
            web.get("/v1/datasets/{name}/manifest", manifest),
        ]
    )
    dest = tmp_path / "dest"
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "netopt", "sync", f"netopt://127.0.0.1:{port}/ds", str(dest),
            "--cache-dir", str(tmp_path / "cache"),
            cwd=REPO, env={**os.environ, "NETOPT_TOKEN": TOKEN},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        out_bytes, _ = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        await runner.cleanup()
        await real.cleanup()
    out = out_bytes.decode()
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    assert "MemoryError" not in out, out
    assert "decodes to more than the 128000000 bytes expected" in out, out
    assert not dest.exists() or not [p for p in dest.rglob("*") if p.is_file()]


async def test_the_encoding_follows_the_dataset_versions(tmp_path: Path) -> None:
    """Encoded once per version, however many ask; a change publishes a new version and
    the route sends its encoding, never the old one; two versions are kept at most."""
    src = tmp_path / "src"
    make_dataset(src)
    live = LiveDataset.load(src, "ds", CHUNK_BYTES)
    app = create_app(ServeSettings(token=TOKEN, worker_threads=2), {"ds": live}, CPU)
    runner, port = await start_server(app, "127.0.0.1", 0)
    encodings: ManifestEncodings = app[MANIFESTS]
    try:
        first = live.manifest
        got = await asyncio.gather(*(_fetch(port) for _ in range(4)))
        assert all(m == first for m, _ in got)
        assert encodings.encoded == 1
        for version in range(2, 5):
            (src / "text" / "nested" / "small.txt").write_bytes(b"version %d\n" % version)
            (src / f"added-{version}.txt").write_bytes(b"new file %d\n" % version)
            manifest, _ = await _fetch(port)
            assert live.versions_published == version
            assert manifest == live.manifest
            assert manifest.manifest_id != first.manifest_id
            assert {f.path for f in manifest.files} >= {f"added-{version}.txt"}
            small = next(f for f in manifest.files if f.path == "text/nested/small.txt")
            assert small.size_bytes == len(b"version %d\n" % version)
            assert encodings.encoded == version
            # At most the current and the previous version (this one while still held).
            assert 1 <= encodings.versions_held("ds") <= 2
        # Nothing changed: the held encoding is sent again.
        again, _ = await _fetch(port)
        assert again == live.manifest
        assert encodings.encoded == 4
    finally:
        await runner.cleanup()
        live.close()


async def _prefetched(port: int) -> prefetch.MetaAnswer | None:
    prefetch.discard()
    try:
        assert prefetch.start(f"netopt://127.0.0.1:{port}/ds", TOKEN, 0)
        pending = prefetch._pending
        assert pending is not None
        for thread in pending.threads:
            await asyncio.to_thread(thread.join, 20)
        return await prefetch.take_meta("127.0.0.1", port, "ds", TOKEN)
    finally:
        prefetch.discard()


async def test_the_start_up_prefetch_takes_the_manifest_compressed(tmp_path: Path) -> None:
    _small_files(tmp_path / "src", 2000)
    runner, port, _, served = await start(tmp_path / "src")
    try:
        early = await _prefetched(port)
    finally:
        await runner.cleanup()
    assert early is not None
    assert manifest_from_dict(early.manifest) == served
    # The info (a few hundred bytes) and the manifest, compressed: well under the plain JSON.
    assert early.wire_bytes < len(served.canonical_json) / 1.8, early.wire_bytes


async def test_the_start_up_prefetch_drops_a_bomb_and_leaves_it_to_the_normal_path(
    tmp_path: Path,
) -> None:
    runner, port = await _hostile(_rle_frame(1 << 30), "zstd")
    try:
        tracemalloc.start()
        try:
            assert await _prefetched(port) is None
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        await runner.cleanup()
    # The prefetch's cap is the default 128 MB: decoding stops there, not at 1 GiB.
    assert peak_bytes < 2 * MAX_MANIFEST_BYTES + 16 * 1024 * 1024, peak_bytes


async def _slow_manifest_server(
    tmp_path: Path, body_delay_s: float, info_status: int = 200
) -> tuple[web.AppRunner, web.AppRunner, int, Manifest]:
    """A real server's info and manifest, the manifest's body sent ``body_delay_s`` after
    its headers (a large manifest on a long link); the info answered ``info_status``."""
    make_dataset(tmp_path / "src")
    real, real_port, _, served = await start(tmp_path / "src")

    async def info(request: web.Request) -> web.Response:
        body = await _real_answer(real_port, request.path)
        return web.Response(body=body, status=info_status, content_type="application/json")

    async def manifest(request: web.Request) -> web.StreamResponse:
        frame = zstandard.ZstdCompressor().compress(served.canonical_json)
        resp = web.StreamResponse(headers={"Content-Encoding": "zstd"})
        resp.content_length = len(frame)
        await resp.prepare(request)
        await asyncio.sleep(body_delay_s)
        await resp.write(frame)
        return resp

    runner, port = await serve_routes(
        [web.get("/v1/datasets/{name}", info), web.get("/v1/datasets/{name}/manifest", manifest)]
    )
    return real, runner, port, served


async def test_the_prefetch_is_waited_for_while_its_manifest_body_arrives(tmp_path: Path) -> None:
    """Past `TAKE_WAIT_S`, a manifest whose body is arriving is waited for (asking again
    would send it twice, the hedge a third time); without its info, it is not."""
    delay_s = prefetch.TAKE_WAIT_S + 0.7
    real, runner, port, served = await _slow_manifest_server(tmp_path, delay_s)
    try:
        prefetch.discard()
        assert prefetch.start(f"netopt://127.0.0.1:{port}/ds", TOKEN, 0)
        early = await prefetch.take_meta("127.0.0.1", port, "ds", TOKEN)
    finally:
        prefetch.discard()
        await runner.cleanup()
        await real.cleanup()
    assert early is not None
    assert manifest_from_dict(early.manifest) == served


async def test_a_failed_prefetched_info_is_not_waited_on_for_its_manifest(
    tmp_path: Path,
) -> None:
    real, runner, port, _ = await _slow_manifest_server(tmp_path, 5.0, info_status=503)
    try:
        prefetch.discard()
        assert prefetch.start(f"netopt://127.0.0.1:{port}/ds", TOKEN, 0)
        await asyncio.sleep(0.2)  # the info's 503 is in
        started_s = asyncio.get_running_loop().time()
        assert await prefetch.take_meta("127.0.0.1", port, "ds", TOKEN) is None
        waited_s = asyncio.get_running_loop().time() - started_s
    finally:
        prefetch.discard()
        await runner.cleanup()
        await real.cleanup()
    assert waited_s < 2.0, waited_s


async def test_the_served_manifest_is_encoded_as_the_server_starts(tmp_path: Path) -> None:
    """The first client finds the encoding made (or under way) and it is made once."""
    _small_files(tmp_path / "src", 3000)
    runner, port, _, served = await start(tmp_path / "src")
    try:
        encodings: ManifestEncodings = runner.app[MANIFESTS]
        for _ in range(200):  # before any request
            if encodings.encoded:
                break
            await asyncio.sleep(0.025)
        assert encodings.encoded == 1
        manifest, _ = await _fetch(port)
        assert manifest == served
        assert encodings.encoded == 1  # the request took the encoding made at the start
    finally:
        await runner.cleanup()
