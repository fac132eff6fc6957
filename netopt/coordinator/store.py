"""The coordinator's SQLite store: nodes, ingested batches and link summaries.

WAL journal, a ``schema_version`` table and ordered migrations. A batch and its
summaries are written in one transaction, keyed by ``(node, batch_id)``: a
replay finds the key and stores nothing. Batches that arrive while a commit is
running share the next one (group commit).

Durability: every acknowledged batch survives a crash of the coordinator
process (SIGKILL included). By default commits do not fsync
(``synchronous=NORMAL``); the WAL is checkpointed, with fsync, every couple of
seconds on a second connection, so a kernel crash or power cut can lose the
batches acknowledged since the last checkpoint. ``durable_commits=True``
(``synchronous=FULL``) closes that window at the cost of one fsync per commit,
which on a shared ext4 disk waits for other processes' dirty data too.

:class:`Store` is synchronous and must be used from one thread;
:class:`netopt.coordinator.database.Database` runs it on a dedicated thread.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from netopt.coordinator.matrix import LinkRow
from netopt.coordinator.storeapi import (
    SCHEMA_VERSION,
    BatchToStore,
    IngestResult,
    StoredNode,
    migration_statements,
    versions_to_apply,
)
from netopt.errors import StorageError
from netopt.wire.schema import LinkSummary

__all__ = [
    "INSERT_SUMMARY",
    "NODE_COLUMNS",
    "SCHEMA_VERSION",
    "WAL_SIZE_LIMIT_BYTES",
    "BatchToStore",
    "IngestResult",
    "Store",
    "StoredNode",
    "node_from_row",
    "summary_json",
    "summary_row",
]

# What a WAL file is cut back to when it starts over (SQLite's journal_size_limit).
WAL_SIZE_LIMIT_BYTES = 256 * 1024 * 1024
# One compact encoder, built once (json.dumps with arguments builds one per call).
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
INSERT_SUMMARY = (
    "INSERT INTO summaries (node, batch_id, src, dst, taken_at_s, method,"
    " rtt_p50_ms, rtt_p99_ms, rtt_min_ms, jitter_ms, loss_ratio, probes_sent,"
    " probes_received, single_stream_bps, aggregate_bps, data_json)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class Store:
    """Synchronous SQLite access; one instance per thread. Raises StorageError."""

    def __init__(
        self, path: str, *, autocheckpoint: bool = True, durable_commits: bool = True
    ) -> None:
        self._path = path
        try:
            if path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable_commits else 'NORMAL'}")
            # Above the WAL's restart size (Database.checkpoint): a WAL that starts over
            # is then reused as it is, not cut down by the first commit after the restart
            # (truncating 64 MiB there held that commit up for 100 ms).
            self._db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            if not autocheckpoint:
                # Checkpoints (copying the WAL into the database, with an fsync) then run
                # on another connection and thread, so no ingest commit waits for one.
                self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._migrate()
        except (sqlite3.Error, OSError) as exc:
            raise StorageError(f"cannot open database {path}: {exc}") from exc

    def _migrate(self) -> None:
        db = self._db
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = db.execute("SELECT version FROM schema_version").fetchone()
        for version in versions_to_apply(0 if row is None else int(row[0]), self._path):
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in migration_statements(version, "sqlite"):
                    db.execute(statement)
                db.execute("DELETE FROM schema_version")
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def backfill_wal(self) -> None:
        """Checkpoint (PASSIVE) on the writer's own connection: with no commit running,
        it copies every frame left, so the next commit restarts the WAL."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            raise StorageError(f"checkpoint failed: {exc}") from exc

    def truncate_wal(self) -> None:
        """Checkpoint what is left of the WAL and truncate it (briefly blocks writers).

        Under continuous writes a passive checkpoint never catches up with the
        last commit, so the WAL would never restart and would grow without bound.
        """
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            raise StorageError(f"checkpoint failed: {exc}") from exc

    def schema_version(self) -> int:
        """The version the database is at."""
        return int(self._db.execute("SELECT version FROM schema_version").fetchone()[0])

    def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        self._db.close()

    def ping(self) -> None:
        """A query on the connection (SQLite is a file: reachable while it is open)."""
        self._db.execute("SELECT 1").fetchone()

    def nodes(self) -> list[StoredNode]:
        """Every node ever registered."""
        rows = self._db.execute(f"{NODE_COLUMNS} ORDER BY name").fetchall()
        return [node_from_row(r) for r in rows]

    def nodes_changed(self, cursor: int | None) -> tuple[list[StoredNode], int | None]:
        """Every row (one writer: a replica of its own has nothing to follow)."""
        return self.nodes(), None

    def node(self, name: str) -> StoredNode | None:
        """One registry row, or None."""
        row = self._db.execute(f"{NODE_COLUMNS} WHERE name = ?", (name,)).fetchone()
        return None if row is None else node_from_row(row)

    def save_node(self, node: StoredNode) -> None:
        """Insert or replace a registry row."""
        self._write(
            "INSERT OR REPLACE INTO nodes (name, region, host, registration_json,"
            " registered_at_s, last_seen_s, left_at_s, health_json)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                node.name,
                node.region,
                node.host,
                json.dumps(node.registration),
                node.registered_at_s,
                node.last_seen_s,
                node.left_at_s,
                json.dumps(node.health),
            ),
        )

    def touch_nodes(self, updates: Sequence[tuple[str, float, dict[str, Any]]]) -> None:
        """Record ``(name, last_seen_s, health)`` of many nodes in one transaction."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                "UPDATE nodes SET last_seen_s = ?, health_json = ? WHERE name = ?",
                [(seen, json.dumps(health), name) for name, seen, health in updates],
            )
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise StorageError(f"database write failed: {exc}") from exc

    def _write(self, sql: str, args: Sequence[Any]) -> None:
        try:
            self._db.execute(sql, args)
        except sqlite3.Error as exc:
            raise StorageError(f"database write failed: {exc}") from exc

    def ingest(self, batches: Sequence[BatchToStore]) -> list[IngestResult]:
        """Store batches in one transaction (one fsync), each at most once.

        A batch whose ``(node, batch_id)`` is already stored, or appears earlier in
        ``batches``, is a duplicate and adds nothing. Summaries taken before the
        batch's ``oldest_kept_s`` are dropped as expired. Raises StorageError, in
        which case nothing was stored.
        """
        db = self._db
        results: list[IngestResult] = []
        rows: list[tuple[Any, ...]] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                for batch in batches:
                    results.append(self._insert_batch(batch, rows))
                # One statement for the summaries of the whole group.
                db.executemany(INSERT_SUMMARY, rows)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StorageError(f"storing {len(batches)} batch(es) failed: {exc}") from exc
        return results

    def _insert_batch(self, batch: BatchToStore, rows: list[tuple[Any, ...]]) -> IngestResult:
        """Record the batch; its kept summaries' rows are appended to ``rows``."""
        kept = [s for s in batch.summaries if s.taken_at_s >= batch.oldest_kept_s]
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO batches VALUES (?, ?, ?, ?)",
            (batch.node, batch.batch_id, batch.received_at_s, len(kept)),
        )
        if cursor.rowcount == 0:
            return IngestResult(batch.batch_id, True, 0, 0)
        rows.extend(summary_row(batch.node, batch.batch_id, s) for s in kept)
        return IngestResult(batch.batch_id, False, len(kept), len(batch.summaries) - len(kept))

    def link_rows(self, since_s: float) -> list[LinkRow]:
        """Matrix columns of every summary taken at or after ``since_s``."""
        rows = self._db.execute(
            "SELECT src, dst, taken_at_s, rtt_p50_ms, rtt_p99_ms, rtt_min_ms, jitter_ms,"
            " loss_ratio, probes_sent, probes_received, single_stream_bps, aggregate_bps"
            " FROM summaries WHERE taken_at_s >= ?",
            (since_s,),
        ).fetchall()
        return [LinkRow(*row) for row in rows]

    def history(self, src: str, dst: str, since_s: float, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` summaries of src->dst since ``since_s``, oldest first."""
        rows = self._db.execute(
            "SELECT data_json FROM summaries WHERE src = ? AND dst = ? AND taken_at_s >= ?"
            " ORDER BY taken_at_s DESC, id DESC LIMIT ?",
            (src, dst, since_s, limit),
        ).fetchall()
        return [json.loads(r[0]) for r in reversed(rows)]

    def counts(self) -> tuple[int, int]:
        """(batches, summaries) stored."""
        batches = self._db.execute("SELECT count(*) FROM batches").fetchone()[0]
        summaries = self._db.execute("SELECT count(*) FROM summaries").fetchone()[0]
        return int(batches), int(summaries)

    def sweep(self, before_s: float) -> int:
        """Delete summaries taken, and batch records received, before ``before_s``."""
        try:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            deleted = db.execute("DELETE FROM summaries WHERE taken_at_s < ?", (before_s,))
            db.execute("DELETE FROM batches WHERE received_at_s < ?", (before_s,))
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StorageError(f"retention sweep failed: {exc}") from exc
        return int(deleted.rowcount)


NODE_COLUMNS = (
    "SELECT name, region, host, registration_json, registered_at_s, last_seen_s,"
    " left_at_s, health_json FROM nodes"
)


def node_from_row(r: Sequence[Any]) -> StoredNode:
    """A :class:`StoredNode` from the columns of :data:`NODE_COLUMNS`."""
    return StoredNode(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], json.loads(r[7]))


def summary_row(node: str, batch_id: str, s: LinkSummary) -> tuple[Any, ...]:
    """The :data:`INSERT_SUMMARY` parameters of one summary."""
    rtt = s.rtt_ms
    return (
        node,
        batch_id,
        s.src,
        s.dst,
        s.taken_at_s,
        s.method,
        None if rtt is None else rtt.p50,
        None if rtt is None else rtt.p99,
        None if rtt is None else rtt.min,
        s.jitter_ms,
        s.loss_ratio,
        s.probes_sent,
        s.probes_received,
        s.single_stream_bps,
        s.aggregate_bps,
        summary_json(s),
    )


def summary_json(s: LinkSummary) -> str:
    """The stored ``data_json`` of one summary: compact JSON of :meth:`LinkSummary.to_dict`."""
    return _ENCODE(s.to_dict())
