"""The data plane's peer bounds: the chunking rule they assume and the manifest checks."""

from __future__ import annotations

import json

import pytest
from pyfastcdc.cy import FastCDC

from netopt.chunking import ChunkRef
from netopt.dataplane.limits import (
    CDC_MAX_OVER_AVG,
    MAX_AVG_CHUNK_BYTES,
    MAX_MANIFEST_BYTES,
    BodyTooLarge,
    check_manifest_bounds,
    check_manifest_shape,
    max_chunk_bytes,
)
from netopt.transfer.manifest import FileEntry, Manifest, manifest_to_dict


@pytest.mark.parametrize("avg", [256, 4096, 64 * 1024, 1024 * 1024, MAX_AVG_CHUNK_BYTES])
def test_max_chunk_is_what_fastcdc_cuts_at(avg: int) -> None:
    assert max_chunk_bytes(avg) == FastCDC(avg_size=avg, normalized_chunking=1).max_size
    assert CDC_MAX_OVER_AVG * avg == max_chunk_bytes(avg)
    with pytest.raises(ValueError, match="out of range"):
        FastCDC(avg_size=MAX_AVG_CHUNK_BYTES + 1, normalized_chunking=1)


def _manifest(files: int, avg: int = 1024 * 1024, length: int = 4096) -> Manifest:
    entries = tuple(
        FileEntry(f"d/{i:08d}.bin", length, 0o644, 0, (ChunkRef(0, length, f"{i:064x}"),))
        for i in range(files)
    )
    return Manifest("ds", entries, avg)


def test_a_hundred_thousand_file_manifest_fits_every_bound() -> None:
    manifest = _manifest(100_000)
    raw = json.dumps(manifest_to_dict(manifest)).encode()
    assert len(raw) < MAX_MANIFEST_BYTES // 4
    check_manifest_shape(raw)
    check_manifest_bounds(manifest)


def test_too_many_entries_or_too_long_chunks_are_refused() -> None:
    with pytest.raises(BodyTooLarge, match="entries"):
        check_manifest_bounds(_manifest(600), max_entries=1000)
    with pytest.raises(BodyTooLarge, match="chunk of"):
        check_manifest_bounds(_manifest(1, avg=1024, length=4097))
    with pytest.raises(BodyTooLarge, match="average chunk size"):
        check_manifest_bounds(_manifest(1, avg=MAX_AVG_CHUNK_BYTES * 2))


def test_a_body_of_tiny_values_is_refused_before_parsing() -> None:
    raw = b'{"files": [' + b"0," * 40_000 + b"0]}"
    check_manifest_shape(raw, max_entries=4000)  # ~40,000 values: room for 4,000 entries
    with pytest.raises(BodyTooLarge, match="JSON values"):
        check_manifest_shape(raw, max_entries=3000)


def test_a_manifest_over_the_entry_cap_is_refused_before_parsing() -> None:
    # The campaign's hostile server: one more (empty) file than the cap. Refused from the
    # body's bytes, not after parsing it into ~1 KB of objects per entry.
    at_cap = _manifest(0)
    files = [
        {"path": f"f{i:07d}", "size_bytes": 0, "mode": 420, "mtime_ns": 0, "chunks": []}
        for i in range(1001)
    ]
    raw = json.dumps({**manifest_to_dict(at_cap), "files": files}).encode()
    with pytest.raises(BodyTooLarge, match="over the 1000 entries"):
        check_manifest_shape(raw, max_entries=1000)
    check_manifest_shape(raw, max_entries=1001)
