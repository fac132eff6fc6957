"""The store on its own threads: the event loop awaits, the database work happens elsewhere.

:func:`open_database` chooses the store once, from the ``database`` setting: a
path is SQLite (:class:`Database`), a ``postgresql://`` URL is PostgreSQL
(:class:`PgDatabase`, see :mod:`netopt.coordinator.pgstore`). Both run their
store's calls on one thread, group concurrent ingests into one transaction
(:class:`StoreRunner`), time every call (``observe``), and say whether this
replica is the elected one (:meth:`StoreRunner.elect`).

:class:`Database` owns a single-thread executor holding the writer connection
(every :class:`~netopt.coordinator.store.Store` call runs there), groups
concurrent ingests into one transaction, and checkpoints the WAL on a second
connection and thread so that no commit waits for a checkpoint's fsync. Link
matrix queries run on a third, read-only connection and thread
(:class:`~netopt.coordinator.matrix_query.MatrixReader`): a long query holds up
neither the event loop nor ingest.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from netopt.coordinator.catalogue import Catalogue, RouteAnswer, RouteRequest
from netopt.coordinator.groupcommit import GroupCommit, GroupLimits
from netopt.coordinator.matrix_query import MatrixReader
from netopt.coordinator.store import Store
from netopt.coordinator.storeapi import (
    BatchToStore,
    CoordinatorStore,
    IngestResult,
    PlanRow,
    database_kind,
    redact_url,
)
from netopt.errors import DependencyError, StorageError

if TYPE_CHECKING:
    from netopt.coordinator.pgstore import PgStore

__all__ = [
    "BACKGROUND_NICE",
    "DEFAULT_INGEST_LIMITS",
    "LINGER_UNTIL_BATCHES",
    "RESTART_AFTER_FRAMES",
    "Database",
    "PgDatabase",
    "StoreRunner",
    "ingest_limits",
    "open_database",
]

P = ParamSpec("P")
T = TypeVar("T")

# WAL frames past which the writer backfills the rest so that the WAL starts over (the
# file is kept: store.WAL_SIZE_LIMIT_BYTES is larger).
RESTART_AFTER_FRAMES = 32768
# Nice value of the checkpoint and reader threads: on a busy core the scheduler then
# runs the event loop and the writer first (a checkpoint copying 10k pages, sharing a
# core with the loop on equal terms, stretched the loop's garbage collections 3-5x).
BACKGROUND_NICE = 10
# With a linger (``ingest_linger_s``), a group is also written as soon as this many
# batches wait (Kafka's batch.size beside linger.ms). Measured on PostgreSQL, 1,000
# agents, linger 20 ms: 2.9-3.8 batches per statement (1.07-1.13 without), the
# coordinators' CPU 8-12% lower and PostgreSQL's ~27% lower, p99 27-37 ms (9-15 ms
# without); it made two replicas no cheaper relative to one, so it is off by default.
LINGER_UNTIL_BATCHES = 4


def ingest_limits(linger_s: float) -> GroupLimits:
    """The group commit bounds for a linger of ``linger_s`` (0: write at once)."""
    return GroupLimits(linger_s=linger_s, linger_until_batches=LINGER_UNTIL_BATCHES)


DEFAULT_INGEST_LIMITS = ingest_limits(0.0)


def _lower_thread_priority(nice: int = BACKGROUND_NICE) -> None:
    """Raise the calling thread's nice value (Linux: per thread); ignored where refused."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


class MatrixSource(Protocol):
    """What answers link matrix queries (on a thread of its own)."""

    def links(
        self, since_s: float, regions: dict[str, str], *, with_regions: bool = False
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]: ...

    def close(self) -> None: ...


class StoreRunner(abc.ABC):
    """Runs a :class:`CoordinatorStore` on one dedicated thread; every method is awaited.

    ``observe(operation, seconds)``, when set, is called after every store call.
    """

    shared = False
    """Whether other replicas may write the same database."""

    def __init__(self, description: str, limits: GroupLimits = DEFAULT_INGEST_LIMITS) -> None:
        self.description = description
        """What the database is, fit for a log (a URL without its password)."""
        self.observe: Callable[[str, float], None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netopt-db")
        self._store: CoordinatorStore | None = None
        self._ingest = GroupCommit(self._write_group, limits)
        self._reader_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netopt-read")
        self._reader: MatrixSource | None = None

    @abc.abstractmethod
    def _open_store(self) -> CoordinatorStore:
        """Open (create, migrate) the store; called on the database thread."""

    @abc.abstractmethod
    def _open_reader(self) -> MatrixSource:
        """Open the link-matrix reader; called on the reader thread."""

    async def open(self) -> None:
        """Open the database (creating and migrating it) on the database thread."""
        self._store = await self._run(self._open_store)
        self._reader = await asyncio.get_running_loop().run_in_executor(
            self._reader_executor, self._open_reader
        )

    async def matrix(
        self, since_s: float, regions: dict[str, str], *, with_regions: bool = False
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Link entries (and region-pair entries) of summaries taken since ``since_s``.

        Computed on the reader thread; see :meth:`MatrixReader.links`.
        Raises StorageError.
        """
        reader = self._reader
        if reader is None:
            raise StorageError("database is not open")
        return await self._timed(
            "matrix",
            self._reader_executor,
            lambda: reader.links(since_s, regions, with_regions=with_regions),
        )

    async def checkpoint(self) -> int:
        """Housekeeping of the engine's own files (SQLite's WAL); 0 where there is none."""
        return 0

    async def elect(self) -> bool:
        """Whether this replica does the work that must happen once (sweeps).

        One process on SQLite: always. Raises StorageError where the election
        needs the database and it cannot be reached.
        """
        return True

    async def plans_after(self, seq: int) -> list[PlanRow]:
        """The probe plans the elected replica stored after ``seq`` (a shared store's;
        one replica plans in memory). Raises StorageError."""
        raise StorageError(f"database {self.description} keeps no elected probe plans")

    async def publish_plan(self, row: PlanRow) -> int | None:
        """Store ``row`` (its ``seq`` is ignored) while this replica leads; the new
        ``seq``, or None when it does not lead. Raises StorageError."""
        raise StorageError(f"database {self.description} keeps no elected probe plans")

    async def route_chunks(
        self,
        catalogue: Catalogue,
        req: RouteRequest,
        regions: dict[str, str],
        live: set[str],
        now_s: float,
    ) -> RouteAnswer:
        """Route a region-sharing call. One replica: ``catalogue`` holds the state in
        memory (pure, on the loop). Raises CatalogueError."""
        return catalogue.route(req, regions, live, now_s)

    async def describe_catalogue(
        self, catalogue: Catalogue, live: set[str], now_s: float
    ) -> list[dict[str, object]]:
        """Every dataset version the catalogue knows (see :meth:`Catalogue.describe`)."""
        return catalogue.describe(live, now_s)

    async def ping(self) -> None:
        """A round trip to the database on the reader thread; StorageError if unreachable."""
        await self._timed("ping", self._reader_executor, self._ping_reader)

    def _ping_reader(self) -> None:
        if self._store is None:
            raise StorageError("database is not open")

    async def _timed(self, name: str, executor: ThreadPoolExecutor, fn: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, fn)
        finally:
            if self.observe is not None:
                self.observe(name, time.perf_counter() - started)

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._timed(
            getattr(fn, "__name__", "call"), self._executor, lambda: fn(*args, **kwargs)
        )

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args)`` on the database thread (``fn`` is a bound store method)."""
        return await self._run(fn, *args, **kwargs)

    async def ingest(self, batch: BatchToStore) -> IngestResult:
        """Store one batch; batches arriving together share one write (group commit,
        :mod:`~netopt.coordinator.groupcommit`).

        Returns once the batch is committed. Raises StorageError (the queue full, or
        the group's write failed: nothing of it stored).
        """
        return await self._ingest.submit(batch)

    async def _write_group(self, batches: list[BatchToStore]) -> list[IngestResult]:
        return await self._run(self.store.ingest, batches)

    @property
    def store(self) -> CoordinatorStore:
        """The open store (only call its methods through :meth:`call`)."""
        if self._store is None:
            raise StorageError("database is not open")
        return self._store

    async def close(self) -> None:
        """Close the reader and the store, then stop the threads."""
        loop = asyncio.get_running_loop()
        await self._ingest.close()
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await loop.run_in_executor(self._reader_executor, reader.close)
        if self._store is not None:
            store, self._store = self._store, None
            await loop.run_in_executor(self._executor, store.close)
        self._reader_executor.shutdown(wait=True)
        self._executor.shutdown(wait=True)


class Database(StoreRunner):
    """SQLite at ``path``: the writer on one thread, the WAL checkpointed on a second,
    matrix queries on a read-only connection on a third."""

    def __init__(
        self,
        path: str,
        *,
        durable_commits: bool = False,
        limits: GroupLimits = DEFAULT_INGEST_LIMITS,
    ) -> None:
        super().__init__(path, limits)
        self._path = path
        self._durable_commits = durable_commits
        self._sqlite: Store | None = None
        self._checkpointer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netopt-ckpt")
        self._checkpoint_db: sqlite3.Connection | None = None

    def _open_store(self) -> CoordinatorStore:
        durable = self._durable_commits
        self._sqlite = Store(self._path, autocheckpoint=False, durable_commits=durable)
        return self._sqlite

    def _open_reader(self) -> MatrixSource:
        _lower_thread_priority()
        return MatrixReader(self._path)

    async def open(self) -> None:
        """Open the database (creating and migrating it) and the checkpoint connection."""
        await super().open()

        def open_checkpointer() -> sqlite3.Connection:
            _lower_thread_priority()
            return sqlite3.connect(self._path, isolation_level=None, timeout=30)

        self._checkpoint_db = await asyncio.get_running_loop().run_in_executor(
            self._checkpointer, open_checkpointer
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
            await self._run(self._sqlite_store.truncate_wal)
        elif frames > restart_after_frames:
            await self._run(self._sqlite_store.backfill_wal)
        return frames

    @property
    def _sqlite_store(self) -> Store:
        if self._sqlite is None:
            raise StorageError("database is not open")
        return self._sqlite

    async def close(self) -> None:
        """Close the store (the last connection to close checkpoints) and stop the threads."""
        if self._checkpoint_db is not None:
            db, self._checkpoint_db = self._checkpoint_db, None
            await asyncio.get_running_loop().run_in_executor(self._checkpointer, db.close)
        self._checkpointer.shutdown(wait=True)
        await super().close()
        self._sqlite = None


class PgDatabase(StoreRunner):
    """PostgreSQL at ``url``: the writer on one thread; matrix queries, pings and the
    election on a second connection and thread."""

    shared = True

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        limits: GroupLimits = DEFAULT_INGEST_LIMITS,
    ) -> None:
        super().__init__(redact_url(url), limits)
        self._url = url
        self._password = password
        self._pg_reader: PgStore | None = None
        self._pg_writer: PgStore | None = None

    def _connect(self, *, migrate: bool) -> PgStore:
        try:  # psycopg is the `postgres` extra: only a PostgreSQL coordinator needs it
            from netopt.coordinator.pgstore import PgStore
        except ImportError as exc:
            raise DependencyError(
                f"database {self.description} is PostgreSQL, but psycopg is not installed"
                f" ({exc}): pip install 'netopt[postgres]'"
            ) from None
        return PgStore(self._url, password=self._password, migrate=migrate)

    def _open_store(self) -> CoordinatorStore:
        self._pg_writer = self._connect(migrate=True)
        return self._pg_writer

    @property
    def _writer(self) -> PgStore:
        if self._pg_writer is None:
            raise StorageError("database is not open")
        return self._pg_writer

    async def route_chunks(
        self,
        catalogue: Catalogue,
        req: RouteRequest,
        regions: dict[str, str],
        live: set[str],
        now_s: float,
    ) -> RouteAnswer:
        """Route against the version's state in PostgreSQL (shared by the replicas);
        ``catalogue`` gives only the TTLs. Raises CatalogueError, StorageError."""
        fresh = Catalogue(catalogue.session_ttl_s, catalogue.retry_after_s)
        return await self._run(self._writer.catalogue_route, fresh, req, regions, live, now_s)

    async def describe_catalogue(
        self, catalogue: Catalogue, live: set[str], now_s: float
    ) -> list[dict[str, object]]:
        """Every dataset version stored, read on the reader thread."""
        fresh = Catalogue(catalogue.session_ttl_s, catalogue.retry_after_s)
        reader = self._reader_store
        return await self._timed(
            "describe_catalogue",
            self._reader_executor,
            lambda: reader.catalogue_describe(fresh, live, now_s),
        )

    def _open_reader(self) -> MatrixSource:
        self._pg_reader = self._connect(migrate=False)
        return self._pg_reader

    def _ping_reader(self) -> None:
        self._reader_store.ping()

    @property
    def _reader_store(self) -> PgStore:
        if self._pg_reader is None:
            raise StorageError("database is not open")
        return self._pg_reader

    async def elect(self) -> bool:
        """Whether this replica holds PostgreSQL's leader lock (taking it when free)."""
        return await self._timed("elect", self._reader_executor, self._reader_store.try_lead)

    async def plans_after(self, seq: int) -> list[PlanRow]:
        """The stored probe plans after ``seq``, read on the reader thread."""
        reader = self._reader_store
        return await self._timed(
            "plans_after", self._reader_executor, lambda: reader.plans_after(seq)
        )

    async def publish_plan(self, row: PlanRow) -> int | None:
        """Stored on the connection that holds the leader lock, only while it holds it."""
        reader = self._reader_store

        def publish() -> int | None:
            return reader.publish_plan(row.version, row.plan_json, row.computed_at_s,
                                       row.active_from_s)  # fmt: skip

        return await self._timed("publish_plan", self._reader_executor, publish)


def open_database(
    database: str,
    *,
    durable_commits: bool = False,
    password: str | None = None,
    ingest_linger_s: float = 0.0,
) -> StoreRunner:
    """The runner for ``database``: a ``postgresql://`` URL or a SQLite file path.

    ``password`` is PostgreSQL's (None: libpq's ``PGPASSWORD`` or none);
    ``durable_commits`` is SQLite's; ``ingest_linger_s`` is group commit's linger
    (:func:`ingest_limits`). Nothing is opened until :meth:`StoreRunner.open`.
    """
    limits = ingest_limits(ingest_linger_s)
    if database_kind(database) == "postgresql":
        return PgDatabase(database, password=password, limits=limits)
    return Database(database, durable_commits=durable_commits, limits=limits)
