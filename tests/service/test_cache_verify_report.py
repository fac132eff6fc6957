"""``netopt cache verify`` and ``netopt sync --json`` say what they found and fetched, even
when the disk is full (a real small tmpfs) or cached chunks are corrupt."""

from __future__ import annotations

import asyncio
import errno
import json
import random
from pathlib import Path

from netopt.cache.store import Cache
from netopt.cache.syncer import run_sync
from netopt.cli.main import main
from tests.service.cache_helpers import (
    CHUNK_BYTES,
    corrupt_stored_chunk,
    drop_stored_chunk,
    mount_tmpfs,
    request,
    stored_chunks,
    tree,
    umount,
)

SMALL_FILES = 300


def _small_files(root: Path) -> None:
    """300 files of 3 kB: one chunk each, so the index holds 300 entries (~24 kB)."""
    rng = random.Random(3)
    for i in range(SMALL_FILES):
        path = root / f"d{i % 10}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(3000))


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
        chunks = sorted(stored_chunks(cache))
        assert len(chunks) == SMALL_FILES
        assert not list((cache / "chunks").glob("*/*"))  # 3 kB chunks: all packed
        corrupt, gone = chunks[:2], chunks[2]
        for cid in corrupt:
            corrupt_stored_chunk(cache, cid)
        drop_stored_chunk(cache, gone)
        _fill(mnt)

        # Nothing can be written: the removals are not recorded, the index not saved.
        rc = main(["cache", "verify", "--cache-dir", str(cache), "--json"])
        found = json.loads(capsys.readouterr().out)
        assert rc == 1
        assert found["corrupt"] == corrupt
        assert found["missing"] == [gone]
        assert found["unrepaired"] == sorted([*corrupt, gone])
        assert not found["ok"]
        assert any("index" in e and "No space" in e for e in found["errors"]), found["errors"]

        # Repairing on the full disk: a removed record frees no space (packs are
        # compacted later), so nothing can be stored. A corrupt record whose removal
        # could not be recorded would be found corrupt again, never served.
        args = ["cache", "verify", "--cache-dir", str(cache), "--json", "--source", str(src)]
        rc = main(args)
        fixed = json.loads(capsys.readouterr().out)
        assert rc == 1
        assert set(fixed["corrupt"]) <= set(corrupt)
        assert fixed["missing"] == sorted([*corrupt, gone])
        assert fixed["repaired"] == []
        assert fixed["unrepaired"] == sorted([*corrupt, gone])
        assert any("disk is full" in e for e in fixed["errors"]), fixed["errors"]

        # Space again: all three are repaired and the index is saved.
        (mnt / "filler").unlink()
        assert main(args) == 0
        done = json.loads(capsys.readouterr().out)
        assert done["repaired"] == sorted([*corrupt, gone])
        assert done["errors"] == []
        assert done["ok"]
        with Cache.open(cache) as c:
            assert set(c.sizes_bytes) == set(chunks)
        assert main(["cache", "verify", "--cache-dir", str(cache), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["corrupt"] == []
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
        corrupt_stored_chunk(cache, entry.chunks[0].chunk_id, at=10)
    args = [str(src), str(dest), "--cache-dir", str(cache), "--chunk-size", str(CHUNK_BYTES)]
    assert main(["sync", *args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert tree(dest) == tree(src)
    assert report["files_written"] == len(victims)
    assert report["chunks_fetched"] == len(victims)
    assert report["fetched_logical_bytes"] == len(victims) * 3000
