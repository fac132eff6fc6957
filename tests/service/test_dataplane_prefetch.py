"""`netopt.dataplane.prefetch`: a sync's first round trips begun before its imports,
against a real localhost server: answers and sockets are used, anything wrong falls
back to the normal path (which reports errors), nothing leaks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from dataplane_helpers import CPU, FAST, TOKEN, check_tree, make_dataset, start
from test_dataplane_server import _evil_app

from netopt.dataplane import prefetch
from netopt.dataplane.client import ClientOptions, sync_url
from netopt.errors import AuthenticationError, PathTraversalError

CLIENT = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=5)


async def _sync(port: int, dest: Path, client: ClientOptions = CLIENT, streams: int = 4):
    return await sync_url(
        f"netopt://127.0.0.1:{port}/ds",
        dest,
        client,
        client_cpu=CPU,
        sync_options=FAST,
        streams=streams,
    )


@pytest.fixture(autouse=True)
def _fresh_stats():
    prefetch.discard()
    prefetch.STATS.clear()
    yield
    prefetch.discard()


async def _settle() -> None:
    """Let the prefetch threads finish connecting (they are not awaited by `start`)."""
    for _ in range(100):
        pending = prefetch._pending
        if pending is None or not any(t.is_alive() for t in pending.threads):
            return
        await asyncio.sleep(0.02)


async def test_prefetched_answers_and_sockets_are_used(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    runner, port, stats, manifest = await start(tmp_path / "src")
    try:
        assert prefetch.start(f"netopt://127.0.0.1:{port}/ds", TOKEN, 4)
        await _settle()
        summary, _ = await _sync(port, tmp_path / "dst")
        check_tree(tmp_path / "dst", files)
        assert summary.logical_bytes == manifest.total_bytes
        assert sum(stats.chunk_requests.values()) == len(manifest.unique_chunks())
        assert prefetch.STATS["meta_used"] == 1
        assert prefetch.STATS["sockets_used"] >= 1
        # Every connected socket was either taken by a stream or closed at the end.
        assert prefetch.STATS["sockets_used"] + prefetch.STATS["sockets_discarded"] == 4
        assert prefetch._pending is None
    finally:
        await runner.cleanup()


async def test_a_prefetch_with_another_token_or_dataset_is_not_used(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    runner, port, _, _ = await start(tmp_path / "src")
    try:
        prefetch.start(f"netopt://127.0.0.1:{port}/ds", "another-token-0123456789", 0)
        await _settle()
        await _sync(port, tmp_path / "a")
        check_tree(tmp_path / "a", files)
        prefetch.start(f"netopt://127.0.0.1:{port}/other", TOKEN, 0)
        await _settle()
        await _sync(port, tmp_path / "b")
        check_tree(tmp_path / "b", files)
        assert prefetch.STATS["meta_used"] == 0
    finally:
        await runner.cleanup()


async def test_a_refused_prefetch_leaves_the_error_to_the_normal_path(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port, _, _ = await start(tmp_path / "src")
    try:
        prefetch.start(f"netopt://127.0.0.1:{port}/ds", None, 2)
        await _settle()
        with pytest.raises(AuthenticationError):
            await _sync(port, tmp_path / "dst", ClientOptions(token=None))
        assert prefetch.STATS["meta_used"] == 0
    finally:
        await runner.cleanup()


async def test_prefetched_manifest_is_validated_like_any_other(tmp_path: Path) -> None:
    doc = {
        "name": "ds",
        "files": [
            {"path": "../evil", "size_bytes": 3, "mode": 420, "mtime_ns": 0,
             "chunks": [["a" * 64, 3]]}
        ],
    }  # fmt: skip
    runner = web.AppRunner(_evil_app(doc))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        prefetch.start(f"netopt://127.0.0.1:{port}/ds", None, 2)
        await _settle()
        with pytest.raises(PathTraversalError):
            await _sync(port, tmp_path / "box" / "dst", ClientOptions())
        assert prefetch.STATS["meta_used"] == 1
        assert not (tmp_path / "box" / "evil").exists()
    finally:
        await runner.cleanup()


def test_start_ignores_what_is_not_a_dataset_url() -> None:
    for url in ("http://127.0.0.1:1/ds", "netopt://127.0.0.1/ds", "netopt://h:99999/ds",
                "netopt://h:80/", "netopt://h:80/a/b", "/some/dir"):  # fmt: skip
        assert not prefetch.start(url, None, 1), url
    assert prefetch._pending is None
