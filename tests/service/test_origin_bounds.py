"""A hostile web origin cannot make a sync hold or store more than the bounds say: a
listing page over `MAX_PAGE_BYTES`, a file sent without a size past
`UNSIZED_MAX_BYTES`, a ranged read answered with more than the range. A file sent
without a size that ends in time syncs byte for byte, and an origin that ignores ranges
has only what ends at each range read.

The origin is a real aiohttp server on loopback; what it streams is bounded in bytes.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from aiohttp import web

import netopt.cache.httpdir as httpdir_module
import netopt.cache.spool as spool_module
from netopt.cache.syncer import run_sync
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import ProtocolError
from tests.service.cache_helpers import listing_page, request, tree, web_origin

STREAM_CAP_BYTES = 64 << 20
"""The most one answer of the origin sends, however the client reads it."""
PIECE_BYTES = 64 << 10


@dataclass
class Hostile:
    files: dict[str, bytes]
    unsized: set[str] = field(default_factory=set)
    """Files sent without Content-Length (chunked)."""
    endless: set[str] = field(default_factory=set)
    """Files whose GET goes on after the file, up to `STREAM_CAP_BYTES`."""
    page_padding_bytes: int = 0
    ranges: str = "honour"
    """What a ranged GET gets: "honour", "whole" (200 and all of the file, as a server
    that ignores ranges), or "endless" (206 and more than asked)."""
    sent: dict[str, int] = field(default_factory=dict)
    """Body bytes each file's GETs sent, in all."""

    async def listing(self, request: web.Request) -> web.Response:
        page = listing_page(self.files)
        assert isinstance(page.text, str)
        return web.Response(
            text=page.text + " " * self.page_padding_bytes, content_type="text/html"
        )

    async def file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        data = self.files[name]
        headers = {"ETag": '"v1"', "Accept-Ranges": "bytes"}
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(data))})
        asked = request.headers.get("Range")
        status, body = 200, data
        if asked and self.ranges != "whole":
            first, _, last = asked.removeprefix("bytes=").partition("-")
            start, stop = int(first), int(last) + 1 if last else len(data)
            status, body = 206, data[start:stop]
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        endless = name in self.endless or (asked is not None and self.ranges == "endless")
        resp = web.StreamResponse(status=status, headers=headers)
        if name not in self.unsized and not endless:
            resp.content_length = len(body)
        await resp.prepare(request)
        sent = 0
        try:
            while sent < (STREAM_CAP_BYTES if endless else len(body)):
                piece = body[sent : sent + PIECE_BYTES] if sent < len(body) else None
                await resp.write(piece or os.urandom(PIECE_BYTES))
                sent += len(piece or b"x" * PIECE_BYTES)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client stopped reading and went away
        finally:
            self.sent[name] = self.sent.get(name, 0) + sent
        return resp


@pytest.fixture
async def hostile() -> AsyncIterator[tuple[Hostile, str]]:
    served = Hostile(files={"a.bin": os.urandom(2 << 20), "small.txt": b"small\n" * 1000})
    async with web_origin(served.listing, served.file) as url:
        yield served, url


def _once() -> SyncOptions:
    return SyncOptions(retry_window_s=0, backoff_initial_s=0.05, backoff_max_s=0.1)


async def test_a_listing_page_over_the_bound_is_refused(
    tmp_path: Path, hostile: tuple[Hostile, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    served, url = hostile
    monkeypatch.setattr(httpdir_module, "MAX_PAGE_BYTES", 1 << 20)
    served.page_padding_bytes = 3 << 20
    with pytest.raises(ProtocolError, match="listing page over 1048576 bytes"):
        await run_sync(request(url, tmp_path / "d", tmp_path / "c", sync_options=_once()))
    assert not (tmp_path / "d").exists()


async def test_a_file_without_a_size_syncs_when_it_ends(
    tmp_path: Path, hostile: tuple[Hostile, str]
) -> None:
    served, url = hostile
    served.unsized = {"a.bin", "small.txt"}
    await run_sync(request(url, tmp_path / "d", tmp_path / "c", sync_options=_once()))
    assert tree(tmp_path / "d") == served.files


async def test_a_file_without_a_size_stops_at_the_bound(
    tmp_path: Path, hostile: tuple[Hostile, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    served, url = hostile
    monkeypatch.setattr(spool_module, "UNSIZED_MAX_BYTES", 4 << 20)
    served.unsized = {"a.bin"}
    served.endless = {"a.bin"}
    state = tmp_path / "c" / "sources"
    with pytest.raises(ProtocolError, match="without a size and over 4194304 bytes"):
        await run_sync(request(url, tmp_path / "d", tmp_path / "c", sync_options=_once()))
    # What the spool kept of it stayed within the bound (plus the piece that crossed it).
    kept = [p.stat().st_size for p in state.rglob("*.part")] if state.exists() else []
    assert max(kept, default=0) <= (4 << 20) + (1 << 20)
    assert served.sent["a.bin"] < STREAM_CAP_BYTES // 2


@pytest.mark.parametrize("ranges", ["whole", "endless"])
async def test_a_ranged_read_takes_no_more_than_its_range(
    tmp_path: Path, hostile: tuple[Hostile, str], ranges: str
) -> None:
    """A fresh cache with the chunking remembered reads chunks by range: an origin that
    answers with the whole file is read only up to each range's end; one that answers
    with more than the range is refused."""
    served, url = hostile
    first_req = request(url, tmp_path / "d1", tmp_path / "c1", sync_options=_once())
    opts = replace(first_req.source_options, state_dir=str(tmp_path / "state"))
    await run_sync(replace(first_req, source_options=opts))
    served.ranges = ranges
    second = request(url, tmp_path / "d2", tmp_path / "c2", sync_options=_once())
    second = replace(second, source_options=opts)
    size = len(served.files["a.bin"])
    if ranges == "endless":
        with pytest.raises(ProtocolError, match="answered longer"):
            await run_sync(second)
        return
    report = await run_sync(second)
    assert tree(tmp_path / "d2") == served.files
    # Each read ends at its range: half the file per chunk on average, where reading
    # every whole answer took the file once per chunk.
    assert report.summary is not None
    chunks = report.summary.chunks_fetched
    assert chunks >= 8
    assert report.wire_bytes <= 0.7 * chunks * size
