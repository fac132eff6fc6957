"""The cache's packs of small chunks, on real files: round trips, recovery from torn
packs and indexes, removals, compaction, and the agent's lock-free reader."""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from pathlib import Path

import blake3
import pytest

import netopt.cache.packs as packs_module
from netopt.cache.packfmt import (
    ENTRY_BYTES,
    PACK_MAX_CHUNK_BYTES,
    RECORD_HEADER_BYTES,
    PackReader,
    decode_entries,
    encode_entry,
)
from netopt.cache.store import Cache
from netopt.durable import GATHER_S
from netopt.errors import StorageError


def _chunks(count: int, seed: int = 1, size_bytes: int = 3000) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        data = rng.randbytes(rng.randrange(1, size_bytes))
        out.append((blake3.blake3(data).hexdigest(), data))
    return out


def _packs(cache: Path) -> list[Path]:
    return sorted((cache / "packs").glob("*.pack"))


def test_small_chunks_are_packed_and_read_back_after_reopen(tmp_path: Path) -> None:
    chunks = _chunks(500)
    big = os.urandom(PACK_MAX_CHUNK_BYTES)
    big_id = blake3.blake3(big).hexdigest()
    with Cache.open(tmp_path / "c") as cache:
        for cid, data in chunks:
            cache.put(cid, data)
        cache.put(big_id, big)
        assert all(cache.read(cid) == data for cid, data in chunks)  # before durability too
    assert [p.name for p in (tmp_path / "c" / "chunks").glob("*/*")] == [big_id]
    assert len(_packs(tmp_path / "c")) == 1
    with Cache.open(tmp_path / "c") as cache:
        assert set(cache.sizes_bytes) == {cid for cid, _ in chunks} | {big_id}
        assert cache.used_bytes == sum(len(d) for _, d in chunks) + len(big)
        assert all(cache.read(cid) == data for cid, data in chunks)
        assert cache.read(big_id) == big


def test_a_group_put_packs_its_small_chunks_in_one_write_and_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks = _chunks(300, seed=5)
    big = os.urandom(PACK_MAX_CHUNK_BYTES)
    big_id = blake3.blake3(big).hexdigest()
    placed: list[str] = []
    writes: list[int] = []
    real_write = os.write

    def counting_write(fd: int, data: bytes | memoryview) -> int:
        writes.append(len(data))
        return real_write(fd, data)

    with Cache.open(tmp_path / "c") as cache:
        cache.put(*chunks[0])  # already stored: skipped by the group
        items = [(cid, data, lambda cid=cid: placed.append(cid)) for cid, data in chunks[:200]]
        items.append((chunks[1][0], chunks[1][1], None))  # twice in one group: once stored
        monkeypatch.setattr(packs_module.os, "write", counting_write)
        cache.put_many(items)
        monkeypatch.undo()
        cache.put_many([(big_id, big, None), *items[:3]])  # large: a chunk file of its own
        assert len(writes) == 1  # the 199 new small records: one write
        assert writes[0] == sum(RECORD_HEADER_BYTES + len(d) for _, d in chunks[1:200])
        assert all(cache.read(cid) == data for cid, data in chunks[:200])  # before durability
        cache.put_many([(cid, data, None) for cid, data in chunks[200:]])
        cache.flush()
        assert sorted(placed) == sorted(cid for cid, _ in chunks[1:200])  # each once, durable
    with Cache.open(tmp_path / "c") as cache:
        assert set(cache.sizes_bytes) == {cid for cid, _ in chunks} | {big_id}
        assert cache.used_bytes == sum(len(d) for _, d in chunks) + len(big)
        assert all(cache.read(cid) == data for cid, data in chunks)
        assert cache.read(big_id) == big


def test_a_torn_pack_tail_and_a_scrambled_index_lose_only_what_was_not_written(
    tmp_path: Path,
) -> None:
    chunks = _chunks(200)
    with Cache.open(tmp_path / "c") as cache:
        for cid, data in chunks:
            cache.put(cid, data)
    (pack,) = _packs(tmp_path / "c")
    index = pack.with_suffix(".idx")
    # A crash: the index's last 50 entries lost, one scrambled before them; a record
    # half written at the end of the pack.
    entries = index.read_bytes()
    cut = entries[: ENTRY_BYTES * 150]
    scrambled = bytearray(cut)
    scrambled[ENTRY_BYTES * 120 + 5] ^= 0xFF
    index.write_bytes(bytes(scrambled))
    torn_data = b"x" * 1000
    torn_id = blake3.blake3(torn_data).digest()
    with pack.open("ab") as f:
        f.write(b"NPK1" + torn_id + len(torn_data).to_bytes(4, "little") + torn_data[:400])
    size_before = pack.stat().st_size
    with Cache.open(tmp_path / "c") as cache:
        assert set(cache.sizes_bytes) == {cid for cid, _ in chunks}  # all found again
        assert all(cache.read(cid) == data for cid, data in chunks)
    assert pack.stat().st_size == size_before - (RECORD_HEADER_BYTES + 400)  # torn one cut
    good, used = decode_entries(index.read_bytes(), pack.stat().st_size)
    assert used == len(index.read_bytes()) == 200 * ENTRY_BYTES  # the index completed
    assert {e.digest.hex() for e in good} == {cid for cid, _ in chunks}


def test_a_corrupt_record_after_the_index_ends_the_walk(tmp_path: Path) -> None:
    chunks = _chunks(50)
    with Cache.open(tmp_path / "c") as cache:
        for cid, data in chunks:
            cache.put(cid, data)
    (pack,) = _packs(tmp_path / "c")
    pack.with_suffix(".idx").unlink()  # nothing indexed: every record is walked
    raw = bytearray(pack.read_bytes())
    offset = sum(RECORD_HEADER_BYTES + len(d) for _, d in chunks[:30])
    raw[offset + RECORD_HEADER_BYTES + 1] ^= 0xFF  # the 31st record's data
    pack.write_bytes(bytes(raw))
    with Cache.open(tmp_path / "c") as cache:
        assert set(cache.sizes_bytes) == {cid for cid, _ in chunks[:30]}
    assert pack.stat().st_size == offset


def test_removals_stay_removed_even_when_removed_before_they_were_durable(
    tmp_path: Path,
) -> None:
    chunks = _chunks(100)
    with Cache.open(tmp_path / "c") as cache:
        for cid, data in chunks[:50]:
            cache.put(cid, data)
        cache.flush()
        cache.remove([cid for cid, _ in chunks[:10]])  # durable ones: tombstones
        for cid, data in chunks[50:]:
            cache.put(cid, data)
        cache.remove([cid for cid, _ in chunks[-5:]])  # not yet durable
    with Cache.open(tmp_path / "c") as cache:
        assert set(cache.sizes_bytes) == {cid for cid, _ in chunks[10:-5]}
        assert cache.packs.dead_bytes() == sum(
            RECORD_HEADER_BYTES + len(d) for _, d in chunks[:10] + chunks[-5:]
        )


def test_a_mostly_dead_pack_is_compacted_and_its_chunks_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(packs_module, "PACK_TARGET_BYTES", 200_000)
    chunks = _chunks(300)  # ~450 kB: three packs
    with Cache.open(tmp_path / "c") as cache:
        for cid, data in chunks:
            cache.put(cid, data)
        cache.flush()
        first = _packs(tmp_path / "c")[0]
        reader = PackReader(tmp_path / "c" / "packs")
        in_first = [cid for cid, _ in chunks if reader.locate(cid).pack == 1]  # type: ignore[union-attr]
        keep = in_first[:5]
        cache.remove([cid for cid in in_first if cid not in keep])
        dead_before = cache.packs.dead_bytes()
        cache.save_index()  # compacts
        assert not first.exists()
        assert not first.with_suffix(".idx").exists()
        assert cache.packs.dead_bytes() < dead_before
        assert all(cache.read(cid) for cid in keep)
        for cid in keep:  # the agent's reader follows the move
            assert reader.read(cid) == dict(chunks)[cid]
    live = {cid: d for cid, d in chunks if cid in keep or cid not in in_first}
    with Cache.open(tmp_path / "c") as cache:
        assert set(cache.sizes_bytes) == set(live)
        assert all(cache.read(cid) == data for cid, data in live.items())


def test_the_agents_reader_sees_a_chunk_only_once_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks = _chunks(20)
    reader = PackReader(tmp_path / "c" / "packs")
    disk_done = threading.Event()
    real_fdatasync = os.fdatasync

    def slow_disk(fd: int) -> None:
        assert disk_done.wait(30)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_disk)
    with Cache.open(tmp_path / "c") as cache:
        try:
            for cid, data in chunks:
                cache.put(cid, data)
            assert all(cache.read(cid) == data for cid, data in chunks)  # the cache reads them
            time.sleep(2 * GATHER_S)
            assert reader.chunk_ids() == set()  # not durable: not indexed, not served to peers
        finally:
            disk_done.set()
        cache.flush()
        assert reader.chunk_ids() == {cid for cid, _ in chunks}
        assert all(reader.read(cid) == data for cid, data in chunks)
        cache.remove([chunks[0][0]])
        assert chunks[0][0] not in reader.chunk_ids()


def test_hostile_index_entries_are_not_followed(tmp_path: Path) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    (packs / "00000001.pack").write_bytes(b"\0" * 100)
    digest = os.urandom(32)
    (packs / "00000001.idx").write_bytes(
        encode_entry(digest, 10**12, 50)  # past the pack's end
        + encode_entry(digest, 40, 60)
    )
    assert PackReader(packs).chunk_ids() == set()  # the first bad entry ends the index
    (packs / "00000001.idx").write_bytes(encode_entry(digest, 40, PACK_MAX_CHUNK_BYTES + 1))
    assert PackReader(packs).chunk_ids() == set()


def test_a_failure_inside_the_commit_is_an_error_never_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(fd: int) -> None:
        raise RuntimeError("a bug below the commit")

    monkeypatch.setattr(os, "fdatasync", broken)
    cache = Cache.open(tmp_path / "c")
    try:
        cid, data = _chunks(1)[0]
        cache.put(cid, data)
        with pytest.raises(StorageError, match="a bug below the commit"):
            cache.flush()
        assert not cache.has(cid)  # never durable: forgotten
    finally:
        monkeypatch.undo()
        with contextlib.suppress(StorageError):
            cache.close()


def test_the_agents_reader_finds_a_chunk_announced_just_after_its_last_look(
    tmp_path: Path,
) -> None:
    # A peer asks for a chunk as soon as it is announced (after its index entry is
    # written); the reader had looked a moment before, for another chunk.
    first, second = _chunks(2, seed=5)
    reader = PackReader(tmp_path / "c" / "packs")
    with Cache.open(tmp_path / "c") as cache:
        cache.put(*first)
        cache.flush()
        assert reader.read(first[0]) == first[1]
        assert reader.read(second[0]) is None  # a miss: the reader has just looked
        cache.put(*second)
        cache.flush()
        assert reader.read(second[0]) == second[1]  # well within the sweep's interval
