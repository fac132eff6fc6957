"""One contract, two stores: SQLite (a file) and PostgreSQL (a real server started by
``postgres_server``) pass the same tests, including idempotent ingest across two
connections (two replicas) and refusing a schema newer than this netopt."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from netopt.coordinator.matrix import link_figures, region_figures
from netopt.coordinator.matrix_query import MatrixReader
from netopt.coordinator.pgstore import PgStore
from netopt.coordinator.store import Store
from netopt.coordinator.storeapi import (
    SCHEMA_VERSION,
    BatchToStore,
    CoordinatorStore,
    StoredNode,
)
from netopt.errors import StorageError
from netopt.wire.schema import LinkSummary, RttFigures
from tests.pgserver import PASSWORD, PgServer

Opener = Callable[..., Any]


@pytest.fixture(params=["sqlite", "postgresql"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens a store on one fresh database; each call is another connection (a replica).

    ``managed=False``: the caller closes it (SQLite: on the thread that opened it).
    """
    opened: list[Any] = []
    if request.param == "sqlite":
        path = str(tmp_path / "c.db")

        def open_store(managed: bool = True) -> Any:
            store = Store(path, durable_commits=False)
            if managed:
                opened.append(store)
            return store
    else:
        server: PgServer = request.getfixturevalue("postgres_server")
        url = server.new_database()

        def open_store(managed: bool = True) -> Any:
            store = PgStore(url, password=PASSWORD)
            if managed:
                opened.append(store)
            return store

    yield open_store
    for store in opened:
        store.close()


def _summary(src: str, dst: str, taken_at_s: float, rtt_ms: float) -> LinkSummary:
    rtt = RttFigures(rtt_ms * 0.9, rtt_ms, rtt_ms, rtt_ms * 1.1, rtt_ms * 1.3, rtt_ms * 1.5)
    return LinkSummary(src, dst, taken_at_s, 10.0, "udp", 100, 97, rtt, rtt_ms / 20,
                       loss_ratio=0.03)  # fmt: skip


def _batch(node: str, batch_id: str, taken: list[float], oldest_kept_s: float = 0.0) -> Any:
    summaries = [_summary(node, "us-1", t, 10.0 + i) for i, t in enumerate(taken)]
    return BatchToStore(node, batch_id, summaries, 5000.0, oldest_kept_s)


def _node(name: str, region: str, seen_s: float = 100.0) -> StoredNode:
    return StoredNode(name, region, "127.0.0.1", {"node": name, "probe_port": 7471}, 50.0,
                      seen_s, None, {})  # fmt: skip


def test_schema_is_current_and_data_survives_a_reopen(opener: Opener) -> None:
    store: CoordinatorStore = opener()
    assert store.schema_version() == SCHEMA_VERSION
    store.save_node(_node("hk-1", "hk"))
    store.ingest([_batch("hk-1", "b1", [1000.0, 1001.0])])
    store.close()
    again: CoordinatorStore = opener()
    assert again.schema_version() == SCHEMA_VERSION
    assert [n.name for n in again.nodes()] == ["hk-1"]
    assert again.counts() == (1, 2)
    again.ping()


def test_registry_rows_round_trip(opener: Opener) -> None:
    store: CoordinatorStore = opener()
    node = _node("hk-1", "hk")
    store.save_node(node)
    store.save_node(_node("eu-1", "eu"))
    assert store.node("hk-1") == node
    assert store.node("nope") is None
    left = StoredNode("hk-1", "hk2", "10.0.0.1", {"x": [1]}, 50.0, 120.0, 130.0, {"ok": True})
    store.save_node(left)
    assert store.nodes() == [_node("eu-1", "eu"), left]
    store.touch_nodes([("eu-1", 200.0, {"load": 0.5})])
    eu = store.node("eu-1")
    assert eu is not None
    assert (eu.last_seen_s, eu.health) == (200.0, {"load": 0.5})


def test_changed_nodes_are_read_after_each_replicas_writes(opener: Opener) -> None:
    a: CoordinatorStore = opener()
    b: CoordinatorStore = opener()
    a.save_node(_node("hk-1", "hk"))
    a.save_node(_node("eu-1", "eu"))
    everything, cursor = b.nodes_changed(None)
    assert everything == b.nodes() == [_node("eu-1", "eu"), _node("hk-1", "hk")]
    a.touch_nodes([("hk-1", 300.0, {"load": 1.0})])
    a.save_node(_node("us-1", "us"))
    changed, cursor = b.nodes_changed(cursor)
    names = [n.name for n in changed]
    assert {"hk-1", "us-1"} <= set(names)  # every change, whoever wrote it
    assert changed[names.index("hk-1")].last_seen_s == 300.0
    if isinstance(a, Store):
        assert cursor is None  # one writer: every row, every time
        return
    assert names == ["hk-1", "us-1"]  # the unchanged row is not read again
    assert b.nodes_changed(cursor)[0] == []  # nothing written since
    # A transaction running across a read is seen by the next one, although it
    # commits after a younger transaction that the read already saw.
    slow: Any = opener()
    with slow._db.transaction():
        slow.touch_nodes([("eu-1", 400.0, {})])  # its own (nested) transaction: savepoint
        a.save_node(_node("cn-1", "cn"))
        changed, cursor = b.nodes_changed(cursor)
        assert [n.name for n in changed] == ["cn-1"]
    changed, cursor = b.nodes_changed(cursor)
    assert "eu-1" in [n.name for n in changed]


def test_ingest_stores_a_batch_once_across_replicas(opener: Opener) -> None:
    a: CoordinatorStore = opener()
    b: CoordinatorStore = opener()
    first = a.ingest([_batch("hk-1", "b1", [1000.0, 1001.0]), _batch("hk-1", "b1", [1000.0])])
    assert [(r.duplicate, r.accepted) for r in first] == [(False, 2), (True, 0)]
    again = b.ingest([_batch("hk-1", "b1", [1000.0, 1001.0]), _batch("hk-2", "b1", [1002.0])])
    assert [(r.duplicate, r.accepted) for r in again] == [(True, 0), (False, 1)]
    assert a.counts() == (2, 3)
    assert b.counts() == (2, 3)


def test_concurrent_replays_of_one_batch_store_it_once(opener: Opener) -> None:
    first: CoordinatorStore = opener()  # creates the schema before the replicas race
    replicas = 4
    barrier = threading.Barrier(replicas)
    outcomes: list[bool] = []
    lock = threading.Lock()

    def send() -> None:
        store: CoordinatorStore = opener(managed=False)  # its own connection, on its thread
        try:
            barrier.wait(10)
            for index in range(20):
                result = store.ingest([_batch("hk-1", f"b{index}", [1000.0 + index])])[0]
                with lock:
                    outcomes.append(result.duplicate)
        finally:
            store.close()

    threads = [threading.Thread(target=send) for _ in range(replicas)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(outcomes) == 20 * replicas
    assert outcomes.count(False) == 20
    assert first.counts() == (20, 20)


def test_expired_summaries_are_dropped_and_sweep_deletes_old_rows(opener: Opener) -> None:
    store: CoordinatorStore = opener()
    result = store.ingest([_batch("hk-1", "b1", [900.0, 1000.0, 1100.0], oldest_kept_s=950.0)])[0]
    assert (result.accepted, result.expired) == (2, 1)
    assert [r.taken_at_s for r in store.link_rows(0.0)] == [1000.0, 1100.0]
    assert store.sweep(1050.0) == 1
    assert store.counts() == (1, 1)
    assert store.sweep(6000.0) == 1
    assert store.counts() == (0, 0)  # batch records go with retention too


def test_history_is_newest_first_cut_then_oldest_first(opener: Opener) -> None:
    store: CoordinatorStore = opener()
    store.ingest([_batch("hk-1", "b1", [1000.0, 1001.0, 1002.0, 1003.0])])
    points = store.history("hk-1", "us-1", 1000.5, 2)
    assert [p["taken_at_s"] for p in points] == [1002.0, 1003.0]
    assert points[0]["rtt_ms"]["p50"] == 12.0
    assert store.history("us-1", "hk-1", 0.0, 10) == []


def test_matrix_figures_match_the_reference(opener: Opener, tmp_path: Path) -> None:
    store: Any = opener()
    for n, node in enumerate(("hk-1", "hk-2", "eu-1")):
        store.ingest([_batch(node, f"b{k}", [1000.0 + k, 1000.5 + k]) for k in range(3 + n)])
    regions = {"hk-1": "hk", "hk-2": "hk", "eu-1": "eu", "us-1": "us"}
    rows = store.link_rows(0.0)
    want_links = link_figures(rows, regions)
    want_regions = region_figures(want_links, rows, regions)
    if isinstance(store, Store):
        reader = MatrixReader(str(tmp_path / "c.db"))
        try:
            got = reader.links(0.0, regions, with_regions=True)
        finally:
            reader.close()
    else:
        got = store.links(0.0, regions, with_regions=True)
    assert got == (want_links, want_regions)


def test_a_newer_schema_is_refused(opener: Opener) -> None:
    store: Any = opener()
    if isinstance(store, Store):
        store._db.execute("UPDATE schema_version SET version = 99")
    else:
        store._db.execute("UPDATE schema_version SET version = 99")
    store.close()
    with pytest.raises(StorageError, match="newer"):
        opener()


def test_an_older_schema_is_migrated_keeping_its_rows(opener: Opener) -> None:
    store: Any = opener()
    store.ingest([_batch("hk-1", "b1", [1000.0])])
    for statement in ("DROP TABLE probe_plans",
                      "DROP TABLE catalogue_holdings", "DROP TABLE catalogue_versions",
                      "ALTER TABLE nodes DROP COLUMN changed_xid",
                      "UPDATE schema_version SET version = 1"):  # fmt: skip
        store._db.execute(statement)
    store.close()
    again: CoordinatorStore = opener()
    assert again.schema_version() == SCHEMA_VERSION == 4
    assert again.counts() == (1, 1)


def test_every_column_is_stored_as_given(opener: Opener) -> None:
    store: CoordinatorStore = opener()
    rtt = RttFigures(0.5, 1.25, 1.0, 2.0, 3.0, 1e-3 + 3.0)
    probe = LinkSummary("hk-1", "us-1", 1000, 10.0, "udp", 100, 97, rtt, 0.1, loss_ratio=0.03)
    lost = LinkSummary("hk-2", "eu-1", 1000.125, 10.0, "tcp-connect", 5, 0, None, None,
                       loss_ratio=1.0)  # fmt: skip
    bulk = LinkSummary("hk-1", "eu-1", 1001.0, 10.0, "bulk-tcp", single_stream_bps=9_000_000_000,
                       aggregate_bps=1.5e10, streams=4, target='a "quoted" target')  # fmt: skip
    sent = [("hk-1", "b2", [bulk, probe]), ("hk-2", "b1", [lost]), ("hk-1", "b1", [probe])]
    results = store.ingest([BatchToStore(n, b, s, 5000.0, 0.0) for n, b, s in sent])
    assert [(r.duplicate, r.accepted) for r in results] == [(False, 2), (False, 1), (False, 1)]
    rows = sorted(store.link_rows(0.0), key=lambda r: (r.src, r.dst, r.taken_at_s))
    assert [(r.src, r.dst, r.taken_at_s) for r in rows] == [
        ("hk-1", "eu-1", 1001.0), ("hk-1", "us-1", 1000.0), ("hk-1", "us-1", 1000.0),
        ("hk-2", "eu-1", 1000.125),
    ]  # fmt: skip
    got = rows[1]
    assert (got.rtt_p50_ms, got.rtt_p99_ms, got.rtt_min_ms) == (1.0, 3.0, 0.5)
    assert (got.jitter_ms, got.loss_ratio, got.probes_sent, got.probes_received) == (
        0.1, 0.03, 100, 97,
    )  # fmt: skip
    assert (rows[0].single_stream_bps, rows[0].aggregate_bps, rows[0].rtt_p50_ms) == (
        9e9, 1.5e10, None,
    )  # fmt: skip
    assert (rows[3].rtt_p50_ms, rows[3].loss_ratio, rows[3].single_stream_bps) == (None, 1.0, None)
    assert store.history("hk-1", "eu-1", 0.0, 10) == [bulk.to_dict()]
    assert store.history("hk-2", "eu-1", 0.0, 10) == [lost.to_dict()]
    assert store.history("hk-1", "us-1", 0.0, 10) == [probe.to_dict(), probe.to_dict()]


def test_overlapping_groups_from_two_replicas_store_each_batch_once(opener: Opener) -> None:
    first: CoordinatorStore = opener()  # creates the schema before the replicas race
    rounds, keys = 15, 12
    barrier = threading.Barrier(2)
    stored: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def send(reverse: bool) -> None:
        store: CoordinatorStore = opener(managed=False)
        try:
            for r in range(rounds):
                ids = [f"r{r}-{k:02d}" for k in range(keys)]
                order = reversed(ids) if reverse else ids
                group = [_batch("hk-1", i, [1000.0 + r]) for i in order]
                barrier.wait(10)
                try:
                    results = store.ingest(group)
                except StorageError as exc:  # a deadlock, say: the test fails below
                    with lock:
                        failures.append(exc)
                    continue
                with lock:
                    stored.extend(r.batch_id for r in results if not r.duplicate)
        finally:
            store.close()

    threads = [threading.Thread(target=send, args=(reverse,)) for reverse in (False, True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    assert sorted(stored) == sorted(f"r{r}-{k:02d}" for r in range(rounds) for k in range(keys))
    assert first.counts() == (rounds * keys, rounds * keys)
