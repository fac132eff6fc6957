"""An origin whose files change: `netopt serve` publishes new versions, syncs follow them.

Users update datasets in place and append shards; a sync must send the current
state (as rsync and rclone do), never mix versions, and never report success with
bytes the origin no longer has.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from netopt.cache.syncer import run_sync
from netopt.dataplane.origin import LiveDataset
from netopt.dataplane.server import ServeSettings, ServeStats, create_app, start_server
from netopt.dataplane.synctypes import SyncProgress
from netopt.dataplane.watch import TreeWatcher
from netopt.errors import DatasetChangedError
from netopt.transfer.manifest import build_manifest
from tests.service.cache_helpers import CHUNK_BYTES, request, served_options, tree
from tests.service.dataplane_helpers import CPU, TOKEN

NAME = "ds"


def _write_tree(root: Path, seed: int, files: int = 12, size: int = 200_000) -> None:
    rng = random.Random(seed)
    for i in range(files):
        path = root / f"part-{i // 4}" / f"shard-{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
    (root / "top.txt").write_bytes(b"top level %d\n" % seed)


async def _serve(
    root: Path, stat_walk_only: bool = False, stats: ServeStats | None = None
) -> tuple[LiveDataset, object, int]:
    live = LiveDataset.load(root, NAME, CHUNK_BYTES)
    if stat_walk_only:
        live._watcher.close()  # as on a kernel without inotify: every answer walks
        live._watcher.reason = "test: inotify turned off"
    app = create_app(ServeSettings(token=TOKEN, worker_threads=2), {NAME: live}, CPU, stats)
    runner, port = await start_server(app, "127.0.0.1", 0)
    return live, runner, port


def _change_after_reads(live: LiveDataset, stats: ServeStats, change: Callable[[], bool]) -> None:
    """Call ``change()`` (True: it changed a file) whenever the server brings the dataset
    up to date after reading chunks since the last change: at a stream's end, between
    its last chunk read and the end frame that names the version (the window in which a
    change must still be caught). ``change`` returning False stops the changes."""
    real_fresh = live.fresh
    reads_at_change = [0]

    async def fresh(run_in_thread: Any) -> Any:
        reads = sum(stats.chunk_requests.values())
        if reads > reads_at_change[0] and change():
            reads_at_change[0] = reads
        return await real_fresh(run_in_thread)

    live.fresh = fresh  # type: ignore[method-assign]


@pytest.mark.parametrize("stat_walk_only", [False, True], ids=["inotify", "stat-walk"])
async def test_changed_files_publish_a_version_equal_to_a_fresh_build(
    tmp_path: Path, stat_walk_only: bool
) -> None:
    src = tmp_path / "src"
    _write_tree(src, seed=1)
    live, runner, port = await _serve(src, stat_walk_only)
    try:
        first = live.manifest.manifest_id
        first_chunks = set(live.index)
        assert live.watching.startswith("inotify" if not stat_walk_only else "stat walk")
        # In place, same size; appended; a new shard in a new directory; one removed.
        shard = src / "part-0" / "shard-001.bin"
        data = bytearray(shard.read_bytes())
        data[5000:5010] = b"X" * 10
        shard.write_bytes(bytes(data))
        with (src / "part-1" / "shard-004.bin").open("ab") as f:
            f.write(b"appended shard tail")
        (src / "part-9").mkdir()
        (src / "part-9" / "new.bin").write_bytes(os.urandom(50_000))
        (src / "part-2" / "shard-008.bin").unlink()
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            base = f"http://127.0.0.1:{port}/v1/datasets/{NAME}"
            async with http.get(base) as resp:
                info = await resp.json()
            # The same files chunked from scratch give the same version, so a restarted
            # server and a live one agree on what a version is.
            assert info["manifest_id"] == build_manifest(src, NAME, CHUNK_BYTES).manifest_id
            assert info["manifest_id"] != first
            # A chunk only the old version had is gone, and the answer says why.
            gone = sorted(first_chunks - set(live.index))
            assert gone, "the in-place change must have produced a new chunk"
            async with http.get(f"{base}/chunks/{gone[0]}") as resp:
                assert resp.status == 410
                body = await resp.json()
            assert body["error"] == "DatasetChangedError"
            # Nothing changed since: the next answer is the same version, not a rebuild.
            published = live.versions_published
            async with http.get(f"{base}/manifest") as resp:
                manifest = await resp.json()
            assert live.versions_published == published
            assert {f["path"] for f in manifest["files"]} == {
                p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()
            }
    finally:
        await runner.cleanup()  # type: ignore[attr-defined]
        live.close()


async def test_files_changed_mid_sync_restart_on_the_new_version(tmp_path: Path) -> None:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    _write_tree(src, seed=1, files=24)
    live, runner, port = await _serve(src)
    rewritten: list[int] = []

    def rewrite_everything(progress: SyncProgress) -> None:
        # After the first stored chunk, every file changes: the chunks not yet fetched
        # are gone from the origin and the ones written belong to an old version.
        if not rewritten and progress.chunks_done >= 1:
            rewritten.append(progress.chunks_done)
            _write_tree(src, seed=2, files=24)

    try:
        url = f"netopt://127.0.0.1:{port}/{NAME}"
        req = request(url, dest, cache, source_options=served_options(TOKEN, CPU))
        report = await run_sync(req, on_progress=rewrite_everything)
        assert rewritten
        assert report.version_restarts >= 1
        # Success means DEST is the origin's current state, whole.
        assert tree(dest) == tree(src)
        assert report.manifest_id == build_manifest(src, NAME, CHUNK_BYTES).manifest_id
    finally:
        await runner.cleanup()  # type: ignore[attr-defined]
        live.close()


async def test_an_origin_that_never_settles_fails_clearly(tmp_path: Path) -> None:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    _write_tree(src, seed=1)
    stats = ServeStats()
    live, runner, port = await _serve(src, stats=stats)
    seeds = iter(range(100, 200))

    def keep_changing() -> bool:
        (src / "top.txt").write_bytes(b"version %d\n" % next(seeds))
        return True

    # Every attempt's chunks are followed by a change before the server names the version.
    _change_after_reads(live, stats, keep_changing)
    try:
        url = f"netopt://127.0.0.1:{port}/{NAME}"
        req = request(url, dest, cache, source_options=served_options(TOKEN, CPU))
        with pytest.raises(DatasetChangedError, match="changed 4 times during the sync"):
            await run_sync(req)
    finally:
        await runner.cleanup()  # type: ignore[attr-defined]
        live.close()


def test_watcher_sees_writes_renames_and_new_directories(tmp_path: Path) -> None:
    from netopt.dataplane.watch import stat_tree

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"1")
    watcher = TreeWatcher()
    try:
        assert watcher.active, watcher.reason
        watcher.watch(stat_tree(tmp_path)[1])
        assert not watcher.changed()
        (tmp_path / "a" / "f").write_bytes(b"2")
        assert watcher.changed()
        assert not watcher.changed()
        watcher.watch(stat_tree(tmp_path)[1])
        (tmp_path / "a" / "sub").mkdir()
        assert watcher.changed()
        watcher.watch(stat_tree(tmp_path)[1])
        (tmp_path / "a" / "sub" / "g").write_bytes(b"new")
        assert watcher.changed()
        watcher.watch(stat_tree(tmp_path)[1])
        os.rename(tmp_path / "a" / "f", tmp_path / "a" / "h")
        assert watcher.changed()
    finally:
        watcher.close()


def _wait_for_line(proc: subprocess.Popen[str], needle: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline() if proc.stdout else ""
        if needle in line:
            return line
        assert line or proc.poll() is None, "serve exited"
    raise AssertionError(f"no {needle!r} from serve")


def test_cli_resync_after_in_place_change_sends_the_current_bytes(tmp_path: Path) -> None:
    # The reproduction with the real commands: serve, sync, change a file in
    # place, sync again: the second sync must write the new bytes.
    src, dest = tmp_path / "src", tmp_path / "dest"
    _write_tree(src, seed=1, files=4)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    serve = subprocess.Popen(
        [sys.executable, "-m", "netopt", "serve", str(src), "--name", NAME,
         "--bind", "127.0.0.1:0", "--token-file", str(token_file)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        line = _wait_for_line(serve, "serving netopt://", 60)
        url = line.split()[1]

        def sync() -> dict[str, object]:
            out = subprocess.run(
                [sys.executable, "-m", "netopt", "sync", url, str(dest), "--json",
                 "--token-file", str(token_file)],
                capture_output=True, text=True, env=env, timeout=120,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            result: dict[str, object] = json.loads(out.stdout)
            return result

        sync()
        assert tree(dest) == tree(src)
        shard = src / "part-0" / "shard-002.bin"
        data = bytearray(shard.read_bytes())
        data[100:104] = b"NEW!"
        shard.write_bytes(bytes(data))
        with (src / "top.txt").open("ab") as f:
            f.write(b"appended\n")
        again = sync()
        assert again["files_written"] == 2
        assert tree(dest) == tree(src)
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        if serve.stdout:
            serve.stdout.close()


async def test_a_file_added_with_an_unservable_name_is_left_out(tmp_path: Path) -> None:
    # A name no client could write safely (a control character) appears after the start:
    # the dataset keeps answering, with the new good file and without the bad one.
    src = tmp_path / "src"
    _write_tree(src, seed=1, files=4)
    live, runner, port = await _serve(src)
    try:
        (src / "bad\nname.txt").write_bytes(b"refused")
        (src / "good.txt").write_bytes(b"served")
        url = f"http://127.0.0.1:{port}/v1/datasets/{NAME}/manifest"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(headers=headers) as http, http.get(url) as resp:
            assert resp.status == 200
            paths = {f["path"] for f in (await resp.json())["files"]}
        assert "good.txt" in paths
        assert "bad\nname.txt" not in paths
        published = live.versions_published
        (src / "top.txt").write_bytes(b"changed again\n")
        live.refresh()
        assert live.versions_published == published + 1
        assert "bad\nname.txt" not in {f.path for f in live.manifest.files}
    finally:
        await runner.cleanup()  # type: ignore[attr-defined]
        live.close()


async def test_a_change_after_the_last_chunk_read_is_still_caught(tmp_path: Path) -> None:
    # The version check rides on the streams' end frames: a change made once the server
    # read every chunk, before it names the version at a stream's end, must still restart
    # the sync, never succeed. (The client ends its names with its last ask, so that end
    # comes right after the last frame: a change after it is after the sync's snapshot.)
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    _write_tree(src, seed=1, files=24)
    stats = ServeStats()
    live, runner, port = await _serve(src, stats=stats)
    changed: list[int] = []

    def change_after_the_last_chunk() -> bool:
        if changed or sum(stats.chunk_requests.values()) < len(live.index):
            return False
        changed.append(1)
        (src / "top.txt").write_bytes(b"changed after the last read\n")
        return True

    _change_after_reads(live, stats, change_after_the_last_chunk)
    try:
        url = f"netopt://127.0.0.1:{port}/{NAME}"
        req = request(url, dest, cache, source_options=served_options(TOKEN, CPU))
        report = await run_sync(req)
        assert changed
        assert report.version_restarts == 1
        assert tree(dest) == tree(src)
        assert report.manifest_id == build_manifest(src, NAME, CHUNK_BYTES).manifest_id
    finally:
        await runner.cleanup()  # type: ignore[attr-defined]
        live.close()
