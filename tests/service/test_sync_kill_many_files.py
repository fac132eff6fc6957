"""A real ``netopt sync`` of many small files, killed (SIGKILL) at random points and re-run.

After every kill each file under its final name in DEST is byte-exact, the cache
verifies, and the next run fetches no chunk the cache already held; the last run
completes the tree exactly. Durability is batched (files and chunks are made durable
and renamed in groups, off the fetch path), so a kill lands between a chunk's write
and its batch's flush most of the time: those chunks must not be lost either.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from netopt.cache.store import Cache
from netopt.cache.verify import verify_cache
from tests.service.cache_helpers import stored_chunks
from tests.service.dataplane_helpers import TOKEN, start
from tests.service.test_sync_many_files import make_tree

REPO = Path(__file__).resolve().parents[2]
FILES = 3000
KILLS = 4


def _finished_files(src: Path, dest: Path) -> int:
    """Files under their final names in DEST, each checked byte for byte against SRC."""
    count = 0
    for path in dest.rglob("*"):
        if not path.is_file() or path.name.endswith(".netopt-tmp"):
            continue
        rel = path.relative_to(dest)
        assert path.read_bytes() == (src / rel).read_bytes(), rel
        count += 1
    return count


def _stored(cache: Path) -> tuple[int, int]:
    """Chunks written so far, flushed or not: (chunk files, temporary ones and indexed pack
    records; bytes appended to packs, indexed or not). Zeros before the sync starts."""
    tmp = cache / "tmp"
    unflushed = sum(1 for _ in tmp.iterdir()) if tmp.is_dir() else 0
    packed_bytes = sum(p.stat().st_size for p in cache.glob("packs/*.pack"))
    return unflushed + len(stored_chunks(cache)), packed_bytes


async def _sync(url: str, dest: Path, cache: Path) -> asyncio.subprocess.Process:
    env = {**os.environ, "NETOPT_TOKEN": TOKEN}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "netopt", "sync", url, str(dest), "--cache-dir", str(cache),
        "--rate-limit-mbps", "6", "--level", "0", "--streams", "4",
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


async def test_kill_many_file_sync_at_random_points_then_complete(tmp_path: Path) -> None:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    make_tree(src, FILES, seed=9)
    runner, port, stats, manifest = await start(src, "ds")
    url = f"netopt://127.0.0.1:{port}/ds"
    rng = random.Random(14)
    held: set[str] = set()
    kills = 0
    proc: asyncio.subprocess.Process | None = None
    try:
        for _ in range(KILLS):
            stats.chunk_requests.clear()
            proc = await _sync(url, dest, cache)
            deadline_s = time.monotonic() + 60
            start_count = _stored(cache)
            while _stored(cache) == start_count and proc.returncode is None:
                assert time.monotonic() < deadline_s, "no chunk arrived"
                await asyncio.sleep(0.01)
            await asyncio.sleep(rng.uniform(0.0, 1.5))
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            await proc.wait()
            assert proc.stderr is not None
            await proc.stderr.read()
            # No chunk the cache held when this run started was asked for again.
            assert not set(stats.chunk_requests) & held
            finished = _finished_files(src, dest)
            left = sum(1 for _ in (cache / "tmp").iterdir())  # written, not yet flushed
            with Cache.open(cache) as c:
                report = await verify_cache(c)
                assert report.corrupt == ()
                assert not any(c.tmp_dir.iterdir())
                held = set(c.sizes_bytes)
            print(f"killed: {finished} files in place, {len(held)} chunks ({left} unflushed)")
        assert kills >= 2, "the sync finished before it could be killed"
        stats.chunk_requests.clear()
        proc = await _sync(url, dest, cache)
        assert proc.stderr is not None
        err = await proc.stderr.read()
        assert await proc.wait() == 0, err.decode()[-2000:]
        assert not set(stats.chunk_requests) & held
        assert set(stats.chunk_requests) | held >= set(manifest.unique_chunks())
        assert _finished_files(src, dest) == FILES
        assert not list(dest.rglob("*.netopt-tmp"))
    finally:
        if proc is not None and proc.returncode is None:  # a failed assertion above
            proc.kill()
            await proc.communicate()
        await runner.cleanup()
