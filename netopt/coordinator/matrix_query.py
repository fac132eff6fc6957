"""The link matrix computed inside SQLite, on a read-only connection of its own.

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
from collections.abc import Mapping
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

__all__ = ["MatrixReader"]


def _ranked_sql(keys: str, source: str) -> str:
    """Per group of ``keys``: count and the values at ``floor(rank)`` and ``floor(rank) + 1``.

    ``source`` yields the ``keys`` columns and ``v`` (never NULL). The rank of
    quantile q is ``(n - 1) * q / 100`` as in :func:`~netopt.percentile.percentile`.
    """
    picks = []
    for q in SPREAD_QUANTILES:
        low = f"CAST((n - 1) * {q} / 100.0 AS INTEGER)"
        picks.append(f"max(CASE WHEN i = {low} THEN v END)")
        picks.append(f"max(CASE WHEN i = {low} + 1 THEN v END)")
    # Composed from this module's constants only; values are always bound parameters.
    return (
        f"SELECT {keys}, n, {', '.join(picks)} FROM ("  # noqa: S608 - constants only
        f" SELECT {keys}, v, row_number() OVER (PARTITION BY {keys} ORDER BY v) - 1 AS i,"
        f" count(*) OVER (PARTITION BY {keys}) AS n FROM ({source}))"
        f" GROUP BY {keys}"
    )


_WINDOW = "FROM main.summaries WHERE taken_at_s >= ?1"
_PAIRS_SQL = (
    "SELECT src, dst, count(*), max(taken_at_s), min(rtt_min_ms),"
    " sum(CASE WHEN probes_sent > 0 THEN probes_sent ELSE 0 END),"
    " sum(CASE WHEN probes_sent > 0 THEN probes_received ELSE 0 END)"
    f" {_WINDOW} GROUP BY src, dst"
)
# The newest row of each pair that matches a condition (ties: the one stored last).
_LATEST_SQL = (
    "SELECT src, dst, {columns} FROM ("  # noqa: S608 - constants only
    " SELECT src, dst, {columns}, row_number() OVER"
    " (PARTITION BY src, dst ORDER BY taken_at_s DESC, id DESC) AS k"
    f" {_WINDOW} AND ({{condition}})) WHERE k = 1"
)
_LATEST_PROBE_SQL = _LATEST_SQL.format(
    columns="taken_at_s, rtt_p50_ms, rtt_p99_ms, jitter_ms, loss_ratio",
    condition="rtt_p50_ms IS NOT NULL OR probes_sent > 0",
)
_LATEST_SINGLE_SQL = _LATEST_SQL.format(
    columns="single_stream_bps, taken_at_s", condition="single_stream_bps IS NOT NULL"
)
_LATEST_AGGREGATE_SQL = _LATEST_SQL.format(
    columns="aggregate_bps, taken_at_s", condition="aggregate_bps IS NOT NULL"
)
_PAIR_RTT_SQL = _ranked_sql(
    "src, dst", f"SELECT src, dst, rtt_p50_ms AS v {_WINDOW} AND rtt_p50_ms IS NOT NULL"
)
_PAIR_JITTER_SQL = _ranked_sql(
    "src, dst", f"SELECT src, dst, jitter_ms AS v {_WINDOW} AND jitter_ms IS NOT NULL"
)
# Summaries whose two ends have a known region, keyed by the unordered region pair.
_REGION_ROWS = (
    "SELECT min(a.region, b.region) AS ra, max(a.region, b.region) AS rb,"
    " s.rtt_p50_ms AS v, s.probes_sent AS sent, s.probes_received AS received"
    " FROM main.summaries AS s"
    " JOIN temp.node_region AS a ON a.node = s.src"
    " JOIN temp.node_region AS b ON b.node = s.dst"
    " WHERE s.taken_at_s >= ?1"
)
_REGIONS_SQL = (
    "SELECT ra, rb, count(*), sum(CASE WHEN sent > 0 THEN sent ELSE 0 END),"  # noqa: S608
    " sum(CASE WHEN sent > 0 THEN received ELSE 0 END)"
    f" FROM ({_REGION_ROWS}) GROUP BY ra, rb"
)
_REGION_RTT_SQL = _ranked_sql(
    "ra, rb",
    f"SELECT ra, rb, v FROM ({_REGION_ROWS}) WHERE v IS NOT NULL",  # noqa: S608 - constants only
)


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
        db = self._db
        latest = {(r[0], r[1]): r[2:] for r in db.execute(_LATEST_PROBE_SQL, (since_s,))}
        single = {(r[0], r[1]): r[2:] for r in db.execute(_LATEST_SINGLE_SQL, (since_s,))}
        aggregate = {(r[0], r[1]): r[2:] for r in db.execute(_LATEST_AGGREGATE_SQL, (since_s,))}
        rtts = _ranked(db.execute(_PAIR_RTT_SQL, (since_s,)).fetchall(), 2)
        jitters = _ranked(db.execute(_PAIR_JITTER_SQL, (since_s,)).fetchall(), 2)
        pairs = []
        for src, dst, count, latest_at_s, rtt_min_ms, sent, received in db.execute(
            _PAIRS_SQL, (since_s,)
        ):
            key = (src, dst)
            pairs.append(
                PairAggregate(
                    src, dst, int(count), latest_at_s, rtt_min_ms, int(sent), int(received),
                    latest.get(key), single.get(key), aggregate.get(key), rtts.get(key),
                    jitters.get(key),
                )
            )  # fmt: skip
        return link_entries(pairs, regions)

    def _regions(
        self, since_s: float, regions: Mapping[str, str], links: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        db = self._db
        db.execute("DELETE FROM temp.node_region")
        db.execute(
            "INSERT INTO temp.node_region SELECT key, value FROM json_each(?)",
            (json.dumps(dict(regions)),),
        )
        rtts = _ranked(db.execute(_REGION_RTT_SQL, (since_s,)).fetchall(), 2)
        aggregates = [
            RegionAggregate(ra, rb, int(count), int(sent), int(received), rtts.get((ra, rb)))
            for ra, rb, count, sent, received in db.execute(_REGIONS_SQL, (since_s,))
        ]
        return region_entries(aggregates, links)
