"""The compressibility sample: stretches spread over the dataset, compressed as they travel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zstandard

from netopt.errors import StorageError
from netopt.transfer.sampling import SAMPLE_RUNS, sample_bytes, sample_files

PACKAGE = Path(__file__).resolve().parents[2] / "netopt"


def _tree(root: Path) -> list[Path]:
    """netopt's own sources copied under ``root`` (real, similar small text files)."""
    out: list[Path] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        dest = root / path.relative_to(PACKAGE)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(path.read_bytes())
        out.append(dest)
    return out


def test_a_tree_of_small_files_samples_higher_in_a_stream_than_file_by_file(
    tmp_path: Path,
) -> None:
    files = _tree(tmp_path)
    alone = sample_files(files, (3,))
    in_stream = sample_files(files, (3,), in_stream=True)
    assert alone.sample_bytes == in_stream.sample_bytes > 0
    assert in_stream.ratio_by_level[3] > 1.1 * alone.ratio_by_level[3]
    # What a stream of every file, one context, flushed after each, gets:
    stream = zstandard.ZstdCompressor(level=3).compressobj()
    data = [p.read_bytes() for p in files]
    whole = sum(len(stream.compress(d)) + len(stream.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
                for d in data)  # fmt: skip
    assert in_stream.ratio_by_level[3] == pytest.approx(sum(map(len, data)) / whole, rel=0.2)


def test_the_sample_spreads_over_the_dataset_not_its_largest_files(tmp_path: Path) -> None:
    """Two large random files and 8 MB of small text files: the old sample (largest files
    first) saw only random bytes; spread by bytes, the text counts for its share."""
    big = [tmp_path / "a-big.bin", tmp_path / "b-big.bin"]
    for path in big:
        path.write_bytes(os.urandom(4 * 1024 * 1024))
    text = b"".join(p.read_bytes() for p in sorted(PACKAGE.rglob("*.py")))
    small = []
    for index in range(800):
        path = tmp_path / "c-text" / f"{index:04d}.txt"
        path.parent.mkdir(exist_ok=True)
        start = index * 10_000 % max(1, len(text) - 10_000)
        path.write_bytes(text[start : start + 10_000])
        small.append(path)
    profile = sample_files([*big, *small], (3,), in_stream=True)
    # Half the bytes are text: the sample sees it (1.36 here; random bytes alone: 1.0).
    assert profile.ratio_by_level[3] > 1.25
    assert profile.sample_bytes <= 8 * 1024 * 1024


def test_a_large_file_is_sampled_in_slices_across_it(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    half = 6 * 1024 * 1024
    path.write_bytes(b"\0" * half + os.urandom(half))
    profile = sample_files([path], (1,), budget_bytes=SAMPLE_RUNS * 1024 * 1024)
    assert profile.sample_bytes == SAMPLE_RUNS * 1024 * 1024
    # Half the slices are zeros (ratio ~inf), half random (~1): about 2x in all.
    assert 1.8 < profile.ratio_by_level[1] < 2.2


def test_empty_and_unreadable(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert sample_files([empty]).sample_bytes == 0
    with pytest.raises(StorageError):
        sample_files([tmp_path / "missing"])


def test_sample_bytes_runs_compress_each_stretch_as_one_stream() -> None:
    piece = PACKAGE.joinpath("dataplane", "handlers.py").read_bytes()
    alone = sample_bytes([piece, piece], (3,))
    together = sample_bytes((), (3,), runs=[[piece, piece]])
    assert together.sample_bytes == alone.sample_bytes == 2 * len(piece)
    assert together.ratio_by_level[3] > 1.6 * alone.ratio_by_level[3]  # the repeat is free
