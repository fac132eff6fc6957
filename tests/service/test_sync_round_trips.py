"""The round trips of a small sync, counted on a real server: ``netopt sync`` of a 1.3 MB
dataset asks for the info and the manifest together, then its chunks over at most a
stream per data connection (no request per file or per chunk); the live-origin check
rides on the streams' ends (the server names the version after its last read), so no
info request follows; and a stream names its last chunk and its end together, so that end
comes right after the last frame, not a round trip later. Counted from the requests the
server saw, not timed."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from netopt.chunking import chunk_bytes
from netopt.dataplane.client import ClientOptions, sync_url
from netopt.dataplane.handlers import PART_CACHE, auth_middleware
from netopt.dataplane.limits import MAX_AVG_CHUNK_BYTES, MAX_CHUNK_PARTS
from netopt.dataplane.prefetch import META_COPIES, WARM_CONNECTIONS
from netopt.dataplane.server import ServeSettings, add_dataplane, load_dataset, start_server
from netopt.dataplane.streamwork import MIN_PART_BYTES
from netopt.dataplane.synctypes import SyncSummary
from netopt.transfer.planner import TransferPlan
from netopt.webshell import service_shell
from tests.service.dataplane_helpers import (
    CHUNK_BYTES,
    CPU,
    FAST,
    TOKEN,
    check_tree,
    make_dataset,
    real_text,
)

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Seen:
    route: str
    started_s: float
    ended_s: float
    query: dict[str, str] | None = None
    status: int = 0
    body_bytes: int = 0


def _route(path: str) -> str:
    parts = path.strip("/").split("/")  # v1 datasets NAME [manifest|stream|batch|chunks ...]
    if len(parts) < 3:
        return parts[-1]  # health (the warm-up requests of a sync without the prefetch)
    return "info" if len(parts) == 3 else parts[3]


async def _serve(
    root: Path,
    seen: list[Seen],
    *,
    whole_stream_bodies: bool = False,
    chunk_bytes: int = CHUNK_BYTES,
    part_version: str | None = None,
    corrupt_parts: int = 0,
    late_health: asyncio.Event | None = None,
    info_chunk_parts: int | None = None,
    held_part: tuple[str, asyncio.Event] | None = None,
    held_after_bytes: int = 0,
) -> tuple[web.AppRunner, int]:
    """The data plane on loopback, noting each request's route. ``whole_stream_bodies``:
    a stream request is answered only once its body (the names) has ended.
    ``late_health``: the second health request (a warm-up's) is answered only once it is
    set (10 s at most), as a connection whose handshake lost a packet is late.
    ``info_chunk_parts``: the info says the server cuts a chunk into that many parts at
    most (as an older server's does). ``held_part`` (part, event): the first request for
    that part of a chunk is answered only once the event is set (30 s at most), as one
    whose packet was lost waits for the sender's loss recovery; with ``held_after_bytes``,
    that answer sends that many bytes of its body first. Each answer with a body notes
    its length (``Seen.body_bytes``)."""

    corrupted: list[str] = []
    health_seen = 0
    held = False

    @web.middleware
    async def record(request: web.Request, handler: web.Handler) -> web.StreamResponse:
        nonlocal health_seen, held
        started_s = time.monotonic()
        status = body_bytes = 0
        try:
            if late_health is not None and _route(request.path) == "health":
                health_seen += 1
                if health_seen == 2:
                    await asyncio.wait_for(late_health.wait(), 10)
            if held_part is not None and request.query.get("part") == held_part[0] and not held:
                held = True
                if held_after_bytes:
                    return await _sent_in_two(
                        await handler(request), request, held_after_bytes, held_part[1]
                    )
                await asyncio.wait_for(held_part[1].wait(), 30)
            if whole_stream_bodies and _route(request.path) == "stream":
                await request.content.wait_eof()  # unread: the handler reads the names
            resp = await handler(request)
            if info_chunk_parts is not None and _route(request.path) == "info":
                assert isinstance(resp, web.Response)
                assert isinstance(resp.body, bytes)
                info = json.loads(resp.body)
                info["chunk_parts"] = info_chunk_parts
                resp.body = json.dumps(info).encode()
            if part_version is not None and "X-Netopt-Version" in resp.headers:
                resp.headers["X-Netopt-Version"] = part_version  # as if the files changed
            if (
                len(corrupted) < corrupt_parts
                and isinstance(resp, web.Response)
                and "X-Netopt-Version" in resp.headers  # a part's answer
                and isinstance(resp.body, bytes)
            ):
                corrupted.append(request.path)
                resp.body = bytes([resp.body[0] ^ 0xFF]) + resp.body[1:]  # same length
            status = resp.status
            if isinstance(resp, web.Response) and isinstance(resp.body, bytes):
                body_bytes = len(resp.body)
            return resp
        finally:
            query = dict(request.query)
            ended_s = time.monotonic()
            seen.append(Seen(_route(request.path), started_s, ended_s, query, status, body_bytes))

    app = web.Application(
        middlewares=[
            record,
            service_shell("data plane", max_request_bytes=1024**2),
            auth_middleware,
        ]
    )
    dataset = load_dataset(root, "ds", chunk_bytes)
    add_dataplane(app, ServeSettings(token=TOKEN, worker_threads=2), {"ds": dataset}, CPU)
    return await start_server(app, "127.0.0.1", 0)


async def _sent_in_two(
    resp: web.StreamResponse, request: web.Request, first_bytes: int, release: asyncio.Event
) -> web.StreamResponse:
    """``resp``'s answer, its first ``first_bytes`` bytes sent at once, the rest once
    ``release`` is set (30 s at most), as a lost packet holds back the rest of a body."""
    assert isinstance(resp, web.Response)
    assert isinstance(resp.body, bytes)
    body = resp.body
    out = web.StreamResponse(status=resp.status, headers=resp.headers)
    out.content_length = len(body)
    await out.prepare(request)
    await out.write(body[:first_bytes])
    try:
        await asyncio.wait_for(release.wait(), 30)
        await out.write(body[first_bytes:])
    except ConnectionError:
        pass  # the client cut this copy: another one came first
    return out


async def _sync_level3(
    port: int, dest: Path, read_timeout_s: float, within_s: float = 20
) -> tuple[SyncSummary, TransferPlan]:
    """`sync_url` of the served dataset into ``dest`` at zstd level 3, the plan choosing
    the streams (as the CLI does), within ``within_s``."""
    client = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=read_timeout_s)
    async with asyncio.timeout(within_s):
        return await sync_url(
            f"netopt://127.0.0.1:{port}/ds", dest, client,
            client_cpu=CPU, sync_options=FAST, zstd_level=3,
        )  # fmt: skip


async def _sync(port: int, dest: Path, cache: Path) -> dict[str, object]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "netopt", "sync", f"netopt://127.0.0.1:{port}/ds", str(dest),
        "--cache-dir", str(cache), "--json",
        cwd=REPO, env={**os.environ, "NETOPT_TOKEN": TOKEN},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    report: dict[str, object] = json.loads(out)
    return report


async def test_a_small_sync_takes_two_request_rounds(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    seen: list[Seen] = []
    runner, port = await _serve(tmp_path / "src", seen)
    try:
        report = await _sync(port, tmp_path / "dest", tmp_path / "cache")
        check_tree(tmp_path / "dest", files)
        first = list(seen)
        seen.clear()
        again = await _sync(port, tmp_path / "dest", tmp_path / "cache")
    finally:
        await runner.cleanup()
    routes = [s.route for s in first]
    # The start-up prefetch sends the info as `META_COPIES` copies, and asks for the
    # manifest's first piece twice (the rest, had there been more, as shares over
    # `MANIFEST_CONNECTIONS` connections): a small manifest is that piece; nothing more.
    assert 1 <= routes.count("manifest") <= 2, routes
    assert 1 <= len(_manifest_bodies(first)) <= 2, [(s.route, s.status) for s in first]
    assert 1 <= routes.count("info") <= META_COPIES, routes  # no version check after chunks
    assert not {"chunks", "batch"} & set(routes), routes  # no request per chunk or file
    streams = [s for s in first if s.route == "stream"]
    assert 1 <= len(streams) <= 4, routes  # at most one per warm data connection
    # Round 1: info and manifest, asked independently of each other (in parallel by
    # design; on loopback one may be answered before the other arrives, so not asserted).
    meta = [s for s in first if s.route in ("info", "manifest")]
    assert all(s.started_s < min(t.started_s for t in streams) for s in meta)
    # Round 2: the streams, asked only once a manifest was there.
    manifest_s = min(s.ended_s for s in _manifest_bodies(first))
    assert all(s.started_s >= manifest_s for s in streams)
    # No round 3: the streams are the last requests (their end frames carried the version).
    assert all(s.route == "stream" for s in first[len(first) - len(streams) :]), routes
    assert report["files_written"] == len(files)
    # A sync with nothing to fetch: info and manifest, and the check (no stream carried it).
    # The manifest is the version its cache holds: answered 304, read back from the cache.
    assert {s.route for s in seen} == {"info", "manifest"}
    assert 2 <= [s.route for s in seen].count("info") <= META_COPIES + 1
    assert 1 <= [s.route for s in seen].count("manifest") <= 2
    assert {s.status for s in seen if s.route == "manifest"} == {304}
    assert again["files_written"] == 0
    assert again["manifest_id"] == report["manifest_id"]


def _manifest_bodies(seen: list[Seen]) -> list[Seen]:
    """The manifest requests answered with some of it (200 or 206; not 416)."""
    return [s for s in seen if s.route == "manifest" and s.status in (200, 206)]


async def _sync_answered_whole(
    tmp_path: Path, streams: int, read_timeout_s: float
) -> tuple[SyncSummary, list[Seen]]:
    """`sync_url` of ``tmp_path/src`` into ``tmp_path/dest`` over ``streams`` streams, from
    a server that answers a stream only once its body (the names) ended; within 30 s."""
    seen: list[Seen] = []
    runner, port = await _serve(tmp_path / "src", seen, whole_stream_bodies=True)
    client = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=read_timeout_s)
    try:
        async with asyncio.timeout(30):
            summary, _ = await sync_url(
                f"netopt://127.0.0.1:{port}/ds", tmp_path / "dest", client,
                client_cpu=CPU, sync_options=FAST, streams=streams,
            )  # fmt: skip
    finally:
        await runner.cleanup()
    return summary, seen


async def test_a_small_sync_ends_each_stream_with_its_last_name(tmp_path: Path) -> None:
    # A server that answers a stream only after its body ended: a stream that has named
    # its last chunk must end its names at once, not wait for the frames first (then the
    # server's end frame, which carries the version, would come a round trip after the
    # last frame). Waiting deadlocks here: the bound turns that into a failure.
    # One stream: it names every chunk of this small dataset in its first breath (with
    # more, each names its share and the rest as frames arrive, which this server,
    # waiting for the whole body, would never send).
    files = make_dataset(tmp_path / "src")
    summary, seen = await _sync_answered_whole(tmp_path, streams=1, read_timeout_s=2)
    check_tree(tmp_path / "dest", files)
    assert summary.chunk_retries == 0
    routes = [s.route for s in seen]
    assert routes.count("info") == 1, routes  # every stream's end frame carried the version
    assert routes.count("stream") == 1, routes


async def test_the_stream_that_empties_the_queue_ends_every_streams_names(
    tmp_path: Path,
) -> None:
    # Two streams, two chunks (two small files): the first stream names one, the second
    # the other and empties the queue. A server that answers a stream only once its body
    # ended then answers the first only if the second ended its names too; had it waited
    # for its own frame to name its end (a round trip late on a real link), the first
    # stream would wait here until it counted as stalled, and its chunk would be fetched
    # again.
    # Under the chunker's smallest chunk (a quarter of the average): one chunk a file.
    # Random files of 20,000 bytes were cut in two about one time in twelve.
    files = {"a.bin": os.urandom(8_000), "b.bin": os.urandom(8_000)}
    assert all(len(chunk_bytes(data, CHUNK_BYTES)) == 1 for data in files.values())
    (tmp_path / "src").mkdir()
    for rel, data in files.items():
        (tmp_path / "src" / rel).write_bytes(data)
    summary, seen = await _sync_answered_whole(tmp_path, streams=2, read_timeout_s=5)
    check_tree(tmp_path / "dest", files)
    assert summary.chunks_fetched == 2
    assert summary.chunk_retries == 0
    routes = [s.route for s in seen]
    assert routes.count("stream") == 2, routes
    assert routes.count("info") == 1, routes  # both end frames carried the version


async def _sync_four_parts(port: int, dest: Path, *, read_timeout_s: float) -> SyncSummary:
    """The dataset synced in process over four streams at zstd 3 (20 s at most)."""
    client = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=read_timeout_s)
    async with asyncio.timeout(20):
        summary, _ = await sync_url(
            f"netopt://127.0.0.1:{port}/ds", dest, client,
            client_cpu=CPU, sync_options=FAST, streams=4, zstd_level=3,
        )  # fmt: skip
    return summary


async def test_a_one_chunk_sync_fetches_its_chunk_in_parts_over_every_stream(
    tmp_path: Path,
) -> None:
    # One large chunk and four streams: the chunk comes as parts, one per connection, all
    # asked at once after the manifest (one round), each naming the version after its
    # read, so no info request follows. The joined chunk is verified whole.
    files = _one_file(tmp_path / "src", 700 * 1024)
    seen: list[Seen] = []
    runner, port = await _serve(tmp_path / "src", seen, chunk_bytes=1024 * 1024)
    try:
        summary = await _sync_four_parts(port, tmp_path / "dest", read_timeout_s=2)
    finally:
        await runner.cleanup()
    check_tree(tmp_path / "dest", files)
    assert summary.chunk_retries == 0
    chunk_count = summary.chunks_fetched
    assert 1 <= chunk_count <= 2  # 700 KB at 1 MiB average chunks
    routes = [s.route for s in seen]
    assert "health" not in routes  # the warm-up opens its connections without a request
    assert routes.count("info") == 1, routes  # the parts' headers carried the version
    assert not {"stream", "batch"} & set(routes), routes
    asked = [s for s in seen if s.route == "chunks"]
    parts = 4 // chunk_count
    assert len(asked) == chunk_count * parts, routes
    assert all(s.query is not None and s.query["parts"] == str(parts) for s in asked)
    assert sorted(int(s.query["part"]) for s in asked if s.query) == sorted(
        list(range(parts)) * chunk_count
    )
    manifest = next(s for s in seen if s.route == "manifest")
    assert all(s.started_s >= manifest.ended_s for s in asked)
    assert summary.wire_bytes < summary.logical_bytes  # each part came compressed


async def test_a_part_held_back_is_asked_again_and_the_sync_does_not_wait_for_it(
    tmp_path: Path,
) -> None:
    # A 1 MiB sync as the CLI runs it (the plan's streams: 32 parts, one per warm
    # connection). Part 1's first request is held by the server (as a lost packet holds
    # a part back on a lossy link): once the other parts show it late, the sync asks for
    # it again on another connection and ends with that copy, well inside the 30 s read
    # timeout a held request would otherwise wait out (then the chunk is asked again whole).
    files = _one_file(tmp_path / "src")
    seen: list[Seen] = []
    release = asyncio.Event()
    runner, port = await _serve(
        tmp_path / "src", seen, chunk_bytes=4 * 1024 * 1024, held_part=("1", release)
    )
    try:
        summary, _ = await _sync_level3(port, tmp_path / "dest", 30)
        synced_s = time.monotonic()
        assert not release.is_set()
    finally:
        release.set()
        await runner.cleanup()
    check_tree(tmp_path / "dest", files)
    assert summary.chunks_fetched == 1
    assert summary.chunk_retries == 0  # not asked again whole: the part's copy came
    asked = [s for s in seen if s.route == "chunks" and s.query is not None]
    assert {s.query["parts"] for s in asked if s.query} == {"32"}
    copies = Counter(s.query["part"] for s in asked if s.query is not None)
    assert copies["1"] >= 2, copies
    assert set(copies) == {str(part) for part in range(32)}, copies
    held = min((s for s in asked if s.query and s.query["part"] == "1"), key=lambda s: s.started_s)
    assert held.ended_s > synced_s  # the sync ended while the first request was held


async def test_what_a_copy_cut_late_had_read_counts_in_the_wire_bytes(tmp_path: Path) -> None:
    # As above, but the held copy of part 1 sends the first half of its body before it
    # is held: those bytes crossed the link, and the sync's wire bytes say so (they
    # counted only the copies that came first).
    _one_file(tmp_path / "src")
    seen: list[Seen] = []
    release = asyncio.Event()
    runner, port = await _serve(
        tmp_path / "src", seen, chunk_bytes=4 * 1024 * 1024, held_part=("1", release),
        held_after_bytes=2048,
    )  # fmt: skip
    try:
        summary, _ = await _sync_level3(port, tmp_path / "dest", 30)
    finally:
        release.set()
        await runner.cleanup()
    answers = [s for s in seen if s.route == "chunks" and s.query is not None and s.body_bytes]
    part_bytes = {s.query["part"]: s.body_bytes for s in answers if s.query is not None}
    assert len(part_bytes) == 32
    assert part_bytes["1"] > 2048  # the held copy had more to send than it did
    assert summary.chunk_retries == 0
    # The wire bytes are the info's and the manifest's (under 4 KB for this one file)
    # and the parts': the copies that came first, and the 2,048 bytes the cut one read.
    meta_bytes = summary.wire_bytes - sum(part_bytes.values()) - 2048
    assert 0 <= meta_bytes < 4096, meta_bytes


def _write_one_file(root: Path, data: bytes) -> None:
    root.mkdir()
    (root / "one.py").write_bytes(data)


async def _serve_one_chunk(
    root: Path, size_bytes: int, chunk_bytes: int = 1024 * 1024
) -> tuple[bytes, web.AppRunner, str]:
    """A server of one file of ``size_bytes`` of text, chunked at ``chunk_bytes`` on
    average (the callers' sizes make it one chunk); the file's bytes, the runner and the
    dataset's URL."""
    data = real_text(size_bytes)
    await asyncio.to_thread(_write_one_file, root, data)
    runner, port = await _serve(root, [], chunk_bytes=chunk_bytes)
    return data, runner, f"http://127.0.0.1:{port}/v1/datasets/ds"


async def test_the_chunk_route_cuts_parts_and_refuses_bad_ones(tmp_path: Path) -> None:
    data, runner, base = await _serve_one_chunk(tmp_path / "src", 300 * 1024)
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            async with http.get(f"{base}/manifest") as resp:
                manifest = await resp.json()
            async with http.get(base) as resp:
                version = (await resp.json())["manifest_id"]
            (ref,) = manifest["files"][0]["chunks"]  # 300 KB: one chunk
            url = f"{base}/chunks/{ref[0]}"
            pieces = []
            for part in range(3):
                async with http.get(url, params={"part": str(part), "parts": "3"}) as resp:
                    assert resp.status == 200
                    assert resp.headers["X-Netopt-Codec"] == "identity"  # level 0
                    assert resp.headers["X-Netopt-Version"] == version
                    pieces.append(await resp.read())
            assert b"".join(pieces) == data
            assert [len(p) for p in pieces] == [len(data) * (i + 1) // 3 - len(data) * i // 3
                                                for i in range(3)]  # fmt: skip
            over = str(MAX_CHUNK_PARTS + 1)
            bad = [{"part": "3", "parts": "3"}, {"part": "0", "parts": over},
                   {"part": "-1", "parts": "2"}, {"part": "x", "parts": "2"}, {"parts": "2"},
                   {"part": "0", "parts": "1" * 40}]  # fmt: skip
            for params in bad:
                async with http.get(url, params=params) as resp:
                    assert resp.status == 400, params
                    assert (await resp.json())["error"] == "ValidationError", params
    finally:
        await runner.cleanup()


async def test_parts_asked_at_once_read_their_chunk_from_disk_once(tmp_path: Path) -> None:
    # A chunk of the size a sync fetches again at its tail (the plan's 2 MiB chunks on a
    # long link; 1.8 MiB of text is what the repository's source holds).
    data, runner, base = await _serve_one_chunk(
        tmp_path / "src", 1800 * 1024, chunk_bytes=MAX_AVG_CHUNK_BYTES
    )
    parts = MAX_CHUNK_PARTS
    cache = runner.app[PART_CACHE]
    cache.keep_s = 0.5  # then swept, with no request after
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            async with http.get(f"{base}/manifest") as resp:
                manifest = await resp.json()
            (ref,) = manifest["files"][0]["chunks"]  # one chunk
            url = f"{base}/chunks/{ref[0]}"

            async def part(index: int) -> bytes:
                params = {"part": str(index), "parts": str(parts)}
                async with http.get(url, params=params) as resp:
                    assert resp.status == 200
                    assert resp.headers["X-Netopt-Codec"] == "identity"
                    return await resp.read()

            pieces = await asyncio.gather(*(part(i) for i in range(parts)))
            assert b"".join(pieces) == data
            assert cache.reads == 1, (cache.reads, cache.shared)
            assert cache.shared == parts - 1
            assert cache.kept_bytes == len(data)
            # The whole chunk is still read and verified as before (not from the parts' copy).
            async with http.get(url) as resp:
                assert await resp.read() == data
            assert cache.reads == 1
            # Unused, the chunk is dropped though no part request comes after it: swept
            # 0.5 s after the first part (still fresh then), and again 0.5 s later.
            await asyncio.sleep(3 * cache.keep_s + 0.2)
            assert cache.kept_bytes == 0
            assert not cache.sweep_due
    finally:
        await runner.cleanup()


async def test_a_part_naming_another_version_makes_the_sync_check_the_info(
    tmp_path: Path,
) -> None:
    # The parts' version headers stand in for the check only when they name the version
    # synced: here each names another, so the sync asks for the info once more (which
    # still names the synced version: the sync succeeds, byte for byte).
    files = _one_file(tmp_path / "src", 400 * 1024)
    seen: list[Seen] = []
    runner, port = await _serve(
        tmp_path / "src", seen, chunk_bytes=1024 * 1024, part_version="0" * 64
    )
    try:
        report = await _sync(port, tmp_path / "dest", tmp_path / "cache")
    finally:
        await runner.cleanup()
    check_tree(tmp_path / "dest", files)
    routes = [s.route for s in seen]
    assert routes.count("chunks") > int(str(report["chunks_fetched"])), routes  # in parts
    data_s = min(s.started_s for s in seen if s.route == "chunks")
    checks = [s for s in seen if s.route == "info" and s.started_s > data_s]
    assert len(checks) == 1, routes  # the check the parts could not stand in for
    assert routes[-1] == "info", routes


async def test_a_bad_part_fails_the_joined_chunk_check_and_the_chunk_is_asked_again(
    tmp_path: Path,
) -> None:
    # The first part served has a flipped byte (same length, no compression: the part
    # decodes): the joined chunk fails its BLAKE3 check, nothing bad is written, and the
    # chunk is fetched again in parts.
    files = _one_file(tmp_path / "src", 400 * 1024)
    seen: list[Seen] = []
    runner, port = await _serve(tmp_path / "src", seen, chunk_bytes=1024 * 1024, corrupt_parts=1)
    client = ClientOptions(token=TOKEN, connect_timeout_s=2, read_timeout_s=2)
    try:
        async with asyncio.timeout(20):
            summary, _ = await sync_url(
                f"netopt://127.0.0.1:{port}/ds", tmp_path / "dest", client,
                client_cpu=CPU, sync_options=FAST, streams=2, zstd_level=0,
            )  # fmt: skip
    finally:
        await runner.cleanup()
    check_tree(tmp_path / "dest", files)
    assert summary.chunk_retries == 1
    assert [s.route for s in seen].count("chunks") == 2 * 2 * summary.chunks_fetched


def _one_file(src: Path, size_bytes: int = 1024 * 1024) -> dict[str, bytes]:
    """``src`` holding one file of real text (1 MiB: one chunk at 4 MiB): its files."""
    files = {"one.py": real_text(size_bytes)}
    src.mkdir()
    (src / "one.py").write_bytes(files["one.py"])
    return files


@pytest.mark.parametrize("offered", [None, 16])
async def test_without_a_stream_count_a_small_sync_cuts_parts_for_every_warm_connection(
    tmp_path: Path, offered: int | None
) -> None:
    """The plan chooses the streams: a one-chunk sync then cuts its chunk into a part per
    warm connection (at least `WARM_CONNECTIONS`), each part at least `MIN_PART_BYTES`,
    and no more parts than the server's info offers (an older server's 16)."""
    files = _one_file(tmp_path / "src")
    seen: list[Seen] = []
    runner, port = await _serve(
        tmp_path / "src", seen, chunk_bytes=4 * 1024 * 1024, info_chunk_parts=offered
    )
    try:
        summary, plan = await _sync_level3(port, tmp_path / "dest", 2)
    finally:
        await runner.cleanup()
    check_tree(tmp_path / "dest", files)
    assert summary.chunks_fetched == 1
    connections = max(plan.streams, WARM_CONNECTIONS)
    most = MAX_CHUNK_PARTS if offered is None else offered
    parts = min(connections, most, len(files["one.py"]) // MIN_PART_BYTES)
    assert parts == (32 if offered is None else 16)  # 1 MiB: 32 parts of 32 KiB
    assert plan.streams < parts  # the rule is what gives the parts here, not the plan
    asked = [s for s in seen if s.route == "chunks"]
    assert len(asked) == parts, [s.route for s in seen]
    assert {s.query["parts"] for s in asked if s.query} == {str(parts)}


async def test_a_late_warm_up_connection_holds_nothing_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One warm-up connection of `WARM_CONNECTIONS` is answered late: the sync goes on
    over the others (its chunk in one part per open one) and is done before the late one
    answers; closing the source ends that request. The warm-up opens its connections with
    health requests here (where aiohttp cannot open one idle), so that one can be late on
    loopback; `tests/service/test_warm_connections.py` holds an idle one's handshake."""

    def no_idle_connections(*_: object, **__: object) -> None:
        raise TypeError("as an aiohttp without that signature")

    monkeypatch.setattr(aiohttp, "ClientRequest", no_idle_connections)
    files = _one_file(tmp_path / "src")
    seen: list[Seen] = []
    late = asyncio.Event()
    runner, port = await _serve(
        tmp_path / "src", seen, chunk_bytes=4 * 1024 * 1024, late_health=late
    )
    try:
        summary, _ = await _sync_level3(port, tmp_path / "dest", 20, within_s=30)
        done_s = time.monotonic()
        late.set()
    finally:
        await runner.cleanup()
    check_tree(tmp_path / "dest", files)
    assert summary.chunks_fetched == 1
    health = [s for s in seen if s.route == "health"]
    assert len(health) == WARM_CONNECTIONS
    # Every other warm-up request was answered before the sync ended; the late one after.
    assert sorted(s.ended_s > done_s for s in health) == [False] * (WARM_CONNECTIONS - 1) + [True]
    asked = [s for s in seen if s.route == "chunks"]
    parts = WARM_CONNECTIONS - 1  # one per open connection: none waits for the late one
    assert len(asked) == parts, [s.route for s in seen]
    assert {s.query["parts"] for s in asked if s.query} == {str(parts)}
