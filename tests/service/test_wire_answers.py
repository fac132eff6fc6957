"""A coordinator's answers reach their callers checked: a real hostile server answering
``GET /api/v1/agents/{node}/plan``, ``/api/v1/nodes`` or ``/api/v1/links`` with a
malformed answer gets a ProtocolError naming the field from ``CoordinatorClient.plan``,
``.nodes`` or ``.links``, never a KeyError deep in the agent or a command."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from netopt.errors import ProtocolError
from netopt.wire.answers import MAX_NODES, NodePlanAnswer, NodesAnswer
from netopt.wire.client import CoordinatorClient
from netopt.wire.fields import RequestInvalid

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
async def _answering(body: Any, path: str = "/api/v1/agents/{node}/plan") -> AsyncIterator[str]:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response(body)

    app = web.Application()
    app.router.add_get(path, answer)
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


NODE = {"node": "hk-1", "region": "hk", "state": "live", "host": "198.18.1.10",
        "nics": [{"name": "eth0", "addresses": ["198.18.1.10/24"], "speed_mbps": 10000.0,
                  "mtu": 9000, "added_later": 1}],
        "probe_port": 7471, "data_port": 7470, "health": {"uptime_s": 5}}  # fmt: skip
NODES = {"now_s": 1.7e9, "stale_after_s": 90.0, "nodes": [NODE, {**NODE, "node": "hk-2",
         "state": "left", "nics": []}]}  # fmt: skip
LINK = {
    "src": "hk-1", "dst": "us-1", "src_region": "hk", "dst_region": "us",
    "summary_count": 3, "latest_at_s": 1.7e9,
    "latest": {"taken_at_s": 1.7e9, "rtt_p50_ms": 81.0, "rtt_p99_ms": 90.0,
               "jitter_ms": None, "loss_ratio": 0.0},
    "window": {"rtt_p50_ms": {"p50": 80.5, "p90": 82.0, "p99": 90.0}, "rtt_min_ms": 79.0,
               "jitter_ms": None, "loss_ratio": 0.01, "probes_sent": 100},
    "bandwidth": {"single_stream_bps": 6e7, "aggregate_bps": 8.5e7, "taken_at_s": 1.7e9},
}  # fmt: skip
LINKS = {"window_s": 3600.0, "now_s": 1.7e9, "links": [LINK]}


async def test_nodes_and_links_are_read_into_typed_values() -> None:
    async with _answering(NODES, "/api/v1/nodes") as url, CoordinatorClient(url, TOKEN) as c:
        nodes = await c.nodes()
    assert [(n.node, n.state, n.data_port) for n in nodes.nodes] == [
        ("hk-1", "live", 7470),
        ("hk-2", "left", 7470),
    ]
    assert [n.node for n in nodes.live()] == ["hk-1"]
    assert nodes.nodes[0].nics[0].mtu == 9000
    assert nodes.nodes[0].addresses() == ("198.18.1.10",)
    async with _answering(LINKS, "/api/v1/links") as url, CoordinatorClient(url, TOKEN) as c:
        links = await c.links(window_s=3600)
    (link,) = links.links
    assert (link.src, link.dst, link.summary_count) == ("hk-1", "us-1", 3)
    assert link.window.rtt_p50_ms is not None
    assert link.window.rtt_p50_ms.p50 == 80.5
    assert link.window.jitter_ms is None
    assert (link.bandwidth.single_stream_bps, link.bandwidth.aggregate_bps) == (6e7, 8.5e7)
    assert link.latest is not None
    assert link.latest.rtt_p50_ms == 81.0


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/nodes", {"nodes": "junk"}, "nodes answer.nodes"),
        ("/api/v1/nodes", {"nodes": [{**NODE, "node": 7}]}, "nodes answer.nodes[0].node"),
        ("/api/v1/nodes", {"nodes": [{**NODE, "state": "gone"}]}, "nodes[0].state"),
        ("/api/v1/nodes", {"nodes": [{**NODE, "data_port": 70000}]}, "nodes[0].data_port"),
        ("/api/v1/nodes", {"nodes": [{**NODE, "nics": "junk"}]}, "nodes[0].nics"),
        (
            "/api/v1/nodes",
            {"nodes": [{**NODE, "nics": [{"name": "eth0", "addresses": ["not an address"]}]}]},
            "nodes[0].nics[0].addresses[0]",
        ),
        ("/api/v1/links", {"links": [{**LINK, "dst": "../x"}]}, "links answer.links[0].dst"),
        (
            "/api/v1/links",
            {"links": [{**LINK, "window": {"rtt_p50_ms": {"p50": "fast"}}}]},
            "links[0].window.rtt_p50_ms.p50",
        ),
        (
            "/api/v1/links",
            {"links": [{**LINK, "bandwidth": {"aggregate_bps": -1}}]},
            "links[0].bandwidth.aggregate_bps",
        ),
        (
            "/api/v1/links",
            {"links": [{**LINK, "window": {"loss_ratio": 2}}]},
            "links[0].window.loss_ratio",
        ),
        ("/api/v1/links", {"links": [{**LINK, "latest": []}]}, "links[0].latest"),
        ("/api/v1/links", [], "links answer"),
    ],
)
async def test_malformed_nodes_or_links_are_a_protocol_error_naming_the_field(
    path: str, body: Any, field: str
) -> None:
    async with _answering(body, path) as url, CoordinatorClient(url, TOKEN) as client:
        fetch = client.nodes() if path.endswith("nodes") else client.links()
        with pytest.raises(ProtocolError, match=r"malformed (nodes|links) answer") as caught:
            await fetch
    assert field in str(caught.value)


def test_an_answer_over_the_count_bound_is_refused_before_its_items_are_read() -> None:
    with pytest.raises(RequestInvalid, match=f"at most {MAX_NODES}") as caught:
        NodesAnswer.from_dict({"nodes": [None] * (MAX_NODES + 1)})
    assert caught.value.field == "nodes answer.nodes"
