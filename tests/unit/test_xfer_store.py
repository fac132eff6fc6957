"""The cache's index save makes only the chunk directories it changed durable."""

from __future__ import annotations

import os
from pathlib import Path

import blake3
import pytest

import netopt.cache.store as store_module
from netopt.cache.store import Cache


def _chunk(seed: int) -> tuple[str, bytes]:
    data = os.urandom(256) + bytes([seed])
    return blake3.blake3(data).hexdigest(), data


def test_save_index_fsyncs_only_the_directories_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    real = store_module.fsync_dir

    def record(directory: str | os.PathLike[str]) -> None:
        synced.append(Path(directory))
        real(directory)

    monkeypatch.setattr(store_module, "fsync_dir", record)
    cache = Cache.open(tmp_path / "cache")
    try:
        chunks = [_chunk(i) for i in range(3)]
        for cid, data in chunks:
            cache.put(cid, data)
        cache.save_index()
        assert set(synced) == {cache.chunk_path(cid).parent for cid, _ in chunks}
        synced.clear()
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
