"""Agents against a real coordinator that restarts on an empty database.

Ten agents (real ``Agent`` objects: probe servers, HTTP servers, spools) start
together in one event loop, register with a real coordinator on loopback, then
the coordinator is stopped and a fresh one (new database, same port) takes its
place. Every agent learns it is unknown (404) from its next heartbeat or report
and registers again: those re-registrations must be spread over the heartbeat
interval, not arrive in step.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from pathlib import Path

import aiohttp
import pytest
from coordinator_helpers import AUTH, TOKEN, free_port, make_settings

from netopt.agent.daemon import Agent
from netopt.config import ListenAddress, ProbePlanSettings
from netopt.config.services import AgentSettings, ProbeSettings, SpoolSettings
from netopt.coordinator.server import serve

AGENTS = 10
INTERVAL_S = 3.0


class RunningCoordinator:
    def __init__(self, tmp_path: Path, port: int, database: str) -> None:
        self.settings = make_settings(
            tmp_path, port, database=str(tmp_path / database),
            probe_plan=ProbePlanSettings(per_node_budget=2, bandwidth_tests=False),
        )  # fmt: skip
        self.stop = asyncio.Event()
        self.ready = asyncio.Event()
        self.task = asyncio.create_task(
            serve(self.settings, self.stop, on_ready=lambda h, p: self.ready.set())
        )

    async def close(self) -> None:
        self.stop.set()
        await self.task


async def _registered_at(url: str) -> dict[str, float]:
    async with (
        aiohttp.ClientSession(headers=AUTH) as session,
        session.get(url + "/api/v1/nodes") as response,
    ):
        body = await response.json()
    return {n["node"]: n["registered_at_s"] for n in body["nodes"]}


async def _wait_all_registered(url: str, timeout_s: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            seen = await _registered_at(url)
            if len(seen) == AGENTS:
                return seen
        assert time.monotonic() < deadline, "not every agent registered in time"
        await asyncio.sleep(0.05)


@pytest.fixture
def agents(tmp_path: Path) -> tuple[int, list[Agent]]:
    port = free_port()
    fleet = []
    for i in range(AGENTS):
        settings = AgentSettings(
            node=f"n{i}", region="hk" if i % 2 else "us",
            coordinator_url=f"http://127.0.0.1:{port}", listen=ListenAddress("127.0.0.1", 0),
            heartbeat_interval_s=INTERVAL_S, report_interval_s=INTERVAL_S,
            probe=ProbeSettings(port=free_port(), rate_pps=5, window_s=1),
            spool=SpoolSettings(dir=str(tmp_path / f"spool-{i}")),
        )  # fmt: skip
        fleet.append(Agent(settings, TOKEN, rng=random.Random(1000 + i)))
    return port, fleet


async def test_reregistration_after_a_restart_is_spread(
    tmp_path: Path, agents: tuple[int, list[Agent]]
) -> None:
    port, fleet = agents
    url = f"http://127.0.0.1:{port}"
    first = RunningCoordinator(tmp_path, port, "first.db")
    await first.ready.wait()
    stop = asyncio.Event()
    runs = [asyncio.create_task(agent.run(stop)) for agent in fleet]
    try:
        await _wait_all_registered(url, 20)
        await first.close()
        second = RunningCoordinator(tmp_path, port, "second.db")  # lost state: all unknown
        await second.ready.wait()
        try:
            again = await _wait_all_registered(url, 3 * INTERVAL_S)
        finally:
            stop.set()
            await asyncio.gather(*runs)
            await second.close()
    finally:
        stop.set()
        await asyncio.gather(*runs, return_exceptions=True)
    times_s = sorted(again.values())
    spread_s = times_s[-1] - times_s[0]
    # In step (the old fixed phases) all ten arrive within a few tens of ms. With
    # random phases over a 3 s interval, ten agents spanning < 1 s has a chance of
    # about 4e-4 (range of 10 uniforms).
    assert spread_s > INTERVAL_S / 3, f"re-registrations in step: {times_s}"
    busiest = max(sum(1 for t in times_s if s <= t < s + 0.1) for s in times_s)
    assert busiest <= AGENTS // 2, f"{busiest} agents re-registered within 100 ms: {times_s}"
