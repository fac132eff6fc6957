"""The coordinator's PostgreSQL store: the same rows as SQLite's, shared by replicas.

Chosen by ``database: postgresql://USER@HOST:PORT/DB`` in the coordinator's
settings; the password comes from ``database_password_file`` or libpq's
``PGPASSWORD``, never from the URL (the loader refuses one there). Every message
names the URL without a password (:func:`~netopt.coordinator.storeapi.redact_url`).

Idempotent ingest across replicas: ``batches`` has the primary key
``(node, batch_id)`` and a batch is inserted ``ON CONFLICT DO NOTHING``, in the
same statement as its summaries (one round trip, no explicit transaction); two
replicas storing the same batch at once serialise on that key, and the second
finds it stored. Migrations run under a transaction-level advisory lock, so
replicas starting together migrate once.

Election: :meth:`PgStore.try_lead` takes a session-level advisory lock; it is
held as long as this connection lives, so a replica that dies (its connection
ends) hands it to the next one that asks.

:class:`PgStore` is synchronous (psycopg 3) and must be used from one thread; a
broken connection (the database restarted) is reopened by the next call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import psycopg

from netopt.coordinator.catalogue import Catalogue, RouteAnswer, RouteRequest, VersionState
from netopt.coordinator.matrix import LinkRow
from netopt.coordinator.matrix_query import POSTGRES_SQL, pair_entries, region_pair_entries
from netopt.coordinator.store import NODE_COLUMNS, node_from_row, summary_json
from netopt.coordinator.storeapi import (
    SCHEMA_VERSION,
    BatchToStore,
    IngestResult,
    PlanRow,
    StoredNode,
    migration_statements,
    redact_url,
    versions_to_apply,
)
from netopt.errors import StorageError

__all__ = ["LEADER_LOCK_KEY", "MIGRATION_LOCK_KEY", "PgStore"]

T = TypeVar("T")

# Advisory lock keys (any 64-bit numbers that no other program on the database uses).
MIGRATION_LOCK_KEY = 0x6E65746F70740001
LEADER_LOCK_KEY = 0x6E65746F70740002
CONNECT_TIMEOUT_S = 5
_LINK_COLUMNS = (
    "SELECT src, dst, taken_at_s, rtt_p50_ms, rtt_p99_ms, rtt_min_ms, jitter_ms,"
    " loss_ratio, probes_sent, probes_received, single_stream_bps, aggregate_bps"
    " FROM summaries WHERE taken_at_s >= %s ORDER BY id"
)
PLANS_KEPT = 8  # stored plans kept: the active one and those waiting for their time
# Stored only while this session holds the leader lock (a replica that lost it without
# noticing yet writes nothing); pg_locks shows a bigint key as classid (high half), objid.
_PUBLISH_PLAN = (
    "INSERT INTO probe_plans (version, plan_json, computed_at_s, active_from_s)"
    " SELECT %(version)s, %(plan)s, %(computed)s, %(active)s WHERE EXISTS (SELECT 1"
    " FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
    " AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = %(key)s)"
    " RETURNING seq"
)
# One statement, so one round trip and no explicit transaction, for a whole group: the
# batch keys no replica stored yet are inserted (ON CONFLICT DO NOTHING: a key another
# replica is inserting at the same moment waits for that one's commit, then conflicts)
# and only their summaries follow, read from the JSON the coordinator stores anyway
# (data_json, SQLite's row too; a json element's text is its input, unchanged). The
# statement is atomic: all of it is stored or nothing. Keys are taken in one order (by
# key), so two replicas storing overlapping groups wait for each other, never deadlock.
# Returns the keys stored.
_INGEST = (
    "WITH offered AS ("
    " SELECT * FROM unnest(%s::text[], %s::text[], %s::float8[], %s::int[])"
    " WITH ORDINALITY AS o (node, batch_id, received_at_s, summary_count, n)),"
    " docs AS (SELECT * FROM json_array_elements(%s::json) WITH ORDINALITY AS d (summaries, n)),"
    " new AS (INSERT INTO batches (node, batch_id, received_at_s, summary_count)"
    " SELECT node, batch_id, received_at_s, summary_count FROM offered ORDER BY node, batch_id"
    " ON CONFLICT (node, batch_id) DO NOTHING RETURNING node, batch_id),"
    " kept AS (INSERT INTO summaries (node, batch_id, src, dst, taken_at_s, method,"
    " rtt_p50_ms, rtt_p99_ms, rtt_min_ms, jitter_ms, loss_ratio, probes_sent,"
    " probes_received, single_stream_bps, aggregate_bps, data_json)"
    " SELECT o.node, o.batch_id, f.src, f.dst, f.taken_at_s, f.method,"
    " (f.rtt_ms->>'p50')::float8, (f.rtt_ms->>'p99')::float8, (f.rtt_ms->>'min')::float8,"
    " f.jitter_ms, f.loss_ratio, f.probes_sent, f.probes_received, f.single_stream_bps,"
    " f.aggregate_bps, e.s::text"
    " FROM new JOIN offered o USING (node, batch_id) JOIN docs d ON d.n = o.n,"
    " json_array_elements(d.summaries) WITH ORDINALITY AS e (s, i),"
    " json_to_record(e.s) AS f (src text, dst text, taken_at_s float8, method text,"
    " rtt_ms jsonb, jitter_ms float8, loss_ratio float8, probes_sent int, probes_received int,"
    " single_stream_bps float8, aggregate_bps float8) ORDER BY o.n, e.i)"
    " SELECT node, batch_id FROM new"
)


class PgStore:
    """Synchronous PostgreSQL access; one instance per thread. Raises StorageError."""

    def __init__(self, url: str, *, password: str | None = None, migrate: bool = True) -> None:
        self._url = url
        self._password = password
        self._db = self._connect()
        self._leading = False
        if migrate:
            try:
                self._guard("migrating", self._migrate)
            except BaseException:
                self._db.close()
                raise

    def _connect(self) -> psycopg.Connection[Any]:
        extra: dict[str, Any] = {} if self._password is None else {"password": self._password}
        try:
            return psycopg.connect(
                self._url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name="netopt-coordinator",
                # A dead peer is noticed in ~10 s rather than the kernel's two hours.
                keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
                **extra,
            )  # fmt: skip
        except psycopg.Error as exc:
            raise StorageError(
                f"cannot connect to database {redact_url(self._url)}: {_first_line(exc)}"
            ) from None
        except ValueError as exc:  # libpq rejected the URL itself
            raise StorageError(f"bad database URL {redact_url(self._url)}: {exc}") from None

    def _conn(self) -> psycopg.Connection[Any]:
        if self._db.closed or self._db.broken:
            self._leading = False  # a session-level lock ends with its connection
            self._db = self._connect()
        return self._db

    def _guard(self, doing: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except psycopg.Error as exc:
            raise StorageError(
                f"{doing} failed on database {redact_url(self._url)}: {_first_line(exc)}"
            ) from None

    def _migrate(self) -> None:
        db = self._conn()
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT version FROM schema_version").fetchone()
            current = 0 if row is None else int(row[0])
            for version in versions_to_apply(current, self._url):
                for statement in migration_statements(version, "postgresql"):
                    db.execute(statement)
            if current != SCHEMA_VERSION:
                db.execute("DELETE FROM schema_version")
                db.execute("INSERT INTO schema_version (version) VALUES (%s)", (SCHEMA_VERSION,))

    def schema_version(self) -> int:
        """The version the database is at."""

        def read() -> int:
            row = self._conn().execute("SELECT version FROM schema_version").fetchone()
            return 0 if row is None else int(row[0])

        return self._guard("reading the schema version", read)

    def close(self) -> None:
        """Close the connection (and with it any lock it holds)."""
        self._leading = False
        self._db.close()

    def ping(self) -> None:
        """One round trip; StorageError when the database cannot be reached."""
        self._guard("ping", lambda: self._conn().execute("SELECT 1").fetchone())

    def try_lead(self) -> bool:
        """Whether this connection holds the leader lock (taking it when free)."""

        def attempt() -> bool:
            db = self._conn()
            if self._leading:
                db.execute("SELECT 1").fetchone()  # still connected: still holding it
                return True
            row = db.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK_KEY,)).fetchone()
            self._leading = bool(row and row[0])
            return self._leading

        try:
            return self._guard("election", attempt)
        except StorageError:
            self._leading = False
            raise

    def publish_plan(self, version: str, plan_json: str, computed_at_s: float,
                     active_from_s: float) -> int | None:  # fmt: skip
        """Store a probe plan if this connection holds the leader lock; its ``seq``, or
        None when it does not (nothing stored). Keeps the newest ``PLANS_KEPT``."""

        def write() -> int | None:
            db = self._conn()
            args = {"version": version, "plan": plan_json, "computed": computed_at_s,
                    "active": active_from_s, "key": LEADER_LOCK_KEY}  # fmt: skip
            with db.transaction():
                row = db.execute(_PUBLISH_PLAN, args).fetchone()
                if row is None:
                    return None
                db.execute("DELETE FROM probe_plans WHERE seq <= %s", (row[0] - PLANS_KEPT,))
                return int(row[0])

        return self._guard("storing the probe plan", write)

    def plans_after(self, seq: int) -> list[PlanRow]:
        """The stored probe plans with a ``seq`` above ``seq``, oldest first."""
        sql = (
            "SELECT seq, version, plan_json, computed_at_s, active_from_s FROM probe_plans"
            " WHERE seq > %s ORDER BY seq"
        )
        rows = self._guard(
            "reading probe plans", lambda: self._conn().execute(sql, (seq,)).fetchall()
        )
        return [PlanRow(int(r[0]), r[1], r[2], float(r[3]), float(r[4])) for r in rows]

    def nodes(self) -> list[StoredNode]:
        """Every node ever registered."""
        sql = f"{NODE_COLUMNS} ORDER BY name"
        rows = self._guard("reading nodes", lambda: self._conn().execute(sql).fetchall())
        return [node_from_row(r) for r in rows]

    def nodes_changed(self, cursor: int | None) -> tuple[list[StoredNode], int | None]:
        """The rows written by transactions that the read returning ``cursor`` could not
        see (every row when None), and the next cursor.

        Every write stamps its row with its transaction id (``changed_xid``); the cursor
        is the oldest transaction still running when this read's snapshot was taken
        (its ``xmin``): every transaction below it had ended and was seen, so the next
        read asks for ``changed_xid >= cursor`` and misses none, committed in any order.
        """

        def read() -> tuple[list[tuple[Any, ...]], int]:
            db = self._conn()
            with db.transaction():
                db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                row = db.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()
                assert row is not None
                if cursor is None:
                    rows = db.execute(f"{NODE_COLUMNS} ORDER BY name").fetchall()
                else:
                    rows = db.execute(
                        f"{NODE_COLUMNS} WHERE changed_xid >= %s::text::xid8 ORDER BY name",
                        (str(cursor),),
                    ).fetchall()
                return rows, int(row[0])

        rows, next_cursor = self._guard("reading changed nodes", read)
        return [node_from_row(r) for r in rows], next_cursor

    def node(self, name: str) -> StoredNode | None:
        """One registry row, or None."""
        sql = f"{NODE_COLUMNS} WHERE name = %s"
        row = self._guard("reading a node", lambda: self._conn().execute(sql, (name,)).fetchone())
        return None if row is None else node_from_row(row)

    def save_node(self, node: StoredNode) -> None:
        """Insert or replace a registry row."""
        args = (
            node.name, node.region, node.host, json.dumps(node.registration),
            node.registered_at_s, node.last_seen_s, node.left_at_s, json.dumps(node.health),
        )  # fmt: skip
        self._guard(
            "saving a node",
            lambda: self._conn().execute(
                "INSERT INTO nodes (name, region, host, registration_json, registered_at_s,"
                " last_seen_s, left_at_s, health_json, changed_xid)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, pg_current_xact_id())"
                " ON CONFLICT (name) DO UPDATE SET region = excluded.region,"
                " host = excluded.host, registration_json = excluded.registration_json,"
                " registered_at_s = excluded.registered_at_s,"
                " last_seen_s = excluded.last_seen_s, left_at_s = excluded.left_at_s,"
                " health_json = excluded.health_json, changed_xid = excluded.changed_xid",
                args,
            ),
        )

    def touch_nodes(self, updates: Sequence[tuple[str, float, dict[str, Any]]]) -> None:
        """Record ``(name, last_seen_s, health)`` of many nodes in one transaction.

        A replica's older heartbeat never moves ``last_seen_s`` back.
        """

        def write() -> None:
            db = self._conn()
            with db.transaction(), db.cursor() as cur:
                cur.executemany(
                    "UPDATE nodes SET last_seen_s = %s, health_json = %s,"
                    " changed_xid = pg_current_xact_id() WHERE name = %s AND last_seen_s <= %s",
                    [(seen, json.dumps(h), name, seen) for name, seen, h in updates],
                )

        self._guard("recording heartbeats", write)

    def ingest(self, batches: Sequence[BatchToStore]) -> list[IngestResult]:
        """Store batches in one statement, each ``(node, batch_id)`` at most once.

        A batch already stored (by any replica) or earlier in ``batches`` is a
        duplicate. Summaries taken before ``oldest_kept_s`` are dropped as expired.
        Raises StorageError, in which case nothing was stored.
        """

        def write() -> list[IngestResult]:
            kept = [[x for x in b.summaries if x.taken_at_s >= b.oldest_kept_s] for b in batches]
            first: dict[tuple[str, str], int] = {}
            for index, batch in enumerate(batches):
                first.setdefault((batch.node, batch.batch_id), index)
            offered = sorted(first.values())
            # One JSON text (a list of JSON strings would be escaped, slowly, as an array):
            # per batch offered, the list of its kept summaries' stored JSON.
            docs = ",".join("[" + ",".join(map(summary_json, kept[i])) + "]" for i in offered)
            args = (
                [batches[i].node for i in offered],
                [batches[i].batch_id for i in offered],
                [batches[i].received_at_s for i in offered],
                [len(kept[i]) for i in offered],
                f"[{docs}]",
            )
            rows = self._conn().execute(_INGEST, args).fetchall()
            stored = {first[(node, batch_id)] for node, batch_id in rows}
            return [
                IngestResult(b.batch_id, False, len(kept[i]), len(b.summaries) - len(kept[i]))
                if i in stored
                else IngestResult(b.batch_id, True, 0, 0)
                for i, b in enumerate(batches)
            ]

        return self._guard(f"storing {len(batches)} batch(es)", write)

    def link_rows(self, since_s: float) -> list[LinkRow]:
        """Matrix columns of every summary taken at or after ``since_s``, in stored order."""
        rows = self._guard(
            "reading summaries",
            lambda: self._conn().execute(_LINK_COLUMNS, (since_s,)).fetchall(),
        )
        return [LinkRow(*row) for row in rows]

    def links(
        self, since_s: float, regions: Mapping[str, str], *, with_regions: bool = False
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Pair entries and, if asked, region-pair entries (as ``MatrixReader.links``):
        computed in PostgreSQL by the same queries, in one snapshot."""

        def query() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            db = self._conn()
            with db.transaction():
                db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")

                def rows(sql: str) -> list[tuple[Any, ...]]:
                    return db.execute(sql, {"since": since_s}).fetchall()

                links = pair_entries(POSTGRES_SQL, rows, regions)
                if not with_regions:
                    return links, []
                db.execute(
                    "CREATE TEMP TABLE IF NOT EXISTS node_region (node TEXT PRIMARY KEY,"
                    " region TEXT) ON COMMIT DELETE ROWS"
                )
                db.execute(
                    "INSERT INTO pg_temp.node_region SELECT key, value FROM json_each_text(%s)",
                    (json.dumps(dict(regions)),),
                )
                return links, region_pair_entries(POSTGRES_SQL, rows, links)

        return self._guard("link matrix query", query)

    def history(self, src: str, dst: str, since_s: float, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` summaries of src->dst since ``since_s``, oldest first."""
        rows = self._guard(
            "reading history",
            lambda: (
                self._conn()
                .execute(
                    "SELECT data_json FROM summaries WHERE src = %s AND dst = %s"
                    " AND taken_at_s >= %s ORDER BY taken_at_s DESC, id DESC LIMIT %s",
                    (src, dst, since_s, limit),
                )
                .fetchall()
            ),
        )
        return [json.loads(r[0]) for r in reversed(rows)]

    def counts(self) -> tuple[int, int]:
        """(batches, summaries) stored."""

        def read() -> tuple[int, int]:
            db = self._conn()
            batches = db.execute("SELECT count(*) FROM batches").fetchone()
            summaries = db.execute("SELECT count(*) FROM summaries").fetchone()
            assert batches is not None
            assert summaries is not None
            return int(batches[0]), int(summaries[0])

        return self._guard("counting", read)

    def sweep(self, before_s: float) -> int:
        """Delete summaries taken, and batch records received, before ``before_s``."""

        def delete() -> int:
            db = self._conn()
            with db.transaction():
                cur = db.execute("DELETE FROM summaries WHERE taken_at_s < %s", (before_s,))
                db.execute("DELETE FROM batches WHERE received_at_s < %s", (before_s,))
                return int(cur.rowcount)

        return self._guard("retention sweep", delete)

    def catalogue_route(
        self,
        catalogue: Catalogue,
        req: RouteRequest,
        regions: Mapping[str, str],
        live: Collection[str],
        now_s: float,
    ) -> RouteAnswer:
        """Route one call of region sharing against the version's stored state.

        One transaction holds the version's row lock from reading its state to
        writing it back, so replicas routing the same version take turns and never
        lease one chunk twice. ``catalogue`` (empty, with the TTLs) does the routing.
        Raises CatalogueError (nothing written) for a call that contradicts the version.
        """
        key = (req.dataset, req.manifest_id)

        def route() -> RouteAnswer:
            db = self._conn()
            with db.transaction():
                db.execute(
                    "INSERT INTO catalogue_versions VALUES (%s, %s, %s, '')"
                    " ON CONFLICT (dataset, manifest_id) DO NOTHING",
                    (*key, req.chunk_count),
                )
                row = db.execute(
                    "SELECT chunk_count, sessions_json FROM catalogue_versions"
                    " WHERE dataset = %s AND manifest_id = %s FOR UPDATE",
                    key,
                ).fetchone()
                assert row is not None
                holders = {
                    node: (int(chunks), bytes(bits))
                    for node, chunks, bits in db.execute(
                        "SELECT node, chunks, bits FROM catalogue_holdings"
                        " WHERE dataset = %s AND manifest_id = %s",
                        key,
                    )
                }
                catalogue.load(*key, VersionState(int(row[0]), row[1], holders))
                answer = catalogue.route(req, regions, live, now_s)
                state = catalogue.export(*key, [req.node] if req.have else [])
                db.execute(
                    "UPDATE catalogue_versions SET sessions_json = %s"
                    " WHERE dataset = %s AND manifest_id = %s",
                    (state.sessions_json, *key),
                )
                for node, (chunks, bits) in state.holders.items():
                    db.execute(
                        "INSERT INTO catalogue_holdings VALUES (%s, %s, %s, %s, %s)"
                        " ON CONFLICT (dataset, manifest_id, node)"
                        " DO UPDATE SET chunks = excluded.chunks, bits = excluded.bits",
                        (*key, node, chunks, bits),
                    )
                return answer

        return self._guard("routing chunks", route)

    def catalogue_describe(
        self, catalogue: Catalogue, live: Collection[str], now_s: float
    ) -> list[dict[str, object]]:
        """Every stored version, as :meth:`Catalogue.describe` gives it."""

        def read() -> list[dict[str, object]]:
            db = self._conn()
            with db.transaction():
                versions = db.execute(
                    "SELECT dataset, manifest_id, chunk_count, sessions_json"
                    " FROM catalogue_versions"
                ).fetchall()
                holders: dict[tuple[str, str], dict[str, tuple[int, bytes]]] = {}
                for dataset, manifest_id, node, chunks in db.execute(
                    "SELECT dataset, manifest_id, node, chunks FROM catalogue_holdings"
                ):
                    holders.setdefault((dataset, manifest_id), {})[node] = (int(chunks), b"")
            for dataset, manifest_id, chunk_count, sessions_json in versions:
                state = VersionState(
                    int(chunk_count), sessions_json, holders.get((dataset, manifest_id), {})
                )
                catalogue.load(dataset, manifest_id, state)
            return catalogue.describe(live, now_s)

        return self._guard("reading the catalogue", read)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
