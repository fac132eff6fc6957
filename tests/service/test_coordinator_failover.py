"""Two real coordinator processes on one PostgreSQL; one is killed with SIGKILL while
agents (the agent's own reporter and spool, with both addresses) keep reporting:
ingest goes on through the other, every summary is stored exactly once, and the
survivor is the elected leader afterwards. Also killed mid-way through region
sharing: ``netopt sync`` processes finish through the other replica, each chunk
crossing the border once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from aiohttp import web
from coordinator_helpers import TOKEN, registration
from dataplane_helpers import CPU, FAST, check_tree
from dataplane_helpers import start as start_origin
from replica_helpers import REPO, Replica, two_replicas

from netopt.agent.metrics import AgentMetrics
from netopt.agent.reporter import NeedsRegistration, Reporter
from netopt.agent.spool import Spool
from netopt.cache.peerserve import CachedDatasets
from netopt.cache.shared import SharingOptions
from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import SyncRequest, run_sync
from netopt.dataplane.client import ClientOptions
from netopt.dataplane.server import ServeSettings, ServeStats
from netopt.dataplane.server import create_app as create_dataplane
from netopt.dataplane.server import start_server as start_dataplane
from netopt.transfer.manifest import Manifest
from netopt.wire.client import CoordinatorClient
from netopt.wire.schema import LinkSummary, Registration, RttFigures
from tests.pgserver import PASSWORD, PgServer

AGENTS = 16
ROUNDS = 24
PER_ROUND = 8
KILL_AFTER_ROUND = 8


@pytest.fixture
def replicas(tmp_path: Path, postgres_server: PgServer) -> Iterator[tuple[str, list[Replica]]]:
    database = postgres_server.new_database()
    with two_replicas(tmp_path, database) as started:
        yield database, started


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


@dataclass
class _Region:
    """The sharing world around two replicas: an origin and each node's cache served to
    its peers by the data plane (in this process, so the origin's per-chunk counts are
    read), registered through replica a."""

    origin_url: str
    origin_stats: ServeStats
    manifest: Manifest
    runners: list[web.AppRunner]

    async def cleanup(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


async def _start_region(tmp_path: Path, a: Replica, nodes: dict[str, str]) -> _Region:
    origin, origin_port, stats, manifest = await start_origin(
        tmp_path / "origin" / "ds", token=TOKEN
    )
    world = _Region(f"netopt://127.0.0.1:{origin_port}/ds", stats, manifest, [origin])
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
            for node, region in nodes.items():
                (tmp_path / node / "cache").mkdir(parents=True)
                app = create_dataplane(
                    ServeSettings(token=TOKEN, worker_threads=2),
                    CachedDatasets(tmp_path / node / "cache"), CPU,
                )  # fmt: skip
                runner, port = await start_dataplane(app, "127.0.0.1", 0)
                world.runners.append(runner)
                body = {**registration(node, region), "data_port": port}
                async with s.post(a.url + "/api/v1/agents/register", json=body) as response:
                    assert response.status == 200, await response.text()
    except BaseException:
        await world.cleanup()
        raise
    return world


async def test_kill_9_of_the_replica_a_shared_sync_started_on(
    tmp_path: Path, replicas: tuple[str, list[Replica]]
) -> None:
    """Three ``netopt sync`` processes of region hk share through the catalogue, their
    coordinator list starting with replica a; a is killed with SIGKILL mid-sync. Their
    sessions and leases live in PostgreSQL, so they finish through b: every tree byte
    for byte, each chunk fetched from the origin by hk at most once, none from the
    other region's node, and every session ended (the last calls went to b)."""
    _, (a, b) = replicas
    root = tmp_path / "origin" / "ds"
    files = {"big.bin": os.urandom(6 << 20), "text/small.txt": b"small\n" * 1000}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(a.wait_ready(session), b.wait_ready(session))
    hk = ["hk-1", "hk-2", "hk-3"]
    world = await _start_region(tmp_path, a, {**dict.fromkeys(hk, "hk"), "us-1": "us"})
    procs: list[asyncio.subprocess.Process] = []
    try:
        chunks = set(world.manifest.unique_chunks())
        # The other region holds everything first (through replica a's catalogue).
        us = await run_sync(
            SyncRequest(
                source=world.origin_url, dest=str(tmp_path / "us-1" / "data"),
                cache_dir=str(tmp_path / "us-1" / "cache"),
                source_options=SourceOptions(client=ClientOptions(token=TOKEN), client_cpu=CPU),
                sync_options=FAST, sharing=SharingOptions(a.url, TOKEN, "us-1"),
            )
        )  # fmt: skip
        assert us.sharing is not None
        assert us.sharing["chunks_from_source"] == len(chunks)
        before = Counter(world.origin_stats.chunk_requests)
        assert set(before) == chunks
        assert set(before.values()) == {1}

        env = {**os.environ, "NETOPT_TOKEN": TOKEN}
        for node in hk:
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "netopt", "sync", world.origin_url,
                    str(tmp_path / node / "data"), "--json", "--coordinator", f"{a.url},{b.url}",
                    "--node", node, "--cache-dir", str(tmp_path / node / "cache"),
                    "--rate-limit-mbps", "8", "--retry-window-s", "20",
                    cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            )  # fmt: skip
        waits = [asyncio.ensure_future(p.communicate()) for p in procs]

        async def hk_held(session: aiohttp.ClientSession) -> int:
            async with session.get(b.url + "/api/v1/datasets") as response:
                versions = (await response.json())["versions"]
            return sum(h["chunks"] for v in versions for h in v["holders"] if h["node"] in hk)

        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
            deadline = time.monotonic() + 20
            while await hk_held(s) < len(chunks) // 3:  # seen through b: it is in PostgreSQL
                assert not any(w.done() for w in waits), "a sync ended before the kill"
                assert time.monotonic() < deadline, "the syncs made no progress"
                await asyncio.sleep(0.05)
            assert not any(w.done() for w in waits), "a sync ended before the kill"
            a.kill()  # mid-sync: every session and lease was opened through a
            killed_at_s = time.monotonic()
            outputs = await asyncio.wait_for(asyncio.gather(*waits), 60)
            finished_s = time.monotonic() - killed_at_s
            for node, proc, (out, err) in zip(hk, procs, outputs, strict=True):
                assert proc.returncode == 0, (node, out[-2000:], err[-2000:])
            reports = [json.loads(out) for out, _ in outputs]
            async with s.get(b.url + "/api/v1/datasets") as response:
                (version,) = (await response.json())["versions"]
        assert a.process.poll() == -signal.SIGKILL
        for node in hk:
            check_tree(tmp_path / node / "data", files)
        crossings = Counter(world.origin_stats.chunk_requests)
        crossings.subtract(before)
        assert set(crossings) == chunks
        assert max(crossings.values()) <= 1, "a chunk crossed the border twice for hk"
        shared = [(r["sharing"], err[-1500:]) for r, (_, err) in zip(reports, outputs, strict=True)]
        assert sum(r["chunks_from_source"] for r, _ in shared) == len(chunks), shared
        # Each started empty: every chunk came from a peer or SOURCE (a peer's chunks may
        # be fetched again when a batch is retried: in-region bytes, not a crossing).
        assert all(
            r["chunks_from_peers"] + r["chunks_from_source"] >= len(chunks) for r, _ in shared
        ), shared
        assert all(r["peers_excluded"] == [] for r, _ in shared), shared
        assert {h["node"]: h["chunks"] for h in version["holders"]} == dict.fromkeys(
            [*hk, "us-1"], len(chunks)
        )
        assert version["sessions"] == []  # ended by calls that only b could answer
        assert version["leases"] == 0
        from_peers = sum(r["chunks_from_peers"] for r, _ in shared)
        print(
            f"{len(chunks)} chunks, each crossed once, {from_peers} from peers;"
            f" syncs done {finished_s:.1f} s after the kill"
        )
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await world.cleanup()
