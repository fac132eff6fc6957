"""The three aiohttp services refuse a request without the token the same way.

Coordinator, data plane (``netopt serve``) and the agent's doctor routes, each a real
server on localhost: one 401 JSON body ``{"error": "AuthenticationError", "message"}``
and a ``WWW-Authenticate: Bearer`` challenge, from ``webshell.check_bearer``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

from netopt.coordinator.app import CoordinatorDeps, create_app
from tests.service.agent_helpers import running_agent
from tests.service.coordinator_helpers import FakeClock, make_settings
from tests.service.dataplane_helpers import make_dataset, start

TOKEN = "shell-test-token-0123456789"
WRONG = [{}, {"Authorization": "Bearer not-the-token-at-all"}, {"Authorization": f"Basic {TOKEN}"}]


@asynccontextmanager
async def _coordinator(tmp_path: Path) -> AsyncIterator[str]:
    (tmp_path / "coord").mkdir()
    settings = make_settings(tmp_path / "coord")
    app = create_app(settings, CoordinatorDeps(clock=FakeClock()))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/api/v1/nodes"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def _dataplane(tmp_path: Path, token: str) -> AsyncIterator[str]:
    make_dataset(tmp_path / "data")
    runner, port, _, _ = await start(tmp_path / "data", token=token)
    try:
        yield f"http://127.0.0.1:{port}/v1/datasets/ds"
    finally:
        await runner.cleanup()


async def _refusals(url: str, method: str) -> list[tuple[int, set[str], str, str]]:
    seen = []
    async with aiohttp.ClientSession() as session:
        for headers in WRONG:
            async with session.request(method, url, headers=headers, json={}) as r:
                body = await r.json()
                seen.append(
                    (r.status, set(body), body["error"], r.headers.get("WWW-Authenticate", ""))
                )
    return seen


async def test_all_three_services_refuse_with_one_error_shape(tmp_path: Path) -> None:
    async with _coordinator(tmp_path) as url:
        coordinator = await _refusals(url, "GET")
    async with _dataplane(tmp_path, TOKEN) as url:
        dataplane = await _refusals(url, "GET")
    async with running_agent(tmp_path, TOKEN) as agent:
        doctor = await _refusals(f"http://127.0.0.1:{agent.http_port}/v1/doctor/run", "POST")
    for seen in (coordinator, dataplane, doctor):
        for status, keys, name, challenge in seen:
            assert status == 401
            assert keys == {"error", "message"}
            assert name == "AuthenticationError"
            assert challenge.startswith("Bearer")
