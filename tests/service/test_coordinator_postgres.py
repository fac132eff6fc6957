"""The coordinator on PostgreSQL: clear start-up errors naming the (redacted) URL, two
replicas on one database answering for each other, one elected leader that hands over,
store latency and the leader on /metrics, readiness following the database."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp.test_utils import TestClient
from coordinator_helpers import AUTH, TOKEN, batch, make_settings, registration, summary

from netopt.config import parse_settings
from netopt.coordinator.app import COORDINATOR, CoordinatorDeps, create_app
from netopt.coordinator.pgstore import PLANS_KEPT, PgStore
from netopt.errors import ConfigError
from tests.pgserver import PASSWORD, PgServer

REPO = Path(__file__).resolve().parents[2]
MakeClient = Callable[[Any], Awaitable[TestClient[Any, Any]]]


def _start(
    tmp_path: Path, database: str, env_password: str | None
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"kind: coordinator\nlisten: {{host: 127.0.0.1, port: 0}}\ndatabase: {database}\n"
    )
    env = {**os.environ, "NETOPT_TOKEN": TOKEN}
    env.pop("PGPASSWORD", None)
    if env_password is not None:
        env["PGPASSWORD"] = env_password
    return subprocess.run(
        [sys.executable, "-m", "netopt", "coordinator", "--config", str(config)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_start_up_errors_name_the_url_without_a_traceback(
    tmp_path: Path, postgres_server: PgServer
) -> None:
    url = postgres_server.new_database()
    wrong = _start(tmp_path, url, "not-the-password")
    assert wrong.returncode == 1
    assert f"database {url}" in wrong.stderr
    assert "password authentication failed" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    assert "not-the-password" not in wrong.stderr

    bad_host = "postgresql://netopt@no-such-host.invalid:5432/db"
    refused = _start(tmp_path, bad_host, PASSWORD)
    assert refused.returncode == 1
    assert bad_host in refused.stderr
    assert "Traceback" not in refused.stderr

    postgres_server.psql(
        "CREATE TABLE schema_version (version INTEGER NOT NULL);"
        " INSERT INTO schema_version VALUES (99)",
        url.rpartition("/")[2],
    )
    newer = _start(tmp_path, url, PASSWORD)
    assert newer.returncode == 1
    assert "schema version 99, newer" in newer.stderr
    assert url in newer.stderr
    assert "Traceback" not in newer.stderr


def test_a_password_in_the_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError, match="holds a password") as caught:
        parse_settings(
            "kind: coordinator\ndatabase: postgresql://u:hunter2secret@db:5432/n\n", "c.yaml"
        )
    assert "hunter2secret" not in str(caught.value)
    with pytest.raises(ConfigError, match="unknown scheme"):
        parse_settings("kind: coordinator\ndatabase: mysql://u@db/n\n", "c.yaml")
    ok = parse_settings("kind: coordinator\ndatabase: postgresql://u@db:5432/n\n", "c.yaml")
    assert ok.database == "postgresql://u@db:5432/n"


async def _replica(
    aiohttp_client: MakeClient, tmp_path: Path, url: str, password_file: Path
) -> TestClient[Any, Any]:
    settings = make_settings(tmp_path, database=url, database_password_file=str(password_file))
    return await aiohttp_client(create_app(settings, CoordinatorDeps(heartbeat_flush_s=3600)))


async def test_two_replicas_share_registry_ingest_and_one_leader(
    aiohttp_client: MakeClient, tmp_path: Path, postgres_server: PgServer
) -> None:
    url = postgres_server.new_database()
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD + "\n")
    a = await _replica(aiohttp_client, tmp_path, url, password_file)
    b = await _replica(aiohttp_client, tmp_path, url, password_file)
    assert not (tmp_path / "postgresql:").exists()  # never taken as a file path

    response = await a.post("/api/v1/agents/register", json=registration("hk-1", "hk"),
                            headers=AUTH)  # fmt: skip
    assert response.status == 200
    # Replica b never saw the registration; it answers from the shared store.
    response = await b.post("/api/v1/agents/hk-1/heartbeat", json={}, headers=AUTH)
    assert response.status == 200, await response.text()
    sent = batch("b-1", [summary("hk-1", "us-1", 1_800_000_000.0 - 5)])
    answers = []
    for client in (a, b, a):
        response = await client.post("/api/v1/agents/hk-1/summaries", json=sent, headers=AUTH)
        answers.append((await response.json())["duplicate"])
    assert answers == [False, True, True]
    links = await (await b.get("/api/v1/links?window_s=3600", headers=AUTH)).json()
    assert len(links["links"]) <= 1

    leaders = [a.app[COORDINATOR].leader, b.app[COORDINATOR].leader]
    assert sorted(leaders) == [False, True]
    leader, follower = (a, b) if leaders[0] else (b, a)
    metrics = await (await follower.get("/metrics", headers=AUTH)).text()
    assert "netopt_coordinator_leader 0.0" in metrics
    assert 'netopt_coordinator_store_duration_seconds_count{operation="ingest"}' in metrics
    ready = await follower.get("/readyz")
    assert ready.status == 200
    assert (await ready.json())["leader"] is False

    await leader.close()  # the leader's connections end: its lock is free once the server
    # has seen the disconnect (asynchronous), as the election loop retries every flush
    deadline = asyncio.get_running_loop().time() + 10
    while not await follower.app[COORDINATOR].elect():
        assert asyncio.get_running_loop().time() < deadline, "the lock never moved"
        await asyncio.sleep(0.05)
    metrics = await (await follower.get("/metrics", headers=AUTH)).text()
    assert "netopt_coordinator_leader 1.0" in metrics


async def test_readiness_fails_while_the_database_is_down(
    aiohttp_client: MakeClient, tmp_path: Path, postgres_server: PgServer
) -> None:
    url = postgres_server.new_database()
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD)
    client = await _replica(aiohttp_client, tmp_path, url, password_file)
    assert (await client.get("/readyz")).status == 200
    postgres_server.ctl("stop", "-m", "immediate")
    try:
        down = await client.get("/readyz")
        assert down.status == 503
        body = await down.json()
        assert body["error"] == "NotReady"
        assert url in body["message"]
        response = await client.post("/api/v1/agents/register",
                                     json=registration("hk-1", "hk"), headers=AUTH)  # fmt: skip
        assert response.status == 503  # a storage failure: agents keep their spool
    finally:
        postgres_server.ctl("start")
    assert (await client.get("/readyz")).status == 200  # the connection is reopened
    with psycopg.connect(url, password=PASSWORD) as db:
        assert db.execute("SELECT count(*) FROM nodes").fetchone() == (0,)


async def test_a_replica_follows_only_what_the_other_changed(
    aiohttp_client: MakeClient, tmp_path: Path, postgres_server: PgServer
) -> None:
    url = postgres_server.new_database()
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD)
    a = await _replica(aiohttp_client, tmp_path, url, password_file)
    b = await _replica(aiohttp_client, tmp_path, url, password_file)
    ca, cb = a.app[COORDINATOR], b.app[COORDINATOR]
    for node in ("hk-1", "hk-2", "sg-1"):
        body = registration(node, node[:2])
        assert (await a.post("/api/v1/agents/register", json=body, headers=AUTH)).status == 200
    assert await cb.refresh_registry() == 3
    assert await cb.refresh_registry() == 0  # nothing written since
    read: list[int] = []
    store = cb.db.store
    changed = store.nodes_changed

    def counting(cursor: int | None) -> Any:
        rows, next_cursor = changed(cursor)
        read.append(len(rows))
        return rows, next_cursor

    store.nodes_changed = counting  # type: ignore[method-assign]
    heartbeat = await a.post("/api/v1/agents/hk-2/heartbeat", json={"load": 1}, headers=AUTH)
    assert heartbeat.status == 200
    await ca.flush_heartbeats()
    assert (await a.delete("/api/v1/agents/sg-1", headers=AUTH)).status == 200
    assert await cb.refresh_registry() == 2
    assert read == [2]  # hk-2's heartbeat and sg-1's departure, not the fleet
    assert cb.nodes["hk-2"].last_seen_s == ca.nodes["hk-2"].last_seen_s
    assert cb.state_counts() == {"live": 2, "stale": 0, "left": 1}


MANIFEST = "ab" * 32


async def _route(client: TestClient[Any, Any], body: dict[str, Any]) -> Any:
    response = await client.post(
        f"/api/v1/datasets/ds/versions/{MANIFEST}/route", json=body, headers=AUTH
    )
    assert response.status == 200, await response.text()
    return await response.json()


async def test_region_sharing_state_is_shared_by_the_replicas(
    aiohttp_client: MakeClient, tmp_path: Path, postgres_server: PgServer
) -> None:
    url = postgres_server.new_database()
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD)
    a = await _replica(aiohttp_client, tmp_path, url, password_file)
    b = await _replica(aiohttp_client, tmp_path, url, password_file)
    for node in ("hk-1", "hk-2"):
        body = {**registration(node, "hk"), "data_port": 7480}
        assert (await a.post("/api/v1/agents/register", json=body, headers=AUTH)).status == 200
    await b.app[COORDINATOR].refresh_registry()

    first = await _route(a, {"node": "hk-1", "chunk_count": 4, "want": [0, 1]})
    assert first["origin"] == [0, 1]  # hk-1 holds the leases, taken through replica a
    second = await _route(b, {"node": "hk-2", "chunk_count": 4, "want": [0, 1, 2]})
    assert (second["wait"], second["origin"]) == ([0, 1], [2])  # b sees a's leases
    await _route(b, {"node": "hk-1", "chunk_count": 4, "have": [0]})  # hk-1 goes on via b
    third = await _route(a, {"node": "hk-2", "chunk_count": 4, "want": [0, 1]})
    assert (third["peers"], third["wait"]) == ({"hk-1": [0]}, [1])
    assert third["endpoints"] == {"hk-1": "127.0.0.1:7480"}

    listed = await (await b.get("/api/v1/datasets", headers=AUTH)).json()
    (version,) = listed["versions"]
    assert version["holders"] == [{"node": "hk-1", "chunks": 1, "live": True}]
    assert version["leases"] == 2
    body = {"node": "hk-1", "chunk_count": 5, "want": [0]}
    wrong = await b.post(f"/api/v1/datasets/ds/versions/{MANIFEST}/route", json=body, headers=AUTH)
    assert wrong.status == 400


def test_only_the_lock_holder_stores_a_plan_and_old_plans_go(postgres_server: PgServer) -> None:
    url = postgres_server.new_database()
    holder, other = PgStore(url, password=PASSWORD), PgStore(url, password=PASSWORD)
    try:
        assert other.publish_plan("v0", "{}", 1.0, 1.0) is None  # nobody leads yet
        assert holder.try_lead()
        assert not other.try_lead()
        assert other.publish_plan("v0", "{}", 1.0, 1.0) is None
        seqs = [holder.publish_plan(f"v{i}", "{}", float(i), float(i) + 5) for i in range(12)]
        assert all(seq is not None for seq in seqs)
        kept = other.plans_after(0)
        assert [p.version for p in kept] == [f"v{i}" for i in range(12 - PLANS_KEPT, 12)]
        assert (kept[-1].computed_at_s, kept[-1].active_from_s) == (11.0, 16.0)
        assert other.plans_after(kept[-1].seq) == []
        holder.close()  # the lock goes with the connection (the server notices at once)
        deadline = time.monotonic() + 10
        while not other.try_lead():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert other.publish_plan("v12", "{}", 12.0, 17.0) is not None
    finally:
        holder.close()
        other.close()
