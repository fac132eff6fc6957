"""A cold sync's lead (`netopt.dataplane.lead`) over real localhost servers: a lead the
sync carries on (moving no chunk twice), through the library and through the command
with its start-up prefetch; a server that answers a lead with other chunks or with
endless bytes; a lead of another version; the stream route's refusals."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from dataplane_helpers import CPU, FAST, REPO, TOKEN, serve_routes
from dataplane_helpers import start as start_plain

from netopt.cache.syncer import run_sync
from netopt.chunking import ChunkRef
from netopt.dataplane.httpsource import ClientOptions, HttpChunkSource, parse_dataset_url
from netopt.dataplane.leadplan import LEAD_BLOCK_CHUNKS, LEAD_MIN_BYTES
from netopt.dataplane.server import ServeSettings, ServeStats, create_app, load_dataset
from netopt.dataplane.server import start_server as _start_server
from netopt.errors import ProtocolError
from netopt.transfer.manifest import FileEntry, Manifest
from tests.service.cache_helpers import request, served_options, tree

CHUNK_BYTES = 64 * 1024
PACKAGES = Path(sysconfig.get_paths()["purelib"])
TREE_BYTES = LEAD_MIN_BYTES + 4 * 1024 * 1024
MANIFEST_DELAY_S = 0.4
"""The test server answers manifests this late: its info comes first, as a tree's does
on a long link (its manifest takes seconds), so the sync leads."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def package_tree(root: Path, size_bytes: int) -> int:
    """Files of the packages installed beside netopt (real sources, extension modules,
    data; each under 1 MiB) copied into ``root`` until ``size_bytes``; their total."""
    total = 0
    for path in sorted(PACKAGES.rglob("*")):
        if not path.is_file() or path.is_symlink() or path.stat().st_size > 1024 * 1024:
            continue
        target = root / path.relative_to(PACKAGES)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        total += target.stat().st_size
        if total >= size_bytes:
            return total
    raise AssertionError(f"only {total} bytes of installed packages")


class Recorder:
    """A middleware that answers manifests `MANIFEST_DELAY_S` late and notes each lead
    request's query and answer status (``rewrite``: the lead's query it passes on)."""

    def __init__(
        self,
        rewrite: Callable[[dict[str, str]], dict[str, str]] | None = None,
        manifest_delay_s: float = MANIFEST_DELAY_S,
    ) -> None:
        self.leads: list[tuple[dict[str, str], int]] = []
        self._rewrite = rewrite
        self._manifest_delay_s = manifest_delay_s

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.endswith("/manifest"):
            await asyncio.sleep(self._manifest_delay_s)
        if not request.path.endswith("/stream") or "lead" not in request.query:
            return await handler(request)
        query = dict(request.query)
        if self._rewrite is not None:
            passed = self._rewrite(query)
            request = request.clone(rel_url=request.rel_url.with_query(passed))
        try:
            resp = await handler(request)
        except web.HTTPException as exc:
            self.leads.append((query, exc.status))
            raise
        self.leads.append((query, resp.status))
        return resp


async def serve(root: Path, recorder: Recorder) -> tuple[web.AppRunner, int, ServeStats, Manifest]:
    dataset = load_dataset(root, "ds", CHUNK_BYTES)
    stats = ServeStats()
    app = create_app(ServeSettings(token=TOKEN, worker_threads=2), {"ds": dataset}, CPU, stats)
    app.middlewares.insert(0, recorder.middleware)
    runner, port = await _start_server(app, "127.0.0.1", 0)
    return runner, port, stats, dataset.manifest


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lead") / "src"
    package_tree(root, TREE_BYTES)
    return root


async def test_a_cold_sync_leads_and_moves_no_chunk_twice(packages: Path, tmp_path: Path) -> None:
    recorder = Recorder()
    runner, port, stats, manifest = await serve(packages, recorder)
    lengths = manifest.unique_chunks()
    assert len(lengths) >= 1000  # a tree of many small files, as users sync
    url, cache = f"netopt://127.0.0.1:{port}/ds", tmp_path / "cache"
    opts = served_options(TOKEN, CPU)
    try:
        report = await run_sync(
            request(url, tmp_path / "a", cache, source_options=opts, sync_options=FAST)
        )
        assert tree(tmp_path / "a") == tree(packages)
        assert recorder.leads, "the sync did not lead"
        assert {status for _, status in recorder.leads} == {200}
        led = Counter(int(query["count"]) for query, _ in recorder.leads)
        assert sum(n * k for n, k in led.items()) >= 0.4 * len(lengths) * 0.9
        # Each chunk crossed once: the lead's and the sync's own streams together.
        assert set(stats.chunk_requests) == set(lengths)
        assert all(n == 1 for n in stats.chunk_requests.values())
        assert report.summary is not None
        assert report.summary.chunks_fetched == len(lengths)
        # A version in the cache: a second sync (another DEST) does not lead.
        leads_before = len(recorder.leads)
        again = await run_sync(
            request(url, tmp_path / "b", cache, source_options=opts, sync_options=FAST)
        )
        assert tree(tmp_path / "b") == tree(packages)
        assert len(recorder.leads) == leads_before
        assert again.summary is not None
        assert again.summary.chunks_fetched == 0
    finally:
        await runner.cleanup()


async def test_a_lead_answered_with_other_chunks_is_fetched_again(
    packages: Path, tmp_path: Path
) -> None:
    """The server sends each lead the chunks one run further on than asked: every frame
    is checked against the name the manifest gives its place, so each lead stream breaks
    at its first frame and its chunks come again; nothing unchecked is written."""

    def shifted(query: dict[str, str]) -> dict[str, str]:
        return {**query, "from": str(int(query["from"]) + LEAD_BLOCK_CHUNKS)}

    recorder = Recorder(shifted)
    runner, port, _stats, manifest = await serve(packages, recorder)
    try:
        url = f"netopt://127.0.0.1:{port}/ds"
        opts = served_options(TOKEN, CPU)
        dest, cache = tmp_path / "dest", tmp_path / "cache"
        report = await run_sync(request(url, dest, cache, source_options=opts, sync_options=FAST))
        assert recorder.leads
        assert tree(tmp_path / "dest") == tree(packages)
        assert report.summary is not None
        assert report.summary.chunks_fetched == len(manifest.unique_chunks())
        assert report.summary.chunk_retries >= 1  # the lies were seen, and charged
    finally:
        await runner.cleanup()


async def test_a_lead_of_another_version_is_refused_and_dropped(
    packages: Path, tmp_path: Path
) -> None:
    recorder = Recorder()
    runner, port, _, manifest = await serve(packages, recorder)
    url = parse_dataset_url(f"netopt://127.0.0.1:{port}/ds")
    try:
        async with HttpChunkSource(url, ClientOptions(token=TOKEN), zstd_level=1) as source:
            other = "ab" * 32
            source.start_lead(other, [(0, 100, 2 * LEAD_BLOCK_CHUNKS)])
            assert source.lead is not None
            source.lead.widen()
            for _ in range(100):  # until the server has answered (at most 2 s)
                if recorder.leads:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)  # and its answer is in
            # The server refuses the lead (409): the sync is handed no stream.
            assert await source.take_leads(manifest) == []
        every = str(2 * LEAD_BLOCK_CHUNKS)
        refused = {"lead": other, "from": "0", "count": "100", "every": every, "level": "1"}
        assert recorder.leads == [(refused, 409)]
        # A lead the server accepted, for a version other than the manifest the sync
        # ends up with (the files changed in between): dropped too.
        async with HttpChunkSource(url, ClientOptions(token=TOKEN), zstd_level=1) as source:
            source.start_lead(manifest.manifest_id, [(0, 100, LEAD_BLOCK_CHUNKS)])
            changed = Manifest(manifest.name, manifest.files[1:], manifest.avg_chunk_bytes)
            assert await source.take_leads(changed) == []
    finally:
        await runner.cleanup()


async def test_a_lead_answered_with_endless_bytes_holds_a_bounded_amount() -> None:
    sent = 0

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        resp = web.StreamResponse()
        await resp.prepare(request)
        block = os.urandom(256 * 1024)
        for _ in range(400):  # 100 MB at most
            await resp.write(block)
            sent += len(block)
        return resp

    runner, port = await serve_routes([web.post("/v1/datasets/ds/stream", endless)])
    url = parse_dataset_url(f"netopt://127.0.0.1:{port}/ds")
    ref = ChunkRef(0, 1000, "ef" * 32)
    fake = Manifest("ds", (FileEntry("f", 1000, 0o644, 0, (ref,)),))
    try:
        async with HttpChunkSource(url, ClientOptions(token=TOKEN)) as source:
            source.start_lead(fake.manifest_id, [(0, 1000, LEAD_BLOCK_CHUNKS)])
            lead = source.lead
            assert lead is not None
            lead.widen()
            for _ in range(200):  # until it stops reading (at most 4 s)
                held = lead.held_bytes
                await asyncio.sleep(0.02)
                if held == lead.held_bytes and held:
                    break
            assert 0 < lead.held_bytes <= lead.each_max_bytes + 1024 * 1024
            assert sent < 100 * 1024 * 1024  # the server was held back, not drained
            # Named once the "manifest" is in, the garbage fails its first frame.
            taken = await source.take_leads(fake)
            assert len(taken) == 1
            stream, names = taken[0]
            assert names == [ref.chunk_id]
            with pytest.raises(ProtocolError):
                await stream.next(ref.chunk_id, 1000)
            await stream.aclose(complete=False)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"lead": "zz", "from": "0", "count": "10", "every": "64"}, 400),
        ({"lead": "VERSION", "from": "x", "count": "10", "every": "64"}, 400),
        ({"lead": "VERSION", "from": "0", "count": "0", "every": "64"}, 400),
        ({"lead": "VERSION", "from": "0", "count": "10", "every": "63"}, 400),
        ({"lead": "VERSION", "from": "99999999", "count": "10", "every": "64"}, 400),
        ({"lead": "VERSION", "from": "0", "count": "1" * 40, "every": "64"}, 400),
        ({"lead": "VERSION", "from": "0", "count": "10"}, 400),
        ({"lead": "ab" * 32, "from": "0", "count": "10", "every": "64"}, 409),
    ],
)
async def test_the_stream_route_refuses_a_bad_lead(
    tmp_path: Path, params: dict[str, str], status: int
) -> None:
    src = tmp_path / "src"
    package_tree(src, 512 * 1024)
    runner, port, _, manifest = await start_plain(src)
    query = {k: (manifest.manifest_id if v == "VERSION" else v) for k, v in params.items()}
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            url = f"http://127.0.0.1:{port}/v1/datasets/ds/stream"
            async with http.post(url, params=query, data=b"") as resp:
                assert resp.status == status
                body = await resp.json()
                want = "DatasetChangedError" if status == 409 else "ValidationError"
                assert body["error"] == want
    finally:
        await runner.cleanup()


async def test_the_command_leads_from_its_prefetched_info(packages: Path, tmp_path: Path) -> None:
    """``netopt sync`` as users run it: the start-up prefetch's info starts the lead
    while its manifest is still coming (late enough to come after the command's imports,
    as a tree's does over a long link)."""
    recorder = Recorder(manifest_delay_s=2.0)
    runner, port, stats, manifest = await serve(packages, recorder)
    trace_file, dest = tmp_path / "trace.json", tmp_path / "dest"
    env = {**os.environ, "NETOPT_TOKEN": TOKEN, "NETOPT_TRACE": str(trace_file)}
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "netopt", "sync", f"netopt://127.0.0.1:{port}/ds", str(dest),
            "--cache-dir", str(tmp_path / "cache"), "--json",
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        assert json.loads(out)["chunks_fetched"] == len(manifest.unique_chunks())
        assert tree(dest) == tree(packages)
        counts = json.loads(trace_file.read_text())["counts"]
        assert counts["lead_streams_carried"] >= 1
        assert counts["lead_chunks"] >= 1
        assert recorder.leads
        assert {status for _, status in recorder.leads} == {200}
        assert all(n == 1 for n in stats.chunk_requests.values())
    finally:
        await runner.cleanup()
