"""A download's pieces are written in `WRITE_BYTES` writes, and what came before a cut
is on disk when the block ends (the next try resumes after it), never written twice."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import pytest

from netopt.cache.spool import WRITE_BYTES, _Pending


async def test_pieces_are_written_in_blocks_and_the_rest_when_a_cut_ends_the_block(
    tmp_path: Path,
) -> None:
    piece = os.urandom(WRITE_BYTES // 3 + 1)
    path = tmp_path / "download"

    async def five_pieces_then_a_cut(f: BinaryIO) -> None:
        async with _Pending(f) as pending:
            for count in range(1, 6):
                await pending.add(piece)
                f.flush()
                # Nothing written until a block's worth came, then all of it.
                assert path.stat().st_size == (len(piece) * 3 if count >= 3 else 0)
            raise ConnectionResetError("the link was cut")

    with path.open("wb") as f, pytest.raises(ConnectionResetError):
        await five_pieces_then_a_cut(f)
    assert path.read_bytes() == piece * 5


async def test_a_block_whose_write_failed_is_not_written_again(tmp_path: Path) -> None:
    class Full:
        def __init__(self) -> None:
            self.writes: list[int] = []

        def writelines(self, pieces: list[bytes]) -> None:
            self.writes.append(sum(map(len, pieces)))
            if len(self.writes) == 1:
                raise OSError(28, "No space left on device")

    full = Full()
    with pytest.raises(OSError, match="No space"):
        async with _Pending(full) as pending:  # type: ignore[arg-type]
            await pending.add(b"x" * WRITE_BYTES)
    # The failed block once, then the (empty) rest when the block ended.
    assert full.writes == [WRITE_BYTES, 0]
