"""Files keep their modes and mtimes whatever the syncing process's umask: a file is
created with its mode and gets an ``fchmod`` only when the umask took bits of it
(`netopt.dataplane.assemble._write_whole`), so a umask that takes bits the files need
must still leave every mode exact. Real server, real files."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from netopt.fsutil import process_umask
from tests.service.cache_helpers import sync_served_tree

MODES = [0o644, 0o664, 0o600, 0o755, 0o775, 0o777, 0o640, 0o700, 0o444, 0o400, 0o200]


def _make(root: Path) -> dict[str, tuple[int, int]]:
    """Small and larger files in each mode; path -> (mode, mtime_ns)."""
    out: dict[str, tuple[int, int]] = {}
    for i, mode in enumerate(MODES):
        for size in (1 + i, 300_000 + i):  # one chunk written whole; several chunks
            rel = f"d{i % 3}/m{mode:o}-{size}.bin"
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(size))
            mtime_ns = 1_600_000_000_000_000_000 + i * 1_000_000_007
            os.utime(path, ns=(mtime_ns, mtime_ns))
            path.chmod(mode)
            out[rel] = (mode, mtime_ns)
    return out


def test_the_umask_is_read_from_the_kernel() -> None:
    before = os.umask(0o027)
    try:
        assert process_umask() == 0o027
        os.umask(0o077)
        assert process_umask() == 0o077
    finally:
        os.umask(before)


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000, 0o777])
def test_modes_and_mtimes_are_exact_under_any_umask(tmp_path: Path, umask: int) -> None:
    src, dest, cache = tmp_path / "src", tmp_path / "dest", tmp_path / "cache"
    expected = _make(src)

    before = os.umask(umask)
    try:
        report = asyncio.run(sync_served_tree(src, dest, cache))
    finally:
        os.umask(before)
    assert report.summary is not None
    assert report.summary.files_written == len(expected)
    for rel, (mode, mtime_ns) in expected.items():
        st = (dest / rel).stat()
        assert stat.S_IMODE(st.st_mode) == mode, (rel, oct(stat.S_IMODE(st.st_mode)))
        assert st.st_mtime_ns == mtime_ns, rel
        assert (dest / rel).read_bytes() == (src / rel).read_bytes()
