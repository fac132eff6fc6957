"""A web origin's listing of a deep tree is crawled several pages at once, byte for byte,
and a hostile listing cannot make the crawl go on or hold more than its bounds: endless
subdirectories stop at `MAX_PAGES`, a page of too many links at `MAX_PAGE_LINKS`, the
pages read at once at `LINKS_HELD_MAX`.

The origin is a real aiohttp server on loopback serving nested directory listings (as
nginx's autoindex does: a page per directory, links relative to it); each listing page
takes `PAGE_DELAY_S` to answer, as a page a round trip away does.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

import netopt.cache.httpdir as httpdir_module
from netopt.cache.syncer import run_sync
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import ProtocolError
from tests.service.cache_helpers import request, tree

PAGE_DELAY_S = 0.05


@dataclass
class Tree:
    """Files by relative path; listing pages answered and the most answered at once."""

    files: dict[str, bytes]
    endless: bool = False
    """Every page also links a new subdirectory (a generated, endless listing)."""
    extra_links: int = 0
    """Links to files that are not there, added to the top page."""
    site_pages: frozenset[str] = frozenset()
    """Directories whose page is a site's index.html, not a listing (as nginx sends when
    the directory holds one): links only outside the tree."""
    pages: int = 0
    running: int = 0
    most_at_once: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        if path and not path.endswith("/"):
            if path not in self.files:
                raise web.HTTPNotFound
            data = self.files[path]
            headers = {"ETag": f'"{hash(data)}"', "Content-Length": str(len(data))}
            return web.Response(body=None if request.method == "HEAD" else data, headers=headers)
        self.pages += 1
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await asyncio.sleep(PAGE_DELAY_S)
        finally:
            self.running -= 1
        if path in self.site_pages:
            page = '<html><link href="/static/site.css"><a href="/index.html">home</a></html>'
            return web.Response(text=page, content_type="text/html")
        names = {rel[len(path) :].split("/", 1)[0] + ("/" if "/" in rel[len(path) :] else "")
                 for rel in self.files if rel.startswith(path)}  # fmt: skip
        if self.endless:
            names.add(f"more{self.pages}/")
        names |= {f"ghost{i}.bin" for i in range(self.extra_links if not path else 0)}
        links = "".join(f'<a href="{n}">{n}</a>' for n in ["../", *sorted(names)])
        return web.Response(text=f"<html><body>{links}</body></html>", content_type="text/html")


def deep_tree() -> dict[str, bytes]:
    """75 directories over three levels (60 class folders in 12 groups in 3 splits, as
    image datasets are laid out), two files in each class folder, some of them empty."""
    files: dict[str, bytes] = {}
    for split in ("train", "val", "test"):
        for group in range(4):
            for cls in range(5):
                folder = f"{split}/g{group}/c{cls}"
                files[f"{folder}/a.bin"] = os.urandom(3000 + 100 * cls)
                files[f"{folder}/b.txt"] = b"" if cls == 0 else f"{folder}\n".encode() * 50
    files["README.txt"] = b"a deep tree\n"
    return files


@pytest.fixture
async def origin() -> AsyncIterator[tuple[Tree, str]]:
    served = Tree(files=deep_tree())
    app = web.Application()
    app.add_routes([web.get("/ds/{path:.*}", served.handle)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield served, f"http://127.0.0.1:{runner.addresses[0][1]}/ds/"
    finally:
        await runner.cleanup()


def _once() -> SyncOptions:
    return SyncOptions(retry_window_s=0, backoff_initial_s=0.05, backoff_max_s=0.1)


async def test_a_deep_tree_is_listed_several_pages_at_once(
    tmp_path: Path, origin: tuple[Tree, str], caplog: pytest.LogCaptureFixture
) -> None:
    served, url = origin
    await run_sync(request(url, tmp_path / "d", tmp_path / "c", sync_options=_once()))
    assert tree(tmp_path / "d") == served.files
    assert "linked nothing" not in caplog.text
    # Every directory's page once: the top, 3 splits, 12 groups, 60 class folders.
    assert served.pages == 1 + 3 + 12 + 60
    # Pages overlapped, never more than the bound (one at a time, 76 pages a round
    # trip each would be 76 round trips).
    assert 1 < served.most_at_once <= httpdir_module.PAGES_AT_ONCE


async def test_a_directory_whose_page_is_not_a_listing_is_named_in_a_warning(
    tmp_path: Path, origin: tuple[Tree, str], caplog: pytest.LogCaptureFixture
) -> None:
    # Two class folders answer with a site's page (their index.html) instead of a
    # listing: their files cannot be found by any crawler. The sync moves the rest and
    # says which directories hid theirs, instead of ending as if the tree were whole.
    served, url = origin
    hidden = ("train/g0/c1/", "val/g2/c3/")
    served.site_pages = frozenset(hidden)
    await run_sync(request(url, tmp_path / "d", tmp_path / "c", sync_options=_once()))
    shown = {rel: data for rel, data in served.files.items() if not rel.startswith(hidden)}
    assert len(shown) == len(served.files) - 4
    assert tree(tmp_path / "d") == shown
    warnings = [r.getMessage() for r in caplog.records if "linked nothing" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert "2 directories" in warnings[0]
    assert all(h in warnings[0] for h in hidden)


async def test_an_endless_listing_stops_at_the_bound(
    tmp_path: Path, origin: tuple[Tree, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    served, url = origin
    served.endless = True
    monkeypatch.setattr(httpdir_module, "MAX_PAGES", 200)
    with pytest.raises(ProtocolError, match="more than 200 directories"):
        await run_sync(request(url, tmp_path / "d", tmp_path / "c", sync_options=_once()))
    # Refused at the bound, with at most the pages already asked for still read.
    assert served.pages <= 200 + httpdir_module.PAGES_AT_ONCE
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("bound", "refusal"),
    [
        ("MAX_PAGE_LINKS", "listing page of over 1000 links"),
        ("LINKS_HELD_MAX", "listing pages read at once hold over 1000 links"),
    ],
)
async def test_a_page_of_too_many_links_is_refused(
    tmp_path: Path,
    origin: tuple[Tree, str],
    monkeypatch: pytest.MonkeyPatch,
    bound: str,
    refusal: str,
) -> None:
    """One page's links, and those of the pages read at once together, are bounded."""
    served, url = origin
    served.extra_links = 5000
    monkeypatch.setattr(httpdir_module, bound, 1000)
    with pytest.raises(ProtocolError, match=refusal):
        await run_sync(request(url, tmp_path / "d", tmp_path / "c", sync_options=_once()))
    assert not (tmp_path / "d").exists()
