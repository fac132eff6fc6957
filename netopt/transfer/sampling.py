"""How a dataset compresses: a sample of it, compressed at each zstd level as it will travel.

The plan's ratio per level comes from here, so the sample must look like what crosses
the wire. Two things decide that:

- **Where the sample comes from.** `sample_files` takes `SAMPLE_RUNS` stretches spread
  evenly over the dataset's bytes, in the dataset's own order: a stretch is whole files
  one after another where files are small (a tree of packages: its ``.py`` files, not
  its few largest shared objects), a 1 MiB slice where a file is large. Sampling the
  largest files only gave a tree the ratio of its binaries.
- **How it is compressed.** Stored and per-chunk frames compress each chunk alone
  (``in_stream=False``); a stream with a context (`netopt.dataplane.streamctx`)
  compresses its small chunks as one stream, flushed after each, with the same window
  (`STREAM_WINDOW_LOG`), and its large ones alone (``in_stream=True``), so each stretch
  is compressed that way.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import zstandard

from netopt.errors import StorageError
from netopt.transfer.planner import SampleProfile

__all__ = [
    "BUNDLE_MAX_BYTES",
    "BUNDLE_MAX_CHUNKS",
    "CONTEXT_MAX_CHUNK_BYTES",
    "DEFAULT_LEVELS",
    "SAMPLE_RUNS",
    "STREAM_WINDOW_LOG",
    "fits_bundle",
    "sample_bytes",
    "sample_file",
    "sample_files",
    "stream_compressor",
]

DEFAULT_LEVELS: tuple[int, ...] = (1, 3, 5, 7, 9)
SAMPLE_RUNS = 8
"""Stretches a sample is taken from, evenly spread over the dataset's bytes."""
STREAM_WINDOW_LOG = 22
"""The window (4 MiB) of a stream's shared zstd context: the history a chunk may refer
to, and the memory one stream's context costs each side."""
CONTEXT_MAX_CHUNK_BYTES = 256 * 1024
"""Chunks at least this long are compressed alone (``zstd`` frames, outside the context):
such a chunk is most of its own history, and zstd compresses it faster alone (a 1 MiB
JSON-lines chunk at level 5: 184 MB/s alone, 106 MB/s through a context, same ratio),
while a tree's small files gain (installed packages at level 3: ratio 2.53 chunk by
chunk, 2.84 with the chunks under 256 KiB in the context, 2.96 with all of them)."""
BUNDLE_MAX_BYTES = 64 * 1024
BUNDLE_MAX_CHUNKS = 64
"""A stream with a context sends consecutive chunks under `CONTEXT_MAX_CHUNK_BYTES` that are
ready together as one bundle (one ``zstd-bundle`` frame, see `netopt.dataplane.streamctx`) of
at most this many bytes and chunks, flushed once: a block flush per 1-4 KB file costs zstd
a block header and fresh entropy tables each time (100,000 such files at level 3: ratio
3.97 flushed per file, 4.29 per 16 files, 4.30 per 64) and a third more CPU, and each
frame's 37-byte header another 5 %."""
_SLICE_BYTES = 1024 * 1024


def stream_compressor(level: int) -> zstandard.ZstdCompressionObj:
    """A stream context's compressor: ``level``, `STREAM_WINDOW_LOG`, no checksum or size
    (the chunks are verified by name; the stream has no end)."""
    params = zstandard.ZstdCompressionParameters.from_level(
        level, window_log=STREAM_WINDOW_LOG, write_checksum=0, write_content_size=0
    )
    return zstandard.ZstdCompressor(compression_params=params).compressobj()


def sample_bytes(
    pieces: Iterable[bytes],
    levels: Sequence[int] = DEFAULT_LEVELS,
    *,
    runs: Sequence[Sequence[bytes]] | None = None,
) -> SampleProfile:
    """The ratio per level of ``pieces``, each compressed alone (as chunks are); or, with
    ``runs`` (stretches of pieces, ``pieces`` then ignored), each stretch compressed as
    one stream flushed after each piece (as a stream with a context sends them)."""
    stretches = [[p for p in run if p] for run in runs] if runs is not None else None
    data = [p for p in pieces if p] if stretches is None else []
    raw = sum(len(p) for p in data) + sum(len(p) for run in stretches or () for p in run)
    ratios: dict[int, float] = {}
    for level in levels:
        if stretches is None:
            compressor = zstandard.ZstdCompressor(level=level)
            packed = sum(len(compressor.compress(p)) for p in data)
        else:
            packed = sum(_stream_bytes(run, level) for run in stretches)
        ratios[level] = raw / packed if packed else 1.0
    return SampleProfile(ratio_by_level=ratios, sample_bytes=raw)


def _stream_bytes(run: Sequence[bytes], level: int) -> int:
    """``run`` as a stream with a context sends it: pieces under `CONTEXT_MAX_CHUNK_BYTES`
    through the stream's compressor in bundles (`fits_bundle`), flushed after each bundle;
    longer ones alone."""
    stream = stream_compressor(level)
    alone = zstandard.ZstdCompressor(level=level)
    flush = zstandard.COMPRESSOBJ_FLUSH_BLOCK
    total = 0
    bundle_bytes = bundle_chunks = 0
    for piece in run:
        if len(piece) >= CONTEXT_MAX_CHUNK_BYTES:
            if bundle_chunks:
                total += len(stream.flush(flush))
                bundle_bytes = bundle_chunks = 0
            total += len(alone.compress(piece))
            continue
        if bundle_chunks and not fits_bundle(bundle_bytes, bundle_chunks, len(piece)):
            total += len(stream.flush(flush))
            bundle_bytes = bundle_chunks = 0
        total += len(stream.compress(piece))
        bundle_bytes += len(piece)
        bundle_chunks += 1
    if bundle_chunks:
        total += len(stream.flush(flush))
    return total


def fits_bundle(bundle_bytes: int, bundle_chunks: int, length_bytes: int) -> bool:
    """True when a chunk of ``length_bytes`` may join a bundle of ``bundle_chunks`` chunks
    and ``bundle_bytes`` (see `BUNDLE_MAX_BYTES`); with none yet, when it may start one
    (any chunk under `CONTEXT_MAX_CHUNK_BYTES`)."""
    if not bundle_chunks:
        return length_bytes < CONTEXT_MAX_CHUNK_BYTES
    return (
        length_bytes < CONTEXT_MAX_CHUNK_BYTES
        and bundle_chunks < BUNDLE_MAX_CHUNKS
        and bundle_bytes + length_bytes <= BUNDLE_MAX_BYTES
    )


def _stretch(
    paths: Sequence[Path], sizes: Sequence[int], starts: Sequence[int], at: int, budget: int
) -> list[bytes]:
    """Pieces from byte ``at`` of the dataset on: files from there, whole up to a slice,
    until ``budget`` bytes."""
    index = bisect.bisect_right(starts, at) - 1
    offset = at - starts[index]
    pieces: list[bytes] = []
    taken = 0
    while index < len(paths) and taken < budget:
        size = sizes[index]
        offset = max(0, min(offset, size - _SLICE_BYTES))
        want = min(_SLICE_BYTES, size - offset, budget - taken)
        if want > 0:
            with paths[index].open("rb") as f:
                f.seek(offset)
                piece = f.read(want)
            pieces.append(piece)
            taken += len(piece)
        index, offset = index + 1, 0
    return pieces


def sample_files(
    paths: Sequence[str | os.PathLike[str]],
    levels: Sequence[int] = DEFAULT_LEVELS,
    budget_bytes: int = 8 * 1024 * 1024,
    *,
    in_stream: bool = False,
) -> SampleProfile:
    """Sample ``paths`` (in the dataset's order): `SAMPLE_RUNS` stretches evenly spread
    over their bytes, ``budget_bytes`` in all (module doc); ``in_stream``: each stretch
    compressed as one stream, else each piece alone.

    Raises StorageError when a file cannot be read.
    """
    files = [Path(p) for p in paths]
    try:
        sizes = [p.stat().st_size for p in files]
        starts, total = [], 0
        for size in sizes:
            starts.append(total)
            total += size
        if total == 0:
            return SampleProfile({}, 0)
        runs = max(1, min(SAMPLE_RUNS, -(-total // _SLICE_BYTES)))
        per_run = max(1, min(budget_bytes, total) // runs)
        stretches = [
            _stretch(files, sizes, starts, total * run // runs, per_run) for run in range(runs)
        ]
    except OSError as exc:
        raise StorageError(f"cannot read sample: {exc}") from exc
    if in_stream:
        return sample_bytes((), levels, runs=stretches)
    return sample_bytes([p for run in stretches for p in run], levels)


def sample_file(
    path: str | os.PathLike[str],
    levels: Sequence[int] = DEFAULT_LEVELS,
    budget_bytes: int = 8 * 1024 * 1024,
) -> SampleProfile:
    """Sample up to ``budget_bytes`` of ``path`` in 1 MiB slices spread over the file.

    Raises StorageError when the file cannot be read.
    """
    return sample_files([path], levels, budget_bytes)
