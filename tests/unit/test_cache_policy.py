"""Cache policy (pure): eviction under epoch scans, pins, aging; sync planning; residency."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from netopt.cache.policy import ChunkAccess, age_access, evict, needs_aging, record_access
from netopt.cache.residency import check_residency, find_spec, residency_violation
from netopt.cache.syncer import plan_sync
from netopt.chunking import ChunkRef
from netopt.config.datasets import DatasetSpec, DatasetsSettings
from netopt.errors import EXIT_USAGE, ResidencyError
from netopt.transfer.manifest import FileEntry, Manifest

CHUNK_BYTES = 1000


def simulate_policy(items: int, capacity_items: int, epochs: int) -> float:
    """Epoch-order cyclic scan through a cache run by `evict`; the hit ratio."""
    sizes: dict[str, int] = {}
    access: dict[str, ChunkAccess] = {}
    tick = hits = reads = 0
    for _ in range(epochs):
        for i in range(items):
            cid = f"{i:064x}"
            tick += 1
            reads += 1
            if cid in sizes:
                hits += 1
            else:
                sizes[cid] = CHUNK_BYTES  # fetched and stored; in use while it is read
                for victim in evict(sizes, capacity_items * CHUNK_BYTES, {cid}, access):
                    del sizes[victim]
            access[cid] = record_access(access.get(cid), tick)
            assert sum(sizes.values()) <= capacity_items * CHUNK_BYTES
    return hits / reads


def simulate_lru(items: int, capacity_items: int, epochs: int) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = reads = 0
    for _ in range(epochs):
        for i in range(items):
            reads += 1
            if i in cache:
                hits += 1
                cache.move_to_end(i)
            else:
                cache[i] = None
                if len(cache) > capacity_items:
                    cache.popitem(last=False)
    return hits / reads


def test_epoch_scan_at_half_capacity_keeps_hitting() -> None:
    ratio = simulate_policy(items=200, capacity_items=100, epochs=20)
    assert ratio >= 0.45
    # The same scan drives plain LRU to zero: the reason for the policy.
    assert simulate_lru(items=200, capacity_items=100, epochs=20) == 0.0


def test_evict_fits_capacity_least_read_first() -> None:
    sizes = {"a": 10, "b": 10, "c": 10}
    access = {"a": ChunkAccess(5, 1), "b": ChunkAccess(1, 2), "c": ChunkAccess(3, 3)}
    assert evict(sizes, 30, set(), access) == ()
    assert evict(sizes, 20, set(), access) == ("b",)
    assert evict(sizes, 10, set(), access) == ("b", "c")


def test_evict_never_takes_pinned_or_in_use() -> None:
    sizes = {"a": 10, "b": 10, "c": 10}
    assert evict(sizes, 0, {"a", "c"}, {}) == ("b",)
    assert evict(sizes, 0, {"a", "b", "c"}, {}) == ()


def test_ties_go_most_recent_first() -> None:
    sizes = {"old": 10, "new": 10}
    access = {"old": ChunkAccess(1, 1), "new": ChunkAccess(1, 9)}
    assert evict(sizes, 10, set(), access) == ("new",)


def test_aging_halves_counts() -> None:
    access = {"a": ChunkAccess(100, 5), "b": ChunkAccess(1, 6)}
    assert needs_aging(access)
    aged = age_access(access)
    assert aged == {"a": ChunkAccess(50, 5)}
    assert not needs_aging({"a": ChunkAccess(3, 1)})


def _file(path: str, chunks: list[tuple[str, int]], mtime_ns: int = 7) -> FileEntry:
    refs, offset = [], 0
    for cid, n in chunks:
        refs.append(ChunkRef(offset, n, cid))
        offset += n
    return FileEntry(path, offset, 0o644, mtime_ns, tuple(refs))


def test_plan_sync_counts_fetch_and_reuse() -> None:
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    manifest = Manifest("ds", (_file("x", [(a, 10), (b, 20)]), _file("y", [(c, 5)])))
    plan = plan_sync(manifest, {"y": (5, 7)}, {a})
    assert (plan.files_total, plan.files_to_write, plan.bytes_to_write) == (2, 1, 30)
    assert (plan.chunks_to_fetch, plan.bytes_to_fetch) == (1, 20)
    assert (plan.chunks_reused, plan.bytes_reused) == (1, 10)


def test_residency_rules() -> None:
    catalogue = DatasetsSettings(
        (
            DatasetSpec("scans", "/mnt/scans", residency=("hk",)),
            DatasetSpec("open", "netopt://hk-1:7470/open"),
        )
    )
    scans = find_spec(catalogue, "scans")
    assert residency_violation(scans, "hk") is None
    assert residency_violation(find_spec(catalogue, "open"), "us") is None
    assert find_spec(catalogue, "other", "netopt://hk-1:7470/open/") is not None
    with pytest.raises(ResidencyError, match=r"residency: \[hk\].*'us'") as info:
        check_residency(scans, "us")
    assert info.value.exit_code == EXIT_USAGE
    with pytest.raises(ResidencyError, match="region is unknown"):
        check_residency(scans, None)
