"""Two real coordinator processes on one PostgreSQL; one is killed with SIGKILL while
agents (the agent's own reporter and spool, with both addresses) keep reporting:
ingest goes on through the other, every summary is stored exactly once, and the
survivor is the elected leader afterwards."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from coordinator_helpers import TOKEN, free_port, registration

from netopt.agent.metrics import AgentMetrics
from netopt.agent.reporter import NeedsRegistration, Reporter
from netopt.agent.spool import Spool
from netopt.wire.client import CoordinatorClient
from netopt.wire.schema import LinkSummary, Registration, RttFigures
from tests.pgserver import PASSWORD, PgServer

REPO = Path(__file__).resolve().parents[2]
AGENTS = 16
ROUNDS = 24
PER_ROUND = 8
KILL_AFTER_ROUND = 8


class Replica:
    """``python -m netopt coordinator`` on a PostgreSQL URL (password from PGPASSWORD)."""

    def __init__(self, tmp_path: Path, name: str, database: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp_path / f"{name}.yaml"
        self.config.write_text(
            f"kind: coordinator\nlisten: {{host: 127.0.0.1, port: {self.port}}}\n"
            f"token: {TOKEN}\ndatabase: {database}\nstale_after_s: 600\n"
        )
        self.log = tmp_path / f"{name}.log"
        env = {**os.environ, "PGPASSWORD": PASSWORD}
        env.pop("NETOPT_TOKEN", None)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "netopt", "coordinator", "--config", str(self.config)],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    async def wait_ready(self, session: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            try:
                async with session.get(self.url + "/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        pytest.fail(f"replica did not become ready: {self.log.read_text()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=20)


@pytest.fixture
def replicas(tmp_path: Path, postgres_server: PgServer) -> Iterator[tuple[str, list[Replica]]]:
    database = postgres_server.new_database()
    started = [Replica(tmp_path, "a", database)]
    try:
        started.append(Replica(tmp_path, "b", database))
        yield database, started
    finally:
        for replica in started:
            replica.kill()


def _summary(node: str, index: int) -> LinkSummary:
    rtt = RttFigures(9.0, 10.0, 10.0, 11.0, 12.0, 13.0)
    return LinkSummary(node, f"peer-{index % 4}", time.time(), 10.0, "udp", 100, 99, rtt, 0.5,
                       loss_ratio=0.01)  # fmt: skip


async def test_kill_9_of_one_replica_loses_and_duplicates_nothing(
    tmp_path: Path, replicas: tuple[str, list[Replica]]
) -> None:
    database, (a, b) = replicas
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(a.wait_ready(session), b.wait_ready(session))
    killed = asyncio.Event()
    acks_after_kill: list[float] = []
    killed_at_s = [0.0]

    async def agent(i: int) -> tuple[int, int]:
        node = f"n-{i}"
        urls = [a.url, b.url] if i % 2 == 0 else [b.url, a.url]  # half start on each
        reporter = Reporter(node, Spool(tmp_path / f"spool-{i}", 1 << 20), AgentMetrics())
        async with CoordinatorClient(urls, TOKEN, timeout_s=5) as client:
            reg = Registration.from_dict(registration(node, f"r{i % 2}"))
            await client.register(reg)
            for round_index in range(ROUNDS):
                for k in range(PER_ROUND):
                    reporter.add(_summary(node, k))
                await reporter.spool_pending()
                try:
                    sent = (await reporter.flush(client)).sent
                except NeedsRegistration:
                    await client.register(reg)
                    sent = 0
                if sent and killed.is_set() and urls[0] == a.url:  # moved over to b
                    acks_after_kill.append(time.monotonic() - killed_at_s[0])
                if i == 0 and round_index == KILL_AFTER_ROUND:
                    a.kill()  # SIGKILL: no goodbye, connections cut mid-request
                    killed_at_s[0] = time.monotonic()
                    killed.set()
                await asyncio.sleep(0.05)
            for _ in range(50):  # what is still spooled goes to whichever replica answers
                if not len(reporter.spool):
                    break
                await reporter.flush(client)
                await asyncio.sleep(0.1)
            return reporter.produced, len(reporter.spool)

    results = await asyncio.gather(*(agent(i) for i in range(AGENTS)))
    assert a.process.poll() == -signal.SIGKILL
    assert [left for _, left in results] == [0] * AGENTS
    produced = sum(p for p, _ in results)
    assert produced == AGENTS * ROUNDS * PER_ROUND
    assert acks_after_kill, "no agent of the killed replica was acknowledged after the kill"
    with psycopg.connect(database, password=PASSWORD) as db:
        stored = db.execute("SELECT count(*) FROM summaries").fetchone()
        batches = db.execute("SELECT count(*), sum(summary_count) FROM batches").fetchone()
        distinct = db.execute(
            "SELECT count(*) FROM (SELECT DISTINCT node, batch_id FROM summaries) AS d"
        ).fetchone()
    assert stored == (produced,)  # 0 lost, 0 stored twice
    assert batches is not None
    assert distinct == (batches[0],)
    assert int(batches[1]) == produced
    # The once-only work moved too: the survivor holds the leader lock (it asks every 2 s).
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 15
        while True:
            async with session.get(b.url + "/readyz") as response:
                if (await response.json())["leader"]:
                    break
            assert time.monotonic() < deadline, "the surviving replica never became the leader"
            await asyncio.sleep(0.2)
    print(f"moved-over ack {min(acks_after_kill):.2f} s after the kill; {produced} stored once")


async def test_postgresql_restart_under_load_spools_then_stores_everything_once(
    tmp_path: Path, replicas: tuple[str, list[Replica]], postgres_server: PgServer
) -> None:
    """PostgreSQL stopped (pg_ctl stop -m fast) and started while agents report through
    both replicas: both say not-ready on /readyz while it is down, agents keep their
    batches in the spool, and once it is back every summary is stored exactly once and
    a replica leads again."""
    database, (a, b) = replicas
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(a.wait_ready(session), b.wait_ready(session))
    agents = 8
    stop_producing = asyncio.Event()
    spooled_while_down: list[int] = []
    down = asyncio.Event()

    async def agent(i: int) -> tuple[int, int]:
        node = f"r-{i}"
        urls = [a.url, b.url] if i % 2 == 0 else [b.url, a.url]
        reporter = Reporter(node, Spool(tmp_path / f"restart-spool-{i}", 1 << 20), AgentMetrics())
        async with CoordinatorClient(urls, TOKEN, timeout_s=5) as client:
            reg = Registration.from_dict(registration(node, f"r{i % 2}"))
            await client.register(reg)
            while not stop_producing.is_set():
                for k in range(4):
                    reporter.add(_summary(node, k))
                await reporter.spool_pending()
                try:
                    result = await reporter.flush(client)
                    if down.is_set() and not result.reachable:
                        spooled_while_down.append(len(reporter.spool))
                except NeedsRegistration:
                    await client.register(reg)
                await asyncio.sleep(0.1)
            for _ in range(100):  # the spool drains to whichever replica answers
                if not len(reporter.spool):
                    break
                try:
                    await reporter.flush(client)
                except NeedsRegistration:
                    await client.register(reg)
                await asyncio.sleep(0.1)
            return reporter.produced, len(reporter.spool)

    async def readyz(session: aiohttp.ClientSession, replica: Replica) -> tuple[int, Any]:
        async with session.get(replica.url + "/readyz") as response:
            return response.status, await response.json()

    async def until(session: aiohttp.ClientSession, status: int, within_s: float) -> list[Any]:
        deadline = time.monotonic() + within_s
        while True:
            answers = [await readyz(session, r) for r in (a, b)]
            if all(s == status for s, _ in answers):
                return [body for _, body in answers]
            assert time.monotonic() < deadline, f"replicas never all {status}: {answers}"
            await asyncio.sleep(0.1)

    async def restart() -> None:
        async with aiohttp.ClientSession() as session:
            await asyncio.sleep(1.0)  # under load first
            await asyncio.to_thread(postgres_server.ctl, "stop", "-m", "fast")
            down.set()
            try:
                bodies = await until(session, 503, 10)
                assert all(
                    isinstance(body, dict) and body["error"] == "NotReady" for body in bodies
                ), bodies
                await asyncio.sleep(1.5)  # agents keep producing into their spools
            finally:
                await asyncio.to_thread(postgres_server.ctl, "start")
                down.clear()
            await until(session, 200, 20)
            await asyncio.sleep(1.0)  # under load again
            stop_producing.set()
            deadline = time.monotonic() + 15
            while not any([(await readyz(session, r))[1]["leader"] for r in (a, b)]):
                assert time.monotonic() < deadline, "no replica leads after the restart"
                await asyncio.sleep(0.2)

    started = time.monotonic()
    results, _ = await asyncio.gather(asyncio.gather(*(agent(i) for i in range(agents))), restart())
    assert max(spooled_while_down, default=0) > 0, "no agent spooled while down"
    assert [left for _, left in results] == [0] * agents
    produced = sum(p for p, _ in results)
    with psycopg.connect(database, password=PASSWORD) as db:
        stored = db.execute("SELECT count(*) FROM summaries").fetchone()
        batches = db.execute("SELECT count(*), sum(summary_count) FROM batches").fetchone()
        distinct = db.execute(
            "SELECT count(*) FROM (SELECT DISTINCT node, batch_id FROM summaries) AS d"
        ).fetchone()
    assert stored == (produced,)  # 0 lost, 0 stored twice
    assert batches is not None
    assert distinct == (batches[0],)
    assert int(batches[1]) == produced
    print(f"{produced} summaries stored once across a restart; {time.monotonic() - started:.1f} s")
