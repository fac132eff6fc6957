"""A tree of 10,000 small files with the odd parts of real trees, synced from a real
server byte for byte: nested directories, empty files, names that are not UTF-8, plus
symlinks and empty directories, which a sync does not carry (the manifest lists regular
files only: a symlink is left out, never followed, and a directory exists in DEST only
because a file is in it)."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

from tests.service.cache_helpers import sync_served_tree

FILES = 10_000
RAW_NAMES = [b"caf\xe9.txt", b"\xff\xfe-latin1-\xe4.bin", b"ok-\xc3\xa9-utf8.txt"]


def _make(root: Path) -> dict[bytes, bytes]:
    """The tree; its regular files as (path bytes relative to root) -> content."""
    rng = random.Random(22)
    files: dict[bytes, bytes] = {}
    for i in range(FILES):
        rel = f"a{i % 7}/b{i % 11}/c{i % 13}/f{i:05d}.dat".encode()
        files[rel] = b"" if i % 97 == 0 else rng.randbytes(rng.randint(1, 4096))
    for j, name in enumerate(RAW_NAMES):
        files[b"odd/\xe9t\xe9/" + name] = rng.randbytes(100 + j)
    for rel, data in files.items():
        path = os.path.join(os.fsencode(root), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    (root / "empty-dir" / "nested-empty").mkdir(parents=True)
    os.symlink("a0/b0/c0/f00000.dat", root / "link-to-file")
    os.symlink("a1", root / "link-to-dir")
    os.symlink("/etc/passwd", root / "a2" / "link-outside")
    return files


def _tree(root: Path) -> tuple[dict[bytes, bytes], set[bytes], set[bytes]]:
    """(regular files -> bytes, symlinks, directories) under ``root``, as path bytes."""
    base = os.fsencode(root)
    files: dict[bytes, bytes] = {}
    links: set[bytes] = set()
    dirs: set[bytes] = set()
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, base)
            if rel.startswith(b".netopt"):
                continue
            if os.path.islink(path):
                links.add(rel)
            elif os.path.isdir(path):
                dirs.add(rel)
            else:
                with open(path, "rb") as f:
                    files[rel] = f.read()
    return files, links, dirs


def test_an_odd_tree_of_ten_thousand_files_syncs_byte_for_byte(tmp_path: Path) -> None:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    expected = _make(src)

    report = asyncio.run(sync_served_tree(src, dest, cache))
    assert report.summary is not None
    assert report.summary.files_written == len(expected)
    files, links, dirs = _tree(dest)
    assert files == expected  # every regular file, byte for byte, names as bytes
    assert links == set()  # symlinks are left out, not followed
    assert b"empty-dir" not in dirs  # empty directories are not carried
    assert b"odd/\xe9t\xe9" in dirs
