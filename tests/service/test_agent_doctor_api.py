"""The agent's doctor endpoints over a real localhost socket: auth, validation, a run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from netopt.agent.daemon import Agent
from netopt.config import parse_settings
from netopt.config.services import AgentSettings
from tests.service.coordinator_helpers import free_port

TOKEN = "doctor-api-token-0123456789"


async def test_doctor_routes_need_the_token_and_validate(tmp_path: Path) -> None:
    settings = parse_settings(
        f"node: n1\nregion: hk\ncoordinator_url: http://127.0.0.1:{free_port()}\n"
        f"listen: {{host: 127.0.0.1, port: 0}}\nprobe: {{port: {free_port()}}}\n"
        f"spool: {{dir: {tmp_path / 'spool'}}}\n",
        "agent.yaml", "agent", env={},
    )  # fmt: skip
    assert isinstance(settings, AgentSettings)
    agent = Agent(settings, TOKEN)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        for _ in range(100):
            if agent.http_port:
                break
            await asyncio.sleep(0.05)
        base = f"http://127.0.0.1:{agent.http_port}"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as session:
            async with session.post(base + "/v1/doctor/run", json={"peers": []}) as r:
                assert r.status == 401
                assert (await r.json())["error"] == "DoctorRequestError"
            bad = {"Authorization": "Bearer not-the-token-at-all"}
            async with session.post(base + "/v1/doctor/run", json={}, headers=bad) as r:
                assert r.status == 401
            async with session.post(base + "/v1/doctor/run", data=b"{", headers=auth) as r:
                assert r.status == 400
            for body in ({"peers": ["not-an-address"]}, {"peers": [], "master_port": 0}):
                async with session.post(base + "/v1/doctor/run", json=body, headers=auth) as r:
                    assert r.status == 400
            async with session.post(
                base + "/v1/doctor/listen", json={"duration_s": 10_000}, headers=auth
            ) as r:
                assert r.status == 400
            async with session.post(
                base + "/v1/doctor/run", json={"peers": [], "check_mtu": False}, headers=auth
            ) as r:
                assert r.status == 200
                report = await r.json()
            assert report["node"] == "n1"
            assert "host" in report["checks_run"]
            assert any(s["check"] == "ports" for s in report["not_checked"])
    finally:
        stop.set()
        await task
