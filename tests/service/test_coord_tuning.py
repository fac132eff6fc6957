"""The coordinator's latency tuning: quieter background threads, a WAL file kept whole."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from netopt.coordinator.database import BACKGROUND_NICE, RESTART_AFTER_FRAMES, Database
from netopt.coordinator.store import WAL_SIZE_LIMIT_BYTES

PAGE_BYTES = 4096
WAL_FRAME_HEADER_BYTES = 24


def _own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


async def test_checkpoint_and_reader_threads_yield_to_the_loop(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "c.db"))
    await db.open()
    try:
        loop = asyncio.get_running_loop()
        base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        checkpointer = await loop.run_in_executor(db._checkpointer, _own_nice)
        reader = await loop.run_in_executor(db._reader_executor, _own_nice)
        writer = await db.call(_own_nice)
        expected = min(19, base + BACKGROUND_NICE)
        assert (checkpointer, reader, writer) == (expected, expected, base)
        assert _own_nice() == base
    finally:
        await db.close()


async def test_a_restarting_wal_is_not_cut_down(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "c.db"))
    await db.open()
    try:
        store = db.store
        limit = await db.call(
            lambda: int(store._db.execute("PRAGMA journal_size_limit").fetchone()[0])
        )
    finally:
        await db.close()
    assert limit == WAL_SIZE_LIMIT_BYTES
    assert limit > RESTART_AFTER_FRAMES * (PAGE_BYTES + WAL_FRAME_HEADER_BYTES)
