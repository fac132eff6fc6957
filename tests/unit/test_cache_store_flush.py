"""The cache's index save makes only the chunk directories it changed durable (chunk
files: chunks too large to be packed)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import blake3
import pytest

import netopt.cache.store as store_module
import netopt.durable as durable_module
from netopt.cache.packfmt import PACK_MAX_CHUNK_BYTES
from netopt.cache.store import Cache
from netopt.errors import StorageError


def _chunk(seed: int) -> tuple[str, bytes]:
    data = os.urandom(PACK_MAX_CHUNK_BYTES) + bytes([seed])  # a chunk file, not packed
    return blake3.blake3(data).hexdigest(), data


def test_save_index_fsyncs_only_the_directories_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stored chunks are made durable in batches by the cache's flusher before the
    # index is written; save_index itself fsyncs only the directories removals changed.
    synced: list[Path] = []
    real = store_module.fsync_dirs

    def record(directories: Iterable[Path]) -> None:
        dirs = sorted(set(directories))
        synced.extend(dirs)
        real(dirs)

    monkeypatch.setattr(store_module, "fsync_dirs", record)
    cache = Cache.open(tmp_path / "cache")
    try:
        chunks = [_chunk(i) for i in range(3)]
        for cid, data in chunks:
            cache.put(cid, data)
        cache.save_index()
        assert synced == []  # the puts' directories were the flusher's to sync
        assert all(cache.chunk_path(cid).is_file() for cid, _ in chunks)
        cache.save_index()
        assert synced == []  # nothing changed since
        cache.remove([chunks[0][0]])
        cache.save_index()
        assert synced == [cache.chunk_path(chunks[0][0]).parent]
    finally:
        cache.close()
    reopened = Cache.open(tmp_path / "cache")
    try:
        assert {c for c, _ in chunks[1:]} == set(reopened.sizes_bytes)
        assert reopened.read(chunks[1][0]) == chunks[1][1]
    finally:
        reopened.close()


def test_a_bug_inside_the_file_flushers_commit_is_an_error_never_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(items: object) -> list[bool]:
        raise RuntimeError("a bug below the commit")

    monkeypatch.setattr(durable_module, "_commit_one_filesystem", broken)
    flusher = durable_module.BatchFlusher("test-flusher")
    tmp = tmp_path / ".f.tmp"
    tmp.write_bytes(b"x")
    flusher.add(tmp, tmp_path / "f", 1, os.stat(tmp).st_dev)
    with pytest.raises(StorageError, match="a bug below the commit"):
        flusher.flush()
    assert not (tmp_path / "f").exists()
    with pytest.raises(StorageError):
        flusher.close()
