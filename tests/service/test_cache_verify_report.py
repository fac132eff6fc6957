"""``netopt cache verify`` and ``netopt sync --json`` say what they found and fetched, even
when the disk is full (a real small tmpfs) or cached chunk files are corrupt."""

from __future__ import annotations

import asyncio
import errno
import json
import random
from pathlib import Path

from netopt.cache.store import Cache
from netopt.cache.syncer import run_sync
from netopt.cli.main import main
from tests.service.cache_helpers import CHUNK_BYTES, mount_tmpfs, request, tree, umount

SMALL_FILES = 300


def _small_files(root: Path) -> None:
    """300 files of 3 kB: one chunk each, so the index holds 300 entries (~24 kB)."""
    rng = random.Random(3)
    for i in range(SMALL_FILES):
        path = root / f"d{i % 10}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(3000))


def _chunk_file(cache: Path, chunk_id: str) -> Path:
    return cache / "chunks" / chunk_id[:2] / chunk_id


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(data)


def _fill(where: Path) -> None:
    """Write a file until the filesystem has not a byte left."""
    with (where / "filler").open("wb", buffering=0) as f:
        piece = 1 << 20
        while piece:
            try:
                f.write(b"\0" * piece)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                piece //= 2


def test_verify_on_a_full_disk_reports_what_it_found(tmp_path: Path, capsys) -> None:
    src, mnt = tmp_path / "src", tmp_path / "small"
    _small_files(src)
    mount_tmpfs(mnt, "4m")
    try:
        cache = mnt / "cache"
        asyncio.run(run_sync(request(str(src), tmp_path / "a", cache)))
        # A second sync reads every chunk from the cache: each gets an entry in the index.
        asyncio.run(run_sync(request(str(src), tmp_path / "b", cache)))
        chunks = sorted(p.name for p in (cache / "chunks").glob("*/*"))
        assert len(chunks) == SMALL_FILES
        corrupt, gone = chunks[:2], chunks[2]
        for cid in corrupt:
            _corrupt(_chunk_file(cache, cid))
        _chunk_file(cache, gone).unlink()
        _fill(mnt)

        # Removing the corrupt chunks frees two pages; the index needs more.
        rc = main(["cache", "verify", "--cache-dir", str(cache), "--json"])
        found = json.loads(capsys.readouterr().out)
        assert rc == 1
        assert found["corrupt"] == corrupt
        assert found["missing"] == [gone]
        assert found["unrepaired"] == sorted([*corrupt, gone])
        assert not found["ok"]
        assert any("index" in e and "No space" in e for e in found["errors"]), found["errors"]

        # Repairing: two chunks fit in the freed pages, the third does not.
        args = ["cache", "verify", "--cache-dir", str(cache), "--json", "--source", str(src)]
        rc = main(args)
        fixed = json.loads(capsys.readouterr().out)
        assert rc == 1
        assert fixed["corrupt"] == []
        assert fixed["missing"] == sorted([*corrupt, gone])
        assert len(fixed["repaired"]) == 2
        assert len(fixed["unrepaired"]) == 1
        assert any("disk is full" in e for e in fixed["errors"]), fixed["errors"]

        # Space again: the last one is repaired and the index is saved.
        (mnt / "filler").unlink()
        assert main(args) == 0
        done = json.loads(capsys.readouterr().out)
        assert done["repaired"] == fixed["unrepaired"]
        assert done["errors"] == []
        assert done["ok"]
        with Cache.open(cache) as c:
            assert set(c.sizes_bytes) == set(chunks)
    finally:
        umount(mnt)


def test_sync_counts_chunks_fetched_again_after_a_corrupt_cache_read(
    tmp_path: Path, capsys
) -> None:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    _small_files(src)
    asyncio.run(run_sync(request(str(src), dest, cache)))
    # Two files to write again, their chunks corrupt in the cache (real files on disk).
    victims = ["d0/f000.bin", "d1/f001.bin"]
    with Cache.open(cache) as c:
        (name,) = c.datasets
        manifest = c.manifest(name)
    for rel in victims:
        (dest / rel).unlink()
        (entry,) = [f for f in manifest.files if f.path == rel]
        _corrupt(_chunk_file(cache, entry.chunks[0].chunk_id))
    args = [str(src), str(dest), "--cache-dir", str(cache), "--chunk-size", str(CHUNK_BYTES)]
    assert main(["sync", *args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert tree(dest) == tree(src)
    assert report["files_written"] == len(victims)
    assert report["chunks_fetched"] == len(victims)
    assert report["fetched_logical_bytes"] == len(victims) * 3000
