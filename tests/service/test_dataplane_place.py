"""A sync given a listing of its destination begins the fetch while the files' directories
are made (a real server on localhost, real files)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from aiohttp import web
from dataplane_helpers import FAST, TOKEN, check_tree, make_dataset, serve_with_middleware, start

import netopt.dataplane.sync as sync_module
from netopt.dataplane.assemble import Placement, place_files
from netopt.dataplane.chunkio import DirChunkSink
from netopt.dataplane.client import ClientOptions, HttpChunkSource, parse_dataset_url
from netopt.dataplane.sync import sync_manifest
from netopt.errors import PathTraversalError
from netopt.transfer.manifest import FileEntry, Manifest

CLIENT = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=5)
WAIT_S = 10.0
FETCH_FAILED_PAUSE_S = 0.3


def _deep_tree(root: Path) -> dict[str, bytes]:
    """`make_dataset`'s files and 200 small files in 40 nested directories."""
    files = make_dataset(root)
    for i in range(200):
        rel = f"pkg{i % 8}/sub{i % 5}/leaf{i % 3}/f{i}.py"
        data = (f"# file {i}\n" * (i + 1)).encode()
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        files[rel] = data
    return files


async def test_the_fetch_begins_before_the_directories_are_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _deep_tree(tmp_path / "src")
    runner, port, stats, manifest = await start(tmp_path / "src")
    real_place = place_files
    asked_first: list[bool] = []

    def place_when_asked(
        dest: Path, entries: list[FileEntry]
    ) -> tuple[Path, list[tuple[FileEntry, str, Placement]]]:
        # On the sync's thread: wait for the server to have served a chunk (bounded), then
        # make the directories. A sync that waited for them would never ask in time.
        deadline_s = time.monotonic() + WAIT_S
        while stats.chunk_requests_total == 0 and time.monotonic() < deadline_s:
            time.sleep(0.005)
        asked_first.append(stats.chunk_requests_total > 0)
        return real_place(dest, entries)

    monkeypatch.setattr(sync_module, "place_files", place_when_asked)
    dest = tmp_path / "dest"
    try:
        url = parse_dataset_url(f"netopt://127.0.0.1:{port}/ds")
        async with HttpChunkSource(url, CLIENT) as source:
            sink = DirChunkSink(tmp_path / "chunks", fsync=False)
            summary = await sync_manifest(manifest, source, sink, dest, FAST, present={})
    finally:
        await runner.cleanup()
    assert asked_first == [True]
    check_tree(dest, files)
    assert summary.files_written == len(files)
    assert summary.chunks_fetched == len(manifest.unique_chunks())
    assert not list(dest.rglob("*.netopt-tmp"))


async def test_the_listing_decides_what_is_written(tmp_path: Path) -> None:
    """A file the listing found with the manifest's size and mtime is left as it is; one it
    found otherwise, and one it did not find, are written."""
    files = _deep_tree(tmp_path / "src")
    runner, port, _, manifest = await start(tmp_path / "src")
    dest = tmp_path / "dest"
    kept, stale = "pkg0/sub0/leaf0/f0.py", "text/data.jsonl"
    by_path = {entry.path: entry for entry in manifest.files}
    for rel in (kept, stale):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(b"whatever was there")
    present = {
        kept: (by_path[kept].size_bytes, by_path[kept].mtime_ns),
        stale: (by_path[stale].size_bytes + 1, by_path[stale].mtime_ns),
    }
    inode = os.stat(dest / kept).st_ino
    try:
        url = parse_dataset_url(f"netopt://127.0.0.1:{port}/ds")
        async with HttpChunkSource(url, CLIENT) as source:
            sink = DirChunkSink(tmp_path / "chunks", fsync=False)
            summary = await sync_manifest(manifest, source, sink, dest, FAST, present=present)
    finally:
        await runner.cleanup()
    assert summary.files_skipped == 1
    assert summary.files_written == len(files) - 1
    assert (dest / kept).read_bytes() == b"whatever was there"  # trusted, as rsync does
    assert os.stat(dest / kept).st_ino == inode
    check_tree(dest, {rel: data for rel, data in files.items() if rel != kept})


async def _refused_through_a_link(tmp_path: Path, port: int, manifest: Manifest) -> Path:
    """A sync of ``manifest`` from the server on ``port`` into ``tmp_path/dest``, whose
    ``text/nested`` is a link to ``tmp_path/outside``: refused (PathTraversalError). The
    directory outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    (dest / "text").mkdir(parents=True)
    (dest / "text" / "nested").symlink_to(outside, target_is_directory=True)
    url = parse_dataset_url(f"netopt://127.0.0.1:{port}/ds")
    async with HttpChunkSource(url, CLIENT) as source:
        sink = DirChunkSink(tmp_path / "chunks", fsync=False)
        with pytest.raises(PathTraversalError, match="symlink"):
            await sync_manifest(manifest, source, sink, dest, FAST, present={})
    return outside


async def test_a_symlink_out_of_dest_still_stops_a_sync_that_began_fetching(
    tmp_path: Path,
) -> None:
    make_dataset(tmp_path / "src")
    runner, port, _, manifest = await start(tmp_path / "src")
    try:
        outside = await _refused_through_a_link(tmp_path, port, manifest)
    finally:
        await runner.cleanup()
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "dest" / "random.bin").exists()


async def test_a_symlink_out_of_dest_goes_before_a_fetch_error_that_came_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server answers every chunk request 404 at once (a fetch error, final), and the
    # directories are made only after it did: the symlink's refusal is still the error
    # raised, as when the directories were made before the first request.
    make_dataset(tmp_path / "src")

    @web.middleware
    async def no_chunks(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.path.endswith(("/stream", "/batch")) or "/chunks/" in request.path:
            refused.append(request.path)
            raise web.HTTPNotFound(text="no such chunk")
        return await handler(request)

    refused: list[str] = []
    runner, port, dataset = await serve_with_middleware(tmp_path / "src", no_chunks)
    real_place = place_files

    def place_after_a_refusal(
        dest: Path, entries: list[FileEntry]
    ) -> tuple[Path, list[tuple[FileEntry, str, Placement]]]:
        # The stream's 404, then the batches' (the fallback): the client has failed its
        # fetch a moment after the second (on loopback, well within the pause).
        deadline_s = time.monotonic() + WAIT_S
        while len(refused) < 2 and time.monotonic() < deadline_s:
            time.sleep(0.005)
        time.sleep(FETCH_FAILED_PAUSE_S)
        return real_place(dest, entries)

    monkeypatch.setattr(sync_module, "place_files", place_after_a_refusal)
    try:
        outside = await _refused_through_a_link(tmp_path, port, dataset.manifest)
    finally:
        await runner.cleanup()
    assert refused  # the fetch failed first
    assert list(outside.iterdir()) == []
