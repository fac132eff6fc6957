"""Durability is batched: a sync of many files makes them durable in a few ``syncfs`` /
fsync rounds, not one fsync per file and per cached chunk, and still reports success
only once every file and chunk is durable and in place."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from pathlib import Path

import pytest

from netopt import fsutil
from netopt.cache.store import Cache
from netopt.cache.syncer import run_sync
from netopt.durable import BatchFlusher
from netopt.errors import StorageError
from tests.service.cache_helpers import request, tree
from tests.service.test_sync_many_files import make_tree

FILES = 2000


class SyncCalls:
    """Counts the real fsync and syncfs calls made (from any thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fsyncs = 0
        self.syncfs = 0
        self.lock = threading.Lock()
        real_fsync, real_syncfs = os.fsync, fsutil.syncfs

        def fsync(fd: int) -> None:
            with self.lock:
                self.fsyncs += 1
            real_fsync(fd)

        def syncfs(path: str | os.PathLike[str]) -> bool:
            with self.lock:
                self.syncfs += 1
            return real_syncfs(path)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr("netopt.durable.syncfs", syncfs)


def test_many_files_sync_without_an_fsync_per_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    make_tree(src, FILES, seed=3)
    calls = SyncCalls(monkeypatch)
    report = asyncio.run(run_sync(request(str(src), dest, cache)))
    assert report.summary is not None
    assert report.summary.files_written == FILES
    assert tree(dest) == tree(src)
    # Before: one fsync per file and one per cached chunk (over 4,000 here).
    assert calls.fsyncs + calls.syncfs < FILES // 10, (calls.fsyncs, calls.syncfs)
    with Cache.open(cache) as c:  # every chunk in place, none left pending
        assert len(c.sizes_bytes) >= FILES // 2
        assert not any(c.tmp_dir.iterdir())
    assert not list(dest.rglob("*.netopt-tmp"))


def _written(path: Path, data: bytes) -> tuple[Path, int]:
    path.write_bytes(data)
    return path, os.stat(path).st_dev


@pytest.mark.parametrize("files", [3, 40])  # an fsync each; one syncfs for all
def test_flusher_places_files_only_with_their_mode_and_mtime(tmp_path: Path, files: int) -> None:
    flusher = BatchFlusher("test-flush")
    placed: list[tuple[int, bool]] = []
    for i in range(files):
        tmp, dev = _written(tmp_path / f".f{i}.tmp", b"x" * i)
        flusher.add(
            tmp, tmp_path / f"f{i}", i, dev, mode=0o600 if i % 2 else 0o444,
            mtime_ns=1_000_000_000 * (i + 1), on_commit=lambda ok, i=i: placed.append((i, ok)),
        )  # fmt: skip
    (tmp_path / ".f1.tmp").unlink(missing_ok=True)  # withdrawn, unless already placed
    flusher.close()
    assert sorted(i for i, _ in placed) == list(range(files))
    for i, ok in placed:
        final = tmp_path / f"f{i}"
        assert ok == final.exists()
        if ok:
            st = final.stat()
            assert final.read_bytes() == b"x" * i
            assert stat.S_IMODE(st.st_mode) == (0o600 if i % 2 else 0o444)
            assert st.st_mtime_ns == 1_000_000_000 * (i + 1)
    assert all(ok for i, ok in placed if i != 1)
    assert not list(tmp_path.glob(".*.tmp"))


def test_flusher_reports_a_disk_failure_on_flush_and_add(tmp_path: Path) -> None:
    flusher = BatchFlusher("test-flush")
    tmp, dev = _written(tmp_path / ".a.tmp", b"a")
    # The final directory is gone: the rename fails with ENOTDIR-like errors, not ENOENT.
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    flusher.add(tmp, blocker / "a", 1, dev)
    with pytest.raises(StorageError, match="cannot make files durable"):
        flusher.flush()
    tmp2, _ = _written(tmp_path / ".b.tmp", b"b")
    with pytest.raises(StorageError):
        flusher.add(tmp2, tmp_path / "b", 1, dev)
    with pytest.raises(StorageError):
        flusher.close()
    assert tmp.exists()  # left under its temporary name for its owner to clean up
