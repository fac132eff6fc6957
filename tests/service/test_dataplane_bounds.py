"""The data-plane server bounds what one request can make it hold or send.

A real ``netopt serve`` (a subprocess, so its peak RSS is its own) gets a stream
request whose body floods chunk names; an in-process server gets a batch that names
one chunk a thousand times, and stream bodies that are not names.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import struct
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from tests.service.dataplane_helpers import make_dataset, start
from tests.service.serve_process import ServeProcess, serve_process

MIB = 1024 * 1024
FLOOD_BYTES = 96 * MIB
RSS_GROWTH_BOUND_MB = 40.0
"""What the flood may add to the server's peak RSS (it queued every name: ~200 MB)."""


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _names(port: int) -> list[str]:
    url = f"http://127.0.0.1:{port}/v1/datasets/ds/manifest"
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc = json.load(resp)
    return [c[0] for f in doc["files"] for c in f["chunks"]]


def _settled_peak_mb(server: ServeProcess) -> float:
    """The server's peak RSS once its RSS has stopped moving (it has read what was sent)."""
    last = server.rss_mb()
    deadline_s = time.monotonic() + 15
    while time.monotonic() < deadline_s:
        time.sleep(0.5)
        now = server.rss_mb()
        if abs(now - last) < 1:
            break
        last = now
    return server.peak_rss_mb()


def _flood(port: int, first: str, flood_name: str) -> int:
    """A stream request naming ``first``, then ``flood_name`` over and over (never reading
    the frames); the bytes the server took before it cut the stream."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sent = 0
    try:
        sock.sendall(
            b"POST /v1/datasets/ds/stream?level=0 HTTP/1.1\r\nHost: t\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + _chunk(first.encode() + b"\n")
        )
        block = _chunk((flood_name.encode() + b"\n") * (MIB // 65))
        while sent < FLOOD_BYTES:
            sock.sendall(block)
            sent += len(block)
    except OSError:
        pass  # the server cut the stream: what a bounded one does
    finally:
        sock.close()
    return sent


def test_stream_name_flood_keeps_server_memory_bounded(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    with serve_process(tmp_path / "src", tmp_path) as server:
        names = _names(server.port)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v1/health", timeout=10):
            pass
        before_mb = server.peak_rss_mb()
        sent = _flood(server.port, names[0], names[0])
        after_mb = _settled_peak_mb(server)
        print(f"server peak RSS {before_mb:.0f} -> {after_mb:.0f} MB, {sent / MIB:.0f} MiB sent")
        assert after_mb - before_mb < RSS_GROWTH_BOUND_MB
        url = f"http://127.0.0.1:{server.port}/v1/health"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200


async def _post(port: int, route: str, body: bytes) -> tuple[int, str, object]:
    url = f"http://127.0.0.1:{port}/v1/datasets/ds/{route}?level=0"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=io.BytesIO(body)) as resp,
    ):
        raw = await resp.read()
        doc = json.loads(raw) if resp.content_type == "application/json" else None
        return resp.status, resp.content_type, doc


async def test_batch_naming_a_chunk_twice_is_refused(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await start(tmp_path / "src", token=None)
    try:
        name = next(iter(manifest.unique_chunks()))
        status, kind, body = await _post(
            port, "batch", json.dumps({"chunks": [name] * 1024}).encode()
        )
        assert (status, kind) == (400, "application/json")
        assert isinstance(body, dict)
        assert "more than once" in str(body["message"])
        assert stats.payload_bytes_sent == 0
        others = list(manifest.unique_chunks())[:3]
        status, _, _ = await _post(port, "batch", json.dumps({"chunks": others}).encode())
        assert status == 200
    finally:
        await runner.cleanup()


async def test_stream_bodies_that_are_not_names_get_a_json_4xx(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port, _, _ = await start(tmp_path / "src", token=None)
    try:
        for body, want in [
            (b"a" * (3 * MIB) + b"\n", 400),  # one 3 MB line
            (("0" * 64 + "\n").encode() * 100_000, 404),  # not a chunk of this dataset
            (b"\xff" * 64 + b"\n", 400),
        ]:
            status, kind, doc = await _post(port, "stream", body)
            assert (status, kind) == (want, "application/json"), doc
            assert isinstance(doc, dict)
            assert doc["error"]
            assert doc["message"]
    finally:
        await runner.cleanup()


async def test_a_stream_that_repeats_a_name_is_cut_after_the_first_frame(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await start(tmp_path / "src", token=None)
    try:
        names = list(manifest.unique_chunks())
        body = "".join(f"{n}\n" for n in [names[0], names[1], names[0], *names[2:]]).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/datasets/ds/stream?level=0 HTTP/1.1\r\nHost: t\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            got = b""
            while piece := await asyncio.to_thread(sock.recv, 1 << 20):
                got += piece
        assert got.startswith(b"HTTP/1.1 200")
        assert stats.chunk_requests[names[0]] == 1  # the repeat was never sent
        assert sum(stats.chunk_requests.values()) <= 2
    finally:
        await runner.cleanup()


def _cut_mid_stream(port: int, names: list[str], read_bytes: int) -> None:
    """A stream request naming ``names[0]`` whose body never ends; once ``read_bytes`` of
    the answer came (0: none asked for), the connection is reset, as a client killed
    mid-sync (or a cut link) leaves it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    try:
        sock.sendall(
            b"POST /v1/datasets/ds/stream?level=0 HTTP/1.1\r\nHost: t\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            + _chunk(b"\n".join(n.encode() for n in names) + b"\n")
        )
        got = b""
        while len(got) < read_bytes:
            block = sock.recv(65536)
            if not block:
                break
            got += block
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # RST


@pytest.mark.parametrize("read_bytes", [0, 100])
def test_a_client_gone_mid_stream_is_no_server_error(tmp_path: Path, read_bytes: int) -> None:
    # A killed client is routine: the server ends that stream quietly (no traceback in
    # its log) and goes on serving.
    make_dataset(tmp_path / "src")
    with serve_process(tmp_path / "src", tmp_path) as server:
        names = _names(server.port)
        for _ in range(3):
            _cut_mid_stream(server.port, names[:2], read_bytes)
        time.sleep(0.5)  # the server notices the resets
        url = f"http://127.0.0.1:{server.port}/v1/health"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200
        log = server.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert "Error handling request" not in log, log[-3000:]
