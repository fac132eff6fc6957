"""Small files written inside the verify-and-store pool call (`FileAssembler.claim`,
`write_claimed`): a corrupt chunk is fetched again and never written; a write error
fails the sync clearly, leaves nothing half-written in place, and the next sync
finishes without fetching the stored chunk again.

Real files: the source reads a real directory (`LocalChunkSource`, one copy of one
chunk bit-flipped on its way), the sink is the on-disk resume store (`DirChunkSink`:
it stores on the pool thread, so a chunk is verified, stored and its files written in
one call, as in a real sync), DEST is a real directory whose writes really fail. Each
test runs twice: the files written on the event loop, and by the sync's file writer
process (a real child process).
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from netopt.cache.sources import LocalChunkSource
from netopt.dataplane import assemble
from netopt.dataplane.chunkio import DirChunkSink, MemoryChunkSink, RawChunk
from netopt.dataplane.served import ServedDataset, load_dataset
from netopt.dataplane.sync import SyncOptions, sync_manifest
from netopt.dataplane.writerproc import WriterProcess
from netopt.errors import IntegrityError, StorageError
from netopt.transfer.manifest import Manifest

FAST = SyncOptions(
    streams=2, retry_window_s=5, max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.02
)
AVG_CHUNK_BYTES = 4 * 1024 * 1024
"""FastCDC cuts no chunk under a quarter of this: every file up to 1 MiB is one chunk."""


class FlippingSource(LocalChunkSource):
    """The directory's chunks, the first ``bad_copies`` copies of ``victim`` bit-flipped."""

    def __init__(self, dataset: ServedDataset, victim: str, bad_copies: int) -> None:
        super().__init__(dataset)
        self.victim = victim
        self.bad_copies = bad_copies
        self.asked: Counter[str] = Counter()

    async def fetch_chunk(self, chunk_id: str, length_bytes: int) -> RawChunk:
        self.asked[chunk_id] += 1
        raw = await super().fetch_chunk(chunk_id, length_bytes)
        if chunk_id == self.victim and self.asked[chunk_id] <= self.bad_copies:
            data = bytearray(raw.payload)
            data[len(data) // 2] ^= 0x01
            return RawChunk(bytes(data), raw.codec, raw.wire_bytes)
        return raw


def _tree(root: Path, big_bytes: int = 0) -> dict[str, bytes]:
    """Twenty small files in two directories, and ``victim/v.bin`` (``big_bytes`` long,
    else 5 KB), each one chunk."""
    rng = random.Random(5)
    files = {f"d{i % 2}/f{i:02d}.txt": rng.randbytes(rng.randint(500, 6000)) for i in range(20)}
    files["victim/v.bin"] = rng.randbytes(big_bytes or 5000)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _victim_chunk(manifest: Manifest) -> str:
    entry = next(f for f in manifest.files if f.path == "victim/v.bin")
    assert all(len(f.chunks) == 1 for f in manifest.files)  # the premise: one-chunk files
    return entry.chunks[0].chunk_id


def _served(
    tmp_path: Path, bad_copies: int, big_bytes: int = 0
) -> tuple[dict[str, bytes], Manifest, str, FlippingSource]:
    """The tree's files, its manifest, the victim's chunk and a source flipping it."""
    files = _tree(tmp_path / "src", big_bytes)
    dataset = load_dataset(tmp_path / "src", "ds", AVG_CHUNK_BYTES)
    victim = _victim_chunk(dataset.manifest)
    return files, dataset.manifest, victim, FlippingSource(dataset, victim, bad_copies)


def _leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.rglob("*.netopt-tmp"))


@pytest.fixture(params=["loop", "helper"])
def opts(request: pytest.FixtureRequest) -> SyncOptions:
    """Each test twice: the small files written on the event loop, and by the sync's file
    writer process (`netopt.dataplane.writerproc`, whose errors come at its flush)."""
    return FAST if request.param == "loop" else replace(FAST, writer_process_min_files=1)


@pytest.fixture
def helpers(monkeypatch: pytest.MonkeyPatch) -> list[WriterProcess]:
    """The file writer processes the syncs started (a spy on the real start)."""
    started: list[WriterProcess] = []
    real = WriterProcess.start

    def start() -> WriterProcess | None:
        helper = real()
        if helper is not None:
            started.append(helper)
        return helper

    monkeypatch.setattr(WriterProcess, "start", staticmethod(start))
    return started


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files taken to be written inside the verify call (a spy on the real claim)."""
    taken: list[str] = []
    real = assemble.FileAssembler.claim

    def claim(self: assemble.FileAssembler, chunk_id: str) -> assemble.ClaimedWrite | None:
        write = real(self, chunk_id)
        if write is not None:
            taken.append(self.entry.path)
        return write

    monkeypatch.setattr(assemble.FileAssembler, "claim", claim)
    return taken


async def test_a_corrupt_chunk_is_fetched_again_and_the_file_written_from_the_good_copy(
    tmp_path: Path, claims: list[str], opts: SyncOptions, helpers: list[WriterProcess]
) -> None:
    files, manifest, victim, source = _served(tmp_path, bad_copies=1)
    sink = DirChunkSink(tmp_path / "store", fsync=False)
    dest = tmp_path / "dest"
    summary = await sync_manifest(manifest, source, sink, dest, opts)
    assert source.asked[victim] == 2
    assert summary.chunk_retries == 1
    assert summary.files_written == len(files)
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data, rel
    assert (tmp_path / "store" / victim).read_bytes() == files["victim/v.bin"]
    assert _leftovers(dest) == []
    # Written inside the verify call: the bad copy's call claimed it too, and wrote nothing.
    assert claims.count("victim/v.bin") == 2
    if opts.writer_process_min_files == 1:  # every file went through the helper, once
        assert [h.files for h in helpers] == [len(files)]
    else:
        assert helpers == []


async def test_a_chunk_that_stays_corrupt_is_never_written_nor_stored(
    tmp_path: Path, claims: list[str], opts: SyncOptions
) -> None:
    files, manifest, victim, source = _served(tmp_path, bad_copies=opts.max_attempts)
    dest = tmp_path / "dest"
    sink = DirChunkSink(tmp_path / "store", fsync=False)
    with pytest.raises(IntegrityError):
        await sync_manifest(manifest, source, sink, dest, opts)
    assert source.asked[victim] == opts.max_attempts
    assert claims.count("victim/v.bin") == opts.max_attempts
    # Not in place, not half-written beside it, not in the store.
    assert not (dest / "victim" / "v.bin").exists()
    assert list((dest / "victim").iterdir()) == []
    assert not (tmp_path / "store" / victim).exists()
    # The other files' chunks were good: each is in place whole, or not there at all.
    for rel, data in files.items():
        if rel != "victim/v.bin" and (dest / rel).exists():
            assert (dest / rel).read_bytes() == data, rel
    assert _leftovers(dest) == []


class Immutable:
    """Directories made immutable (``chattr +i``: refused even to root), undone at the end."""

    def __init__(self) -> None:
        self.made: list[Path] = []

    def set(self, path: Path) -> None:
        """Make ``path`` immutable; skip the test where the filesystem cannot."""
        if shutil.which("chattr") is None:
            pytest.skip("chattr is not installed")
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"this filesystem has no immutable flag: {done.stderr.strip()}")
        self.made.append(path)

    def clear(self, path: Path) -> None:
        subprocess.run(["chattr", "-i", str(path)], check=True)
        self.made.remove(path)


@pytest.fixture
def immutable() -> Iterator[Immutable]:
    dirs = Immutable()
    yield dirs
    for path in list(dirs.made):
        dirs.clear(path)


async def test_a_refused_write_fails_the_sync_and_the_next_sync_finishes_it(
    tmp_path: Path, claims: list[str], immutable: Immutable, opts: SyncOptions
) -> None:
    files, manifest, victim, source = _served(tmp_path, bad_copies=0)
    dest = tmp_path / "dest"
    (dest / "victim").mkdir(parents=True)
    immutable.set(dest / "victim")
    store = tmp_path / "store"
    with pytest.raises(StorageError, match=r"cannot write .*victim/v\.bin: .*not permitted"):
        await sync_manifest(manifest, source, DirChunkSink(store, fsync=False), dest, opts)
    assert "victim/v.bin" in claims
    assert list((dest / "victim").iterdir()) == []
    # The chunk was verified and stored before the write failed: kept for the next sync.
    assert (store / victim).read_bytes() == files["victim/v.bin"]
    immutable.clear(dest / "victim")
    asked_before = source.asked[victim]
    summary = await sync_manifest(manifest, source, DirChunkSink(store, fsync=False), dest, opts)
    assert source.asked[victim] == asked_before  # resumed from the store, not fetched
    assert summary.files_written + summary.files_skipped == len(files)
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data, rel
    assert _leftovers(dest) == []


async def test_a_write_cut_short_leaves_no_partial_file_and_the_next_sync_finishes_it(
    tmp_path: Path, claims: list[str], opts: SyncOptions
) -> None:
    """The disk takes part of the file and then refuses (``RLIMIT_FSIZE``: EFBIG, as a
    full disk's ENOSPC would): the partial temporary file is removed, never renamed."""
    big_bytes = 1000 * 1000
    files, manifest, victim, source = _served(tmp_path, bad_copies=0, big_bytes=big_bytes)
    dest = tmp_path / "dest"
    sink = MemoryChunkSink()  # the limit is the process's: the store must not write files
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (big_bytes // 2, hard))
    try:
        with pytest.raises(StorageError, match=r"cannot write .*victim/v\.bin: .*too large"):
            await sync_manifest(manifest, source, sink, dest, opts)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert "victim/v.bin" in claims
    assert not (dest / "victim" / "v.bin").exists()
    assert _leftovers(dest) == []
    assert os.listdir(dest / "victim") == []
    asked_before = source.asked[victim]
    await sync_manifest(manifest, source, sink, dest, opts)
    assert source.asked[victim] == asked_before
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data, rel
    assert _leftovers(dest) == []


async def test_a_helper_that_cannot_start_leaves_the_writes_to_the_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, helpers: list[WriterProcess]
) -> None:
    files, manifest, _, source = _served(tmp_path, bad_copies=0)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the helper exits at once
    dest = tmp_path / "dest"
    opts = replace(FAST, writer_process_min_files=1)
    summary = await sync_manifest(manifest, source, MemoryChunkSink(), dest, opts)
    assert len(helpers) == 1  # started, found not ready, and the sync wrote the files itself
    assert helpers[0].files == 0
    assert summary.files_written == len(files)
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data, rel
    assert _leftovers(dest) == []
