"""The agent's doctor endpoints over a real localhost socket: auth, validation, a run."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.service.agent_helpers import running_agent

TOKEN = "doctor-api-token-0123456789"


async def test_doctor_routes_need_the_token_and_validate(tmp_path: Path) -> None:
    async with running_agent(tmp_path, TOKEN) as agent:
        base = f"http://127.0.0.1:{agent.http_port}"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as session:
            async with session.post(base + "/v1/doctor/run", json={"peers": []}) as r:
                assert r.status == 401
                assert (await r.json())["error"] == "AuthenticationError"
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
