"""Region-aware sharing: each chunk crosses a border once per region.

With a coordinator, ``netopt sync`` on a node asks the coordinator's chunk
catalogue where each chunk should come from (see
:mod:`netopt.coordinator.catalogue`): from an in-region peer's agent that holds
it, from SOURCE (across the border) when the node holds the chunk's lease, or
later when another node of the region is fetching it across the border right
now. The node reports every chunk it stores, so its agent serves it to the
region's next askers.

`join_region` opens a sync's session and wraps the opened source of any kind
(`netopt.cache.sources`) in a :class:`SharedChunkSource`, an ordinary
`ChunkSource` to the sync engine: it
routes each batch, fetches the parts from peers and SOURCE concurrently and
yields the chunks in the order asked. A peer that fails is excluded for the rest
of the sync and its chunks are routed again (another peer, or SOURCE), so a peer
killed mid-sync costs a retry, not the sync. A sync killed mid-way stops
renewing its session; the coordinator frees its leases after the session TTL.

Sharing is an optimisation, never a reason to fail: when the coordinator stops
answering mid-sync (every address unreachable or a 5xx for `FAILING_GRACE_S`, or at
once for a refusal or a malformed route), the batch's chunks come from SOURCE and
the sync goes on without the catalogue for `OFFLINE_RETRY_S` before it asks again
(`SharingStats.coordinator_failures`, ``chunks_unshared``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from netopt.dataplane.chunkio import ChunkSource, RawChunk
from netopt.dataplane.httpsource import (
    ClientOptions,
    DatasetUrl,
    HttpChunkSource,
    checked_dataset_url,
)
from netopt.errors import NetoptError, PeerUnreachableError, ProtocolError, ValidationError
from netopt.names import is_node_name
from netopt.transfer.manifest import Manifest
from netopt.wire.client import CoordinatorClient

__all__ = [
    "JoinedRegion",
    "RegionSharing",
    "SharedChunkSource",
    "SharingOptions",
    "SharingStats",
    "join_region",
]

log = logging.getLogger(__name__)

MAX_INDEXES = 65536
"""Chunk indexes per list in one call (the coordinator's limit)."""
STEAL_AFTER_S = 30.0
"""A chunk in flight for another node this long is fetched from SOURCE (the lessee is stuck)."""
FLUSH_INTERVAL_S = 0.5
"""How often stored chunks are reported (and the session renewed) between routing calls."""
FAILING_GRACE_S = 5.0
"""How long an unreachable coordinator is asked again before a batch goes to SOURCE
(a replica's failover takes well under this; a dead coordinator costs at most this)."""
OFFLINE_RETRY_S = 10.0
"""After the coordinator failed a routing call, how long batches go to SOURCE unasked."""
MAX_ROUTE_PEERS = 1024
"""Peers one route answer may name."""


@dataclass(frozen=True)
class SharingOptions:
    """How to reach the coordinator, and who this node is."""

    coordinator_url: str
    token: str
    node: str
    peer_streams: int = 4
    timeout_s: float = 10.0


@dataclass
class SharingStats:
    """Where this sync's chunks came from."""

    chunks_from_peers: int = 0
    wire_bytes_from_peers: int = 0
    chunks_from_source: int = 0
    wire_bytes_from_source: int = 0
    waits: int = 0
    steals: int = 0
    route_calls: int = 0
    peers_excluded: list[str] = field(default_factory=list)
    start_fraction: float = 0.0
    coordinator_failures: int = 0
    """Routing calls the coordinator failed (the batch went to SOURCE)."""
    chunks_unshared: int = 0
    """Chunks sent to SOURCE without asking the catalogue (it was failing)."""

    def to_dict(self) -> dict[str, Any]:
        """The stats as JSON-able data."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class _Route:
    peers: dict[str, list[str]]
    endpoints: dict[str, str]
    origin: list[str]
    wait: list[str]
    retry_after_s: float


def _indexes(value: object, chunk_count: int, what: str) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_INDEXES:
        raise ProtocolError(f"route answer: {what} is not a list of at most {MAX_INDEXES}")
    for i in value:
        if type(i) is not int or not 0 <= i < chunk_count:
            raise ProtocolError(f"route answer: {what} holds {i!r}, not a chunk index")
    return value


def read_route(answer: object, ids: Sequence[str]) -> _Route:
    """A coordinator's route answer, checked: node names, endpoint strings, chunk indexes
    within the manifest, a bounded retry delay. Raises ProtocolError naming the field."""
    if not isinstance(answer, dict):
        raise ProtocolError("route answer is not an object")
    peers_raw = answer.get("peers", {})
    endpoints_raw = answer.get("endpoints", {})
    if not isinstance(peers_raw, dict) or len(peers_raw) > MAX_ROUTE_PEERS:
        raise ProtocolError(f"route answer: peers is not an object of <= {MAX_ROUTE_PEERS}")
    if not isinstance(endpoints_raw, dict) or len(endpoints_raw) > MAX_ROUTE_PEERS:
        raise ProtocolError(f"route answer: endpoints is not an object of <= {MAX_ROUTE_PEERS}")
    count = len(ids)
    peers: dict[str, list[str]] = {}
    for node, indexes in peers_raw.items():
        if not is_node_name(node):
            raise ProtocolError(f"route answer: peers names {node!r}, not a node name")
        peers[node] = [ids[i] for i in _indexes(indexes, count, f"peers[{node}]")]
    endpoints: dict[str, str] = {}
    for node, endpoint in endpoints_raw.items():
        if not is_node_name(node) or not isinstance(endpoint, str) or len(endpoint) > 300:
            raise ProtocolError(f"route answer: endpoints[{node!r}] is not a host:port")
        endpoints[node] = endpoint
    retry_after_s = answer.get("retry_after_s", 0.25)
    if type(retry_after_s) not in (int, float) or not 0.0 <= retry_after_s <= 60.0:
        raise ProtocolError(f"route answer: retry_after_s {retry_after_s!r} is not 0-60")
    return _Route(
        peers=peers,
        endpoints=endpoints,
        origin=[ids[i] for i in _indexes(answer.get("origin", []), count, "origin")],
        wait=[ids[i] for i in _indexes(answer.get("wait", []), count, "wait")],
        retry_after_s=float(retry_after_s),
    )


class RegionSharing:
    """One sync's session with the coordinator's chunk catalogue."""

    def __init__(self, client: CoordinatorClient, options: SharingOptions, manifest: Manifest):
        self.client = client
        self.options = options
        self.manifest = manifest
        self.ids = list(manifest.unique_chunks())
        self.index_of = {cid: i for i, cid in enumerate(self.ids)}
        self.stats = SharingStats()
        self.excluded: set[str] = set()
        self._stored: list[int] = []
        self._offline_until_s = float("-inf")
        self._failing_since_s = float("inf")
        """When routing calls began to fail unanswered (inf: the last one was answered)."""
        self._path = f"/api/v1/datasets/{manifest.name}/versions/{manifest.manifest_id}/route"

    def stored(self, chunk_id: str) -> None:
        """Note a chunk stored in the cache; reported with the next call."""
        index = self.index_of.get(chunk_id)
        if index is not None:
            self._stored.append(index)

    def exclude(self, node: str) -> None:
        """Stop fetching from ``node`` for the rest of this sync."""
        if node not in self.excluded:
            self.excluded.add(node)
            self.stats.peers_excluded.append(node)

    def online(self) -> bool:
        """Whether to ask the catalogue now (False for a while after it failed a call)."""
        return time.monotonic() >= self._offline_until_s

    def failed(self, exc: NetoptError) -> None:
        """The coordinator failed a routing call: go on without it for OFFLINE_RETRY_S."""
        self.stats.coordinator_failures += 1
        first = self.online()  # concurrent batches' calls fail together: say it once
        self._offline_until_s = time.monotonic() + OFFLINE_RETRY_S
        if first:
            log.warning(
                "region sharing: the coordinator failed (%s); fetching from SOURCE, asking again "
                "in %.0f s",
                exc,
                OFFLINE_RETRY_S,
            )

    async def _call(
        self, want: Sequence[str], done: bool = False, steal: Sequence[str] = ()
    ) -> dict[str, Any]:
        have, self._stored = self._stored[:MAX_INDEXES], self._stored[MAX_INDEXES:]
        body = {
            "node": self.options.node,
            "chunk_count": len(self.ids),
            "want": [self.index_of[c] for c in want],
            "have": have,
            "exclude": sorted(self.excluded),
            "steal": [self.index_of[c] for c in steal],
            "done": done,
        }
        self.stats.route_calls += 1
        try:
            answer: dict[str, Any] = await self.client.request("POST", self._path, body)
        except BaseException:
            self._stored[:0] = have  # report them with the next call
            raise
        return answer

    async def join(self) -> float:
        """Open the session; where in the chunk order to start (0..1)."""
        answer = await self._call(())
        start = answer.get("start_fraction", 0.0) if isinstance(answer, dict) else None
        if type(start) not in (int, float) or not 0.0 <= start <= 1.0:
            raise ProtocolError(f"join answer: start_fraction {start!r} is not 0-1")
        self.stats.start_fraction = float(start)
        return self.stats.start_fraction

    async def route(self, want: Sequence[str], steal: Sequence[str] = ()) -> _Route:
        """Sources for ``want`` (and report what was stored since the last call);
        ``steal``: chunks of ``want`` waited for too long, to fetch from SOURCE now."""
        return read_route(await self._call(want, steal=steal), self.ids)

    async def route_or_source(self, want: Sequence[str], steal: Sequence[str] = ()) -> _Route:
        """`route`, or all of ``want`` from SOURCE while the coordinator is failing.

        An unreachable coordinator (or a 5xx) is asked again with backoff for up to
        `FAILING_GRACE_S`, so a replica's failover costs no border crossing; a refusal or
        a malformed answer, which asking again does not mend, goes to SOURCE at once."""
        delay_s = 0.25
        while self.online():
            try:
                answer = await self.route(want, steal)
            except PeerUnreachableError as exc:
                now_s = time.monotonic()
                self._failing_since_s = min(self._failing_since_s, now_s)
                if now_s - self._failing_since_s + delay_s > FAILING_GRACE_S:
                    self.failed(exc)
                    break
                await asyncio.sleep(delay_s * (0.5 + random.random()))
                delay_s = min(2.0 * delay_s, 2.0)
            except NetoptError as exc:
                self.failed(exc)
                break
            else:
                self._failing_since_s = float("inf")
                return answer
        self.stats.chunks_unshared += len(want)
        return _Route(peers={}, endpoints={}, origin=list(want), wait=[], retry_after_s=0.0)

    async def flush(self) -> None:
        """Report stored chunks now (also renews the session); best effort: a failing
        coordinator is logged (`failed`), never raised."""
        while self._stored and self.online():
            try:
                await self._call(())
            except NetoptError as exc:
                self.failed(exc)

    async def flush_forever(self) -> None:
        """Report stored chunks every FLUSH_INTERVAL_S; errors are logged, not raised."""
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            if not self.online():
                continue
            try:
                await self._call(())
            except NetoptError as exc:
                log.warning("cannot report stored chunks to the coordinator: %s", exc)

    async def close(self) -> None:
        """Report what is left and end the session (frees leases at once); skipped while
        the coordinator is failing (its session TTL frees them)."""
        if not self.online():
            return
        with contextlib.suppress(NetoptError):
            await self._call((), done=True)


@dataclass(frozen=True)
class JoinedRegion:
    """A sync in its region's sharing: the catalogue session, and the source that routes
    every batch through it."""

    sharing: RegionSharing
    source: SharedChunkSource


async def join_region(
    options: SharingOptions,
    manifest: Manifest,
    origin: ChunkSource,
    holds: Callable[[str], bool],
    stack: contextlib.AsyncExitStack,
) -> JoinedRegion | str:
    """Open the catalogue session for ``manifest`` (the chunks ``holds`` says this node
    already has are reported stored: peers may fetch them) and wrap ``origin``; the
    session, its flusher and the peers' connections close with ``stack``. The reason,
    as a string, when the coordinator refuses or cannot be reached."""
    client = await stack.enter_async_context(
        CoordinatorClient(options.coordinator_url, options.token, timeout_s=options.timeout_s)
    )
    sharing = RegionSharing(client, options, manifest)
    for chunk_id in manifest.unique_chunks():
        if holds(chunk_id):
            sharing.stored(chunk_id)
    try:
        await sharing.join()
    except NetoptError as exc:
        log.warning("syncing without region sharing: %s", exc)
        return str(exc)
    stack.push_async_callback(sharing.close)
    flusher = asyncio.get_running_loop().create_task(sharing.flush_forever())

    async def stop_flusher() -> None:
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher

    stack.push_async_callback(stop_flusher)
    peer_options = ClientOptions(token=options.token, streams=options.peer_streams)
    source = SharedChunkSource(origin, sharing, peer_options)
    stack.push_async_callback(source.aclose)
    return JoinedRegion(sharing, source)


def _endpoint_url(endpoint: str, name: str) -> DatasetUrl:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValidationError(f"the coordinator gave a bad peer endpoint {endpoint!r}")
    return checked_dataset_url(endpoint, host, port, name)


class SharedChunkSource:
    """`ChunkSource` that routes every batch through the catalogue (see module doc)."""

    def __init__(
        self, origin: ChunkSource, sharing: RegionSharing, peer_options: ClientOptions
    ) -> None:
        self.origin = origin
        self.sharing = sharing
        self.peer_options = peer_options
        self._peers: dict[str, HttpChunkSource] = {}

    async def aclose(self) -> None:
        """Close the connections to peers."""
        for source in self._peers.values():
            await source.__aexit__(None, None, None)
        self._peers.clear()

    async def _peer(self, node: str, endpoint: str) -> HttpChunkSource:
        source = self._peers.get(node)
        if source is None:
            url = _endpoint_url(endpoint, self.sharing.manifest.name)
            source = HttpChunkSource(url, self.peer_options, None)
            await source.__aenter__()
            self._peers[node] = source
        return source

    async def fetch_manifest(self) -> Manifest:
        return await self.origin.fetch_manifest()

    async def fetch_chunk(self, chunk_id: str, length_bytes: int) -> RawChunk:
        async for raw in self.fetch_chunks([(chunk_id, length_bytes)]):
            return raw
        raise AssertionError("unreachable")  # pragma: no cover

    async def fetch_chunks(self, wanted: Sequence[tuple[str, int]]) -> AsyncIterator[RawChunk]:
        """Route ``wanted``, fetch its parts concurrently, yield the chunks in order.

        Raises what SOURCE raises for the chunks leased to this node (the sync
        engine retries), and what the coordinator client raises.
        """
        batch = _Batch(self, wanted)
        try:
            async for raw in batch.run():
                yield raw
        finally:
            await batch.cancel()


class _Batch:
    """One ``fetch_chunks`` call in progress."""

    def __init__(self, owner: SharedChunkSource, wanted: Sequence[tuple[str, int]]) -> None:
        self.owner = owner
        self.order = [cid for cid, _ in wanted]
        self.lengths = dict(wanted)
        self.got: dict[str, RawChunk] = {}
        self.routed: set[str] = set()
        self.failure: BaseException | None = None
        self.changed = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    def _start(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self) -> AsyncIterator[RawChunk]:
        sharing = self.owner.sharing
        pos = 0
        waiting: dict[str, float] = {}
        """chunk -> when it was first answered ``wait``."""
        last_route_s = float("-inf")
        retry_after_s = 0.25
        while True:
            while pos < len(self.order) and self.order[pos] in self.got:
                yield self.got.pop(self.order[pos])
                pos += 1
            if pos == len(self.order):
                return
            if self.failure is not None:
                raise self.failure
            unrouted = [c for c in self.order[pos:] if c not in self.got and c not in self.routed]
            if unrouted and time.monotonic() - last_route_s >= retry_after_s:
                now_s = time.monotonic()
                steal = [c for c in unrouted if now_s - waiting.get(c, now_s) > STEAL_AFTER_S]
                route = await sharing.route_or_source(unrouted, steal)
                last_route_s = time.monotonic()
                retry_after_s = route.retry_after_s
                sharing.stats.waits += len(route.wait)
                sharing.stats.steals += len(steal)
                for cid in route.wait:
                    waiting.setdefault(cid, last_route_s)
                for node, cids in route.peers.items():
                    self.routed.update(cids)
                    self._start(self._from_peer(node, route.endpoints.get(node, ""), cids))
                if route.origin:
                    self.routed.update(route.origin)
                    self._start(self._from_origin(route.origin))
                if route.peers or route.origin:
                    continue
            self.changed.clear()
            timeout_s = max(0.0, last_route_s + retry_after_s - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout_s if unrouted else None)

    async def _from_peer(self, node: str, endpoint: str, cids: list[str]) -> None:
        stats = self.owner.sharing.stats
        try:
            source = await self.owner._peer(node, endpoint)
            received = 0
            async for raw in source.fetch_chunks([(c, self.lengths[c]) for c in cids]):
                self.got[cids[received]] = raw
                received += 1
                stats.chunks_from_peers += 1
                stats.wire_bytes_from_peers += raw.wire_bytes
                self.changed.set()
        except NetoptError as exc:
            log.warning("peer %s failed (%s); routing its chunks elsewhere", node, exc)
            self.owner.sharing.exclude(node)
        finally:
            self.routed.difference_update(cids)
            self.changed.set()

    async def _from_origin(self, cids: list[str]) -> None:
        stats = self.owner.sharing.stats
        try:
            received = 0
            async for raw in self.owner.origin.fetch_chunks([(c, self.lengths[c]) for c in cids]):
                self.got[cids[received]] = raw
                received += 1
                stats.chunks_from_source += 1
                stats.wire_bytes_from_source += raw.wire_bytes
                self.changed.set()
        except NetoptError as exc:
            self.failure = exc  # raised by run(): the sync engine retries the batch
        finally:
            self.routed.difference_update(cids)
            self.changed.set()

    async def cancel(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(BaseException):
                await task
