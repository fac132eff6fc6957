"""A stream's bundles from a real server on localhost, read by the real client stream
(`HttpChunkStream`): a good bundle hands out each chunk verified; a bundle the client
never asked for, a bad head flag, or chunks too large to share a bundle are refused
before any of its payload is decoded."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import aiohttp
import blake3
import pytest
from aiohttp import web
from dataplane_helpers import serve_routes

from netopt.dataplane.chunkio import frame_header
from netopt.dataplane.streamctx import BUNDLE_HEAD, ContextEncoder, ContextError
from netopt.dataplane.streaming import HttpChunkStream
from netopt.errors import ProtocolError

SMALL = [os.urandom(1000), b"text " * 200]
LARGE = [os.urandom(300_000), os.urandom(300_000)]


def _name(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


@contextlib.asynccontextmanager
async def _serving(answer: bytes) -> AsyncIterator[str]:
    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-netopt-frames"})
        await resp.prepare(request)
        await resp.write(answer)
        await resp.write_eof()
        return resp

    runner, port = await serve_routes([web.post("/v1/datasets/ds/stream", stream)])
    try:
        yield f"http://127.0.0.1:{port}/v1/datasets/ds/stream"
    finally:
        await runner.cleanup()


async def _check(resp: aiohttp.ClientResponse, where: str) -> None:
    if resp.status != 200:
        raise ProtocolError(f"{where}: {resp.status}")


async def _read_exactly(resp: aiohttp.ClientResponse, n_bytes: int) -> bytes:
    return await resp.content.readexactly(n_bytes)


async def _read_all(answer: bytes, chunks: list[bytes], params: dict[str, str]) -> list[bytes]:
    """Ask for ``chunks`` on a stream whose server answers ``answer``; what came out."""
    async with _serving(answer) as url, aiohttp.ClientSession() as session:
        stream = HttpChunkStream(
            session, url, params, "test stream", "unreachable", _check, _read_exactly
        )
        try:
            for data in chunks:
                stream.ask(_name(data), len(data))
            stream.end()
            return [(await stream.next(_name(d), len(d))).payload for d in chunks]
        finally:
            await stream.aclose(complete=False)


BUNDLED = {"level": "3", "ctx": "1", "bundle": "1"}


async def test_a_good_bundle_hands_out_each_chunk_verified() -> None:
    payload = ContextEncoder().encode_bundle(SMALL, 3)
    answer = frame_header(_name(SMALL[0]), "zstd-bundle", len(payload)) + payload
    assert await _read_all(answer, SMALL, BUNDLED) == SMALL


@pytest.mark.parametrize(
    ("chunks", "head", "params", "error", "says"),
    [
        pytest.param(LARGE, BUNDLE_HEAD.pack(2, 1), BUNDLED, ContextError, "may not share one",
                     id="chunks-too-large-to-share"),
        pytest.param(SMALL, BUNDLE_HEAD.pack(2, 7), BUNDLED, ProtocolError, "bad flag",
                     id="bad-flag"),
        pytest.param(SMALL, BUNDLE_HEAD.pack(2, 1), {"level": "3", "ctx": "1"}, ProtocolError,
                     "unexpected frame", id="not-asked-for"),
        pytest.param(SMALL, BUNDLE_HEAD.pack(3, 1), BUNDLED, ContextError, "a bundle of 3",
                     id="more-than-asked"),
    ],
)  # fmt: skip
async def test_a_lying_bundle_is_refused_before_it_is_decoded(
    chunks: list[bytes], head: bytes, params: dict[str, str], error: type, says: str
) -> None:
    payload = head + b"\x00" * 64  # never decoded: the head is refused first
    answer = frame_header(_name(chunks[0]), "zstd-bundle", len(payload)) + payload
    with pytest.raises(error, match=says):
        await _read_all(answer, chunks, params)
