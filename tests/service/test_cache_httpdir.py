"""A web server's directory listing as a sync SOURCE: crawl, chunk here, delta re-sync."""

from __future__ import annotations

import functools
import os
import random
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from netopt.cache.httpdir import list_links
from netopt.cache.syncer import run_sync
from tests.service.cache_helpers import make_dataset, request, tree


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def web_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "www"
    (root / "ds").mkdir(parents=True)
    handler = functools.partial(_Quiet, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root / "ds", f"http://127.0.0.1:{server.server_address[1]}/ds/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_list_links_stays_under_the_base() -> None:
    html = (
        '<a href="../">up</a><a href="a.bin">a</a><a href="sub/">sub</a>'
        '<a href="http://evil/x">x</a><a href="?C=M">sort</a><a href="/other/b">b</a>'
    )
    files, dirs = list_links(html, "http://h/ds/", "http://h/ds/")
    assert files == ["http://h/ds/a.bin"]
    assert dirs == ["http://h/ds/sub/"]


async def test_http_dir_source_then_delta_resync(tmp_path: Path, web_root) -> None:
    src, url = web_root
    total = make_dataset(src)
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    first = await run_sync(request(url, dest, cache))
    assert first.source_kind == "http-dir"
    assert tree(dest) == tree(src)
    assert total <= first.wire_bytes < 1.02 * total  # the files plus the listings
    # 1% of the bytes change: two of the small files (a later mtime, as a real edit has).
    for name in ("s001.bin", "s030.bin"):
        path = src / "shards" / name
        path.write_bytes(random.Random(name).randbytes(40_000))
        os.utime(path, (path.stat().st_mtime + 5, path.stat().st_mtime + 5))
    second = await run_sync(request(url, dest, cache))
    assert tree(dest) == tree(src)
    assert second.plan.files_to_write == 2
    assert 80_000 <= second.wire_bytes <= 0.03 * total
