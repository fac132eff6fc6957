"""Region sharing on loopback: a real coordinator, a real origin server and each node's
cache served to its peers by the data plane, synced with the real sync engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from coordinator_helpers import TOKEN, make_settings, registration
from dataplane_helpers import CPU, FAST, check_tree, make_dataset
from dataplane_helpers import start as start_origin

from netopt.cache.peerserve import CachedDatasets
from netopt.cache.shared import SharingOptions
from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import SyncReport, SyncRequest, run_sync
from netopt.coordinator.app import create_app as coordinator_app
from netopt.dataplane.client import ClientOptions
from netopt.dataplane.server import ServeSettings, ServeStats, create_app, start_server
from netopt.transfer.manifest import Manifest


@dataclass
class World:
    tmp: Path
    files: dict[str, bytes]
    origin_url: str
    origin_stats: ServeStats
    manifest: Manifest
    coordinator_url: str
    peers: dict[str, web.AppRunner]

    def cache(self, node: str) -> Path:
        return self.tmp / node / "cache"

    def request(self, node: str, coordinator_url: str | None = None) -> SyncRequest:
        return SyncRequest(
            source=self.origin_url,
            dest=str(self.tmp / node / "data"),
            cache_dir=str(self.cache(node)),
            source_options=SourceOptions(client=ClientOptions(token=TOKEN), client_cpu=CPU),
            sync_options=FAST,
            sharing=SharingOptions(coordinator_url or self.coordinator_url, TOKEN, node),
        )

    async def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            aiohttp.ClientSession(headers=headers) as session,
            session.request(method, self.coordinator_url + path, json=body) as resp,
        ):
            return resp.status, await resp.json()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    origin_root = tmp_path / "origin" / "ds"
    files = make_dataset(origin_root)
    origin, origin_port, stats, manifest = await start_origin(origin_root, token=TOKEN)
    coordinator = web.AppRunner(coordinator_app(make_settings(tmp_path)))
    await coordinator.setup()
    site = web.TCPSite(coordinator, "127.0.0.1", 0)
    await site.start()
    coordinator_url = f"http://127.0.0.1:{coordinator.addresses[0][1]}"
    w = World(tmp_path, files, f"netopt://127.0.0.1:{origin_port}/ds", stats, manifest,
              coordinator_url, {})  # fmt: skip
    for node, region in (("hk-1", "hk"), ("hk-2", "hk"), ("hk-3", "hk"), ("us-1", "us")):
        w.cache(node).mkdir(parents=True)
        app = create_app(
            ServeSettings(token=TOKEN, worker_threads=2), CachedDatasets(w.cache(node)), CPU
        )
        runner, port = await start_server(app, "127.0.0.1", 0)
        w.peers[node] = runner
        status, _ = await w.api(
            "POST", "/api/v1/agents/register",
            {**registration(node, region), "data_port": port},
        )  # fmt: skip
        assert status == 200
    yield w
    for runner in w.peers.values():
        await runner.cleanup()
    await coordinator.cleanup()
    await origin.cleanup()


def origin_requests(w: World) -> list[int]:
    return sorted(w.origin_stats.chunk_requests.values())


def sharing_of(report: SyncReport) -> dict[str, Any]:
    assert report.sharing is not None
    return report.sharing


async def test_a_second_node_fetches_everything_from_its_in_region_peer(world: World) -> None:
    chunks = len(world.manifest.unique_chunks())
    first = await run_sync(world.request("hk-1"))
    assert sharing_of(first)["enabled"] is True
    assert sharing_of(first)["chunks_from_source"] == chunks
    second = await run_sync(world.request("hk-2"))
    shared = sharing_of(second)
    assert shared["chunks_from_peers"] == chunks
    assert shared["chunks_from_source"] == 0
    assert origin_requests(world) == [1] * chunks
    check_tree(world.tmp / "hk-1" / "data", world.files)
    check_tree(world.tmp / "hk-2" / "data", world.files)
    # A node of another region does not fetch from hk's peers.
    third = await run_sync(world.request("us-1"))
    assert sharing_of(third)["chunks_from_peers"] == 0
    status, listing = await world.api("GET", "/api/v1/datasets")
    assert status == 200
    (version,) = listing["versions"]
    assert version["manifest_id"] == world.manifest.manifest_id
    assert {h["node"]: h["chunks"] for h in version["holders"]} == {
        "hk-1": chunks, "hk-2": chunks, "us-1": chunks}  # fmt: skip
    assert version["sessions"] == []


async def test_three_concurrent_syncs_fetch_each_chunk_from_the_source_once(
    world: World,
) -> None:
    chunks = len(world.manifest.unique_chunks())
    reports = await asyncio.gather(*(run_sync(world.request(f"hk-{i}")) for i in (1, 2, 3)))
    assert origin_requests(world) == [1] * chunks
    assert sum(sharing_of(r)["chunks_from_source"] for r in reports) == chunks
    assert sum(sharing_of(r)["chunks_from_peers"] for r in reports) == 2 * chunks
    # They started at different places of the chunk order.
    assert sorted(sharing_of(r)["start_fraction"] for r in reports) == [0.0, 0.25, 0.5]
    for i in (1, 2, 3):
        check_tree(world.tmp / f"hk-{i}" / "data", world.files)


async def test_a_dead_peer_is_excluded_and_its_chunks_come_from_elsewhere(world: World) -> None:
    chunks = len(world.manifest.unique_chunks())
    await run_sync(world.request("hk-1"))
    await world.peers.pop("hk-1").cleanup()  # hk-1's agent dies; still "live" in the registry
    report = await run_sync(world.request("hk-2"))
    shared = sharing_of(report)
    assert shared["peers_excluded"] == ["hk-1"]
    assert shared["chunks_from_source"] == chunks
    check_tree(world.tmp / "hk-2" / "data", world.files)


async def test_an_unreachable_coordinator_means_a_plain_sync(world: World) -> None:
    report = await run_sync(world.request("hk-1", coordinator_url="http://127.0.0.1:9"))
    assert sharing_of(report)["enabled"] is False
    assert "unreachable" in sharing_of(report)["reason"]
    check_tree(world.tmp / "hk-1" / "data", world.files)


async def test_route_requests_are_validated(world: World) -> None:
    path = f"/api/v1/datasets/ds/versions/{world.manifest.manifest_id}/route"
    status, body = await world.api("POST", path, {"node": "hk-1", "chunk_count": 3, "want": [3]})
    assert status == 400
    assert body["field"] == "want[0]"
    status, body = await world.api("POST", path, {"node": "nobody", "chunk_count": 3})
    assert status == 404
    status, body = await world.api(
        "POST", "/api/v1/datasets/ds/versions/xyz/route", {"node": "hk-1",
                                                                       "chunk_count": 3}
    )  # fmt: skip
    assert status == 400
    assert body["field"] == "manifest_id"
    status, body = await world.api("POST", path, {"node": "hk-1", "chunk_count": 3, "bogus": 1})
    assert status == 400
    assert "bogus" in body["message"]


class FailingCoordinator:
    """A real coordinator stand-in that opens the session, then fails every routing call
    the way MODE says: ``503``, ``garbage`` (a malformed route) or ``vanish`` (stops
    listening: connection refused)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0
        self.runner: web.AppRunner | None = None
        self.site: web.TCPSite | None = None
        self.stopping: asyncio.Future[None] | None = None
        self.joined_s = 0.0
        self.failed = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = await request.json()
        if not body["want"] and self.calls == 1:
            self.joined_s = time.monotonic()
            return web.json_response({"start_fraction": 0.0})
        if self.mode == "blip":  # a failover: 503 for 0.8 s, then every chunk from SOURCE
            if time.monotonic() - self.joined_s < 0.8:
                self.failed += 1
                return web.json_response({"error": "Unavailable", "message": "x"}, status=503)
            return web.json_response({"origin": body["want"]})
        if self.mode == "garbage":
            return web.json_response({"peers": {"hk-2": [10**9]}, "endpoints": {"hk-2": 7}})
        if self.mode == "vanish":  # stop listening, and cut the open connections
            if self.site is not None:
                self.stopping = asyncio.ensure_future(self.stop())
            assert request.transport is not None
            request.transport.abort()
            return web.Response()  # never sent
        return web.json_response({"error": "Unavailable", "message": "gone"}, status=503)

    async def stop(self) -> None:
        if self.site is not None:
            await self.site.stop()
            self.site = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/api/v1/datasets/{name}/versions/{version}/route", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        self.site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await self.site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"


async def _sync_through(
    world: World, coordinator: FailingCoordinator
) -> tuple[FailingCoordinator, SyncReport]:
    """hk-1's sync with ``coordinator`` as its only coordinator; stopped afterwards."""
    url = await coordinator.start()
    try:
        return coordinator, await run_sync(world.request("hk-1", coordinator_url=url))
    finally:
        assert coordinator.runner is not None
        await coordinator.runner.cleanup()


@pytest.mark.parametrize("mode", ["503", "garbage", "vanish"])
async def test_a_coordinator_failing_mid_sync_means_the_sync_goes_on_from_source(
    world: World, mode: str
) -> None:
    chunks = len(world.manifest.unique_chunks())
    coordinator, report = await _sync_through(world, FailingCoordinator(mode))
    shared = sharing_of(report)
    assert shared["enabled"] is True
    assert coordinator.calls >= 2  # the session opened, then a routing call failed
    assert shared["coordinator_failures"] >= 1
    assert shared["chunks_from_source"] == chunks
    assert shared["chunks_from_peers"] == 0
    check_tree(world.tmp / "hk-1" / "data", world.files)
    assert origin_requests(world) == [1] * chunks


async def test_a_coordinator_failover_blip_is_ridden_out_without_going_to_source(
    world: World,
) -> None:
    chunks = len(world.manifest.unique_chunks())
    coordinator, report = await _sync_through(world, FailingCoordinator("blip"))
    shared = sharing_of(report)
    assert coordinator.failed >= 1  # routing calls were refused, then asked again
    assert shared["coordinator_failures"] == 0
    assert shared["chunks_unshared"] == 0  # every chunk was routed by the catalogue
    assert shared["chunks_from_source"] == chunks
    check_tree(world.tmp / "hk-1" / "data", world.files)
