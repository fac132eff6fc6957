"""The versions a client names (`netopt.dataplane.manifestversions`) and the ones a cache
holds on disk (`netopt.cache.storedmanifests`): real files in a temporary cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from netopt.cache.storedmanifests import known_manifests, load_stored_manifest
from netopt.cachepaths import manifest_file, stored_manifest_ids
from netopt.dataplane.manifestversions import (
    KNOWN_VERSIONS_MAX,
    if_none_match,
    not_modified_id,
)
from netopt.errors import PathTraversalError, ProtocolError
from netopt.transfer.manifest import ChunkRef, FileEntry, Manifest

A, B = "a" * 64, "b" * 64


def _manifest(name: str = "ds", files: int = 3) -> Manifest:
    entries = tuple(
        FileEntry(
            f"d/f{i}.txt", 10, 0o644, 1_700_000_000 * 10**9 + i, (ChunkRef(0, 10, f"{i:064x}"),)
        )
        for i in range(files)
    )
    return Manifest(name=name, files=entries)


def _store(cache: Path, manifest: Manifest, mtime_s: float | None = None) -> Path:
    path = manifest_file(cache, manifest.name, manifest.manifest_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(manifest.canonical_json)
    if mtime_s is not None:
        os.utime(path, (mtime_s, mtime_s))
    return path


def test_if_none_match_names_the_first_well_formed_versions_only() -> None:
    assert if_none_match(()) is None
    assert if_none_match((A, B)) == f'"{A}", "{B}"'
    # A malformed id (it could carry a quote or a comma) is never named.
    assert if_none_match(('x", "y', A.upper(), A)) == f'"{A}"'
    many = [f"{i:064x}" for i in range(3 * KNOWN_VERSIONS_MAX)]
    named = if_none_match(many)
    assert named is not None
    assert named.count('"') == 2 * KNOWN_VERSIONS_MAX
    assert f'"{many[KNOWN_VERSIONS_MAX]}"' not in named


@pytest.mark.parametrize("etag", [f'"{A}"', f'W/"{A}"', f' "{A}" '])
def test_a_304_naming_an_offered_version_is_that_version(etag: str) -> None:
    assert not_modified_id(etag, (B, A)) == A


@pytest.mark.parametrize(
    "etag", [None, "", A, f'"{A}', f'"{A.upper()}"', f'"{"c" * 64}"', '"*"', f'"{A}", "{B}"']
)
def test_a_304_naming_anything_else_is_refused(etag: str | None) -> None:
    with pytest.raises(ProtocolError, match="304 naming"):
        not_modified_id(etag, (A, B))


def test_a_version_past_the_named_ones_is_not_offered() -> None:
    many = [f"{i:064x}" for i in range(KNOWN_VERSIONS_MAX + 1)]
    with pytest.raises(ProtocolError):
        not_modified_id(f'"{many[-1]}"', many)


def test_stored_versions_newest_first_bounded(tmp_path: Path) -> None:
    versions = [_manifest(files=n) for n in range(1, KNOWN_VERSIONS_MAX + 3)]
    for age, manifest in enumerate(versions):
        _store(tmp_path, manifest, mtime_s=1_700_000_000 + age)
    # Not versions: another name, a stray file, a directory named like one.
    (tmp_path / "manifests" / "ds" / "notes.txt").write_text("x")
    (tmp_path / "manifests" / "ds" / f"{'d' * 64}.json").mkdir()
    ids = stored_manifest_ids(tmp_path, "ds", KNOWN_VERSIONS_MAX)
    newest = [m.manifest_id for m in reversed(versions)]
    assert ids == tuple(newest[:KNOWN_VERSIONS_MAX])
    assert stored_manifest_ids(tmp_path, "ds", limit=2) == tuple(newest[:2])


@pytest.mark.parametrize("name", ["other", "../ds", "", "a/b", "."])
def test_no_versions_for_a_name_not_held_or_not_a_name(tmp_path: Path, name: str) -> None:
    _store(tmp_path, _manifest())
    assert stored_manifest_ids(tmp_path, name, KNOWN_VERSIONS_MAX) == ()
    assert stored_manifest_ids(tmp_path / "missing", "ds", KNOWN_VERSIONS_MAX) == ()


def test_a_stored_version_reads_back_as_itself(tmp_path: Path) -> None:
    manifest = _manifest(files=50)
    _store(tmp_path, manifest)
    got = load_stored_manifest(tmp_path, "ds", manifest.manifest_id)
    assert got == manifest
    assert got is not None
    assert got.manifest_id == manifest.manifest_id
    assert got.canonical_json == manifest.canonical_json
    held = known_manifests(tmp_path, "ds")
    assert held.ids == (manifest.manifest_id,)
    assert held.load(manifest.manifest_id) == manifest


def test_a_stored_version_that_does_not_check_is_not_read_back(tmp_path: Path) -> None:
    manifest = _manifest()
    path = _store(tmp_path, manifest)
    mid = manifest.manifest_id
    path.write_bytes(manifest.canonical_json.replace(b"f1.txt", b"f9.txt"))
    assert load_stored_manifest(tmp_path, "ds", mid) is None  # changed
    path.write_bytes(manifest.canonical_json[:-5])
    assert load_stored_manifest(tmp_path, "ds", mid) is None  # cut short
    path.unlink()
    assert load_stored_manifest(tmp_path, "ds", mid) is None  # gone
    # Bytes that hash to their name but are another dataset's, or not a manifest.
    other = _manifest(name="other")
    wrong = manifest_file(tmp_path, "ds", other.manifest_id)
    wrong.write_bytes(other.canonical_json)
    assert load_stored_manifest(tmp_path, "ds", other.manifest_id) is None
    junk = b'{"name": "ds", "files": 7}'
    from blake3 import blake3

    junk_id = blake3(junk).hexdigest()
    manifest_file(tmp_path, "ds", junk_id).write_bytes(junk)
    assert load_stored_manifest(tmp_path, "ds", junk_id) is None
    # A name or id that is not one is never turned into a path.
    assert load_stored_manifest(tmp_path, "../ds", mid) is None
    assert load_stored_manifest(tmp_path, "ds", "../" + mid) is None
    with pytest.raises(PathTraversalError):
        manifest_file(tmp_path, "ds", "../x")
