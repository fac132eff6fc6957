"""PostgreSQL ingest: one statement per group of batches, sent from the event loop.

The statement (:data:`INGEST_SQL`) and its arguments are written once and used by
both the synchronous :class:`~netopt.coordinator.pgstore.PgStore` (the contract
tests, tools) and :class:`AsyncIngest`, which the coordinator runs on its event
loop: the query goes out and its answer comes back through the same ``epoll`` as
the agents' requests, with no hand-over to a database thread and back. At a
hundred groups a second per replica those hand-overs (a thread woken, then the
loop woken through its self-pipe) were a tenth of the CPU a batch cost, and more
the fewer batches a replica takes: two replicas paid them twice as often per batch
as one (issue 23's CPU goal).

Idempotent across replicas: see ``pgstore``'s docstring (``ON CONFLICT DO NOTHING``
on ``(node, batch_id)``, keys in one order, one atomic statement).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from netopt.coordinator.store import summary_json
from netopt.coordinator.storeapi import BatchToStore, IngestResult, redact_url
from netopt.errors import StorageError

__all__ = ["CONNECT_OPTIONS", "INGEST_SQL", "AsyncIngest", "IngestCall", "first_line"]

CONNECT_OPTIONS: dict[str, Any] = {
    "autocommit": True,
    "connect_timeout": 5,
    "application_name": "netopt-coordinator",
    # A dead peer is noticed in ~10 s rather than the kernel's two hours.
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}

# One statement, so one round trip and no explicit transaction, for a whole group: the
# batch keys no replica stored yet are inserted (ON CONFLICT DO NOTHING: a key another
# replica is inserting at the same moment waits for that one's commit, then conflicts)
# and only their summaries follow, read from the JSON the coordinator stores anyway
# (data_json, SQLite's row too; a json element's text is its input, unchanged). The
# statement is atomic: all of it is stored or nothing. Keys are taken in one order (by
# key), so two replicas storing overlapping groups wait for each other, never deadlock.
# Returns the keys stored.
INGEST_SQL = (
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


class IngestCall:
    """One group's statement arguments, and the results once the stored keys are back.

    A batch already stored (by any replica) or earlier in the group is a duplicate;
    summaries taken before a batch's ``oldest_kept_s`` are dropped as expired.
    """

    def __init__(self, batches: Sequence[BatchToStore]) -> None:
        self._batches = batches
        self._kept = [[x for x in b.summaries if x.taken_at_s >= b.oldest_kept_s] for b in batches]
        self._first: dict[tuple[str, str], int] = {}
        for index, batch in enumerate(batches):
            self._first.setdefault((batch.node, batch.batch_id), index)
        offered = sorted(self._first.values())
        # One JSON text (a list of JSON strings would be escaped, slowly, as an array):
        # per batch offered, the list of its kept summaries' stored JSON.
        kept = self._kept
        docs = ",".join("[" + ",".join(map(summary_json, kept[i])) + "]" for i in offered)
        self.args = (
            [batches[i].node for i in offered],
            [batches[i].batch_id for i in offered],
            [batches[i].received_at_s for i in offered],
            [len(kept[i]) for i in offered],
            f"[{docs}]",
        )

    def results(self, stored_keys: Sequence[Sequence[Any]]) -> list[IngestResult]:
        """Each batch's result, from the ``(node, batch_id)`` rows the statement returned."""
        stored = {self._first[(node, batch_id)] for node, batch_id in stored_keys}
        kept = self._kept
        return [
            IngestResult(b.batch_id, False, len(kept[i]), len(b.summaries) - len(kept[i]))
            if i in stored
            else IngestResult(b.batch_id, True, 0, 0)
            for i, b in enumerate(self._batches)
        ]


class AsyncIngest:
    """Ingest on the event loop over its own connection; a broken one is reopened by the
    next call. Raises StorageError (nothing stored)."""

    def __init__(self, url: str, password: str | None) -> None:
        self._url = url
        self._password = password
        self._db: psycopg.AsyncConnection[Any] | None = None

    async def _conn(self) -> psycopg.AsyncConnection[Any]:
        if self._db is None or self._db.closed or self._db.broken:
            extra: dict[str, Any] = {} if self._password is None else {"password": self._password}
            try:
                self._db = await psycopg.AsyncConnection.connect(
                    self._url, **CONNECT_OPTIONS, **extra
                )
            except psycopg.Error as exc:
                raise StorageError(
                    f"cannot connect to database {redact_url(self._url)}: {first_line(exc)}"
                ) from None
        return self._db

    async def ingest(self, batches: Sequence[BatchToStore]) -> list[IngestResult]:
        """Store ``batches`` in one statement, each ``(node, batch_id)`` at most once."""
        call = IngestCall(batches)
        db = await self._conn()
        try:
            rows = await (await db.execute(INGEST_SQL, call.args)).fetchall()
        except psycopg.Error as exc:
            raise StorageError(
                f"storing {len(batches)} batch(es) failed on database"
                f" {redact_url(self._url)}: {first_line(exc)}"
            ) from None
        return call.results(rows)

    async def close(self) -> None:
        """Close the connection."""
        if self._db is not None:
            await self._db.close()
            self._db = None


def first_line(exc: BaseException) -> str:
    """The first line of a driver error (its message, without the query's context)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
