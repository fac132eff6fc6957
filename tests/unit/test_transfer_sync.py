"""The sync engine against in-memory fakes: verification, retries, resume, atomic files."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from netopt.chunking import chunk_bytes
from netopt.dataplane.chunkio import (
    MemoryChunkSink,
    MemoryChunkSource,
    RawChunk,
    decode_chunk,
    encode_chunk,
)
from netopt.dataplane.sync import SyncOptions, sync_manifest
from netopt.dataplane.throttle import TokenBucket
from netopt.errors import IntegrityError, NetworkError, PathTraversalError
from netopt.transfer.manifest import FileEntry, Manifest

FAST = SyncOptions(
    streams=3, retry_window_s=0.05, max_attempts=3, backoff_initial_s=0.001, backoff_max_s=0.002
)


def _dataset(files: dict[str, bytes]) -> tuple[Manifest, dict[str, bytes]]:
    entries = []
    table: dict[str, bytes] = {}
    for path, data in files.items():
        refs = chunk_bytes(data, 16 * 1024)
        for ref in refs:
            table[ref.chunk_id] = data[ref.offset_bytes : ref.offset_bytes + ref.length_bytes]
        entries.append(FileEntry(path, len(data), 0o640, 1_600_000_000 * 10**9, tuple(refs)))
    return Manifest("ds", tuple(entries), 16 * 1024), table


FILES = {
    "a.bin": os.urandom(100_000),
    "dir/b.txt": b"line of text\n" * 8000,
    "empty": b"",
}


async def test_sync_writes_files_with_mode_and_mtime(tmp_path: Path) -> None:
    manifest, table = _dataset(FILES)
    source = MemoryChunkSource(manifest, table, zstd_level=3)
    summary = await sync_manifest(manifest, source, MemoryChunkSink(), tmp_path, FAST)
    for path, data in FILES.items():
        assert (tmp_path / path).read_bytes() == data
        st = (tmp_path / path).stat()
        assert st.st_mode & 0o777 == 0o640
        assert st.st_mtime_ns == 1_600_000_000 * 10**9
    assert summary.files_written == 3
    assert summary.chunks_fetched == len(table)
    assert summary.compression_ratio > 1.0
    assert not list(tmp_path.rglob("*netopt-tmp*"))  # noqa: ASYNC240
    again = await sync_manifest(manifest, source, MemoryChunkSink(), tmp_path, FAST)
    assert again.files_skipped == 3
    assert again.chunks_fetched == 0


async def test_corrupt_chunk_is_refetched_never_stored(tmp_path: Path) -> None:
    manifest, table = _dataset(FILES)
    bad = next(iter(table))
    source = MemoryChunkSource(manifest, table, corrupt_first=frozenset({bad}))
    stored: list[tuple[str, bytes]] = []
    sink = MemoryChunkSink()
    real_put = sink.put

    async def spy_put(chunk_id: str, data: bytes) -> None:
        stored.append((chunk_id, data))
        await real_put(chunk_id, data)

    sink.put = spy_put  # type: ignore[method-assign]
    summary = await sync_manifest(manifest, source, sink, tmp_path, FAST)
    assert source.fetches[bad] == 2
    assert summary.chunk_retries == 1
    assert all(data == table[cid] for cid, data in stored)
    assert (tmp_path / "a.bin").read_bytes() == FILES["a.bin"]


async def test_always_corrupt_gives_integrity_error(tmp_path: Path) -> None:
    manifest, table = _dataset({"x": os.urandom(50_000)})
    broken = {cid: b"\0" * len(data) for cid, data in table.items()}
    with pytest.raises(IntegrityError):
        await sync_manifest(
            manifest, MemoryChunkSource(manifest, broken), MemoryChunkSink(), tmp_path, FAST
        )
    assert not (tmp_path / "x").exists()


class FlakySource(MemoryChunkSource):
    """Fails after ``budget`` successful fetches, like a server that went away."""

    def __init__(self, manifest: Manifest, table: dict[str, bytes], budget: int) -> None:
        super().__init__(manifest, table)
        self.budget = budget

    async def fetch_chunk(self, chunk_id: str, length_bytes: int) -> RawChunk:
        if self.budget <= 0:
            raise NetworkError("gone")
        self.budget -= 1
        return await super().fetch_chunk(chunk_id, length_bytes)


async def test_resume_fetches_only_missing_chunks(tmp_path: Path) -> None:
    manifest, table = _dataset(FILES)
    sink = MemoryChunkSink()
    with pytest.raises(NetworkError):
        await sync_manifest(manifest, FlakySource(manifest, table, 4), sink, tmp_path, FAST)
    kept = set(sink.chunks)
    # Four fetches succeeded; a chunk still being verified when the failure stopped the
    # sync may be dropped (and fetched again), never half-stored.
    assert 1 <= len(kept) <= 4
    second = MemoryChunkSource(manifest, table)
    summary = await sync_manifest(manifest, second, sink, tmp_path, FAST)
    assert set(second.fetches) == set(table) - kept
    assert all(n == 1 for n in second.fetches.values())
    assert summary.chunks_reused <= len(kept)
    for path, data in FILES.items():
        assert (tmp_path / path).read_bytes() == data


async def test_symlink_escape_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "dir").symlink_to(outside)
    manifest, table = _dataset({"dir/b.txt": b"x" * 10})
    with pytest.raises(PathTraversalError):
        await sync_manifest(
            manifest, MemoryChunkSource(manifest, table), MemoryChunkSink(), dest, FAST
        )
    assert not (outside / "b.txt").exists()


def test_decode_bounds_and_verifies() -> None:
    data = b"abc" * 10_000
    cid = chunk_bytes(data, 1 << 20)[0].chunk_id
    frame, codec = encode_chunk(data, 3)
    assert codec == "zstd"
    assert decode_chunk(RawChunk(frame, codec, len(frame)), cid, len(data)) == data
    with pytest.raises(IntegrityError):
        decode_chunk(RawChunk(frame, codec, len(frame)), cid, len(data) - 1)
    with pytest.raises(IntegrityError):
        decode_chunk(RawChunk(b"garbage", "zstd", 7), cid, len(data))
    _, codec = encode_chunk(os.urandom(1000), 3)
    assert codec == "identity"


async def test_token_bucket_waits_for_tokens() -> None:
    now = [0.0]
    bucket = TokenBucket(1000.0, burst_bytes=100.0, clock=lambda: now[0])
    await bucket.take(100)
    assert bucket._tokens == 0
    now[0] = 0.05
    await bucket.take(10)  # 50 bytes refilled
    assert bucket._tokens == pytest.approx(40.0)


def test_destination_directories_fresh_and_existing(tmp_path: Path) -> None:
    # Fresh directories under fresh ones are made without a resolve; existing ones are
    # resolved, so a symlink deep inside an existing tree is still refused, and a path
    # deeper than the interpreter recurses (1,500 levels) is walked without recursion.
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    (dest / "old" / "deeper").mkdir(parents=True)
    (dest / "old" / "deeper" / "link").symlink_to(outside, target_is_directory=True)
    deep = "/".join(["d"] * 1500)
    manifest, _ = _dataset({f"new/a/b/{i}.txt": b"%d" % i for i in range(3)} | {
        "old/deeper/new/c.txt": b"c", f"{deep}/e.txt": b"e", "top.txt": b"t",
    })  # fmt: skip
    try:
        _check_fresh_and_existing(dest, outside, manifest)
    finally:  # bottom-up: shutil.rmtree (pytest's clean-up) recurses once per level
        for depth in range(1500, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(dest / "/".join(["d"] * depth))


def _check_fresh_and_existing(dest: Path, outside: Path, manifest: Manifest) -> None:
    from netopt.dataplane.assemble import scan_destination

    dest_real, pending, skipped = scan_destination(dest, manifest)
    assert skipped == 0
    targets = {entry.path: target for entry, target, _ in pending}
    for rel, target in targets.items():
        assert target == os.path.join(dest_real, rel)
        assert Path(target).parent.is_dir()
    assert {placement.dev for _, _, placement in pending} == {os.stat(dest).st_dev}
    hostile, _ = _dataset({"old/deeper/link/x.txt": b"x"})
    with pytest.raises(PathTraversalError, match="symlink"):
        scan_destination(dest, hostile)
    assert not any(outside.iterdir())
