"""The cache under failure: SIGKILL mid-sync then resume, corrupt chunks, a full disk."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netopt.cache.store import Cache
from netopt.cache.syncer import run_sync
from netopt.cache.verify import verify_cache
from netopt.chunking import chunk_id
from netopt.cli.main import main
from netopt.errors import StorageError
from tests.service.cache_helpers import (
    corrupt_stored_chunk,
    make_dataset,
    mount_tmpfs,
    request,
    served_options,
    stored_chunks,
    tree,
    umount,
)
from tests.service.dataplane_helpers import CPU, FAST, TOKEN, start

REPO = Path(__file__).resolve().parents[2]


def _codec_cache(tmp_path: Path) -> Path:
    path = tmp_path / "codec.json"
    path.write_text(
        json.dumps(
            {
                "version": 4,
                "cores": 2,
                "compress_bytes_per_s": {"1": 3e8},
                "decompress_bytes_per_s": {"1": 9e8},
                "hash_bytes_per_s": 1e9,
            }
        )
    )
    return path


async def test_sigkill_mid_sync_then_resume_moves_no_chunk_twice(tmp_path: Path) -> None:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    total = make_dataset(src)
    runner, port, stats, manifest = await start(src, "ds")
    lengths = manifest.unique_chunks()
    env = {**os.environ, "NETOPT_TOKEN": TOKEN, "NETOPT_CODEC_CACHE": str(_codec_cache(tmp_path))}
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "netopt", "sync", f"netopt://127.0.0.1:{port}/ds", str(dest),
            "--cache-dir", str(cache), "--rate-limit-mbps", "8", "--streams", "2", "--level", "0",
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline_s = time.monotonic() + 30
        while len(stored_chunks(cache)) < 20:
            assert proc.returncode is None, "the sync ended before it could be killed"
            assert time.monotonic() < deadline_s, "no chunks arrived"
            await asyncio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL
        with Cache.open(cache) as c:  # consistent on open: every stored chunk verifies
            report = await verify_cache(c)
            assert report.corrupt == ()
            assert not any(c.tmp_dir.iterdir())
            before = set(c.sizes_bytes)
        assert 20 <= len(before) < len(lengths)
        stats.chunk_requests.clear()
        url = f"netopt://127.0.0.1:{port}/ds"
        opts = served_options(TOKEN, CPU)
        resumed = await run_sync(request(url, dest, cache, source_options=opts, sync_options=FAST))
        assert tree(dest) == tree(src)
        assert not set(stats.chunk_requests) & before
        assert resumed.summary is not None
        expected = sum(n for cid, n in lengths.items() if cid not in before)
        assert resumed.summary.fetched_logical_bytes == expected < total
        assert not list(dest.rglob("*.netopt-tmp"))
    finally:
        await runner.cleanup()


def test_verify_finds_corrupt_chunk_and_repairs_from_source(tmp_path: Path, capsys) -> None:
    src, cache = tmp_path / "src", tmp_path / "cache"
    make_dataset(src)
    asyncio.run(run_sync(request(str(src), tmp_path / "d", cache)))
    victim = sorted(stored_chunks(cache))[3]
    corrupt_stored_chunk(cache, victim)
    assert main(["cache", "verify", "--cache-dir", str(cache), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert found["corrupt"] == [victim]
    assert found["unrepaired"] == [victim]
    # The bad chunk was removed; now repair it (and nothing else) from the origin.
    assert main(["cache", "verify", "--cache-dir", str(cache), "--json", "--source", str(src)]) == 0
    fixed = json.loads(capsys.readouterr().out)
    assert fixed["missing"] == [victim]
    assert fixed["repaired"] == [victim]
    assert fixed["ok"]
    with Cache.open(cache) as c:
        assert asyncio.run(verify_cache(c)).corrupt == ()
        assert c.has(victim)


async def test_full_disk_is_a_clear_error_and_leaves_the_cache_consistent(tmp_path: Path) -> None:
    src, mnt = tmp_path / "src", tmp_path / "small"
    total = make_dataset(src)
    mount_tmpfs(mnt, "2m")
    try:
        cache = mnt / "cache"
        # Refused up front, with the figures, before a chunk moves.
        with pytest.raises(StorageError, match="not enough space") as info:
            await run_sync(request(str(src), mnt / "dest", cache))
        assert str(2 * total) in str(info.value)  # chunks into the cache plus files in DEST
        assert not (mnt / "dest").exists()
        # The disk filling up under a put: a clear error, and a consistent cache after.
        blobs = [os.urandom(200_000 + i) for i in range(20)]
        with Cache.open(cache) as c:
            stored: list[str] = []

            def fill() -> None:
                for blob in blobs:
                    c.put(chunk_id(blob), blob)
                    stored.append(chunk_id(blob))

            with pytest.raises(StorageError, match="disk is full") as info:
                fill()
            assert "cache is consistent" in str(info.value)
            assert 0 < len(stored) < len(blobs)
        with Cache.open(cache) as c:
            assert not any(c.tmp_dir.iterdir())
            report = await verify_cache(c)
            assert report.corrupt == ()
            assert report.checked == len(stored) == len(c.sizes_bytes)
    finally:
        umount(mnt)


async def test_full_disk_under_a_group_put_stores_none_of_the_group(tmp_path: Path) -> None:
    # Small chunks stored a group at a time (one write to the pack per group, as a tree's
    # small frames are) until the disk fills: a clear error, no chunk of the failed
    # group kept, every earlier group whole after a reopen.
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "2m")
    try:
        cache = mnt / "cache"
        groups = [[os.urandom(3000 + 7 * j + i) for j in range(40)] for i in range(30)]
        stored: list[str] = []
        failed: list[str] = []
        with Cache.open(cache) as c:

            def fill() -> None:
                nonlocal failed
                for group in groups:
                    ids = [chunk_id(blob) for blob in group]
                    failed = ids
                    c.put_many([(cid, blob, None) for cid, blob in zip(ids, group, strict=True)])
                    stored.extend(ids)
                    c.flush()

            with pytest.raises(StorageError, match="disk is full") as info:
                fill()
            assert "cache is consistent" in str(info.value)
            assert 0 < len(stored) < sum(map(len, groups))
            assert not any(c.has(cid) for cid in failed)
        with Cache.open(cache) as c:
            report = await verify_cache(c)
            assert report.corrupt == ()
            assert set(c.sizes_bytes) == set(stored)
    finally:
        umount(mnt)
