"""Malformed bodies to every POST route of the coordinator, the agent and the data plane
get a 4xx JSON error, never a 5xx: an integer of 4,301 digits (over Python's limit for
int parsing), JSON nested 100,000 (and 30,000) deep, and one 3 MB line."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from netopt.coordinator.server import serve
from tests.service.agent_helpers import running_agent
from tests.service.coordinator_helpers import AUTH, make_settings
from tests.service.dataplane_helpers import make_dataset, start

AGENT_TOKEN = "malformed-test-token-0123456789"
BODIES = {
    "4301-digit integer": b'{"node": ' + b"7" * 4301 + b"}",
    "4301-digit integer in a list": b'{"chunks": [' + b"1" * 4301 + b"]}",
    "nested 100k deep": b"[" * 100_000 + b"]" * 100_000,
    "nested 30k deep": b'{"a": ' + b"[" * 30_000 + b"]" * 30_000 + b"}",
    "3 MB line": b"a" * (3 * 1024 * 1024) + b"\n",
}
COORDINATOR_POSTS = [
    "/api/v1/agents/register",
    "/api/v1/agents/n1/heartbeat",
    "/api/v1/agents/n1/summaries",
    "/api/v1/placements",
    f"/api/v1/datasets/ds/versions/{'a' * 64}/route",
]


async def _refused_with_json(base: str, paths: list[str], headers: dict[str, str]) -> None:
    async with aiohttp.ClientSession(headers=headers) as session:
        for path in paths:
            for what, body in BODIES.items():
                async with session.post(base + path, data=io.BytesIO(body)) as resp:
                    raw = await resp.read()
                    where = f"{path} with {what}: {resp.status} {raw[:200]!r}"
                    assert 400 <= resp.status < 500, where
                    assert resp.content_type == "application/json", where
                    assert json.loads(raw)["error"], where


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[str]:
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(make_settings(tmp_path), stop, on_ready=lambda _h, p: ready.set_result(p))
    )
    try:
        yield f"http://127.0.0.1:{await asyncio.wait_for(ready, 30)}"
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_coordinator_post_routes(coordinator: str) -> None:
    await _refused_with_json(coordinator, COORDINATOR_POSTS, AUTH)


async def test_agent_post_routes(tmp_path: Path) -> None:
    async with running_agent(
        tmp_path, AGENT_TOKEN, f"cache: {{dir: {tmp_path / 'cache'}}}\n"
    ) as agent:
        paths = ["/v1/doctor/listen", "/v1/doctor/run", "/v1/datasets/ds/batch"]
        paths.append("/v1/datasets/ds/stream")
        auth = {"Authorization": f"Bearer {AGENT_TOKEN}"}
        await _refused_with_json(f"http://127.0.0.1:{agent.http_port}", paths, auth)


async def test_dataplane_post_routes(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port, _, _ = await start(tmp_path / "src", token=None)
    try:
        paths = ["/v1/datasets/ds/batch?level=0", "/v1/datasets/ds/stream?level=0"]
        await _refused_with_json(f"http://127.0.0.1:{port}", paths, {})
    finally:
        await runner.cleanup()
