"""Manifest building, round trips and name validation (traversal refused)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netopt.errors import PathTraversalError, ProtocolError, ValidationError
from netopt.transfer.manifest import (
    STATE_DIR_NAME,
    build_manifest,
    manifest_from_dict,
    manifest_to_dict,
    validate_chunk_id,
    validate_rel_path,
)

GOOD_ID = "a" * 64


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "..",
        "../etc/passwd",
        "a/../../b",
        "a/./b",
        "/etc/passwd",
        "a//b",
        "a/",
        "a\x00b",
        "a\\..\\b",
        "..\\x",
        "a\nb",
        f"{STATE_DIR_NAME}/chunks/x",
        "x" * 300,
    ],
)
def test_unsafe_paths_are_refused(bad: str) -> None:
    with pytest.raises(PathTraversalError):
        validate_rel_path(bad)


@pytest.mark.parametrize("good", ["a", "a/b/c.jsonl", "..a", "a..b", ".hidden", "dir/.x"])
def test_safe_paths_pass(good: str) -> None:
    assert validate_rel_path(good) == good


@pytest.mark.parametrize("bad", ["", "../" + "a" * 61, "A" * 64, "a" * 63, GOOD_ID + "/"])
def test_bad_chunk_ids(bad: str) -> None:
    with pytest.raises(PathTraversalError):
        validate_chunk_id(bad)


def _entry(path: str, chunks: list[list[object]] | None = None, size: int = 3) -> dict[str, object]:
    return {
        "path": path,
        "size_bytes": size,
        "mode": 0o644,
        "mtime_ns": 1,
        "chunks": chunks if chunks is not None else [[GOOD_ID, 3]],
    }


def test_manifest_from_dict_refuses_traversal() -> None:
    with pytest.raises(PathTraversalError):
        manifest_from_dict({"name": "d", "files": [_entry("../../evil")]})
    with pytest.raises(PathTraversalError):
        manifest_from_dict({"name": "d", "files": [_entry("/abs")]})
    with pytest.raises(PathTraversalError):
        manifest_from_dict({"name": "d", "files": [_entry("ok", [["../x", 3]])]})


UNSAFE_PATHS = [
    "",
    "..",
    "../etc/passwd",
    "a/../../b",
    "a/./b",
    "a/.",
    "a/..",
    ".",
    "/etc/passwd",
    "a//b",
    "a/",
    "a\x00b",
    "a\x7fb",
    "a\rb",
    "a\\..\\b",
    "a\nb",
    "a\n",
    "\n",
    f"{STATE_DIR_NAME}/chunks/x",
    STATE_DIR_NAME,
    "x" * 300,
    "d/" + "x" * 256,
    "/".join(["d" * 200] * 25),
]
BAD_IDS = ["", "../" + "a" * 61, "A" * 64, "a" * 63, "a" * 65, GOOD_ID + "/", " " + "a" * 63,
           "a" * 62 + " a", "a" * 62 + "\n\n", "g" * 64, 7, None]  # fmt: skip


_UNSET = object()


def _tree(bad_at: int, path: object = _UNSET, chunk_id: object = _UNSET) -> dict[str, object]:
    """A 2,000-file manifest whose file ``bad_at`` has ``path`` or ``chunk_id``."""
    files: list[object] = [_entry(f"d{i // 100}/f{i}") for i in range(2000)]
    if path is not _UNSET:
        files[bad_at] = _entry(path)  # type: ignore[arg-type]
    if chunk_id is not _UNSET:
        files[bad_at] = _entry(f"d/f{bad_at}", [[chunk_id, 3]])
    return {"name": "d", "files": files}


@pytest.mark.parametrize("bad", UNSAFE_PATHS)
@pytest.mark.parametrize("bad_at", [0, 1234, 1999])
def test_one_unsafe_path_among_many_is_refused_by_name(bad: str, bad_at: int) -> None:
    """The paths are checked together first (a tree's many checks one at a time were
    slow); one bad path anywhere among them still fails the manifest, naming it."""
    with pytest.raises(PathTraversalError) as caught:
        manifest_from_dict(_tree(bad_at, path=bad))
    assert repr(bad)[:30].strip("'\"") in str(caught.value) or len(bad) > 255


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("bad_at", [0, 1234, 1999])
def test_one_bad_chunk_name_among_many_is_refused_by_name(bad: object, bad_at: int) -> None:
    with pytest.raises(PathTraversalError, match="is not 64 lowercase hex digits") as caught:
        manifest_from_dict(_tree(bad_at, chunk_id=bad))
    assert repr(bad)[:20] in str(caught.value)


def test_entries_not_shaped_as_files_are_refused_among_many() -> None:
    for odd in (
        "f",
        ["f"],
        {"path": "f"},
        {"path": "f", "chunks": "x"},
        {"path": "f", "chunks": [7]},
    ):
        tree = _tree(0)
        tree["files"][1500] = odd  # type: ignore[index]
        with pytest.raises(ProtocolError):
            manifest_from_dict(tree)


_PATH_CHARS = st.sampled_from(
    ["a", "b", ".", "/", "\\", "\n", "\x00", "\x1f", "\x7f", "\u00e9", " "]
)


def _each_passes(validate: Callable[[object], str], values: list[str]) -> bool:
    """Whether every one of ``values`` passes ``validate`` on its own."""
    try:
        for value in values:
            validate(value)
    except PathTraversalError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(_PATH_CHARS, max_size=8), max_size=6))
def test_the_paths_checked_together_pass_only_where_each_passes(paths: list[str]) -> None:
    """`manifest_from_dict` refuses the same paths whether they are checked together
    or each on its own."""
    names = [f"{i}/{p}" if i % 2 else p for i, p in enumerate(paths)]  # some nested
    tree = {"name": "d", "files": [_entry(p) for p in names]}
    try:
        manifest_from_dict(tree)
        passed = True
    except PathTraversalError:
        passed = False
    except ValidationError:  # a path listed twice, or both a file and a directory
        passed = True
    assert passed == _each_passes(validate_rel_path, names)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text("0123456789abcdefABCDEF \n", min_size=62, max_size=66), max_size=5))
def test_the_chunk_names_checked_together_pass_only_where_each_passes(ids: list[str]) -> None:
    tree = {"name": "d", "files": [_entry(f"f{i}", [[cid, 3]]) for i, cid in enumerate(ids)]}
    try:
        manifest_from_dict(tree)
        passed = True
    except PathTraversalError:
        passed = False
    assert passed == _each_passes(validate_chunk_id, ids)


def test_manifest_from_dict_checks_structure() -> None:
    with pytest.raises(ProtocolError, match="cover"):
        manifest_from_dict({"name": "d", "files": [_entry("f", size=4)]})
    with pytest.raises(ValidationError, match="twice"):
        manifest_from_dict({"name": "d", "files": [_entry("f"), _entry("f")]})
    with pytest.raises(ValidationError, match="both a file and a directory"):
        manifest_from_dict({"name": "d", "files": [_entry("a"), _entry("a/b")]})
    with pytest.raises(ProtocolError):
        manifest_from_dict({"name": "d", "files": "nope"})


def test_build_and_round_trip(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.bin").write_bytes(os.urandom(300_000))
    (tmp_path / "b.txt").write_bytes(b"hello")
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "link").symlink_to("/etc/passwd")
    (tmp_path / STATE_DIR_NAME).mkdir()
    (tmp_path / STATE_DIR_NAME / "junk").write_bytes(b"x")
    manifest = build_manifest(tmp_path, "ds", avg_chunk_bytes=64 * 1024)
    paths = [f.path for f in manifest.files]
    assert paths == ["b.txt", "empty", "sub/a.bin"]  # no symlink, no state dir
    big = manifest.files[2]
    assert len(big.chunks) > 1
    assert sum(c.length_bytes for c in big.chunks) == 300_000
    again = manifest_from_dict(manifest_to_dict(manifest))
    assert again == manifest
    assert again.manifest_id == manifest.manifest_id
    assert manifest.total_bytes == 300_005


def test_the_canonical_json_is_json_dumps_of_the_document_byte_for_byte(tmp_path: Path) -> None:
    """`canonical_manifest_json` writes the canonical form directly; it must be exactly
    what ``json.dumps(sort_keys, compact)`` makes of `manifest_to_dict`, on names JSON
    must escape (quotes, non-ASCII, non-UTF-8 bytes as surrogates), empty files, many
    chunks and the largest integers a manifest holds."""
    import json

    from netopt.chunking import ChunkRef
    from netopt.transfer.manifest import (
        FileEntry,
        Manifest,
        build_manifest,
        canonical_manifest_json,
        manifest_to_dict,
    )

    def dumped(m: Manifest) -> bytes:
        return json.dumps(manifest_to_dict(m), sort_keys=True, separators=(",", ":")).encode()

    names = ['q"uote', "caf\u00e9/\u65e5\u672c", "tab\u2028sep", "emoji\U0001f600",
             os.fsdecode(b"raw\xff\xfe"), "a b/c", "x" * 255]  # fmt: skip
    files = []
    for i, name in enumerate(names):
        chunks = tuple(ChunkRef(k * 10, 10, f"{(i * 31 + k) % 256:02x}" * 32) for k in range(i % 4))
        files.append(FileEntry(name, 10 * len(chunks), 0o755 - i, 2**62 - i, chunks))
    odd = Manifest("ds-1.x_y", tuple(files), 2**31)
    assert canonical_manifest_json(odd) == dumped(odd)
    for i, name in enumerate(names[:-1]):
        path = tmp_path / "tree" / f"d{i}" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(i * 5000))
    built = build_manifest(tmp_path / "tree", "ds", 4096)
    assert canonical_manifest_json(built) == dumped(built)
    assert built.canonical_json == dumped(built)
