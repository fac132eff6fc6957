"""A re-sync names the versions its cache holds (``If-None-Match``) and reads the current
one back from the cache when the server answers 304 (`netopt.cache.storedmanifests`,
`netopt.dataplane.manifestversions`), over the normal path and the start-up prefetch's
pieces, against real aiohttp servers on localhost: `netopt serve`'s own app, one whose
dataset changed, and one that answers 304 naming a version the client never offered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest
from aiohttp import web

from netopt.cache.syncer import SyncReport, SyncRequest, run_sync
from netopt.cachepaths import manifest_file, stored_manifest_ids
from netopt.dataplane import prefetch
from netopt.dataplane.manifestversions import KNOWN_VERSIONS_MAX
from netopt.errors import ProtocolError
from tests.service.cache_helpers import served_options
from tests.service.dataplane_helpers import CPU, TOKEN, check_tree, serve_with_middleware
from tests.service.test_dataplane_prefetch import _fresh_stats  # noqa: F401 (autouse)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _tree(root: Path, count: int, salt: bytes = b"") -> dict[str, bytes]:
    files = {f"d{i // 200:02d}/f{i:04d}.txt": b"%s%d\n" % (salt, i * 7919) for i in range(count)}
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


class _Recorded:
    """A `netopt serve` app of ``root`` that records each manifest request's
    ``If-None-Match`` and the status it was answered with."""

    def __init__(self) -> None:
        self.asked: list[tuple[str | None, int]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, root: Path) -> None:
        @web.middleware
        async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
            resp = await handler(request)
            if request.path.endswith("/manifest"):
                self.asked.append((request.headers.get("If-None-Match"), resp.status))
            return resp

        self.runner, self.port, _ = await serve_with_middleware(root, record)

    @property
    def statuses(self) -> set[int]:
        return {status for _, status in self.asked}

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def _request(port: int, dest: Path, cache: Path) -> SyncRequest:
    return SyncRequest(
        f"netopt://127.0.0.1:{port}/ds", str(dest), str(cache),
        source_options=served_options(TOKEN, CPU),
    )  # fmt: skip


@contextlib.asynccontextmanager
async def _synced_once(
    tmp_path: Path, count: int
) -> AsyncIterator[tuple[dict[str, bytes], Path, _Recorded, SyncReport]]:
    """A tree of ``count`` files under ``tmp_path/src``, served (recorded) and synced once
    into ``tmp_path/dst1`` through ``tmp_path/cache``: its files, the cache, the server
    (its record cleared) and the first sync's report; the server stopped after."""
    files = _tree(tmp_path / "src", count)
    cache = tmp_path / "cache"
    server = _Recorded()
    await server.start(tmp_path / "src")
    try:
        first = await run_sync(_request(server.port, tmp_path / "dst1", cache))
        assert server.asked == [(None, 200)]  # nothing held yet: nothing named
        server.asked.clear()
        yield files, cache, server, first
    finally:
        await server.stop()


@pytest.mark.parametrize("prefetched", [False, True])
async def test_a_resync_reads_the_held_version_back_instead_of_fetching_it(
    tmp_path: Path, prefetched: bool
) -> None:
    async with _synced_once(tmp_path, 3000) as (files, cache, server, first):
        held = stored_manifest_ids(cache, "ds", KNOWN_VERSIONS_MAX)
        assert held == (first.manifest_id,)
        if prefetched:
            # As `netopt sync` starts it: the versions listed from the cache by name.
            assert prefetch.start(
                f"netopt://127.0.0.1:{server.port}/ds", TOKEN, 2,
                known=partial(stored_manifest_ids, cache, limit=KNOWN_VERSIONS_MAX),
            )  # fmt: skip
        second = await run_sync(_request(server.port, tmp_path / "dst2", cache))
    check_tree(tmp_path / "dst2", files)
    assert second.manifest_id == first.manifest_id
    assert second.summary is not None
    assert second.summary.files_written == len(files)
    # Every manifest request named the held version and was answered 304: no body.
    assert server.asked
    assert all(named == f'"{first.manifest_id}"' for named, _ in server.asked)
    assert server.statuses == {304}
    assert second.overhead_bytes < first.overhead_bytes / 10
    assert prefetch.STATS["meta_used"] == (1 if prefetched else 0)


async def test_a_changed_dataset_is_fetched_whole(tmp_path: Path) -> None:
    _tree(tmp_path / "old", 500)
    files = _tree(tmp_path / "new", 500, salt=b"v2-")
    cache = tmp_path / "cache"
    old, new = _Recorded(), _Recorded()
    await old.start(tmp_path / "old")
    await new.start(tmp_path / "new")
    try:
        first = await run_sync(_request(old.port, tmp_path / "dst", cache))
        second = await run_sync(_request(new.port, tmp_path / "dst", cache))
    finally:
        await old.stop()
        await new.stop()
    check_tree(tmp_path / "dst", files)
    assert second.manifest_id != first.manifest_id
    # The held version was named; the server had another: the whole manifest came.
    assert new.asked == [(f'"{first.manifest_id}"', 200)]
    assert stored_manifest_ids(cache, "ds", KNOWN_VERSIONS_MAX)[0] == second.manifest_id


@pytest.mark.parametrize("damage", ["changed", "removed"])
async def test_a_held_version_that_no_longer_checks_is_fetched_again(
    tmp_path: Path, damage: str
) -> None:
    async with _synced_once(tmp_path, 500) as (files, cache, server, first):
        # Named from the listing, then changed or removed before it is read back.
        stored = manifest_file(cache, "ds", first.manifest_id)
        raw = stored.read_bytes()
        held = (first.manifest_id,)
        known = partial(
            _damage_after_listing, stored, raw.replace(b"f0001.txt", b"f0001.txx"), damage, held
        )
        assert prefetch.start(f"netopt://127.0.0.1:{server.port}/ds", TOKEN, 2, known=known)
        second = await run_sync(_request(server.port, tmp_path / "dst2", cache))
    check_tree(tmp_path / "dst2", files)
    assert second.manifest_id == first.manifest_id
    # 304 to the prefetch's named request; the copy did not check: asked for whole.
    assert server.asked[-1] == (None, 200)
    assert 304 in server.statuses
    assert manifest_file(cache, "ds", first.manifest_id).read_bytes() == raw  # stored again


def _damage_after_listing(
    stored: Path, changed: bytes, damage: str, held: tuple[str, ...], _name: str
) -> tuple[str, ...]:
    if damage == "changed":
        stored.write_bytes(changed)
    else:
        stored.unlink()
    return held


async def test_a_304_naming_a_version_never_offered_is_refused(tmp_path: Path) -> None:
    _tree(tmp_path / "src", 200)
    cache = tmp_path / "cache"
    lying = False

    @web.middleware
    async def lie(request: web.Request, handler: Handler) -> web.StreamResponse:
        if lying and request.path.endswith("/manifest"):
            return web.Response(status=304, headers={"ETag": f'"{"ab" * 32}"'})
        return await handler(request)

    runner, port, _ = await serve_with_middleware(tmp_path / "src", lie)
    try:
        await run_sync(_request(port, tmp_path / "dst1", cache))
        lying = True
        with pytest.raises(ProtocolError, match="304 naming"):
            await asyncio.wait_for(run_sync(_request(port, tmp_path / "dst2", cache)), 30)
    finally:
        await runner.cleanup()
    assert not (tmp_path / "dst2" / "d00").exists()
