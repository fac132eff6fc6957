"""The three aiohttp services refuse a request without the token the same way.

Coordinator, data plane (``netopt serve``) and the agent's doctor routes, each a real
server on localhost: one 401 JSON body ``{"error": "AuthenticationError", "message"}``
and a ``WWW-Authenticate: Bearer`` challenge, from ``webshell.check_bearer``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from netopt.coordinator.app import CoordinatorDeps, create_app
from tests.service.agent_helpers import running_agent
from tests.service.coordinator_helpers import TOKEN as COORDINATOR_TOKEN
from tests.service.coordinator_helpers import FakeClock, make_settings
from tests.service.dataplane_helpers import make_dataset, start

TOKEN = "shell-test-token-0123456789"
WRONG = [{}, {"Authorization": "Bearer not-the-token-at-all"}, {"Authorization": f"Basic {TOKEN}"}]


@asynccontextmanager
async def _coordinator(tmp_path: Path) -> AsyncIterator[str]:
    (tmp_path / "coord").mkdir()
    settings = make_settings(tmp_path / "coord")
    app = create_app(settings, CoordinatorDeps(clock=FakeClock()))
    runner = web.AppRunner(app, shutdown_timeout=1.0)  # as the real server: no lingering wait
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


TOO_BIG = 2 * 1024**2  # body bytes over each service's limit


async def _too_big() -> AsyncIterator[bytes]:
    # Chunked (no Content-Length): each service finds the limit while reading.
    for _ in range(TOO_BIG // 65536):
        yield b" " * 65536


async def _answers(
    base: str, post_route: str, token: str = TOKEN
) -> dict[str, tuple[int, str, bool]]:
    """Status, error name and whether an ``Allow`` came, per kind of bad request; each
    body must be the one error shape."""
    asks: dict[str, tuple[str, str, Any]] = {
        "unknown route": ("GET", f"{base}/no/such/route", None),
        "wrong method": ("PUT", f"{base}{post_route}", b"{}"),
        "malformed": ("POST", f"{base}{post_route}", b'{"not json'),
        "too large": ("POST", f"{base}{post_route}", _too_big),
    }
    seen = {}
    auth = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session:
        for what, (method, url, body) in asks.items():
            data = body() if callable(body) else body
            async with session.request(method, url, data=data, headers=auth) as r:
                assert r.content_type == "application/json", (what, url)
                data = await r.json()
                assert {"error", "message"} <= set(data), (what, url, data)
                assert isinstance(data["error"], str)
                assert isinstance(data["message"], str)
                seen[what] = (r.status, data["error"], "Allow" in r.headers)
    return seen


async def test_all_three_services_answer_bad_requests_with_one_error_shape(
    tmp_path: Path,
) -> None:
    async with _coordinator(tmp_path) as url:
        base = url.removesuffix("/api/v1/nodes")
        coordinator = await _answers(base, "/api/v1/agents/register", COORDINATOR_TOKEN)
    async with _dataplane(tmp_path, TOKEN) as url:
        dataplane = await _answers(url.removesuffix("/v1/datasets/ds"), "/v1/datasets/ds/batch")
    async with running_agent(tmp_path, TOKEN) as agent:
        base = f"http://127.0.0.1:{agent.http_port}"
        doctor = await _answers(base, "/v1/doctor/run")
        async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as r:
            exported = await r.text()
    for seen in (coordinator, dataplane, doctor):
        assert seen["unknown route"] == (404, "NotFound", False)
        assert seen["wrong method"] == (405, "MethodNotAllowed", True)
        assert seen["malformed"][0] == 400  # the name is the service's (RequestInvalid, ...)
        assert seen["too large"][:2] == (413, "RequestTooLarge")
    # The agent's requests are counted by the shell like the coordinator's.
    assert 'netopt_agent_requests_total{method="POST",route="/v1/doctor/run",status="413"}' in (
        exported
    )
