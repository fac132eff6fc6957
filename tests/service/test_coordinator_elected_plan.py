"""Replicas on one PostgreSQL serve the plan the elected replica computed: after
registrations through one replica the other serves the same plan, at no moment do the
two grant a node two overlapping bandwidth tests, and when the leader is killed another
replica computes the plan."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from aiohttp.test_utils import TestClient
from coordinator_helpers import AUTH, FakeClock, make_settings, registration
from replica_helpers import Replica, two_replicas

from netopt.config import ProbePlanSettings
from netopt.coordinator.app import COORDINATOR, CoordinatorDeps, create_app
from tests.pgserver import PASSWORD, PgServer

MakeClient = Callable[[Any], Awaitable[TestClient[Any, Any]]]
FOLLOW_S = 0.1
NODES = [(f"{region}-{i}", region) for i in range(6) for region in ("hk", "us")]


def _conflicts(first: dict[str, Any], second: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Pairs of different bandwidth tests, one from each plan, that hold one node at once.

    Tests of plans with different cycles meet sooner or later: a conflict too.
    """
    held: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
    for plan in (first, second):
        for t in plan["bandwidth_tests"]:
            grant = (t["src"], t["dst"], t["offset_s"], plan["bandwidth_cycle_s"],
                     plan["bandwidth_slot_s"])  # fmt: skip
            held[t["src"]].add(grant)
            held[t["dst"]].add(grant)
    found = []
    for node, grants in held.items():
        ordered = sorted(grants)
        for i, a in enumerate(ordered):
            for b in ordered[i + 1 :]:
                if a[3] != b[3] or abs(a[2] - b[2]) < max(a[4], b[4]):
                    found.append((node, a, b))
    return found


def _members(plan: dict[str, Any]) -> set[str]:
    return {n for p in plan["probes"] for n in (p["src"], p["dst"])}


async def _plan(client: TestClient[Any, Any]) -> dict[str, Any]:
    response = await client.get("/api/v1/plan", headers=AUTH)
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def test_the_other_replica_serves_the_leaders_plan_never_two_overlapping_slots(
    aiohttp_client: MakeClient, tmp_path: Path, postgres_server: PgServer
) -> None:
    url = postgres_server.new_database()
    (tmp_path / "pw").write_text(PASSWORD)
    clock = FakeClock()  # both replicas read one clock: a sample of both is one instant
    settings = make_settings(
        tmp_path, database=url, database_password_file=str(tmp_path / "pw"),
        probe_plan=ProbePlanSettings(per_node_budget=8, bandwidth_slot_s=15.0),
    )  # fmt: skip
    deps = CoordinatorDeps(clock=clock, heartbeat_flush_s=FOLLOW_S)
    a = await aiohttp_client(create_app(settings, deps))
    b = await aiohttp_client(create_app(settings, deps))
    assert a.app[COORDINATOR].leader
    assert not b.app[COORDINATOR].leader

    samples = differing = 0

    async def sample() -> tuple[dict[str, Any], dict[str, Any]]:
        nonlocal samples, differing
        pa, pb = await _plan(a), await _plan(b)  # the clock does not move in between
        assert _conflicts(pa, pb) == [], (pa["plan_version"], pb["plan_version"])
        samples += 1
        differing += pa["plan_version"] != pb["plan_version"]
        return pa, pb

    for name, region in NODES:  # every registration through replica a
        response = await a.post("/api/v1/agents/register", json=registration(name, region),
                                headers=AUTH)  # fmt: skip
        assert response.status == 200
        for _ in range(4):
            await sample()
            clock.now_s += 0.05
            await asyncio.sleep(FOLLOW_S / 2)
    for _ in range(200):
        pa, pb = await sample()
        if pa == pb and _members(pa) == {n for n, _ in NODES}:
            break
        clock.now_s += 0.05
        await asyncio.sleep(FOLLOW_S / 2)
    else:
        pytest.fail(f"replica b never served the full plan: {pb['plan_version']}")
    assert pa["bandwidth_tests"], "the plan holds bandwidth tests: the check saw some"
    mine = await (await b.get("/api/v1/agents/us-3/plan", headers=AUTH)).json()
    assert mine["plan_version"] == pa["plan_version"]
    with psycopg.connect(url, password=PASSWORD) as db:
        newest = db.execute("SELECT version FROM probe_plans ORDER BY seq DESC LIMIT 1")
        assert newest.fetchone() == (pa["plan_version"],)
    print(f"{samples} samples, {differing} at a switch between plans, none overlapping")


@pytest.fixture
def replicas(tmp_path: Path, postgres_server: PgServer) -> Iterator[tuple[str, list[Replica]]]:
    database = postgres_server.new_database()
    with two_replicas(tmp_path, database) as started:
        yield database, started


async def _until_plan_covers(
    session: aiohttp.ClientSession, replica: Replica, nodes: set[str], timeout_s: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        async with session.get(replica.url + "/api/v1/plan", headers=AUTH) as response:
            plan: dict[str, Any] = await response.json()
        if _members(plan) == nodes:
            return plan
        assert time.monotonic() < deadline, f"{replica.url} never planned {sorted(nodes)}"
        await asyncio.sleep(0.2)


async def test_the_leader_killed_another_replica_computes_the_plan(
    replicas: tuple[str, list[Replica]],
) -> None:
    database, replicas_started = replicas
    async with aiohttp.ClientSession() as session:
        leading = []
        for replica in replicas_started:
            await replica.wait_ready(session)
            async with session.get(replica.url + "/readyz") as response:
                leading.append((await response.json())["leader"])
        assert sorted(leading) == [False, True]
        leader, other = replicas_started if leading[0] else reversed(replicas_started)
        first = {n for n, _ in NODES[:6]}
        for name, region in NODES[:6]:  # through the other: the leader follows the registry
            body = registration(name, region)
            async with session.post(other.url + "/api/v1/agents/register", json=body,
                                    headers=AUTH) as response:  # fmt: skip
                assert response.status == 200
        # Follows every 2 s, activation 5 s after storing: well inside 20 s.
        before = await _until_plan_covers(session, other, first, 20)
        assert before == await _until_plan_covers(session, leader, first, 1)

        leader.kill()  # SIGKILL: its connection, and with it the leader lock, ends
        for name, region in NODES[6:8]:
            body = registration(name, region)
            async with session.post(other.url + "/api/v1/agents/register", json=body,
                                    headers=AUTH) as response:  # fmt: skip
                assert response.status == 200
        everyone = first | {n for n, _ in NODES[6:8]}
        after = await _until_plan_covers(session, other, everyone, 30)
        async with session.get(other.url + "/readyz") as response:
            assert (await response.json())["leader"] is True
    assert after["plan_version"] != before["plan_version"]
    with psycopg.connect(database, password=PASSWORD) as db:
        rows = db.execute("SELECT version FROM probe_plans ORDER BY seq DESC LIMIT 1")
        assert rows.fetchone() == (after["plan_version"],)
