"""A real coordinator process killed with SIGKILL mid-ingest and restarted on its database."""

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
import pytest
from coordinator_helpers import AUTH, TOKEN, batch, free_port, registration, summary

REPO = Path(__file__).resolve().parents[2]
BATCHES = 60
PER_BATCH = 5


class Coordinator:
    """``python -m netopt coordinator --config FILE`` as a subprocess."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp_path / "coordinator.yaml"
        self.config.write_text(
            "kind: coordinator\n"
            f"listen: {{host: 127.0.0.1, port: {self.port}}}\n"
            f"token: {TOKEN}\n"
            f"database: {tmp_path / 'coordinator.db'}\n"
            "stale_after_s: 60\n"
        )
        self.log = tmp_path / "coordinator.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "NETOPT_LOG_LEVEL": "warning"}
        env.pop("NETOPT_TOKEN", None)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "netopt", "coordinator", "--config", str(self.config)],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    async def wait_ready(self, session: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process is not None
            assert self.process.poll() is None, self.log.read_text()
            try:
                async with session.get(self.url + "/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        pytest.fail(f"coordinator did not start: {self.log.read_text()}")

    def stop(self, sig: signal.Signals) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        code = self.process.wait(timeout=20)
        self.process = None
        return code


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    proc = Coordinator(tmp_path)
    yield proc
    if proc.process is not None:
        proc.process.kill()
        proc.process.wait(timeout=10)


async def post(session: aiohttp.ClientSession, url: str, body: Any) -> dict[str, Any] | None:
    """The JSON answer, or None when the request failed (the coordinator is down)."""
    try:
        async with session.post(url, json=body, headers=AUTH) as response:
            assert response.status == 200, await response.text()
            result: dict[str, Any] = await response.json()
            return result
    except (TimeoutError, aiohttp.ClientError):
        return None


async def test_sigkill_mid_ingest_then_restart_loses_nothing_and_counts_nothing_twice(
    coordinator: Coordinator,
) -> None:
    now = time.time()
    bodies = [
        batch(f"b-{i}", [summary("hk-1", "us-1", now - i * 0.01 - j * 0.001, 80.0 + j)
                         for j in range(PER_BATCH)])
        for i in range(BATCHES)
    ]  # fmt: skip
    ingest = f"{coordinator.url}/api/v1/agents/hk-1/summaries"
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        coordinator.start()
        await coordinator.wait_ready(session)
        for name, region in (("hk-1", "hk"), ("us-1", "us")):
            ack = await post(
                session, f"{coordinator.url}/api/v1/agents/register", registration(name, region)
            )
            assert ack is not None
        acked = set()
        for i in range(BATCHES // 3):
            result = await post(session, ingest, bodies[i])
            assert result is not None
            assert not result["duplicate"]
            acked.add(i)
        # The rest go out from 4 concurrent senders; the coordinator is killed once a few
        # of them are acknowledged, so others are in flight at that moment, and every
        # batch sent after the kill fails.
        queue = list(range(BATCHES // 3, BATCHES))
        results: dict[int, dict[str, Any] | None] = {}

        async def sender() -> None:
            while queue:
                i = queue.pop(0)
                results[i] = await post(session, ingest, bodies[i])

        senders = [asyncio.create_task(sender()) for _ in range(4)]
        deadline = time.monotonic() + 20
        while sum(r is not None for r in results.values()) < 3:
            assert time.monotonic() < deadline, "no batch was acknowledged"
            await asyncio.sleep(0.001)
        assert coordinator.stop(signal.SIGKILL) == -signal.SIGKILL
        await asyncio.gather(*senders)
        acked |= {i for i, r in results.items() if r is not None}
        assert len(acked) < BATCHES, "the kill came too late to interrupt anything"

        await asyncio.sleep(1.0)
        coordinator.start()
        await coordinator.wait_ready(session)
        # The agent replays everything it holds: unacknowledged batches and, to be
        # sure, acknowledged ones too. Acknowledged ones must all be duplicates.
        replayed = {}
        for i, body in enumerate(bodies):
            result = await post(session, ingest, body)
            assert result is not None
            replayed[i] = result
        assert all(replayed[i]["duplicate"] for i in acked)
        newly = sum(r["accepted"] for r in replayed.values())
        assert newly == PER_BATCH * sum(1 for r in replayed.values() if not r["duplicate"])

        async with session.get(f"{coordinator.url}/api/v1/links?window_s=3600", headers=AUTH) as r:
            links = (await r.json())["links"]
        async with session.get(
            f"{coordinator.url}/api/v1/links/hk-1/us-1/history?window_s=3600&limit=5000",
            headers=AUTH,
        ) as r:
            history = (await r.json())["summaries"]
        async with session.get(f"{coordinator.url}/api/v1/nodes", headers=AUTH) as r:
            nodes = {n["node"] for n in (await r.json())["nodes"]}
    assert nodes == {"hk-1", "us-1"}
    (link,) = links
    assert link["summary_count"] == BATCHES * PER_BATCH
    taken = sorted(s["taken_at_s"] for s in history)
    expected = sorted(s["taken_at_s"] for b in bodies for s in b["summaries"])
    assert taken == pytest.approx(expected)
    assert coordinator.stop(signal.SIGTERM) == 0, coordinator.log.read_text()
