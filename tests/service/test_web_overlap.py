"""A web directory's large file is downloaded as soon as it is listed, while the tree's
small files are still being listed and downloaded: its parts do not wait for the whole
tree. A real aiohttp static origin on loopback (a listing, ranges, ETag) that answers
each small file after a pause and records when each request began and ended."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from netopt.cache.spool import PARTS_MIN_BYTES
from netopt.cache.syncer import run_sync
from tests.service.cache_helpers import request, static_origin, tree

SMALL_FILES = 1000
"""Eight times the files listed at once (128): the last ones wait for slots, 8 pauses."""
PAUSE_S = 0.05


async def test_a_large_files_parts_begin_before_the_small_files_are_all_in(
    tmp_path: Path,
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a-large.bin").write_bytes(os.urandom(4 * PARTS_MIN_BYTES))
    for i in range(SMALL_FILES):
        (src / f"small-{i:04d}.txt").write_bytes(b"%d\n" % i * 50)
    requests: list[tuple[str, str | None, float, float]] = []

    @web.middleware
    async def paced(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        began_s = time.monotonic()
        if "small-" in request.path:
            await asyncio.sleep(PAUSE_S)  # an origin far away, per file
        response = await handler(request)
        requests.append((request.path, request.headers.get("Range"), began_s, time.monotonic()))
        return response

    async with static_origin(src, [paced]) as url:
        await run_sync(request(url, tmp_path / "dest", tmp_path / "cache"))
    assert tree(tmp_path / "dest") == tree(src)
    parts = [began for path, ranged, began, _ in requests if "large" in path and ranged]
    assert len(parts) >= 2  # in parts
    smalls_in = max(ended for path, _, _, ended in requests if "small-" in path)
    # The parts began while small files were still coming (before, only after all).
    assert min(parts) < smalls_in - 3 * PAUSE_S, (min(parts), smalls_in)
