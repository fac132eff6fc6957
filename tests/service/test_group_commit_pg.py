"""Group commit with a linger on the real stores (PostgreSQL from tests/pgserver.py, and
SQLite): batches that arrive together share one write, each stored exactly once; the
queue is bounded; a failed group fails its own batches only, and stores none of them."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from coordinator_helpers import AUTH, T0, batch, make_settings, registration, summary

from netopt.coordinator.app import COORDINATOR, CoordinatorDeps, create_app
from netopt.coordinator.database import Database, PgDatabase, StoreRunner
from netopt.coordinator.groupcommit import GroupCommit, GroupLimits
from netopt.coordinator.storeapi import BatchToStore
from netopt.errors import StorageError
from netopt.wire.schema import SummaryBatch
from tests.pgserver import PASSWORD, PgServer

LINGER_S = 0.2  # long enough that every batch offered below joins the first group


def _batch(node: str, batch_id: str, summaries: int = 2) -> BatchToStore:
    parsed = SummaryBatch.from_dict(
        batch(batch_id, [summary(node, f"us-{k}", T0 - 5) for k in range(summaries)])
    )
    return BatchToStore(node, batch_id, parsed.summaries, T0, T0 - 3600)


class _Writes:
    """Counts the store's ingest calls (one per group) through ``observe``."""

    def __init__(self, runner: StoreRunner) -> None:
        self.count = 0
        runner.observe = self.seen

    def seen(self, operation: str, seconds: float) -> None:
        self.count += operation == "ingest"


@pytest.fixture(params=["postgresql", "sqlite"])
async def opened(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[StoreRunner, str | None]]:
    """A runner lingering LINGER_S, on each store; the PostgreSQL URL (None on SQLite)."""
    limits = GroupLimits(
        linger_s=LINGER_S, linger_until_batches=16, max_group_batches=16, max_pending_batches=40
    )
    url: str | None = None
    runner: StoreRunner
    if request.param == "postgresql":
        server: PgServer = request.getfixturevalue("postgres_server")
        url = server.new_database()
        runner = PgDatabase(url, password=PASSWORD, limits=limits)
    else:
        runner = Database(str(tmp_path / "c.db"), limits=limits)
    await runner.open()
    try:
        yield runner, url
    finally:
        await runner.close()


async def test_batches_arriving_together_share_a_write_and_are_stored_once(
    opened: tuple[StoreRunner, str | None],
) -> None:
    runner, _ = opened
    assert (await runner.ingest(_batch("hk-1", "old"))).duplicate is False
    writes = _Writes(runner)
    offered = [_batch(f"hk-{i % 3}", f"b{i}") for i in range(10)]
    offered += [_batch("hk-1", "b1"), _batch("hk-1", "old")]  # twice in the group; stored before
    started = asyncio.get_running_loop().time()
    results = await asyncio.gather(*(runner.ingest(b) for b in offered))
    waited_s = asyncio.get_running_loop().time() - started
    assert writes.count == 1  # one statement for the twelve
    assert LINGER_S * 0.9 <= waited_s < LINGER_S + 5
    assert [r.duplicate for r in results] == [False] * 10 + [True, True]
    assert [r.accepted for r in results] == [2] * 10 + [0, 0]
    assert await runner.call(runner.store.counts) == (11, 22)


async def test_a_full_group_is_written_without_waiting_out_the_linger(
    opened: tuple[StoreRunner, str | None],
) -> None:
    runner, _ = opened
    writes = _Writes(runner)
    offered = [_batch("hk-1", f"b{i}") for i in range(32)]  # two full groups of 16
    started = asyncio.get_running_loop().time()
    results = await asyncio.gather(*(runner.ingest(b) for b in offered))
    assert asyncio.get_running_loop().time() - started < LINGER_S * 0.9
    assert writes.count == 2
    assert not any(r.duplicate for r in results)
    assert await runner.call(runner.store.counts) == (32, 64)


async def test_the_queue_is_bounded_and_refuses_at_once(
    opened: tuple[StoreRunner, str | None],
) -> None:
    runner, _ = opened
    # A store that never answers while the test holds it: nothing leaves the queue.
    gate = asyncio.Event()
    ingest = GroupCommit(runner._write_group, GroupLimits(max_pending_batches=3))

    async def held(batches: list[BatchToStore]) -> list[object]:
        await gate.wait()
        return await runner._write_group(batches)  # type: ignore[return-value]

    ingest._write = held  # type: ignore[assignment]
    first = asyncio.ensure_future(ingest.submit(_batch("hk-1", "a")))
    await asyncio.sleep(0.05)  # "a" is being written; the next three wait
    waiting = [asyncio.ensure_future(ingest.submit(_batch("hk-1", f"w{i}"))) for i in range(3)]
    await asyncio.sleep(0)
    assert ingest.waiting == 3
    with pytest.raises(StorageError, match="ingest queue full"):
        await ingest.submit(_batch("hk-1", "refused"))
    gate.set()
    assert [r.duplicate for r in await asyncio.gather(first, *waiting)] == [False] * 4
    assert await runner.call(runner.store.counts) == (4, 8)


async def test_a_failed_group_fails_its_batches_only_and_stores_none_of_them(
    opened: tuple[StoreRunner, str | None], tmp_path: Path
) -> None:
    runner, url = opened
    if url is None:  # SQLite: a trigger refuses the batch, as the constraint does below
        with sqlite3.connect(tmp_path / "c.db") as db:
            db.execute(
                "CREATE TRIGGER no_poison BEFORE INSERT ON batches "
                "WHEN NEW.batch_id = 'poison' BEGIN SELECT RAISE(ABORT, 'no_poison'); END"
            )
    else:
        with psycopg.connect(url, password=PASSWORD, autocommit=True) as db:
            db.execute("ALTER TABLE batches ADD CONSTRAINT no_poison CHECK (batch_id <> 'poison')")
    writes = _Writes(runner)
    # A full group of 16 (written at once) with one bad batch, and one more behind it.
    group = [_batch(f"hk-{i}", f"g{i}") for i in range(15)]
    group.insert(7, _batch("hk-1", "poison"))
    tasks = [asyncio.ensure_future(runner.ingest(b)) for b in [*group, _batch("hk-3", "later")]]
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert writes.count == 2
    for outcome in done[:16]:
        assert isinstance(outcome, StorageError)
        assert "storing 16 batch(es) failed" in str(outcome)
        assert "no_poison" in str(outcome)
    # The batch behind the failed group was its own group, and is stored; nothing of
    # the failed group is (no half-stored statement).
    assert not isinstance(done[16], BaseException)
    assert done[16].duplicate is False
    assert await runner.call(runner.store.counts) == (1, 2)
    # The agents replay: the good batches are stored once, the bad one fails again.
    replay = await asyncio.gather(*(runner.ingest(b) for b in group), return_exceptions=True)
    assert all(isinstance(r, StorageError) for r in replay)  # one group again
    good = [b for b in group if b.batch_id != "poison"]
    replay = await asyncio.gather(*(runner.ingest(b) for b in good))
    assert not any(r.duplicate for r in replay)
    assert await runner.call(runner.store.counts) == (16, 32)
    again = await asyncio.gather(*(runner.ingest(b) for b in good))
    assert all(r.duplicate for r in again)
    assert await runner.call(runner.store.counts) == (16, 32)


async def test_a_full_queue_answers_503_json_over_http(
    aiohttp_client: object, tmp_path: Path, postgres_server: PgServer
) -> None:
    url = postgres_server.new_database()
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD)
    settings = make_settings(tmp_path, database=url, database_password_file=str(password_file))
    client = await aiohttp_client(  # type: ignore[operator]
        create_app(settings, CoordinatorDeps(heartbeat_flush_s=3600))
    )
    response = await client.post("/api/v1/agents/register", json=registration("hk-1", "hk"),
                                 headers=AUTH)  # fmt: skip
    assert response.status == 200
    runner = client.app[COORDINATOR].db
    limits = GroupLimits(linger_s=1.0, max_pending_batches=2)
    runner._ingest = GroupCommit(runner._write_group, limits)

    def post(batch_id: str) -> object:
        sent = batch(batch_id, [summary("hk-1", "us-1", T0 - 5)])
        return client.post("/api/v1/agents/hk-1/summaries", json=sent, headers=AUTH)

    waiting = [asyncio.ensure_future(post(f"b{i}")) for i in range(2)]
    await asyncio.sleep(0.3)  # both wait out the linger
    refused = await post("b9")  # type: ignore[misc]
    assert refused.status == 503
    body = await refused.json()
    assert body["error"] == "StorageError"
    assert "ingest queue full" in body["message"]
    for answer in await asyncio.gather(*waiting):
        assert answer.status == 200  # type: ignore[attr-defined]


async def test_the_linger_setting_makes_posts_share_one_statement(
    aiohttp_client: object, tmp_path: Path, postgres_server: PgServer
) -> None:
    url = postgres_server.new_database()
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD)
    settings = make_settings(tmp_path, database=url, database_password_file=str(password_file),
                             ingest_linger_s=LINGER_S)  # fmt: skip
    client = await aiohttp_client(  # type: ignore[operator]
        create_app(settings, CoordinatorDeps(heartbeat_flush_s=3600))
    )
    response = await client.post("/api/v1/agents/register", json=registration("hk-1", "hk"),
                                 headers=AUTH)  # fmt: skip
    assert response.status == 200
    writes = _Writes(client.app[COORDINATOR].db)
    posts = [
        client.post("/api/v1/agents/hk-1/summaries", headers=AUTH,
                    json=batch(f"b{i}", [summary("hk-1", "us-1", T0 - 5)]))
        for i in range(3)
    ]  # fmt: skip
    answers = await asyncio.gather(*posts)
    assert [a.status for a in answers] == [200, 200, 200]
    assert writes.count == 1
    db = client.app[COORDINATOR].db
    assert await db.call(db.store.counts) == (3, 3)
