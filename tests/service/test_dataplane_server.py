"""The data-plane server and client refuse traversal; the server's sockets carry its CC."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from dataplane_helpers import CPU, FAST, TOKEN, make_dataset, start
from yarl import URL

from netopt.cli.main import main
from netopt.dataplane.client import ClientOptions, parse_dataset_url, sync_url
from netopt.dataplane.server import ServeSettings, create_app, load_dataset, start_server
from netopt.errors import PathTraversalError, ValidationError
from netopt.transfer.manifest import manifest_to_dict

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    "path",
    [
        "/v1/datasets/ds/chunks/..%2F..%2Fetc%2Fpasswd",
        "/v1/datasets/ds/chunks/%2Fetc%2Fpasswd",
        "/v1/datasets/ds/chunks/" + "a" * 63 + "%00",
        "/v1/datasets/ds/chunks/" + "A" * 64,
        "/v1/datasets/ds/chunks/random.bin",
        "/v1/datasets/..%2Fsrc/manifest",
        "/v1/datasets/../manifest",
        "/v1/datasets/%00/manifest",
        "/v1/datasets/ds%00/manifest",
        "/v1/datasets/%2Fetc/manifest",
    ],
)
async def test_server_refuses_traversal(tmp_path: Path, path: str) -> None:
    make_dataset(tmp_path / "src")
    (tmp_path / "secret").write_text("top secret")
    runner, port, stats, _ = await start(tmp_path / "src")
    try:
        async with (
            aiohttp.ClientSession(headers=AUTH) as session,
            session.get(URL(f"http://127.0.0.1:{port}{path}", encoded=True)) as resp,
        ):
            body = await resp.read()
        assert resp.status in (400, 404)
        assert b"top secret" not in body
        assert sum(stats.chunk_requests.values()) == 0
    finally:
        await runner.cleanup()


async def test_chunk_endpoint_serves_verified_frames(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await start(tmp_path / "src")
    ref = next(f for f in manifest.files if f.path == "text/data.jsonl").chunks[0]
    base = f"http://127.0.0.1:{port}/v1/datasets/ds/chunks/{ref.chunk_id}"
    try:
        async with aiohttp.ClientSession(headers=AUTH) as session:
            async with session.get(base, params={"level": "3"}) as resp:
                assert resp.status == 200
                assert resp.headers["X-Netopt-Codec"] == "zstd"
                assert len(await resp.read()) < ref.length_bytes
            async with session.get(base, params={"level": "99"}) as resp:
                assert resp.status == 400
            async with session.get(f"http://127.0.0.1:{port}/v1/health") as resp:
                assert (await resp.json()) == {"ok": True}
        assert stats.chunk_requests[ref.chunk_id] == 1
    finally:
        await runner.cleanup()


def _evil_app(manifest_doc: dict[str, object]) -> web.Application:
    async def info(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "name": "ds",
                "manifest_id": "x",
                "total_bytes": 3,
                "files": 1,
                "chunks": 1,
                "sample": {},
                "cpu": {
                    "cores": 1,
                    "compress_bytes_per_s": {},
                    "decompress_bytes_per_s": {},
                    "hash_bytes_per_s": 1e9,
                },
                "congestion_control": "bbr",
            }
        )

    async def manifest(request: web.Request) -> web.Response:
        return web.json_response(manifest_doc)

    app = web.Application()
    app.add_routes(
        [web.get("/v1/datasets/ds", info), web.get("/v1/datasets/ds/manifest", manifest)]
    )
    return app


@pytest.mark.parametrize("evil", ["../evil", "/tmp/evil-abs", "a\x00b", "a/../../evil", "a\\..\\b"])
async def test_client_refuses_traversal_in_manifest(tmp_path: Path, evil: str) -> None:
    doc = {
        "name": "ds",
        "files": [
            {"path": evil, "size_bytes": 3, "mode": 420, "mtime_ns": 0, "chunks": [["a" * 64, 3]]}
        ],
    }
    runner = web.AppRunner(_evil_app(doc))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    dest = tmp_path / "box" / "dst"
    try:
        with pytest.raises(PathTraversalError):
            await sync_url(
                f"netopt://127.0.0.1:{port}/ds",
                dest,
                ClientOptions(),
                client_cpu=CPU,
                sync_options=FAST,
            )
        assert not (tmp_path / "box" / "evil").exists()
        assert not Path("/tmp/evil-abs").exists()  # noqa: ASYNC240
        assert not dest.exists() or not any(dest.iterdir())
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:1/ds",
        "netopt://127.0.0.1/ds",
        "netopt://127.0.0.1:80/../x",
        "netopt://127.0.0.1:80/a/b",
        "netopt://127.0.0.1:80/..",
        "netopt://127.0.0.1:99999/ds",
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(ValidationError):
        parse_dataset_url(url)


def test_good_urls() -> None:
    assert parse_dataset_url("netopt://[::1]:7470/ds.v1").host == "::1"
    assert str(parse_dataset_url("netopt://198.18.1.2:7470/imagenet")) == (
        "netopt://198.18.1.2:7470/imagenet"
    )


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
async def test_accepted_sockets_inherit_congestion_control(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    dataset = load_dataset(tmp_path / "src", "ds", 64 * 1024)
    # reno: allowed in every namespace and never this machine's default (bbr or cubic).
    app = create_app(ServeSettings(token=None, congestion_control="reno"), {"ds": dataset}, CPU)
    runner, port = await start_server(app, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        assert b"200 OK" in await reader.read(200)
        proc = await asyncio.create_subprocess_exec(
            "ss",
            "-tinH",
            "state",
            "established",
            f"( sport = :{port} )",
            stdout=asyncio.subprocess.PIPE,
        )
        raw, _ = await asyncio.wait_for(proc.communicate(), timeout=10)
        out = raw.decode()
        assert "reno" in out.split()
        writer.close()
    finally:
        await runner.cleanup()


def test_cli_sync_unreachable_is_a_clear_error(tmp_path: Path, monkeypatch, capsys) -> None:
    cache = tmp_path / "codec.json"
    cache.write_text(
        json.dumps(
            {
                "version": 4,
                "cores": 2,
                "compress_bytes_per_s": {"1": 3e8, "3": 1e8, "5": 6e7, "7": 4e7, "9": 3e7},
                "decompress_bytes_per_s": {"1": 9e8, "3": 9e8, "5": 9e8, "7": 9e8, "9": 9e8},
                "hash_bytes_per_s": 1e9,
                "startup_s": 0.5,
            }
        )
    )
    monkeypatch.setenv("NETOPT_CODEC_CACHE", str(cache))
    code = main(["sync", "netopt://127.0.0.1:1/ds", str(tmp_path / "d"), "--json",
                 "--retry-window-s", "1"])  # fmt: skip
    assert code == 1
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "PeerUnreachableError"
    assert "unreachable" in out["message"]
    assert "retry window 1 s" in out["message"]  # tried again for the window first


def test_cli_plan_json(tmp_path: Path, monkeypatch, capsys) -> None:
    sample = tmp_path / "s.jsonl"
    sample.write_bytes(b"".join(b'{"id": %d, "v": "abcabc"}\n' % i for i in range(50000)))
    cache = tmp_path / "codec.json"
    cache.write_text(
        json.dumps(
            {
                "version": 4,
                "cores": 2,
                "compress_bytes_per_s": {"1": 3e8, "3": 1.5e8, "5": 9e7, "7": 6e7, "9": 3e7},
                "decompress_bytes_per_s": {"1": 9e8, "3": 9e8, "5": 9e8, "7": 9e8, "9": 9e8},
                "hash_bytes_per_s": 2e9,
                "startup_s": 0.5,
            }
        )
    )
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    code = main(
        [
            "plan",
            "--rate-mbps",
            "100",
            "--rtt-ms",
            "80",
            "--loss",
            "0.01",
            "--sample",
            str(sample),
            "--cc",
            "cubic",
            "--codec-cache",
            str(cache),
            "--json",
        ]
    )
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["codec"] == "zstd"
    assert plan["streams"] > 16
    assert plan["bottleneck"] in ("link", "cpu")


def test_manifest_json_is_stable(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    a = load_dataset(tmp_path / "src", "ds", 64 * 1024).manifest
    b = load_dataset(tmp_path / "src", "ds", 64 * 1024).manifest
    assert manifest_to_dict(a) == manifest_to_dict(b)
    with pytest.raises(ValidationError):
        load_dataset(tmp_path / "src", "../x", 64 * 1024)


@pytest.mark.parametrize(
    "chunks",
    [["../../etc/passwd"], ["/etc/passwd"], ["a" * 63 + "\x00"], ["A" * 64], [], "x", [1]],
)
async def test_batch_refuses_bad_names(tmp_path: Path, chunks: object) -> None:
    make_dataset(tmp_path / "src")
    runner, port, stats, _ = await start(tmp_path / "src")
    url = f"http://127.0.0.1:{port}/v1/datasets/ds/batch"
    try:
        async with (
            aiohttp.ClientSession(headers=AUTH) as session,
            session.post(url, json={"chunks": chunks}) as resp,
        ):
            assert resp.status == 400
        assert sum(stats.chunk_requests.values()) == 0
    finally:
        await runner.cleanup()


async def test_batch_streams_frames_in_order(tmp_path: Path) -> None:
    from netopt.dataplane.chunkio import FRAME_HEADER, RawChunk, decode_chunk, parse_frame_header

    make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await start(tmp_path / "src")
    wanted = list(manifest.unique_chunks().items())[:5]
    url = f"http://127.0.0.1:{port}/v1/datasets/ds/batch"
    try:
        async with (
            aiohttp.ClientSession(headers=AUTH) as session,
            session.post(
                url, params={"level": "1"}, json={"chunks": [c for c, _ in wanted]}
            ) as resp,
        ):
            assert resp.status == 200
            body = await resp.read()
        offset = 0
        for chunk_id, length in wanted:
            got_id, codec, size = parse_frame_header(body[offset : offset + FRAME_HEADER.size])
            offset += FRAME_HEADER.size
            assert got_id == chunk_id
            raw = RawChunk(body[offset : offset + size], codec, size)
            assert len(decode_chunk(raw, chunk_id, length)) == length
            offset += size
        assert offset == len(body)
        assert all(stats.chunk_requests[c] == 1 for c, _ in wanted)
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json={"chunks": [wanted[0][0]]}) as resp,
        ):
            assert resp.status == 401
    finally:
        await runner.cleanup()
