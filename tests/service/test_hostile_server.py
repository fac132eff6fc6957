"""A real `netopt sync` against real malicious servers: every size it is sent is bounded.

Each hostile server is a small aiohttp app on localhost that answers a valid dataset
info and then something oversized: a manifest padded with a gigabyte of whitespace, a
manifest of a million entries, a chunk declared a gigabyte long. The sync runs as a
subprocess so that its peak RSS (its ``VmHWM`` at exit) is its own: it must fail
with a clear error, well within its time limit and a memory bound far below what
reading those bodies whole takes (the unfixed client reached 2-6 GB on these).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard
from aiohttp import web

from netopt.dataplane.chunkio import frame_header
from netopt.dataplane.streamctx import BUNDLE_HEAD
from netopt.transfer.manifest import manifest_from_dict
from netopt.transfer.profile import cpu_profile_to_dict
from tests.service.dataplane_helpers import CPU

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3
MIB = 1024**2
RSS_BOUND_MB = 700
"""Peak RSS the sync may reach against any of these servers: the bounded reads (a 128 MB
manifest at most, a hedged copy and the prefetch's) plus the interpreter's ~100 MB."""
SYNC_TIMEOUT_S = 150.0
ZEROS = bytes(MIB)
CHUNK_ID = "ab" * 32

Route = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _info(files: int, total_bytes: int) -> dict[str, object]:
    return {
        "name": "ds",
        "manifest_id": "0" * 64,
        "total_bytes": total_bytes,
        "files": files,
        "chunks": files,
        "avg_chunk_bytes": MIB,
        "sample": {"1": 1.5, "3": 1.8},
        "cpu": cpu_profile_to_dict(CPU),
        "congestion_control": None,
        "precompressed": None,
    }


async def _stream(request: web.Request, pieces: AsyncIterator[bytes], length: int | None) -> None:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    if length is not None:
        resp.content_length = length
    await resp.prepare(request)
    try:
        async for piece in pieces:
            await resp.write(piece)
        await resp.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the client hung up: what a fixed client does


async def _padded(total_bytes: int) -> AsyncIterator[bytes]:
    """A valid manifest of no files, padded with whitespace to ``total_bytes``."""
    head, tail = b'{"name": "ds", "avg_chunk_bytes": 1048576, "files": []', b"}"
    yield head
    spaces = b" " * MIB
    left = total_bytes - len(head) - len(tail)
    while left > 0:
        yield spaces[:left]
        left -= len(spaces)
    yield tail


async def _entries(count: int) -> AsyncIterator[bytes]:
    """A valid manifest of ``count`` one-chunk files."""
    yield b'{"name": "ds", "avg_chunk_bytes": 1048576, "files": ['
    for start in range(0, count, 10_000):
        yield ", ".join(
            json.dumps(
                {
                    "path": f"d{i // 1000:04d}/f{i:08d}.bin",
                    "size_bytes": 4096,
                    "mode": 420,
                    "mtime_ns": 1_700_000_000_000_000_000,
                    "chunks": [[f"{i:064x}", 4096]],
                }
            )
            for i in range(start, min(count, start + 10_000))
        ).encode() + (b", " if start + 10_000 < count else b"")
        await asyncio.sleep(0)
    yield b"]}"


@dataclass
class Hostile:
    manifest: Route
    info: dict[str, object]
    chunk: Route | None = None


def _padded_server(declare_length: bool) -> Hostile:
    size = GIB

    async def manifest(request: web.Request) -> web.StreamResponse:
        await _stream(request, _padded(size), size if declare_length else None)
        return web.Response()  # never sent: the stream above is the answer

    return Hostile(manifest, _info(0, 0))


def _entries_server() -> Hostile:
    async def manifest(request: web.Request) -> web.StreamResponse:
        await _stream(request, _entries(1_000_000), None)
        return web.Response()

    return Hostile(manifest, _info(1_000_000, 4096 * 1_000_000))


async def _huge_frames() -> AsyncIterator[bytes]:
    yield frame_header(CHUNK_ID, "identity", GIB)
    for _ in range(GIB // MIB):
        yield ZEROS


def _big_chunk_server() -> Hostile:
    """A manifest whose one chunk is declared 1 GiB long (chunked at 1 MiB average), and
    chunk routes that send that gigabyte, a megabyte at a time."""
    doc = {
        "name": "ds",
        "avg_chunk_bytes": MIB,
        "files": [{"path": "big.bin", "size_bytes": GIB, "chunks": [[CHUNK_ID, GIB]]}],
    }

    async def manifest(request: web.Request) -> web.StreamResponse:
        return web.json_response(doc)

    async def chunk(request: web.Request) -> web.StreamResponse:
        if request.method == "GET":

            async def body() -> AsyncIterator[bytes]:
                for _ in range(GIB // MIB):
                    yield ZEROS

            await _stream(request, body(), GIB)
        else:
            await _stream(request, _huge_frames(), None)
        return web.Response()

    return Hostile(manifest, _info(1, GIB), chunk)


def _one_chunk_stream_server(frames: bytes, offers: dict[str, bool]) -> Hostile:
    """A dataset of one 1 MiB chunk whose stream route answers ``frames`` (then a
    megabyte of zeros 64 times); its info offers ``offers`` (``stream_context``...)."""
    doc = {
        "name": "ds",
        "avg_chunk_bytes": MIB,
        "files": [{"path": "big.bin", "size_bytes": MIB, "chunks": [[CHUNK_ID, MIB]]}],
    }

    async def manifest(request: web.Request) -> web.StreamResponse:
        return web.json_response(doc)

    async def chunk(request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            return web.Response(status=503)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-netopt-frames"})
        await resp.prepare(request)
        try:
            await resp.write(frames)
            for _ in range(64):
                await resp.write(ZEROS)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return resp

    version = manifest_from_dict(doc).manifest_id
    info = {**_info(1, MIB), "manifest_id": version, "stream_levels": True, **offers}
    return Hostile(manifest, info, chunk)


def _context_bomb_server() -> Hostile:
    """A server offering stream contexts whose stream frame for a 1 MiB chunk is a zstd
    frame header and 1 MiB of 4-byte RLE blocks: 32 GiB once decoded."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    seed = compressor.compress(b"x") + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    rle_block = (1 << 1 | (128 * 1024) << 3).to_bytes(3, "little") + b"A"
    payload = seed[: zstandard.frame_header_size(seed)] + rle_block * (MIB // 4)
    frames = frame_header(CHUNK_ID, "zstd-stream-new", len(payload)) + payload
    return _one_chunk_stream_server(frames, {"stream_context": True})


def _bundle_server() -> Hostile:
    """A server offering bundles whose stream answers the one 1 MiB chunk asked for with a
    bundle of 64 chunks declared a gigabyte long."""
    frames = frame_header(CHUNK_ID, "zstd-bundle", GIB) + BUNDLE_HEAD.pack(64, 1)
    return _one_chunk_stream_server(frames, {"stream_context": True, "stream_bundles": True})


async def _serve(hostile: Hostile) -> tuple[web.AppRunner, int]:
    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def info(request: web.Request) -> web.Response:
        return web.json_response(hostile.info)

    app = web.Application()
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/datasets/ds", info)
    app.router.add_get("/v1/datasets/ds/manifest", hostile.manifest)
    if hostile.chunk is not None:
        app.router.add_get("/v1/datasets/ds/chunks/{id}", hostile.chunk)
        app.router.add_post("/v1/datasets/ds/batch", hostile.chunk)
        app.router.add_post("/v1/datasets/ds/stream", hostile.chunk)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, int(runner.addresses[0][1])


@dataclass(frozen=True)
class SyncResult:
    exit_code: int
    peak_rss_mb: float
    stderr: str
    timed_out: bool


async def run_sync_process(port: int, tmp_path: Path) -> SyncResult:
    """``netopt sync`` of the hostile dataset as a subprocess; its own peak RSS."""
    codec = tmp_path / "codec.json"
    codec.write_text(json.dumps(cpu_profile_to_dict(CPU)))
    env = {**os.environ, "NETOPT_CODEC_CACHE": str(codec), "PYTHONPATH": str(REPO)}
    err_path = tmp_path / "sync.err"
    hwm_path = tmp_path / "sync.hwm"
    args = [
        sys.executable,
        "-c",
        _PEAK_RSS_LAUNCHER,
        str(hwm_path),
        "sync",
        f"netopt://127.0.0.1:{port}/ds",
        str(tmp_path / "dest"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--cc",
        "default",
    ]
    with err_path.open("wb") as err:
        proc = await asyncio.to_thread(
            subprocess.Popen, args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err
        )  # fmt: skip
    waiter = asyncio.ensure_future(asyncio.to_thread(os.wait4, proc.pid, 0))
    timed_out = False
    try:
        _, status, usage = await asyncio.wait_for(asyncio.shield(waiter), SYNC_TIMEOUT_S)
    except TimeoutError:
        timed_out = True
        proc.kill()
        _, status, usage = await waiter
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    peak_kb = int(hwm_path.read_text()) if hwm_path.exists() else usage.ru_maxrss
    return SyncResult(proc.returncode, peak_kb / 1024, err_path.read_text(), timed_out)


_PEAK_RSS_LAUNCHER = """
import atexit, runpy, sys

def _peak(path=sys.argv[1]):
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            open(path, "w").write(line.split()[1])

atexit.register(_peak)
sys.argv = ["netopt", *sys.argv[2:]]
runpy.run_module("netopt", run_name="__main__", alter_sys=True)
"""
"""``python -m netopt ARGS`` that writes its peak RSS (kB) to its first argument at exit:
the high-water mark of the process's own memory since its exec (``VmHWM``). ``wait4``'s
``ru_maxrss`` also counts the pytest process it was forked from (Linux carries the old
memory's high-water mark across exec), which grows as the suite runs: after 459 tests
it read 754 MB for a sync whose own peak is 78 MB."""


@pytest.mark.parametrize(
    ("make", "says"),
    [
        pytest.param(lambda: _padded_server(True), "at most", id="padded-manifest-declared"),
        pytest.param(lambda: _padded_server(False), "bytes expected", id="padded-manifest-chunked"),
        pytest.param(_entries_server, "bytes expected", id="million-entry-manifest"),
        pytest.param(_big_chunk_server, "chunk of 1073741824 bytes", id="gigabyte-chunk"),
        pytest.param(_context_bomb_server, "decodes to more than", id="stream-context-bomb"),
        pytest.param(_bundle_server, "a bundle of 64 chunks", id="stream-bundle-of-64"),
    ],
)
async def test_sync_refuses_oversized_answers_in_bounded_memory(
    tmp_path: Path, make: Callable[[], Hostile], says: str
) -> None:
    runner, port = await _serve(make())
    try:
        result = await run_sync_process(port, tmp_path)
    finally:
        await runner.cleanup()
    print(f"peak RSS {result.peak_rss_mb:.0f} MB, exit {result.exit_code}")
    assert not result.timed_out, result.stderr[-2000:]
    assert result.exit_code == 1, result.stderr[-2000:]
    assert says in result.stderr, result.stderr[-2000:]
    assert result.peak_rss_mb < RSS_BOUND_MB
    assert not (tmp_path / "dest" / "big.bin").exists()
