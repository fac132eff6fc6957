"""`scan_dest`: what of a manifest DEST already holds, and the leftovers it clears."""

from __future__ import annotations

import os
from pathlib import Path

from netopt.cache.syncer import scan_dest
from netopt.transfer.manifest import build_manifest


def test_scan_dest_lists_files_and_clears_only_their_leftovers(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "x.tar.gz").write_bytes(b"x" * 10)
    (src / "top.txt").write_bytes(b"top")
    (src / "gone.txt").write_bytes(b"gone")
    manifest = build_manifest(src, "ds")
    dest = tmp_path / "dest"
    (dest / "a" / "b").mkdir(parents=True)
    (dest / "a" / "b" / "x.tar.gz").write_bytes(b"y" * 7)
    os.symlink(src / "top.txt", dest / "top.txt")  # a symlink is not a file of the dataset
    stale = dest / "a" / "b" / ".x.tar.gz.0123abcd7.netopt-tmp"
    stale.write_bytes(b"partial")
    foreign = dest / "a" / "b" / ".other.0123abcd.netopt-tmp"  # no file of the manifest
    foreign.write_bytes(b"keep")
    found = scan_dest(dest, manifest)
    st = (dest / "a" / "b" / "x.tar.gz").stat()
    assert found == {"a/b/x.tar.gz": (7, st.st_mtime_ns)}
    assert not stale.exists()
    assert foreign.exists()
