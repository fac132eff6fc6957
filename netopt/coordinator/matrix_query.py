"""The link matrix computed inside the database (SQLite or PostgreSQL).

The queries are written once and rendered per dialect (:class:`MatrixSql`);
:func:`pair_entries` and :func:`region_pair_entries` turn their rows into the
matrix for either store. :class:`MatrixReader` runs them on SQLite's read-only
connection of its own; :class:`~netopt.coordinator.pgstore.PgStore` on its
reader connection.

Grouping, sorting and ranking a window's summaries happen in SQL, so the
Python side handles one row per (src, dst) pair or region pair, never one per
summary: a 300-second window of a thousand agents holds hundreds of thousands
of summaries, far too many to turn into Python objects on a request. SQLite
releases the GIL while it steps, so the event loop and the ingest thread keep
running meanwhile.

The figures are the same as :func:`netopt.coordinator.matrix.link_figures` and
:func:`~netopt.coordinator.matrix.region_figures` over the same summaries (the
unit tests compare both): percentiles come back as the two values around each
rank and are interpolated by :func:`~netopt.coordinator.matrix.spread_from_ranks`.

:class:`MatrixReader` is synchronous and must be used from one thread;
:class:`netopt.coordinator.database.Database` runs it on a reader thread.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netopt.coordinator.matrix import (
    SPREAD_QUANTILES,
    PairAggregate,
    RankedValues,
    RegionAggregate,
    link_entries,
    region_entries,
)
from netopt.errors import StorageError

__all__ = [
    "POSTGRES_SQL",
    "SQLITE_SQL",
    "MatrixReader",
    "MatrixSql",
    "pair_entries",
    "region_pair_entries",
]


def _ranked_sql(keys: str, source: str) -> str:
    """Per group of ``keys``: count and the values at ``floor(rank)`` and ``floor(rank) + 1``.

    ``source`` yields the ``keys`` columns and ``v`` (never NULL). The rank of
    quantile q is ``(n - 1) * q / 100`` as in :func:`~netopt.percentile.percentile`
    (``{floor}`` is the dialect's truncation of a non-negative number).
    """
    picks = []
    for q in SPREAD_QUANTILES:
        low = f"{{floor}}((n - 1) * {q} / 100.0)"
        picks.append(f"max(CASE WHEN i = {low} THEN v END)")
        picks.append(f"max(CASE WHEN i = {low} + 1 THEN v END)")
    # Composed from this module's constants only; values are always bound parameters.
    return (
        f"SELECT {keys}, n, {', '.join(picks)} FROM ("  # noqa: S608 - constants only
        f" SELECT {keys}, v, row_number() OVER (PARTITION BY {keys} ORDER BY v) - 1 AS i,"
        f" count(*) OVER (PARTITION BY {keys}) AS n FROM ({source}) AS src_rows) AS ranked"
        f" GROUP BY {keys}, n"  # n is one value per group (PostgreSQL wants it named)
    )


_WINDOW = "FROM {summaries} WHERE taken_at_s >= {since}"
_PAIRS_SQL = (
    "SELECT src, dst, count(*), max(taken_at_s), min(rtt_min_ms),"
    " sum(CASE WHEN probes_sent > 0 THEN probes_sent ELSE 0 END),"
    " sum(CASE WHEN probes_sent > 0 THEN probes_received ELSE 0 END)"
    f" {_WINDOW} GROUP BY src, dst"
)


def _latest_sql(columns: str, condition: str) -> str:
    """The newest row of each pair that matches ``condition`` (ties: the one stored last)."""
    return (
        f"SELECT src, dst, {columns} FROM ("  # noqa: S608 - constants only
        f" SELECT src, dst, {columns}, row_number() OVER"
        " (PARTITION BY src, dst ORDER BY taken_at_s DESC, id DESC) AS k"
        f" {_WINDOW} AND ({condition})) AS latest WHERE k = 1"
    )


_LATEST_PROBE_SQL = _latest_sql(
    "taken_at_s, rtt_p50_ms, rtt_p99_ms, jitter_ms, loss_ratio",
    "rtt_p50_ms IS NOT NULL OR probes_sent > 0",
)
_LATEST_SINGLE_SQL = _latest_sql("single_stream_bps, taken_at_s", "single_stream_bps IS NOT NULL")
_LATEST_AGGREGATE_SQL = _latest_sql("aggregate_bps, taken_at_s", "aggregate_bps IS NOT NULL")
_PAIR_RTT_SQL = _ranked_sql(
    "src, dst", f"SELECT src, dst, rtt_p50_ms AS v {_WINDOW} AND rtt_p50_ms IS NOT NULL"
)
_PAIR_JITTER_SQL = _ranked_sql(
    "src, dst", f"SELECT src, dst, jitter_ms AS v {_WINDOW} AND jitter_ms IS NOT NULL"
)
# Summaries whose two ends have a known region, keyed by the unordered region pair.
_REGION_ROWS = (
    "SELECT {least}(a.region, b.region) AS ra, {greatest}(a.region, b.region) AS rb,"
    " s.rtt_p50_ms AS v, s.probes_sent AS sent, s.probes_received AS received"
    " FROM {summaries} AS s"
    " JOIN {node_region} AS a ON a.node = s.src"
    " JOIN {node_region} AS b ON b.node = s.dst"
    " WHERE s.taken_at_s >= {since}"
)
_REGIONS_SQL = (
    "SELECT ra, rb, count(*), sum(CASE WHEN sent > 0 THEN sent ELSE 0 END),"  # noqa: S608
    " sum(CASE WHEN sent > 0 THEN received ELSE 0 END)"
    f" FROM ({_REGION_ROWS}) AS region_rows GROUP BY ra, rb"
)
_REGION_RTT_SQL = _ranked_sql(
    "ra, rb",
    f"SELECT ra, rb, v FROM ({_REGION_ROWS}) AS region_rows WHERE v IS NOT NULL",  # noqa: S608
)
_DIALECTS: dict[str, dict[str, str]] = {
    # SQLite: CAST truncates (the rank is never negative); the scalar min/max of two.
    "sqlite": {"summaries": "main.summaries", "node_region": "temp.node_region",
               "since": "?1", "floor": "CAST", "least": "min", "greatest": "max"},
    # PostgreSQL: CAST rounds, so floor first; LEAST/GREATEST; psycopg's named parameter.
    "postgresql": {"summaries": "summaries", "node_region": "pg_temp.node_region",
                   "since": "%(since)s", "floor": "floor", "least": "LEAST",
                   "greatest": "GREATEST"},
}  # fmt: skip


@dataclass(frozen=True)
class MatrixSql:
    """The matrix queries in one SQL dialect (their only parameter is ``since``)."""

    pairs: str
    latest_probe: str
    latest_single: str
    latest_aggregate: str
    pair_rtt: str
    pair_jitter: str
    regions: str
    region_rtt: str

    @classmethod
    def of(cls, dialect: str) -> MatrixSql:
        words = _DIALECTS[dialect]

        def fill(sql: str) -> str:
            text = sql.format(**words)
            # SQLite's CAST needs "AS INTEGER" inside; PostgreSQL's floor() gives a number.
            if dialect == "sqlite":
                text = text.replace(" / 100.0)", " / 100.0 AS INTEGER)")
            return text

        return cls(
            fill(_PAIRS_SQL), fill(_LATEST_PROBE_SQL), fill(_LATEST_SINGLE_SQL),
            fill(_LATEST_AGGREGATE_SQL), fill(_PAIR_RTT_SQL), fill(_PAIR_JITTER_SQL),
            fill(_REGIONS_SQL), fill(_REGION_RTT_SQL),
        )  # fmt: skip


SQLITE_SQL = MatrixSql.of("sqlite")
POSTGRES_SQL = MatrixSql.of("postgresql")
Rows = Callable[[str], Iterable[Sequence[Any]]]
"""Runs one of the queries with ``since`` bound; returns its rows."""


def pair_entries(sql: MatrixSql, rows: Rows, regions: Mapping[str, str]) -> list[dict[str, Any]]:
    """Pair entries (as ``link_figures``) from the queries of ``sql`` run by ``rows``."""
    latest = {(r[0], r[1]): tuple(r[2:]) for r in rows(sql.latest_probe)}
    single = {(r[0], r[1]): tuple(r[2:]) for r in rows(sql.latest_single)}
    aggregate = {(r[0], r[1]): tuple(r[2:]) for r in rows(sql.latest_aggregate)}
    rtts = _ranked(list(rows(sql.pair_rtt)), 2)
    jitters = _ranked(list(rows(sql.pair_jitter)), 2)
    pairs = []
    for src, dst, count, latest_at_s, rtt_min_ms, sent, received in rows(sql.pairs):
        key = (src, dst)
        pairs.append(
            PairAggregate(
                src, dst, int(count), latest_at_s, rtt_min_ms, int(sent), int(received),
                latest.get(key), single.get(key), aggregate.get(key), rtts.get(key),
                jitters.get(key),
            )
        )  # fmt: skip
    return link_entries(pairs, regions)


def region_pair_entries(
    sql: MatrixSql, rows: Rows, links: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Region-pair entries; the ``node_region`` table must hold the registry's regions."""
    rtts = _ranked(list(rows(sql.region_rtt)), 2)
    aggregates = [
        RegionAggregate(ra, rb, int(count), int(sent), int(received), rtts.get((ra, rb)))
        for ra, rb, count, sent, received in rows(sql.regions)
    ]
    return region_entries(aggregates, links)


def _ranked(rows: list[Any], key_len: int) -> dict[tuple[str, ...], RankedValues]:
    out: dict[tuple[str, ...], RankedValues] = {}
    for row in rows:
        out[tuple(row[:key_len])] = RankedValues(int(row[key_len]), tuple(row[key_len + 1 :]))
    return out


class MatrixReader:
    """A read-only connection to the database file at ``path`` (made by
    :class:`~netopt.coordinator.store.Store`, in WAL mode) that answers matrix
    queries; one instance per thread. Raises StorageError when the database
    cannot be opened or read.
    """

    def __init__(self, path: str) -> None:
        try:
            uri = f"{Path(path).resolve().as_uri()}?mode=ro"
            self._db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA temp_store=MEMORY")
            self._db.execute(
                "CREATE TEMP TABLE IF NOT EXISTS node_region (node TEXT PRIMARY KEY, region TEXT)"
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open database {path} for reading: {exc}") from exc

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def links(
        self, since_s: float, regions: Mapping[str, str], *, with_regions: bool = False
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Pair entries (as ``link_figures``) and, if asked, region-pair entries.

        Both come from one read transaction, so they describe the same summaries.
        """
        db = self._db
        try:
            db.execute("BEGIN")
            try:
                links = self._links(since_s, regions)
                pairs = self._regions(since_s, regions, links) if with_regions else []
            finally:
                db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StorageError(f"link matrix query failed: {exc}") from exc
        return links, pairs

    def _links(self, since_s: float, regions: Mapping[str, str]) -> list[dict[str, Any]]:
        return pair_entries(SQLITE_SQL, self._rows(since_s), regions)

    def _rows(self, since_s: float) -> Rows:
        return lambda sql: self._db.execute(sql, (since_s,)).fetchall()

    def _regions(
        self, since_s: float, regions: Mapping[str, str], links: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        db = self._db
        db.execute("DELETE FROM temp.node_region")
        db.execute(
            "INSERT INTO temp.node_region SELECT key, value FROM json_each(?)",
            (json.dumps(dict(regions)),),
        )
        return region_pair_entries(SQLITE_SQL, self._rows(since_s), links)
