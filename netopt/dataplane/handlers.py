"""The data-plane routes' handlers, the app state they read and the token check.

Each handler parses and checks the request (dataset and chunk names against the
manifest's index, never a path; the zstd level), reads and compresses chunks in the
app's thread pool and writes the answer. The batch and stream handlers send frames
(`chunkio.FRAME_HEADER` + payload) and compress a few chunks ahead of the one being
sent. The route table and the app itself are in `netopt.dataplane.server`, which
documents the routes and re-exports the public names here.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TypeVar

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong

from netopt.dataplane.batchrun import ThreadBatcher
from netopt.dataplane.chunkio import Codec, encode_chunk, frame_header, part_bounds
from netopt.dataplane.frames import FRAME_READ_BYTES_PER_S
from netopt.dataplane.leadplan import LEAD_MAX_CHUNKS, lead_positions
from netopt.dataplane.limits import (
    MAX_CHUNK_PARTS,
    MAX_STREAM_NAMES_QUEUED,
    STREAM_NAME_LINE_BYTES,
)
from netopt.dataplane.manifestcache import ManifestEncodings
from netopt.dataplane.manifestwire import RangeNotSatisfiable, accepts_zstd, byte_range
from netopt.dataplane.origin import LiveDataset
from netopt.dataplane.partcache import PartCache
from netopt.dataplane.served import DatasetView, LoadingDatasets, ServedDataset
from netopt.dataplane.streamctx import CONTEXT_MAX_CHUNK_BYTES, ContextEncoder, fits_bundle
from netopt.dataplane.streaming import VERSION_HEADER, end_frame
from netopt.errors import (
    DatasetChangedError,
    IntegrityError,
    NetoptError,
    StorageError,
    ValidationError,
)
from netopt.names import is_dataset_name, is_hash_id
from netopt.transfer.planner import CpuProfile
from netopt.transfer.profile import cpu_profile_to_dict
from netopt.webshell import bearer_refusal, parse_json_document

__all__ = [
    "BATCHER",
    "CPU",
    "DATASETS",
    "EXECUTOR",
    "MANIFESTS",
    "PART_CACHE",
    "SETTINGS",
    "STATS",
    "ServeSettings",
    "ServeStats",
    "auth_middleware",
    "dataset_batch",
    "dataset_chunk",
    "dataset_info",
    "dataset_manifest",
    "dataset_stream",
    "health",
]

# Logs under the server's name, as it did before this module was split from it.
_HttpError = TypeVar("_HttpError", bound=web.HTTPException)

log = logging.getLogger(__name__)

MAX_ZSTD_LEVEL = 19
STREAM_LINE_BYTES = STREAM_NAME_LINE_BYTES + 3
"""One line of a stream request body: a name, optionally a space and a level (``NAME 19``)."""
_STREAM_LINE = (
    "stream lines are a chunk name (64 lowercase hex digits), optionally ' LEVEL' (0..19)"
)
MAX_BATCH_CHUNKS = 1024
_AHEAD = 3
"""Chunks of one batch being read and compressed ahead of the one being sent (at least:
a stream of small chunks reads ahead up to `_AHEAD_BYTES`, see `_stream_ahead`)."""
_AHEAD_BYTES = 1024 * 1024
_AHEAD_MAX = 64


def _stream_ahead(sent_payload_bytes: int, sent_chunks: int) -> int:
    """Chunks a stream reads and compresses ahead: about `_AHEAD_BYTES` of the chunks it
    sent so far (their average payload), between `_AHEAD` and `_AHEAD_MAX` chunks. Small
    chunks then go to the pool in batches and leave in one write per batch."""
    if not sent_chunks:
        return _AHEAD
    average_bytes = max(1, sent_payload_bytes // sent_chunks)
    return max(_AHEAD, min(_AHEAD_MAX, _AHEAD_BYTES // average_bytes))


@dataclass(frozen=True)
class ServeSettings:
    """How the server behaves; ``token`` None means no authentication (``--no-auth``)."""

    token: str | None
    congestion_control: str | None = "bbr"
    worker_threads: int = field(default_factory=lambda: os.cpu_count() or 1)


_TRACKED_CHUNKS_MAX = 100_000
"""Distinct chunk ids counted one by one; beyond, only the total grows (bounded memory on a
long-running server whose origin keeps changing)."""


class ServeStats:
    """Counters for operators and tests: chunk requests (in total, and per chunk for the first
    ``tracked_chunks_max`` distinct chunks) and payload bytes sent."""

    def __init__(self, tracked_chunks_max: int = _TRACKED_CHUNKS_MAX) -> None:
        self.chunk_requests: Counter[str] = Counter()
        self.chunk_requests_total = 0
        self.payload_bytes_sent = 0
        self._tracked_chunks_max = tracked_chunks_max

    def count_chunk(self, chunk_id: str) -> None:
        self.chunk_requests_total += 1
        if chunk_id in self.chunk_requests or len(self.chunk_requests) < self._tracked_chunks_max:
            self.chunk_requests[chunk_id] += 1


DATASETS = web.AppKey("datasets", Mapping[str, DatasetView])
Lookup = Callable[[str], Awaitable[DatasetView | None]]
LOOKUP: web.AppKey[Lookup] = web.AppKey("lookup")
"""How the routes find a dataset by name in `DATASETS` (`dataset_lookup`)."""
SETTINGS = web.AppKey("settings", ServeSettings)
CPU = web.AppKey("cpu", CpuProfile)
STATS = web.AppKey("stats", ServeStats)
EXECUTOR = web.AppKey("executor", ThreadPoolExecutor)
MANIFESTS = web.AppKey("manifests", ManifestEncodings)
"""The served manifests, encoded once per version (`netopt.dataplane.manifestcache`)."""
BATCHER = web.AppKey("batcher", ThreadBatcher)
"""The executor's calls for a stream's chunks, batched (`netopt.dataplane.batchrun`)."""
PART_CACHE = web.AppKey("part_cache", PartCache)
"""The chunks being answered in parts, each read once (`netopt.dataplane.partcache`)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, exc: NetoptError | str) -> web.Response:
    body = exc.to_dict() if isinstance(exc, NetoptError) else {"error": "Error", "message": exc}
    return web.json_response(body, status=status)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = request.app[SETTINGS].token
    if token is None or not request.path.startswith("/v1/datasets"):
        return await handler(request)
    refusal = bearer_refusal(request, token)
    return refusal if refusal is not None else await handler(request)


def dataset_lookup(datasets: Mapping[str, DatasetView]) -> Lookup:
    """How to find a dataset of ``datasets`` by name: `LoadingDatasets.load` where the
    mapping reads its datasets from disk (off the event loop), else a plain get."""
    if isinstance(datasets, LoadingDatasets):
        return datasets.load

    async def get(name: str) -> DatasetView | None:
        return datasets.get(name)

    return get


async def _lookup(request: web.Request) -> DatasetView:
    name = request.match_info["name"]
    if not is_dataset_name(name):
        raise web.HTTPBadRequest(text=f"bad dataset name {name!r}")
    found = await request.app[LOOKUP](name)
    if found is None:
        raise web.HTTPNotFound(text=f"no dataset {name!r}")
    return found


async def _dataset(request: web.Request) -> DatasetView:
    """The dataset named in the request, as its current version (for chunk routes)."""
    found = await _lookup(request)
    return found.current if isinstance(found, LiveDataset) else found


async def _fresh_dataset(request: web.Request) -> DatasetView:
    """The dataset brought up to date with its files first (for info and manifest)."""
    found = await _lookup(request)
    if not isinstance(found, LiveDataset):
        return found
    loop = asyncio.get_running_loop()
    executor = request.app[EXECUTOR]
    try:
        return await found.fresh(lambda refresh: loop.run_in_executor(executor, refresh))
    except StorageError as exc:
        raise _refusal(web.HTTPServiceUnavailable, exc) from None


def _refusal(answer: type[_HttpError], exc: NetoptError) -> _HttpError:
    """``exc`` as an HTTP error of class ``answer`` with netopt's JSON error body."""
    return answer(text=json.dumps(exc.to_dict()), content_type="application/json")


def _gone(chunk_id: str) -> web.HTTPGone:
    exc = DatasetChangedError(
        f"chunk {chunk_id[:16]} is no longer in the dataset: its files changed; "
        "fetch the info and manifest again"
    )
    return _refusal(web.HTTPGone, exc)


_REFRESHING: set[asyncio.Task[None]] = set()
"""Background refreshes started by stale reads, held until they end."""


def _stale_read(request: web.Request) -> None:
    """A chunk no longer matches its file: publish the new version in the background,
    so the client's next request learns that its chunk is gone (410)."""
    task = asyncio.get_running_loop().create_task(_publish_change(request))
    _REFRESHING.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(_REFRESHING.discard)
    task.add_done_callback(_log_refresh_failure)


async def _publish_change(request: web.Request) -> None:
    found = await _lookup(request)
    if isinstance(found, LiveDataset):
        loop = asyncio.get_running_loop()
        executor = request.app[EXECUTOR]
        await found.fresh(lambda fn: loop.run_in_executor(executor, fn))


def _log_refresh_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("publishing the changed dataset failed: %s", task.exception())


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def dataset_info(request: web.Request) -> web.Response:
    ds = await _fresh_dataset(request)
    sample = dict(ds.sample.ratio_by_level)
    cpu = request.app[CPU]
    frames = ds.frames if isinstance(ds, ServedDataset) else None
    precompressed: dict[str, object] | None = None
    if frames is not None:
        precompressed = {
            "level": frames.level,
            "ready_chunks": frames.ready,
            "chunks": frames.chunks,
        }
        if frames.offered and frames.sampled_ratio is not None:
            # Every chunk has its stored frame: that level costs only a read. Clients
            # then plan with it like any other level.
            sample[frames.level] = frames.sampled_ratio
            speeds = {**cpu.compress_bytes_per_s, frames.level: FRAME_READ_BYTES_PER_S}
            cpu = replace(cpu, compress_bytes_per_s=speeds)
    return web.json_response(
        {
            "name": ds.manifest.name,
            "manifest_id": ds.manifest.manifest_id,
            "total_bytes": ds.manifest.total_bytes,
            "files": len(ds.manifest.files),
            "chunks": len(ds.index),
            "avg_chunk_bytes": ds.manifest.avg_chunk_bytes,
            "sample": {str(k): v for k, v in sample.items()},
            "cpu": cpu_profile_to_dict(cpu),
            "congestion_control": request.app[SETTINGS].congestion_control,
            "precompressed": precompressed,
            "stream_levels": True,
            "stream_context": True,
            "stream_bundles": True,
            "stream_lead": True,
            "chunk_parts": MAX_CHUNK_PARTS,
        }
    )


async def dataset_manifest(request: web.Request) -> web.Response:
    """The manifest's canonical JSON, as one zstd frame (``Content-Encoding: zstd``) when
    the request accepts zstd, else plain; both encoded once per version (`MANIFESTS`).
    ``ETag`` names the version (its ``manifest_id``); ``If-None-Match`` naming it: 304.
    One byte range of the body when asked (`manifestwire.byte_range`; ``If-Range`` naming
    another version: the whole body)."""
    ds = await _fresh_dataset(request)
    loop = asyncio.get_running_loop()
    executor = request.app[EXECUTOR]
    encoded = await request.app[MANIFESTS].get(
        request.match_info["name"], ds.manifest, lambda fn: loop.run_in_executor(executor, fn)
    )
    etag = f'"{encoded.manifest_id}"'
    headers = {"ETag": etag, "Vary": "Accept-Encoding", "Accept-Ranges": "bytes"}
    if etag in request.headers.get("If-None-Match", "").replace(" ", "").split(","):
        return web.Response(status=304, headers=headers)
    if accepts_zstd(request.headers.get("Accept-Encoding")):
        headers["Content-Encoding"] = "zstd"
        body = encoded.zstd
    else:
        body = encoded.plain
    if_range = request.headers.get("If-Range")
    try:
        asked = (
            None
            if if_range not in (None, etag)
            else byte_range(request.headers.get("Range"), len(body))
        )
    except RangeNotSatisfiable:
        headers.pop("Content-Encoding", None)  # no body, so none encoded
        headers["Content-Range"] = f"bytes */{len(body)}"
        return web.Response(status=416, headers=headers)
    if asked is None:
        return web.Response(body=body, content_type="application/json", headers=headers)
    start, end = asked
    headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(body)}"
    return web.Response(
        status=206, body=body[start:end], content_type="application/json", headers=headers
    )


def _stored(ds: DatasetView, chunk_id: str, level: int) -> tuple[bytes, Codec] | None:
    """The chunk's stored frame when the dataset was precompressed at ``level`` or higher:
    at least as small as what the asked level would give, and it costs no CPU."""
    frames = ds.frames if isinstance(ds, ServedDataset) else None
    if frames is not None and 0 < level <= frames.level:
        if frames.is_raw(chunk_id):
            return ds.read_chunk(chunk_id), "identity"
        frame = frames.get(chunk_id)
        if frame is not None:
            return frame, "zstd"
    return None


def _read_and_encode(ds: DatasetView, chunk_id: str, level: int) -> tuple[bytes, Codec]:
    stored = _stored(ds, chunk_id, level)
    if stored is not None:
        return stored
    return encode_chunk(ds.read_chunk(chunk_id), level)


Frame = tuple[str, int, bytes, Codec]
"""One frame a stream sends: its (first) chunk's name, how many chunks it carries (more
than one: a ``zstd-bundle``), its payload and codec."""


def _frames_alone(ds: DatasetView, chunk_id: str, level: int) -> list[Frame]:
    """`_read_and_encode` as a stream's frame list."""
    payload, codec = _read_and_encode(ds, chunk_id, level)
    return [(chunk_id, 1, payload, codec)]


def _frames_in_context(
    ds: DatasetView, chunk_ids: list[str], level: int, context: ContextEncoder
) -> list[Frame]:
    """What a stream with a context sends for ``chunk_ids`` (consecutive, at one level):
    each one's stored frame, the raw bytes at level 0, else the bytes through the stream's
    compressor, as one ``zstd-bundle`` for those between stored ones when more than one.
    A stream's calls run one at a time, in the order its frames are sent (its own
    `ThreadBatcher` of one job)."""
    frames: list[Frame] = []
    names: list[str] = []
    pieces: list[bytes] = []

    def send_pieces() -> None:
        if len(pieces) == 1:
            payload, new = context.encode(pieces[0], level)
            frames.append((names[0], 1, payload, "zstd-stream-new" if new else "zstd-stream"))
        elif pieces:
            payload = context.encode_bundle(pieces, level)
            frames.append((names[0], len(pieces), payload, "zstd-bundle"))
        names.clear()
        pieces.clear()

    for chunk_id in chunk_ids:
        if level > 0 and _stored(ds, chunk_id, level) is None:
            names.append(chunk_id)
            pieces.append(ds.read_chunk(chunk_id))
            continue
        send_pieces()
        frames.append((chunk_id, 1, *_read_and_encode(ds, chunk_id, level)))
    send_pieces()
    return frames


def _read_and_encode_part(
    ds: DatasetView, chunk_id: str, level: int, part: tuple[int, int], cache: PartCache
) -> tuple[bytes, Codec]:
    # Verified whole, once for all its parts: every part comes from one good copy.
    data = cache.get(chunk_id, functools.partial(ds.read_chunk, chunk_id))
    start, end = part_bounds(len(data), *part)
    return encode_chunk(data[start:end], level)


def _sweep_parts_later(loop: asyncio.AbstractEventLoop, cache: PartCache) -> None:
    """Sweep ``cache`` `KEEP_S` from now, and again while it keeps anything: its unused
    chunks go even when no part request comes after them (one timer at a time)."""
    if cache.sweep_due:
        return
    cache.sweep_due = True

    def sweep() -> None:
        cache.sweep_due = False
        if cache.sweep():
            _sweep_parts_later(loop, cache)

    loop.call_later(cache.keep_s, sweep)


def _part(request: web.Request) -> tuple[int, int] | None:
    """``?part=I&parts=N`` (0 <= I < N <= `MAX_CHUNK_PARTS`), or None for the whole chunk.
    Raises a 400 (JSON) for anything else."""
    part_text, parts_text = request.query.get("part"), request.query.get("parts")
    if part_text is None and parts_text is None:
        return None
    if (
        part_text is None
        or parts_text is None
        or not (part_text.isascii() and part_text.isdigit() and len(part_text) <= 3)
        or not (parts_text.isascii() and parts_text.isdigit() and len(parts_text) <= 3)
        or not 0 <= int(part_text) < int(parts_text) <= MAX_CHUNK_PARTS
    ):
        raise _refusal(
            web.HTTPBadRequest,
            ValidationError(
                f"part={part_text!r}&parts={parts_text!r}: expected integers with "
                f"0 <= part < parts <= {MAX_CHUNK_PARTS}"
            ),
        )
    return int(part_text), int(parts_text)


def _level(request: web.Request) -> int:
    return _parse_level(request.query.get("level", "0"))


def _parse_level(text: str) -> int:
    """A zstd level from a peer: 0..`MAX_ZSTD_LEVEL`, decimal digits only; else 400."""
    if not (text.isascii() and text.isdigit() and len(text) <= 2):
        raise web.HTTPBadRequest(text="level is not an integer")
    level = int(text)
    if not 0 <= level <= MAX_ZSTD_LEVEL:
        raise web.HTTPBadRequest(text=f"level must be 0..{MAX_ZSTD_LEVEL}")
    return level


def _weight(ds: DatasetView, chunk_id: str) -> int:
    """The chunk's length: the bytes reading and compressing it handles (for batching, the
    stream context and bundles). A served directory's index holds (path, offset, length),
    a node cache's the length alone."""
    where = ds.index.get(chunk_id)
    if isinstance(where, tuple) and len(where) == 3 and isinstance(where[2], int):
        return where[2]
    if isinstance(where, int) and not isinstance(where, bool):
        return where
    return CONTEXT_MAX_CHUNK_BYTES  # unknown: compressed alone, never bundled


def _chunk_name(ds: DatasetView, chunk_id: object) -> str:
    if not is_hash_id(chunk_id):
        raise web.HTTPBadRequest(text="chunk names are 64 lowercase hex digits")
    if chunk_id not in ds.index:
        if isinstance(ds, ServedDataset) and ds.versioned:
            raise _gone(chunk_id)
        raise web.HTTPNotFound(text="no such chunk in this dataset")
    return chunk_id


StreamHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CLIENT_CLOSED_REQUEST = 499
"""The status logged for a request whose client went away before its answer was sent
(nginx's convention); nothing is sent."""


def _client_may_leave(handler: StreamHandler) -> StreamHandler:
    """``handler``, a route that writes its answer as it goes, for which a client that goes
    away (killed mid-sync, a cut link: the connection reset while the body is read or
    the frames written) ends the request quietly, logged as `CLIENT_CLOSED_REQUEST`, not
    as a server error with a traceback."""

    @functools.wraps(handler)
    async def quiet(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ConnectionResetError:
            log.info("%s %s: the client went away", request.method, request.path)
            return web.Response(status=CLIENT_CLOSED_REQUEST)

    return quiet


@_client_may_leave
async def dataset_batch(request: web.Request) -> web.StreamResponse:
    ds = await _dataset(request)
    level = _level(request)
    try:
        body = parse_json_document(await request.read())
    except ValidationError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    wanted = body.get("chunks") if isinstance(body, dict) else None
    if not isinstance(wanted, list) or not 0 < len(wanted) <= MAX_BATCH_CHUNKS:
        raise web.HTTPBadRequest(text=f"chunks must be a list of 1..{MAX_BATCH_CHUNKS} names")
    ids = [_chunk_name(ds, cid) for cid in wanted]
    if len(set(ids)) != len(ids):
        # Each name once: a repeat would send the same chunk again for 70 bytes asked.
        raise web.HTTPBadRequest(text="a batch names a chunk more than once")
    stats = request.app[STATS]
    loop = asyncio.get_running_loop()
    executor = request.app[EXECUTOR]
    resp = web.StreamResponse(headers={"Content-Type": "application/x-netopt-frames"})
    await resp.prepare(request)
    # Compress up to _AHEAD chunks ahead of the one being sent, so the pool never waits
    # on the socket and the socket never waits on one chunk's compression.
    upcoming: deque[asyncio.Future[tuple[bytes, Codec]]] = deque()
    queued = 0

    def refill() -> None:
        nonlocal queued
        while queued < len(ids) and len(upcoming) < _AHEAD:
            upcoming.append(
                loop.run_in_executor(executor, _read_and_encode, ds, ids[queued], level)
            )
            queued += 1

    chunk_id = ids[0]
    try:
        refill()
        for chunk_id in ids:
            stats.count_chunk(chunk_id)
            payload, codec = await upcoming.popleft()
            refill()
            await resp.write(frame_header(chunk_id, codec, len(payload)) + payload)
            stats.payload_bytes_sent += len(payload)
    except (StorageError, IntegrityError) as exc:
        # Cut the stream: the client keeps the whole frames it got and asks again.
        log.warning("batch stopped at chunk %s: %s", chunk_id[:16], exc)
        if isinstance(exc, IntegrityError):
            _stale_read(request)
        if request.transport is not None:
            request.transport.close()
        return resp
    finally:
        for future in upcoming:
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: nobody will send this chunk now
            future.cancel()
    await resp.write_eof()
    return resp


def _lead(request: web.Request, ds: DatasetView) -> Iterator[int]:
    """The positions in ``ds``'s chunk order that the stream request's lead names (none
    without ``lead``): 400 for a malformed or empty one, 409 (JSON) when it names
    another version than ``ds``'s."""
    version = request.query.get("lead")
    if version is None:
        return iter(())
    if not is_hash_id(version):
        raise _bad_lead("lead is not a version id")
    start = _lead_number(request, "from")
    count = _lead_number(request, "count")
    every = _lead_number(request, "every")
    if version != ds.manifest.manifest_id:
        exc = DatasetChangedError(
            f"the lead names version {version[:16]}, not the one served now: "
            "fetch the info and manifest again"
        )
        raise _refusal(web.HTTPConflict, exc)
    try:
        return lead_positions(len(ds.manifest.chunk_order), start, count, every)
    except ValueError as exc:
        raise _bad_lead(str(exc)) from None


def _bad_lead(message: str) -> web.HTTPBadRequest:
    return _refusal(web.HTTPBadRequest, ValidationError(message))


def _lead_number(request: web.Request, key: str) -> int:
    """A lead's ``from``, ``count`` or ``every``: decimal digits, at most as many as
    `LEAD_MAX_CHUNKS` has; else 400."""
    text = request.query.get(key, "")
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(LEAD_MAX_CHUNKS))):
        raise _bad_lead(f"{key} is not a chunk count")
    return int(text)


async def _next_stream_id(
    request: web.Request, ds: DatasetView, seen: set[str], level: int
) -> tuple[str, int] | None:
    """The next chunk name of a stream request's body and the level to send it at (the
    line's ``NAME LEVEL``, else the request's ``level``); None at the body's end.

    400 for a line that is not a name of this dataset's with an optional level in
    0..`MAX_ZSTD_LEVEL` (a long one is refused after `STREAM_LINE_BYTES`, not read
    whole) or a name the stream sent before.
    """
    try:
        line = await request.content.readline(max_line_length=STREAM_LINE_BYTES)
    except LineTooLong:
        raise web.HTTPBadRequest(text=_STREAM_LINE) from None
    if not line:
        return None
    try:
        text = line.strip().decode("ascii")
    except UnicodeDecodeError:
        raise web.HTTPBadRequest(text=_STREAM_LINE) from None
    name_text, sep, level_text = text.partition(" ")
    if sep:
        level = _parse_level(level_text)
    name = _chunk_name(ds, name_text)
    if name in seen:
        raise web.HTTPBadRequest(text="a stream names a chunk more than once")
    seen.add(name)  # names of the dataset only: at most its chunk count
    return name, level


@_client_may_leave
async def dataset_stream(request: web.Request) -> web.StreamResponse:
    """Frames for the chunk names the body sends, in order, as the names arrive; a line
    ``NAME LEVEL`` sends that chunk at LEVEL instead of the request's ``level``. With
    ``lead=VERSION&from=START&count=COUNT&every=EVERY`` (`netopt.dataplane.leadplan`),
    the frames of those chunks of the version's order come first (409 when VERSION is
    not the one served now).

    The first name is checked before the response starts (400/404 as for a
    batch); a bad later name, or a chunk that cannot be read, cuts the stream:
    the client keeps the whole frames it got and asks again.
    """
    ds = await _dataset(request)
    level = _level(request)
    seen: set[str] = set()
    # A lead's chunks come first (named by their place in the version, `leadplan`); the
    # body's names follow. A body may name a chunk of its lead once more: at most twice.
    lead = _lead(request, ds)
    first = (ds.manifest.chunk_order[at], level) if (at := next(lead, None)) is not None else None
    if first is None:
        first = await _next_stream_id(request, ds, seen, level)
    resp = web.StreamResponse(headers={"Content-Type": "application/x-netopt-frames"})
    await resp.prepare(request)
    if first is None:
        await resp.write_eof()
        return resp
    stats = request.app[STATS]
    loop = asyncio.get_running_loop()
    # Bounded: while it is full the body is not read, and TCP holds the client back.
    names: asyncio.Queue[tuple[str, int] | None] = asyncio.Queue(maxsize=MAX_STREAM_NAMES_QUEUED)
    names.put_nowait(first)

    async def read_names() -> None:
        for position in lead:
            await names.put((ds.manifest.chunk_order[position], level))
        while (named := await _next_stream_id(request, ds, seen, level)) is not None:
            await names.put(named)
        await names.put(None)

    reader = loop.create_task(read_names())
    batcher = request.app[BATCHER]
    # ``ctx=1``: the stream's chunks share one zstd context (see netopt.dataplane.streamctx);
    # ``bundle=1`` as well: small chunks already named go through it together.
    context = ContextEncoder() if _stream_context(request) else None
    bundling = context is not None and request.query.get("bundle") == "1"
    # Its calls run in order, one job at a time (many small chunks per job); larger chunks
    # go to the shared pool, alone (see CONTEXT_MAX_CHUNK_BYTES).
    lane = ThreadBatcher(request.app[EXECUTOR], 1)
    upcoming: deque[tuple[list[str], asyncio.Future[list[Frame]]]] = deque()
    upcoming_chunks = 0
    held: tuple[str, int] | None = None  # taken off the queue, not fitting the last bundle
    ended = False
    chunk_id = first[0]
    sent_bytes = sent_chunks = 0
    try:
        while True:
            # Compress chunks ahead; wait for a name only when idle.
            ahead = _stream_ahead(sent_bytes, sent_chunks)
            while (
                not ended
                and upcoming_chunks < ahead
                and (not upcoming or held is not None or not names.empty())
            ):
                got = held if held is not None else await _next_name(names, reader)
                held = None
                if got is None:
                    ended = True
                    break
                name, name_level = got
                future: asyncio.Future[list[Frame]]
                weight_bytes = _weight(ds, name)
                members = [name]
                if context is None or weight_bytes >= CONTEXT_MAX_CHUNK_BYTES:
                    future = batcher.submit(
                        _frames_alone, ds, name, name_level, weight_bytes=weight_bytes
                    )
                else:
                    if bundling and name_level > 0:
                        # Only names that are here already: a bundle never waits for one.
                        held, ended = _fill_bundle(ds, names, members, name_level)
                        weight_bytes = sum(_weight(ds, member) for member in members)
                    future = lane.submit(
                        _frames_in_context, ds, members, name_level, context,
                        weight_bytes=weight_bytes,
                    )  # fmt: skip
                upcoming.append((members, future))
                upcoming_chunks += len(members)
            if not upcoming:
                break
            # The first frames, and every later one already compressed: one write.
            frames: list[bytes] = []
            while upcoming and (not frames or upcoming[0][1].done()):
                members, future = upcoming.popleft()
                upcoming_chunks -= len(members)
                chunk_id = members[0]
                for member in members:
                    stats.count_chunk(member)
                for first_id, _, payload, codec in await future:
                    frames += (frame_header(first_id, codec, len(payload)), payload)
                    stats.payload_bytes_sent += len(payload)
                    sent_bytes += len(payload)
                sent_chunks += len(members)
            await resp.write(b"".join(frames))
    except (StorageError, IntegrityError, web.HTTPException) as exc:
        log.warning("stream stopped at chunk %s: %s", chunk_id[:16], exc)
        if isinstance(exc, IntegrityError):
            _stale_read(request)
        if request.transport is not None:
            request.transport.close()
        return resp
    finally:
        reader.cancel()
        if reader.done() and not reader.cancelled():
            reader.exception()  # retrieved: the stream is cut either way
        for _, future in upcoming:
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: nobody will send this chunk now
            future.cancel()
    try:
        # After every chunk of this stream was read: the version current now, so a
        # client whose chunks all came this way needs no version-check request.
        fresh = await _fresh_dataset(request)
    except web.HTTPException:
        pass  # no end frame: the client asks for the info instead
    else:
        await resp.write(end_frame(fresh.manifest.manifest_id))
    await resp.write_eof()
    return resp


def _fill_bundle(
    ds: DatasetView,
    names: asyncio.Queue[tuple[str, int] | None],
    members: list[str],
    level: int,
) -> tuple[tuple[str, int] | None, bool]:
    """Add to ``members`` (a bundle's first chunk, at ``level``) the names queued now that
    fit it (`fits_bundle`, the same level); (the name taken that did not fit, True when
    the names' end was reached)."""
    bundle_bytes = _weight(ds, members[0])
    while not names.empty():
        got = names.get_nowait()
        if got is None:
            return None, True
        weight_bytes = _weight(ds, got[0])
        if got[1] != level or not fits_bundle(bundle_bytes, len(members), weight_bytes):
            return got, False
        members.append(got[0])
        bundle_bytes += weight_bytes
    return None, False


def _stream_context(request: web.Request) -> bool:
    """True when a stream request asks for one zstd context (``ctx=1``)."""
    return request.query.get("ctx") == "1"


async def _next_name(
    names: asyncio.Queue[tuple[str, int] | None], reader: asyncio.Task[None]
) -> tuple[str, int] | None:
    """The next queued name; raises what the body reader raised (a bad name, a cut body)."""
    if not names.empty():
        return names.get_nowait()
    if names.empty() and reader.done():
        reader.result()
        return None
    getter = asyncio.ensure_future(names.get())
    await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
    if getter.done():
        return getter.result()
    getter.cancel()
    reader.result()
    return names.get_nowait() if not names.empty() else None


async def dataset_chunk(request: web.Request) -> web.Response:
    ds = await _dataset(request)
    level = _level(request)
    part = _part(request)
    chunk_id = _chunk_name(ds, request.match_info["chunk_id"])
    stats = request.app[STATS]
    stats.count_chunk(chunk_id)
    loop = asyncio.get_running_loop()

    def read(ds: DatasetView, chunk_id: str) -> tuple[bytes, Codec]:
        if part is None:
            return _read_and_encode(ds, chunk_id, level)
        return _read_and_encode_part(ds, chunk_id, level, part, request.app[PART_CACHE])

    try:
        payload, codec = await loop.run_in_executor(request.app[EXECUTOR], read, ds, chunk_id)
    except IntegrityError as exc:
        found = await _lookup(request)
        if not isinstance(found, LiveDataset):
            log.warning("chunk %s: %s", chunk_id[:16], exc)
            return _error(500, exc)
        # The file changed since the last version: publish the new one; the chunk is
        # gone (410) unless the new version still holds it elsewhere.
        ds = await _fresh_dataset(request)
        chunk_id = _chunk_name(ds, chunk_id)
        try:
            payload, codec = await loop.run_in_executor(request.app[EXECUTOR], read, ds, chunk_id)
        except (StorageError, IntegrityError):
            raise _gone(chunk_id) from None
    except StorageError as exc:
        log.warning("chunk %s: %s", chunk_id[:16], exc)
        return _error(500, exc)
    stats.payload_bytes_sent += len(payload)
    headers: dict[str, str] = {"X-Netopt-Codec": codec}
    if part is not None:
        _sweep_parts_later(loop, request.app[PART_CACHE])
        # As a stream's end frame: the version current after the read, so a client whose
        # chunks all came in parts needs no version-check request at the end.
        try:
            fresh = await _fresh_dataset(request)
        except web.HTTPException:
            pass  # no version named: the client asks for the info instead
        else:
            headers[VERSION_HEADER] = fresh.manifest.manifest_id
    return web.Response(body=payload, content_type="application/octet-stream", headers=headers)
