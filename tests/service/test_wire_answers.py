"""A coordinator's plan reaches the agent checked: a real hostile server answering
``GET /api/v1/agents/{node}/plan`` with a malformed plan gets a ProtocolError naming
the field from ``CoordinatorClient.plan``, never a KeyError deep in the agent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from netopt.errors import ProtocolError
from netopt.wire.answers import NodePlanAnswer
from netopt.wire.client import CoordinatorClient

TOKEN = "wire-answers-token-0123456789"
PEER = {"node": "eu-1", "region": "eu", "host": "198.18.1.10", "probe_port": 7471,
        "data_port": 7470}  # fmt: skip
GOOD = {
    "node": "hk-1",
    "plan_version": "abc123",
    "probes": [{**PEER, "kind": "cross-border"}],
    "bandwidth_cycle_s": 600.0,
    "bandwidth_slot_s": 15.0,
    "bandwidth_tests": [{**PEER, "offset_s": 30.0}],
    "added_by_a_newer_coordinator": True,
}


@asynccontextmanager
async def _answering(body: Any) -> AsyncIterator[str]:
    async def plan(request: web.Request) -> web.Response:
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/api/v1/agents/{node}/plan", plan)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_a_plan_is_read_into_typed_values() -> None:
    async with _answering(GOOD) as url, CoordinatorClient(url, TOKEN) as client:
        plan = await client.plan("hk-1")
    assert isinstance(plan, NodePlanAnswer)
    assert plan.plan_version == "abc123"
    assert [(p.node, p.host, p.probe_port) for p in plan.probes] == [("eu-1", "198.18.1.10", 7471)]
    assert [(t.peer.node, t.offset_s) for t in plan.bandwidth_tests] == [("eu-1", 30.0)]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**GOOD, "probes": [{**PEER, "probe_port": None}]}, "plan.probes[0].probe_port"),
        ({**GOOD, "probes": [{**PEER, "probe_port": "7471"}]}, "plan.probes[0].probe_port"),
        ({**GOOD, "probes": [{**PEER, "node": "../../etc"}]}, "plan.probes[0].node"),
        ({**GOOD, "probes": [PEER] * 5000}, "plan.probes"),
        ({**GOOD, "bandwidth_tests": [{**PEER, "offset_s": -1}]}, "offset_s"),
        ({**GOOD, "bandwidth_cycle_s": "soon"}, "plan.bandwidth_cycle_s"),
        ([], "plan"),
    ],
)
async def test_a_malformed_plan_is_a_protocol_error_naming_the_field(body: Any, field: str) -> None:
    async with _answering(body) as url, CoordinatorClient(url, TOKEN) as client:
        with pytest.raises(ProtocolError, match="malformed plan") as caught:
            await client.plan("hk-1")
    assert field in str(caught.value)
