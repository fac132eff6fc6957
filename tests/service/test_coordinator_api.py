"""The coordinator's API over a real localhost socket (pytest-aiohttp's test server)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from coordinator_helpers import (
    AUTH,
    T0,
    TOKEN,
    FakeClock,
    batch,
    make_settings,
    registration,
    summary,
)

from netopt.config import CoordinatorSettings
from netopt.coordinator.app import CoordinatorDeps, create_app

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[..., Awaitable[Client]]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def start(
    aiohttp_client: MakeClient, tmp_path: Path, clock: FakeClock
) -> Callable[..., Awaitable[Client]]:
    async def start(settings: CoordinatorSettings | None = None) -> Client:
        app = create_app(settings or make_settings(tmp_path), CoordinatorDeps(clock=clock))
        return await aiohttp_client(app)

    return start


async def call(client: Client, method: str, path: str, body: Any = None, status: int = 200) -> Any:
    response = await client.request(method, path, json=body, headers=AUTH)
    data = await response.json()
    assert response.status == status, data
    return data


async def register(client: Client, *nodes: tuple[str, str]) -> None:
    for name, region in nodes:
        await call(client, "POST", "/api/v1/agents/register", registration(name, region))


async def test_register_heartbeat_liveness_and_leave(start: Any, clock: FakeClock) -> None:
    client = await start()
    ack = await call(
        client, "POST", "/api/v1/agents/register", registration("hk-1", "hk", "198.18.0.1")
    )
    assert ack["heartbeat_interval_s"] == pytest.approx(10.0)
    assert ack["stale_after_s"] == 30.0
    await register(client, ("hk-2", "hk"))
    nodes = {n["node"]: n for n in (await call(client, "GET", "/api/v1/nodes"))["nodes"]}
    assert nodes["hk-1"]["state"] == "live"
    assert nodes["hk-1"]["host"] == "198.18.0.1"
    assert nodes["hk-1"]["nics"][0]["mtu"] == 1500

    clock.now_s += 25
    beat = await call(client, "POST", "/api/v1/agents/hk-1/heartbeat", {"uptime_s": 25.0})
    assert beat["state"] == "live"
    assert beat["plan_version"] != ack["plan_version"]
    clock.now_s += 10  # hk-2 last seen 35 s ago, hk-1 10 s ago
    nodes = {n["node"]: n for n in (await call(client, "GET", "/api/v1/nodes"))["nodes"]}
    assert nodes["hk-1"]["state"] == "live"
    assert nodes["hk-2"]["state"] == "stale"
    assert nodes["hk-1"]["health"]["uptime_s"] == 25.0
    plan = await call(client, "GET", "/api/v1/agents/hk-1/plan")
    assert plan["probes"] == [], "a stale peer must drop out of the plan"

    await call(client, "POST", "/api/v1/agents/hk-2/heartbeat")
    plan = await call(client, "GET", "/api/v1/agents/hk-1/plan")
    fleet = await call(client, "GET", "/api/v1/plan")
    assert [(p["src"], p["dst"]) for p in fleet["probes"]] == [("hk-1", "hk-2")]
    assert [p["node"] for p in plan["probes"]] == ["hk-2"]

    await call(client, "DELETE", "/api/v1/agents/hk-2")
    nodes = {n["node"]: n for n in (await call(client, "GET", "/api/v1/nodes"))["nodes"]}
    assert nodes["hk-2"]["state"] == "left"
    assert (await call(client, "GET", "/api/v1/plan"))["probes"] == []
    error = await call(client, "POST", "/api/v1/agents/zz-9/heartbeat", {}, status=404)
    assert error["error"] == "NotFoundError"


async def test_plan_follows_join_across_regions(start: Any) -> None:
    client = await start()
    await register(client, ("hk-1", "hk"), ("hk-2", "hk"))
    first = await call(client, "GET", "/api/v1/plan")
    await register(client, ("us-1", "us"))
    second = await call(client, "GET", "/api/v1/plan")
    assert first["plan_version"] != second["plan_version"]
    kinds = {(p["src"], p["dst"]): p["kind"] for p in second["probes"]}
    assert "cross-border" in kinds.values()
    assert any("us-1" in pair for pair in kinds)


async def test_ingest_is_idempotent_per_batch(start: Any, clock: FakeClock) -> None:
    client = await start()
    await register(client, ("hk-1", "hk"), ("us-1", "us"))
    body = batch("b-1", [summary("hk-1", "us-1", T0 - 5, 80.0), summary("hk-1", "us-1", T0, 90.0)])
    first = await call(client, "POST", "/api/v1/agents/hk-1/summaries", body)
    assert first == {"batch_id": "b-1", "duplicate": False, "accepted": 2, "expired": 0}
    replay = await call(client, "POST", "/api/v1/agents/hk-1/summaries", body)
    assert replay["duplicate"] is True
    assert replay["accepted"] == 0
    # The same batch id from another agent is a different batch.
    other = batch("b-1", [summary("us-1", "hk-1", T0, 85.0)])
    assert (await call(client, "POST", "/api/v1/agents/us-1/summaries", other))["accepted"] == 1

    links = (await call(client, "GET", "/api/v1/links?window_s=60"))["links"]
    by_pair = {(link["src"], link["dst"]): link for link in links}
    assert by_pair[("hk-1", "us-1")]["summary_count"] == 2
    assert by_pair[("hk-1", "us-1")]["window"]["rtt_p50_ms"]["p50"] == pytest.approx(85.0)
    assert by_pair[("hk-1", "us-1")]["latest"]["rtt_p50_ms"] == pytest.approx(90.0)
    regions = await call(client, "GET", "/api/v1/regions?window_s=60")
    assert regions["regions"] == ["hk", "us"]
    (pair,) = regions["pairs"]
    assert pair["summary_count"] == 3
    assert pair["link_count"] == 2
    history = await call(client, "GET", "/api/v1/links/hk-1/us-1/history?window_s=60")
    assert [s["rtt_ms"]["p50"] for s in history["summaries"]] == [80.0, 90.0]

    metrics = await client.get("/metrics", headers=AUTH)
    text = await metrics.text()
    assert 'netopt_coordinator_batches_total{result="duplicate"} 1.0' in text
    assert 'netopt_coordinator_summaries_total{result="stored"} 3.0' in text
    assert 'netopt_coordinator_nodes{state="live"} 2.0' in text


async def test_ingest_checks_reporter_and_expires_old_summaries(start: Any, tmp_path: Path) -> None:
    client = await start(make_settings(tmp_path, retention_s=3600.0))
    await register(client, ("hk-1", "hk"))
    wrong = batch("b-1", [summary("hk-2", "hk-1", T0)])
    error = await call(client, "POST", "/api/v1/agents/hk-1/summaries", wrong, status=400)
    assert error["field"] == "summaries[0].src"
    old = batch("b-2", [summary("hk-1", "hk-2", T0 - 7200), summary("hk-1", "hk-2", T0)])
    result = await call(client, "POST", "/api/v1/agents/hk-1/summaries", old)
    assert result["accepted"] == 1
    assert result["expired"] == 1
    await call(client, "POST", "/api/v1/agents/zz-1/summaries", batch("b", []), status=404)


async def test_restart_in_process_keeps_nodes_heartbeats_and_data(
    aiohttp_client: MakeClient, tmp_path: Path, clock: FakeClock
) -> None:
    settings = make_settings(tmp_path)
    deps = CoordinatorDeps(clock=clock, heartbeat_flush_s=3600)
    client = await aiohttp_client(create_app(settings, deps))
    await register(client, ("hk-1", "hk"))
    await call(
        client, "POST", "/api/v1/agents/hk-1/summaries", batch("b", [summary("hk-1", "x-1", T0)])
    )
    clock.now_s += 20
    await call(client, "POST", "/api/v1/agents/hk-1/heartbeat", {"spool_bytes": 12})
    await client.close()  # cleanup_ctx flushes heartbeats and closes the database

    again = await aiohttp_client(create_app(settings, deps))
    (node,) = (await call(again, "GET", "/api/v1/nodes"))["nodes"]
    assert node["last_seen_s"] == pytest.approx(T0 + 20)
    assert node["health"]["spool_bytes"] == 12
    replay = await call(
        again, "POST", "/api/v1/agents/hk-1/summaries", batch("b", [summary("hk-1", "x-1", T0)])
    )
    assert replay["duplicate"] is True


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing"),
        ({"Authorization": "Bearer wrong-token-wrong-token"}, "refused"),
        ({"Authorization": f"Basic {TOKEN}"}, "Bearer"),
        ({"Authorization": f"Bearer {TOKEN}x"}, "refused"),
    ],
)
async def test_unauthorised_requests_get_401_json(
    start: Any, headers: dict[str, str], reason: str
) -> None:
    client = await start()
    for method, path in (("GET", "/api/v1/nodes"), ("POST", "/api/v1/agents/register"),
                         ("GET", "/metrics"), ("GET", "/api/v1/nowhere")):  # fmt: skip
        response = await client.request(method, path, headers=headers, json={})
        assert response.status == 401
        body = await response.json()
        assert body["error"] == "AuthenticationError"
        assert reason in body["message"]
        assert response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_malformed_requests_get_400_json(start: Any) -> None:
    client = await start()
    await register(client, ("hk-1", "hk"))
    cases: list[tuple[str, str, bytes]] = [
        ("POST", "/api/v1/agents/register", b"{not json"),
        ("POST", "/api/v1/agents/register", b"[1, 2]"),
        ("POST", "/api/v1/agents/register", b'{"node": "hk-1"}'),
        ("POST", "/api/v1/agents/hk-1/summaries", b'{"batch_id": "a b", "summaries": []}'),
        (
            "POST",
            "/api/v1/agents/hk-1/summaries",
            b'{"batch_id": "a", "summaries": [{"src": NaN}]}',
        ),
        ("POST", "/api/v1/agents/HK_1/heartbeat", b"{}"),
        ("GET", "/api/v1/links?window_s=abc", b""),
        ("GET", "/api/v1/links?window_s=-5", b""),
        ("GET", "/api/v1/links/hk-1/hk-2/history?limit=0", b""),
    ]
    for method, path, body in cases:
        response = await client.request(method, path, data=body, headers=AUTH)
        data = await response.json()
        assert response.status == 400, (path, body, data)
        assert data["error"] == "RequestInvalid"
        assert data["message"]


async def test_oversized_requests_get_413_json(start: Any, tmp_path: Path) -> None:
    client = await start(make_settings(tmp_path, max_request_bytes=2048))
    await register(client, ("hk-1", "hk"))
    big = batch("b", [summary("hk-1", f"n-{i}", T0) for i in range(40)])
    response = await client.post("/api/v1/agents/hk-1/summaries", json=big, headers=AUTH)
    assert response.status == 413
    assert (await response.json())["error"] == "RequestTooLarge"

    async def chunks() -> Any:  # no Content-Length: the limit applies while reading
        for _ in range(10):
            yield b" " * 1024

    response = await client.post("/api/v1/agents/hk-1/summaries", data=chunks(), headers=AUTH)
    assert response.status == 413
    assert (await response.json())["error"] == "RequestTooLarge"
    nodes = await call(client, "GET", "/api/v1/nodes")  # the server is still fine
    assert len(nodes["nodes"]) == 1


async def test_unknown_routes_and_methods_get_json(start: Any) -> None:
    client = await start()
    response = await client.get("/api/v1/nothing", headers=AUTH)
    assert response.status == 404
    assert (await response.json())["error"] == "NotFound"
    response = await client.put("/api/v1/nodes", headers=AUTH)
    assert response.status == 405
    assert (await response.json())["error"] == "MethodNotAllowed"


async def test_public_routes_and_openapi_describe_every_route(start: Any) -> None:
    client = await start()
    doc = await (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    app_paths = {r.resource.canonical for r in client.app.router.routes() if r.resource}
    assert {p for p in app_paths if p.startswith("/api/")} <= set(doc["paths"])
    assert "LinkSummary" in doc["components"]["schemas"]
    page = await client.get("/")
    assert page.status == 200
    assert "dashboard.js" in await page.text()
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert (await (await client.get("/healthz")).json()) == {"ok": True}


async def test_big_fleet_is_replanned_in_the_background(start: Any, clock: FakeClock) -> None:
    client = await start()
    names = [(f"{region}-{i}", region) for region in ("hk", "us") for i in range(80)]
    await register(client, *names)
    # Above INLINE_PLAN_NODES the plan is computed off the event loop and at most
    # once per REPLAN_MIN_INTERVAL_S; it catches up with every join.
    for _ in range(10):  # 10 x 2.5 s stays inside stale_after_s (30 s)
        clock.now_s += 2.5
        plan = await call(client, "GET", "/api/v1/plan")
        if {n for p in plan["probes"] for n in (p["src"], p["dst"])} == {n for n, _ in names}:
            break
        await asyncio.sleep(0.3)
    else:
        pytest.fail("the plan never covered all 160 nodes")
    mine = await call(client, "GET", "/api/v1/agents/hk-0/plan")
    assert mine["plan_version"] == plan["plan_version"]
    assert len(plan["probes"]) <= 160 * 8 // 2  # per_node_budget=8 in make_settings
