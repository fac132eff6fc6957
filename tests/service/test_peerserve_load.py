"""An agent's cache served to peers reads a changed dataset off the event loop: while
one dataset's manifests are being read, the server answers every other request.

A real cache is filled by real syncs, and served as the agent serves it
(`add_dataplane` with `CachedDatasets`) on a loopback port; aiohttp clients ask it.
The one thing replaced is the reading of the large dataset, held on a
``threading.Event`` so the test can see which requests were answered meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from dataplane_helpers import CPU, TOKEN, make_dataset

from netopt.agent.http import MAX_REQUEST_BYTES
from netopt.cache.peerserve import CachedDatasets
from netopt.cache.syncer import SyncReport, SyncRequest, run_sync
from netopt.dataplane.handlers import auth_middleware
from netopt.dataplane.server import ServeSettings, add_dataplane, start_server
from netopt.webshell import service_shell

HEADERS = {"Authorization": f"Bearer {TOKEN}"}


async def _sync_into(cache: Path, origin: Path, dest: Path) -> SyncReport:
    return await run_sync(SyncRequest(source=str(origin), dest=str(dest), cache_dir=str(cache)))


class HeldReads:
    """`CachedDatasets._load` for ``name`` waits until `release`; records each read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.started = threading.Event()
        self.released = threading.Event()
        self.holding = False
        self.reads = 0
        self.threads: list[int] = []
        real = CachedDatasets._load

        def held(datasets: CachedDatasets, asked: str, versions: Any) -> Any:
            if asked == name:
                self.reads += 1
                self.threads.append(threading.get_ident())
                self.holding = True
                self.started.set()
                self.released.wait(10)
                self.holding = False
            return real(datasets, asked, versions)

        monkeypatch.setattr(CachedDatasets, "_load", held)


@pytest.fixture
async def cache_server(tmp_path: Path) -> AsyncIterator[tuple[Path, int, dict[str, SyncReport]]]:
    """A cache holding datasets ``small`` and ``big``, served as an agent serves it
    (`netopt.agent.http`: the service shell, the token, the data-plane routes)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    reports = {}
    for name in ("small", "big"):
        make_dataset(tmp_path / "origin" / name)
        reports[name] = await _sync_into(cache, tmp_path / "origin" / name, tmp_path / "out" / name)
    shell = service_shell("agent", max_request_bytes=MAX_REQUEST_BYTES)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[shell, auth_middleware])
    add_dataplane(app, ServeSettings(token=TOKEN, worker_threads=2), CachedDatasets(cache), CPU)
    runner, port = await start_server(app, "127.0.0.1", 0)
    try:
        yield tmp_path, port, reports
    finally:
        await runner.cleanup()


async def _info(session: aiohttp.ClientSession, port: int, name: str) -> tuple[int, Any]:
    async with session.get(f"http://127.0.0.1:{port}/v1/datasets/{name}", headers=HEADERS) as resp:
        return resp.status, await resp.json()


async def test_a_dataset_being_read_holds_back_no_other_request(
    cache_server: tuple[Path, int, dict[str, SyncReport]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, port, reports = cache_server
    held = HeldReads(monkeypatch, "big")
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        bigs = [asyncio.ensure_future(_info(session, port, "big")) for _ in range(3)]
        assert await asyncio.to_thread(held.started.wait, 5)
        status, body = await _info(session, port, "small")
        answered_while_held = held.holding
        async with session.get(f"http://127.0.0.1:{port}/v1/health") as resp:
            health_while_held = resp.status == 200 and held.holding
        held.released.set()
        answers = await asyncio.gather(*bigs)
    assert status == 200
    assert body["manifest_id"] == reports["small"].manifest_id
    assert answered_while_held, "the other dataset waited for the read of big"
    assert health_while_held
    assert [a[0] for a in answers] == [200, 200, 200]
    assert {a[1]["manifest_id"] for a in answers} == {reports["big"].manifest_id}
    assert held.reads == 1  # three requests, one read
    assert threading.get_ident() not in held.threads


async def test_a_new_version_stored_by_a_sync_is_read_off_the_loop_and_served(
    cache_server: tuple[Path, int, dict[str, SyncReport]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, port, reports = cache_server
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        assert (await _info(session, port, "big"))[1]["manifest_id"] == reports["big"].manifest_id
        (root / "origin" / "big" / "text" / "nested" / "small.txt").write_bytes(b"changed\n")
        second = await _sync_into(root / "cache", root / "origin" / "big", root / "out" / "big")
        assert second.manifest_id != reports["big"].manifest_id
        held = HeldReads(monkeypatch, "big")
        held.released.set()
        status, body = await _info(session, port, "big")
        manifest_url = f"http://127.0.0.1:{port}/v1/datasets/big/manifest"
        async with session.get(manifest_url, headers=HEADERS) as resp:
            files = {f["path"] for f in (await resp.json())["files"]}
    assert status == 200
    assert body["manifest_id"] == second.manifest_id
    assert held.reads == 1
    assert threading.get_ident() not in held.threads
    assert "text/nested/small.txt" in files


async def test_a_dataset_not_in_the_cache_is_404_and_a_bad_name_400(
    cache_server: tuple[Path, int, dict[str, SyncReport]],
) -> None:
    _, port, _ = cache_server
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        missing, body = await _info(session, port, "absent")
        bad, bad_body = await _info(session, port, "bad%20name")
    assert missing == 404
    assert "absent" in body["message"]
    assert bad == 400
    assert "bad name" in bad_body["message"]
