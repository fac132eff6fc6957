"""A real agent on localhost for service tests (its coordinator is not running)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from netopt.agent.daemon import Agent
from netopt.config import parse_settings
from netopt.config.services import AgentSettings
from tests.service.coordinator_helpers import free_port


@asynccontextmanager
async def running_agent(tmp_path: Path, token: str, extra_yaml: str = "") -> AsyncIterator[Agent]:
    """An agent node ``n1`` in region ``hk`` serving HTTP on a free port until the block ends."""
    settings = parse_settings(
        f"node: n1\nregion: hk\ncoordinator_url: http://127.0.0.1:{free_port()}\n"
        f"listen: {{host: 127.0.0.1, port: 0}}\nprobe: {{port: {free_port()}}}\n"
        f"spool: {{dir: {tmp_path / 'spool'}}}\n{extra_yaml}",
        "agent.yaml", "agent", env={},
    )  # fmt: skip
    assert isinstance(settings, AgentSettings)
    agent = Agent(settings, token)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        for _ in range(600):
            if agent.http_port:
                break
            await asyncio.sleep(0.05)
        assert agent.http_port, "the agent did not start"
        yield agent
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
