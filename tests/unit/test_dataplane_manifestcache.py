"""`ManifestEncodings`: once per version, bounded, and never holding an old version alive."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable

import pytest
import zstandard

from netopt.dataplane.manifestcache import EncodedManifest, ManifestEncodings
from netopt.transfer.manifest import FileEntry, Manifest


def _manifest(version: int) -> Manifest:
    entry = FileEntry(f"v{version}.txt", 0, 0o644, version, ())
    return Manifest("ds", (entry,))


async def _in_thread(fn: Callable[[], EncodedManifest]) -> EncodedManifest:
    return await asyncio.to_thread(fn)


async def test_many_requests_for_one_version_encode_it_once() -> None:
    encodings = ManifestEncodings()
    manifest = _manifest(1)
    got = await asyncio.gather(*(encodings.get("ds", manifest, _in_thread) for _ in range(8)))
    assert encodings.encoded == 1
    assert all(g is got[0] for g in got)
    assert got[0].manifest_id == manifest.manifest_id
    assert got[0].plain is manifest.canonical_json
    assert zstandard.ZstdDecompressor().decompress(got[0].zstd) == manifest.canonical_json


async def test_two_versions_are_kept_and_a_dropped_version_is_not_held_alive() -> None:
    encodings = ManifestEncodings(versions_kept=2)
    kept = [_manifest(i) for i in range(4)]
    for i in range(4):
        await encodings.get("ds", kept[i], _in_thread)
    assert encodings.versions_held("ds") == 2
    await encodings.get("ds", kept[3], _in_thread)
    await encodings.get("ds", kept[2], _in_thread)
    assert encodings.encoded == 4  # the two newest were held
    await encodings.get("ds", kept[0], _in_thread)
    assert encodings.encoded == 5  # the oldest had been dropped
    # The cache holds manifests weakly: a version the dataset let go is freed, even one
    # it still lists (its encoding goes with it at the next request).
    assert encodings.versions_held("ds") == 2  # versions 3 and 0
    gone = weakref.ref(kept[3])
    del kept[3]
    gc.collect()
    assert gone() is None
    await encodings.get("ds", kept[0], _in_thread)
    assert encodings.versions_held("ds") == 1


async def test_datasets_beyond_the_bound_are_forgotten_least_recent_first() -> None:
    encodings = ManifestEncodings(datasets_kept=2)
    manifests = {name: _manifest(i) for i, name in enumerate("abc")}
    for name, manifest in manifests.items():
        await encodings.get(name, manifest, _in_thread)
    assert [encodings.versions_held(n) for n in "abc"] == [0, 1, 1]


async def test_a_failed_encoding_is_tried_again() -> None:
    encodings = ManifestEncodings()
    manifest = _manifest(1)
    calls = 0

    async def flaky(fn: Callable[[], EncodedManifest]) -> EncodedManifest:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("pool gone")
        return await asyncio.to_thread(fn)

    with pytest.raises(OSError, match="pool gone"):
        await encodings.get("ds", manifest, flaky)
    assert encodings.versions_held("ds") == 0
    assert (await encodings.get("ds", manifest, flaky)).manifest_id == manifest.manifest_id
