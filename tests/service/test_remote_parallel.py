"""A web-directory source lists and downloads many files at once, within its bounds,
on sockets with the client's congestion control (bbr by default; this machine's own
default is bbr too, so the test sets others and sees them used).

The origin is a real aiohttp server on loopback that answers each HEAD and GET after
a short delay, as a server across a long link does, and counts the requests in
flight; ``ss`` reads the congestion control of the client's real connection.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from netopt.cache.httpdir import DESCRIBES_AT_ONCE
from netopt.cache.remotefiles import DOWNLOADS_AT_ONCE
from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import run_sync
from netopt.dataplane.httpsource import ClientOptions
from tests.service.cache_helpers import CHUNK_BYTES, listing_page, request, tree

FILES = 40
DELAY_S = 0.05


@dataclass
class SlowOrigin:
    files: dict[str, bytes]
    etag: str = '"1"'
    in_flight: Counter[str] = field(default_factory=Counter)
    most: Counter[str] = field(default_factory=Counter)
    client_cc: list[str] = field(default_factory=list)

    async def listing(self, request: web.Request) -> web.Response:
        return listing_page(self.files)

    async def file(self, request: web.Request) -> web.Response:
        self.in_flight[request.method] += 1
        self.most[request.method] = max(self.most[request.method], self.in_flight[request.method])
        try:
            await asyncio.sleep(DELAY_S)
            if request.method == "GET" and not self.client_cc:
                self.client_cc.append(await _peer_congestion_control(request))
            data = self.files[request.match_info["name"]]
            headers = {"ETag": self.etag, "Last-Modified": "Mon, 30 Nov 2026 10:00:00 GMT"}
            if request.method == "HEAD":
                return web.Response(headers={**headers, "Content-Length": str(len(data))})
            return web.Response(body=data, headers=headers)
        finally:
            self.in_flight[request.method] -= 1


async def _peer_congestion_control(request: web.Request) -> str:
    """What ``ss`` says the client's end of this connection runs (same host, loopback)."""
    assert request.transport is not None
    host, port = request.transport.get_extra_info("peername")[:2]
    proc = await asyncio.create_subprocess_exec(
        "ss", "-tinH", "state", "established", "src", f"{host}:{port}",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    known = [cc for cc in ("bbr", "cubic", "reno") if f" {cc} " in f" {out.decode()} "]
    return known[0] if known else out.decode()


@pytest.fixture
async def slow_origin() -> AsyncIterator[tuple[SlowOrigin, str]]:
    origin = SlowOrigin({f"f{i:03d}.bin": os.urandom(20_000 + i) for i in range(FILES)})
    app = web.Application()
    app.add_routes([web.get("/ds/", origin.listing), web.get("/ds/{name}", origin.file)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield origin, f"http://127.0.0.1:{runner.addresses[0][1]}/ds/"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("congestion_control", ["reno", "cubic"])
async def test_many_files_are_listed_and_downloaded_at_once_within_bounds(
    tmp_path: Path, slow_origin: tuple[SlowOrigin, str], congestion_control: str
) -> None:
    origin, url = slow_origin
    dest = tmp_path / "dest"
    opts = SourceOptions(
        client=ClientOptions(congestion_control=congestion_control), avg_chunk_bytes=CHUNK_BYTES
    )
    await run_sync(request(url, dest, tmp_path / "cache", source_options=opts))
    assert tree(dest) == origin.files
    assert origin.most["HEAD"] == 0  # a new file is listed by its GET: one round trip
    assert 1 < origin.most["GET"] <= DESCRIBES_AT_ONCE
    # Every file changes: the re-sync lists the known files by HEAD, then downloads.
    origin.files = {name: os.urandom(len(data)) for name, data in origin.files.items()}
    origin.etag = '"2"'
    origin.most.clear()
    await run_sync(request(url, dest, tmp_path / "cache", source_options=opts))
    assert tree(dest) == origin.files
    assert 1 < origin.most["HEAD"] <= DESCRIBES_AT_ONCE
    assert 1 < origin.most["GET"] <= DOWNLOADS_AT_ONCE
    assert origin.client_cc
    assert set(origin.client_cc) == {congestion_control}  # the client's, not the host's
