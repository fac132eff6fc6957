"""netopt.torch.CachedDataset with a real DataLoader (2 worker processes) over a synced dataset."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from netopt.cache.sources import SourceOptions
from netopt.cache.store import Cache
from netopt.cache.syncer import SyncRequest, run_sync
from netopt.torch import CachedDataset, CachedSampler

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
    pytest.mark.filterwarnings("ignore:Failed to initialize NumPy"),
]

FILES = 24


def _decode(data: bytes) -> tuple[int, int]:
    """A sample: (the index written in the file's first 4 bytes, the file's length)."""
    return int.from_bytes(data[:4], "big"), len(data)


async def _synced(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    rng = random.Random(3)
    want: dict[str, bytes] = {}
    for i in range(FILES):
        data = i.to_bytes(4, "big") + rng.randbytes(3_000 + 97 * i)
        rel = f"part{i % 3}/f{i:03d}.bin"
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
        want[rel] = data
    opts = SourceOptions(avg_chunk_bytes=16 * 1024, name="toy")
    await run_sync(SyncRequest(str(src), str(dest), str(cache), source_options=opts))
    return dest, cache, want


async def test_dataloader_workers_read_prefetch_and_feed_the_cache(tmp_path: Path) -> None:
    import torch.utils.data

    dest, cache_dir, want = await _synced(tmp_path)
    ds = CachedDataset(
        dest, decode=_decode, cache_dir=cache_dir, dataset="toy", prefetch_depth=4,
        journal_dir=tmp_path / "journal",
    )  # fmt: skip
    assert len(ds) == FILES
    sampler = CachedSampler(ds, shuffle=True, seed=7)
    sampler.set_epoch(1)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=1, sampler=sampler, num_workers=2, collate_fn=lambda b: b[0]
    )
    seen = list(loader)
    # Every sample decoded right, in the sampler's order.
    assert [index for index, _ in seen] == [int(ds.files[i][-7:-4]) for i in ds.order]
    assert {ds.files[i]: n for i, (_, n) in zip(ds.order, seen, strict=True)} == {
        rel: len(data) for rel, data in want.items()
    }
    stats = ds.journal_stats()
    assert stats.reads == dict.fromkeys(want, 1)
    assert sum(stats.prefetches.values()) > 0
    # A worker reading position p prefetches p+1..p+4, which holds its own next sample.
    assert stats.prefetch_hits > 0
    assert len(list((tmp_path / "journal").glob("reads-*.jsonl"))) == 2

    with Cache.open(cache_dir) as cache:
        before = {c: a.count for c, a in cache.access.items()}
        manifest = cache.manifest("toy")
    assert ds.feed_cache() == FILES
    assert ds.feed_cache() == 0  # each journal line is fed once
    with Cache.open(cache_dir) as cache:
        after = {c: a.count for c, a in cache.access.items()}
    for entry in manifest.files:
        for ref in entry.chunks:
            assert after[ref.chunk_id] > before.get(ref.chunk_id, 0)


def test_a_default_journal_dir_goes_with_its_dataset_not_with_a_copy(tmp_path: Path) -> None:
    import gc
    import pickle

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "0.txt").write_text("sample 0")
    ds = CachedDataset(tmp_path / "d", prefetch_depth=0)
    journal = ds.journal_dir
    assert ds[0] == b"sample 0"
    clone = pickle.loads(pickle.dumps(ds))  # noqa: S301 (our own bytes)
    assert clone[0] == b"sample 0"
    clone.close()
    del clone
    gc.collect()
    assert journal.is_dir()  # a worker's copy leaves it alone
    assert ds.journal_stats().reads["0.txt"] == 2
    ds.close()
    del ds
    gc.collect()
    assert not journal.exists()
    given = tmp_path / "journal"  # one the caller chose stays
    ds = CachedDataset(tmp_path / "d", prefetch_depth=0, journal_dir=given)
    assert ds[0] == b"sample 0"
    ds.close()
    del ds
    gc.collect()
    assert list(given.glob("reads-*.jsonl"))


def test_dataset_is_picklable_and_works_in_process_without_a_cache(tmp_path: Path) -> None:
    import pickle

    (tmp_path / "d").mkdir()
    for i in range(5):
        (tmp_path / "d" / f"{i}.txt").write_text(f"sample {i}")
    ds = CachedDataset(tmp_path / "d", decode=bytes.decode, prefetch_depth=2)
    try:
        assert [ds[i] for i in range(5)] == [f"sample {i}" for i in range(5)]
        stats = ds.journal_stats()
        assert sum(stats.reads.values()) == 5
        assert stats.prefetch_hits >= 1
        clone = pickle.loads(pickle.dumps(ds))  # noqa: S301 (our own bytes)
        assert clone[4] == "sample 4"
        clone.close()
        assert ds.feed_cache() == 0
        with pytest.raises(IndexError):
            ds[5]
    finally:
        ds.close()
