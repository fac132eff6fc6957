"""The store on its own threads: the event loop awaits, the disk work happens elsewhere.

:class:`Database` owns a single-thread executor holding the writer connection
(every :class:`~netopt.coordinator.store.Store` call runs there), groups
concurrent ingests into one transaction, and checkpoints the WAL on a second
connection and thread so that no commit waits for a checkpoint's fsync. Link
matrix queries run on a third, read-only connection and thread
(:class:`~netopt.coordinator.matrix_query.MatrixReader`): a long query holds up
neither the event loop nor ingest.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from netopt.coordinator.matrix_query import MatrixReader
from netopt.coordinator.store import BatchToStore, IngestResult, Store
from netopt.errors import StorageError

__all__ = ["BACKGROUND_NICE", "RESTART_AFTER_FRAMES", "Database"]

P = ParamSpec("P")
T = TypeVar("T")

# WAL frames past which the writer backfills the rest so that the WAL starts over (the
# file is kept: store.WAL_SIZE_LIMIT_BYTES is larger).
RESTART_AFTER_FRAMES = 32768
# Nice value of the checkpoint and reader threads: on a busy core the scheduler then
# runs the event loop and the writer first (a checkpoint copying 10k pages, sharing a
# core with the loop on equal terms, stretched the loop's garbage collections 3-5x).
BACKGROUND_NICE = 10


def _lower_thread_priority(nice: int = BACKGROUND_NICE) -> None:
    """Raise the calling thread's nice value (Linux: per thread); ignored where refused."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


class Database:
    """Runs a :class:`Store` on one dedicated thread; every method is awaited."""

    def __init__(self, path: str, *, durable_commits: bool = False) -> None:
        self._path = path
        self._durable_commits = durable_commits
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netopt-db")
        self._store: Store | None = None
        self._pending: list[tuple[BatchToStore, asyncio.Future[IngestResult]]] = []
        self._draining = False
        self._checkpointer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netopt-ckpt")
        self._checkpoint_db: sqlite3.Connection | None = None
        self._reader_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netopt-read")
        self._reader: MatrixReader | None = None

    async def open(self) -> None:
        """Open the database (creating and migrating it) on the database thread."""
        self._store = await self._run(
            Store, self._path, autocheckpoint=False, durable_commits=self._durable_commits
        )
        loop = asyncio.get_running_loop()

        def open_checkpointer() -> sqlite3.Connection:
            _lower_thread_priority()
            return sqlite3.connect(self._path, isolation_level=None, timeout=30)

        def open_reader() -> MatrixReader:
            _lower_thread_priority()
            return MatrixReader(self._path)

        self._checkpoint_db = await loop.run_in_executor(self._checkpointer, open_checkpointer)
        self._reader = await loop.run_in_executor(self._reader_executor, open_reader)

    async def matrix(
        self, since_s: float, regions: dict[str, str], *, with_regions: bool = False
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Link entries (and region-pair entries) of summaries taken since ``since_s``.

        Computed in SQL on the reader thread; see :meth:`MatrixReader.links`.
        Raises StorageError.
        """
        reader = self._reader
        if reader is None:
            raise StorageError("database is not open")
        return await asyncio.get_running_loop().run_in_executor(
            self._reader_executor,
            lambda: reader.links(since_s, regions, with_regions=with_regions),
        )

    async def checkpoint(
        self,
        restart_after_frames: int = RESTART_AFTER_FRAMES,
        truncate_after_frames: int = 262144,
    ) -> int:
        """Copy committed WAL frames into the database file; returns the WAL's frames.

        The copy (and its fsync) runs as a PASSIVE checkpoint on a second connection
        and thread, so commits do not wait for it. Under continuous ingest that
        checkpoint never catches up with the last commit, so the WAL would never
        start over: past ``restart_after_frames`` the writer thread then backfills
        the few frames committed meanwhile (no commit runs during that; one small
        fsync), after which the next commit restarts the WAL at its beginning. The
        file is reused in place, no truncation. That backfill holds commits up for
        its fsyncs (35-98 ms measured on a shared disk, whatever the WAL's size), so
        it is done rarely: past ``RESTART_AFTER_FRAMES`` (128 MiB of WAL, ~20 s at
        1,000 agents reporting every 5 s). Only if readers keep that from
        happening and the WAL passes ``truncate_after_frames`` (1 GiB) is it
        truncated, which fsyncs under the write lock (87-280 ms measured on a shared
        disk). Raises StorageError.
        """
        db = self._checkpoint_db
        if db is None:
            raise StorageError("database is not open")

        def passive() -> int:
            try:
                row = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()[0]
            except sqlite3.Error as exc:
                raise StorageError(f"checkpoint failed: {exc}") from exc
            return int(row[1])

        loop = asyncio.get_running_loop()
        frames = await loop.run_in_executor(self._checkpointer, passive)
        if frames > truncate_after_frames:
            await self._run(self.store.truncate_wal)
        elif frames > restart_after_frames:
            await self._run(self.store.backfill_wal)
        return frames

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args)`` on the database thread (``fn`` is a bound Store method)."""
        return await self._run(fn, *args, **kwargs)

    async def ingest(self, batch: BatchToStore) -> IngestResult:
        """Store one batch; batches arriving together share one transaction (group commit).

        Returns once the batch is committed. Raises StorageError.
        """
        future: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        self._pending.append((batch, future))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                group, self._pending = self._pending, []
                try:
                    results = await self._run(self.store.ingest, [b for b, _ in group])
                except Exception as exc:  # every waiter gets the failure
                    for _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(group, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._draining = False

    @property
    def store(self) -> Store:
        """The open store (only call its methods through :meth:`call`)."""
        if self._store is None:
            raise StorageError("database is not open")
        return self._store

    async def close(self) -> None:
        """Close the store (the last connection to close checkpoints) and stop the threads."""
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await asyncio.get_running_loop().run_in_executor(self._reader_executor, reader.close)
        if self._checkpoint_db is not None:
            db, self._checkpoint_db = self._checkpoint_db, None
            await asyncio.get_running_loop().run_in_executor(self._checkpointer, db.close)
        if self._store is not None:
            await self._run(self._store.close)
            self._store = None
        self._checkpointer.shutdown(wait=True)
        self._reader_executor.shutdown(wait=True)
        self._executor.shutdown(wait=True)
