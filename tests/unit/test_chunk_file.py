"""chunk_file: the same chunks as cutting the bytes in memory, and a file truncated
while it is cut ends the chunks early instead of killing the process (SIGBUS)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from netopt.chunking import WHOLE_READ_MAX_BYTES, chunk_bytes, chunk_file

AVG_BYTES = 64 * 1024


@pytest.mark.parametrize(
    "size_bytes",
    [
        0,
        1,
        AVG_BYTES - 1,
        WHOLE_READ_MAX_BYTES,
        WHOLE_READ_MAX_BYTES + 1,
        3 * WHOLE_READ_MAX_BYTES + 17,
    ],
)
def test_file_chunks_match_memory_chunks(tmp_path: Path, size_bytes: int) -> None:
    data = os.urandom(size_bytes)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    got = list(chunk_file(path, AVG_BYTES))
    assert got == chunk_bytes(data, AVG_BYTES)
    assert sum(c.length_bytes for c in got) == size_bytes


TRUNCATE_WHILE_CUTTING = """
import os, sys
from netopt.chunking import chunk_file
path = sys.argv[1]
chunks = chunk_file(path, 64 * 1024)
first = next(chunks)
os.truncate(path, 0)  # another writer replaces the file under the reader
rest = list(chunks)
print(first.length_bytes + sum(c.length_bytes for c in rest))
"""


def test_truncated_while_cutting_does_not_kill_the_process(tmp_path: Path) -> None:
    """A mapped file read past its new end raises SIGBUS; plain reads see EOF."""
    path = tmp_path / "big.bin"
    size_bytes = 64 * 1024 * 1024
    with path.open("wb") as f:
        for _ in range(size_bytes // (1 << 20)):
            f.write(os.urandom(1 << 20))
    proc = subprocess.run(
        [sys.executable, "-c", TRUNCATE_WHILE_CUTTING, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    seen_bytes = int(proc.stdout.strip())
    # What was read before the truncation is cut; nothing after it is invented.
    assert 0 < seen_bytes < size_bytes
