"""A web-directory source lists and downloads many files at once, within its bounds.

The origin is a real aiohttp server on loopback that answers each HEAD and GET after
a short delay, as a server across a long link does, and counts the requests in
flight.
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
from netopt.cache.syncer import run_sync
from tests.service.cache_helpers import listing_page, request, tree

FILES = 40
DELAY_S = 0.05


@dataclass
class SlowOrigin:
    files: dict[str, bytes]
    etag: str = '"1"'
    in_flight: Counter[str] = field(default_factory=Counter)
    most: Counter[str] = field(default_factory=Counter)

    async def listing(self, request: web.Request) -> web.Response:
        return listing_page(self.files)

    async def file(self, request: web.Request) -> web.Response:
        self.in_flight[request.method] += 1
        self.most[request.method] = max(self.most[request.method], self.in_flight[request.method])
        try:
            await asyncio.sleep(DELAY_S)
            data = self.files[request.match_info["name"]]
            headers = {"ETag": self.etag, "Last-Modified": "Mon, 30 Nov 2026 10:00:00 GMT"}
            if request.method == "HEAD":
                return web.Response(headers={**headers, "Content-Length": str(len(data))})
            return web.Response(body=data, headers=headers)
        finally:
            self.in_flight[request.method] -= 1


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


async def test_many_files_are_listed_and_downloaded_at_once_within_bounds(
    tmp_path: Path, slow_origin: tuple[SlowOrigin, str]
) -> None:
    origin, url = slow_origin
    dest = tmp_path / "dest"
    await run_sync(request(url, dest, tmp_path / "cache"))
    assert tree(dest) == origin.files
    assert origin.most["HEAD"] == 0  # a new file is listed by its GET: one round trip
    assert 1 < origin.most["GET"] <= DESCRIBES_AT_ONCE
    # Every file changes: the re-sync lists the known files by HEAD, then downloads.
    origin.files = {name: os.urandom(len(data)) for name, data in origin.files.items()}
    origin.etag = '"2"'
    origin.most.clear()
    await run_sync(request(url, dest, tmp_path / "cache"))
    assert tree(dest) == origin.files
    assert 1 < origin.most["HEAD"] <= DESCRIBES_AT_ONCE
    assert 1 < origin.most["GET"] <= DOWNLOADS_AT_ONCE
