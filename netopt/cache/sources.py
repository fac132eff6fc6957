"""Where a sync reads a dataset from: a SOURCE string parsed once into a `Source` of its kind.

- ``path`` (`PathSource`): a local or mounted directory, chunked here (FastCDC,
  BLAKE3) and read in place;
- ``netopt`` (`NetoptSource`): ``netopt://HOST:PORT/NAME``, a ``netopt serve``
  server or another node's agent;
- ``http-manifest`` (`ManifestUrlSource`): the same server named by its manifest
  URL, ``http(s)://HOST:PORT/v1/datasets/NAME[/manifest]``;
- ``http-dir`` (`WebDirSource`): ``http(s)://HOST/PATH/``, a directory listing of
  any web server (`netopt.cache.httpdir`);
- ``s3`` (`S3Source`): ``s3://BUCKET[/PREFIX]``, objects of an S3-compatible
  service (`netopt.cache.s3`).

`parse_source` is the one place that reads a SOURCE string: it chooses the kind by
the scheme and checks the rest (host, port, dataset name, bucket) before anything is
contacted, so a bad SOURCE fails at once. The `Source` it returns knows its dataset
name and opens itself (`Source.open`) into an `OpenedSource`: the manifest, the
`ChunkSource` the sync engine reads chunks from, the transfer plan when the server
offered one, and the bytes the set-up requests took on the wire. Region sharing
(`netopt.cache.shared`) wraps the opened source of any kind; it is chosen by the
sync's options, not by SOURCE.

Web directories and S3 are imported only when a sync opens one, directories only
for a path (start-up time counts on short syncs). Below this module, the data plane
and the two remote-file engines (`netopt.cache.httpdir`, `netopt.cache.s3`) know
nothing of kinds or of the cache: each returns its parts, and the kind here wraps them.
"""

from __future__ import annotations

import abc
import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit

from netopt.cache.s3url import S3Options, S3Url, parse_s3_url
from netopt.cache.storedmanifests import known_manifests
from netopt.dataplane import trace
from netopt.dataplane.chunkio import ChunkSource, RawChunk
from netopt.dataplane.client import (
    MAX_CONNECTIONS,
    fetch_info_and_manifest,
    link_figures_for,
    part_connections,
    plan_for,
    start_adapting,
)
from netopt.dataplane.httpsource import (
    ClientOptions,
    DatasetInfo,
    DatasetUrl,
    HttpChunkSource,
    checked_dataset_url,
    parse_dataset_url,
)
from netopt.dataplane.leadplan import lead_ranges
from netopt.dataplane.prefetch import WARM_CONNECTIONS
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import DatasetChangedError, IntegrityError, StorageError, ValidationError
from netopt.names import is_dataset_name, is_hash_id
from netopt.transfer.figures import LinkFigures
from netopt.transfer.linklookup import LOOKUP_TIMEOUT_S, CoordinatorRef, measured_link
from netopt.transfer.manifest import Manifest
from netopt.transfer.planner import CpuProfile, LinkProfile, TransferPlan
from netopt.transfer.profile import load_cpu_profile

if TYPE_CHECKING:
    from netopt.cache.remotefiles import RemoteDataset
    from netopt.dataplane.served import ServedDataset

__all__ = [
    "LocalChunkSource",
    "ManifestUrlSource",
    "NetoptSource",
    "OpenedServed",
    "OpenedSource",
    "PathSource",
    "S3Source",
    "Source",
    "SourceOptions",
    "WebDirSource",
    "parse_source",
]

_MANIFEST_URL_RE = re.compile(
    r"(https?)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})/v1/datasets/([^/?#]+)(?:/manifest)?/?"
)
_REMOTE_FILES_STREAMS = 4
"""Streams of a source without a manifest (web directory, bucket): no plan chooses them."""


@dataclass(frozen=True)
class SourceOptions:
    """How to reach a source and how to plan the fetch."""

    client: ClientOptions = field(default_factory=ClientOptions)
    name: str | None = None
    avg_chunk_bytes: int = 1024 * 1024
    streams: int | None = None
    max_streams: int = 64
    """The most connections a plan may choose (an agent config's cache.max_parallel_streams)."""
    zstd_level: int | None = None
    link_rate_bps: float | None = None
    link_loss_ratio: float | None = None
    coordinator: CoordinatorRef | None = None
    """Where to look up the measured link to a netopt server's node (rate, loss)."""
    client_cpu: CpuProfile | None = None
    file_cost_dir: str | None = None
    """Where a sync of many files measures this node's per-file cost when ``client_cpu``
    has none (`netopt.cache.filecost`): on the filesystem it writes to. None: not measured."""
    state_dir: str | None = None
    """Where sources without manifests remember how their files were chunked (web dirs, S3)."""
    s3: S3Options = field(default_factory=S3Options)
    warm_connections: int = WARM_CONNECTIONS
    """Data connections a netopt source opens during its set-up when ``streams`` is not
    given (see `netopt.dataplane.client.fetch_info_and_manifest`)."""
    cache_dir: str | None = None
    """The cache the sync goes through: a netopt source names the versions it holds when
    asking for the manifest, and reads the current one back from it when the server
    says so (`netopt.cache.storedmanifests`). None: every manifest is fetched."""
    lead: bool = False
    """A netopt source may lead (`netopt.dataplane.leadplan`): ask for the version's
    first chunks by their place as soon as its info is in, before the manifest. For a
    sync with nothing of the dataset in hand (the syncer sets it: no version in the
    cache, nothing shared in the region, DEST empty); the source leads only when the
    cache holds no version of the dataset either."""
    retry: SyncOptions = field(default_factory=SyncOptions)
    """The sync's retry window and backoff: a web origin's requests that fail to reach it
    are asked again within them (`netopt.cache.weblink`)."""


@dataclass(frozen=True)
class OpenedSource:
    """A source ready to serve chunks."""

    kind: str
    name: str
    manifest: Manifest
    source: ChunkSource
    streams: int
    overhead_bytes: int = 0
    plan: TransferPlan | None = None
    link_figures: LinkFigures | None = None
    """What the plan assumed of the link, and where each figure came from."""
    part_connections: int = 0
    """`SyncOptions.part_connections` (0: ``streams``)."""
    replan: Callable[[int, int], TransferPlan] | None = None
    """The plan again for the bytes the sync fetches and the files it writes, known once
    the cache and DEST were looked at (``plan`` counts the manifest's chunks and files):
    what the sync reports (a re-sync of a mostly cached dataset is not a full fetch)."""
    file_cost_dir: str | None = None
    """Where the open looked the per-file cost up (`netopt.cache.filecost`: a figure kept
    for that filesystem, or measured there); None when it did not (a source of another
    kind, or a per-file cost given). A sync the files bound keeps what it showed there."""
    file_cost_s: float = 0.0
    """Seconds the open spent finding the per-file cost: ~0 when kept, 2-3 s when
    measured; not the files' time."""

    async def check_still_current(self, shared: bool) -> None:
        """DatasetChangedError when the origin moved on to another version while DEST was
        being written (``shared``: chunks came from region peers too). Only a served
        origin has versions to ask about; with the other kinds a chunk whose bytes
        changed fails its check as it is read."""

    def levels_over_time(self) -> list[dict[str, float | int | None]] | None:
        """The adaptive compression level's samples; None where the level does not adapt."""
        return None


@dataclass(frozen=True, kw_only=True)
class OpenedServed(OpenedSource):
    """An opened netopt server (``netopt`` and ``http-manifest``): its chunk source
    tells whether the version the sync wrote is still the server's."""

    served: HttpChunkSource
    """The same object as ``source``, with its type."""

    async def check_still_current(self, shared: bool) -> None:
        """DEST then holds the older version whole; the restart brings the delta. With
        region sharing (chunks from peers too, maybe after the origin's last stream) it
        always asks."""
        if not shared and await self.served.version_at_end() == self.manifest.manifest_id:
            # Every chunk came over streams whose server named this version after its last
            # read: the check rode on their ends, no request (a round trip) needed.
            trace.count("version_check_on_stream_end")
            return
        info = await self.served.fetch_info()
        if info.manifest_id != self.manifest.manifest_id:
            raise DatasetChangedError(
                f"{self.served.url}: the dataset changed while it was being synced"
            )

    def levels_over_time(self) -> list[dict[str, float | int | None]] | None:
        adapter = self.served.adapter
        return adapter.to_list() if adapter is not None else None


@dataclass(frozen=True)
class Source(abc.ABC):
    """One SOURCE, parsed and checked (`parse_source` makes it): its kind, its dataset
    name, and how to open it."""

    text: str
    """The SOURCE as given."""
    name: str
    """The dataset name it stands for (``--name``, else taken from SOURCE), checked."""

    kind: ClassVar[str]
    recut_on_open: ClassVar[bool] = False
    """True when every open cuts the files into chunks anew with
    `SourceOptions.avg_chunk_bytes` (a directory); web directories and buckets
    remember how each file was cut, servers send their manifest."""

    @abc.abstractmethod
    def open(self, opts: SourceOptions) -> AbstractAsyncContextManager[OpenedSource]:
        """Fetch (or build) the manifest, and plan; connections close on exit.

        Raises StorageError for an unreadable path, PathTraversalError for an unsafe
        remote name, PeerUnreachableError / NetworkError / AuthenticationError for
        servers, ValidationError for a missing bucket, DependencyError for s3://
        without the ``s3`` extra.
        """


def parse_source(text: str, name: str | None = None) -> Source:
    """The `Source` a SOURCE string stands for (``name``, when given, names the dataset).

    ValidationError for an empty SOURCE, an unknown scheme, a malformed URL (no host,
    a bad port, a control character, a bad bucket name) or a dataset name that is not
    allowed.
    """
    if not text:
        raise ValidationError("SOURCE is empty (a directory or a URL expected)")
    scheme, sep, _ = text.partition("://")
    if not sep:
        return PathSource(text, _checked_name(name, _last_part(text)))
    if scheme == "netopt":
        url = parse_dataset_url(text)
        return NetoptSource(text, _checked_name(name, url.name), url)
    if scheme in ("http", "https"):
        match = _MANIFEST_URL_RE.fullmatch(text)
        if match is not None:
            scheme, host, port_text, served = match.groups()
            url = checked_dataset_url(text, host, port_text, served, scheme)
            return ManifestUrlSource(text, _checked_name(name, url.name), url)
        _check_web_url(text)
        return WebDirSource(text, _checked_name(name, _last_part(text)))
    if scheme == "s3":
        bucket = parse_s3_url(text)
        return S3Source(text, _checked_name(name, _last_part(text)), bucket)
    raise ValidationError(f"SOURCE {text!r}: unknown scheme (path, netopt://, http(s)://, s3://)")


def _last_part(text: str) -> str:
    return text.rstrip("/").rsplit("/", 1)[-1] or "dataset"


def _checked_name(given: str | None, derived: str) -> str:
    name = derived if given is None else given
    if not is_dataset_name(name):
        raise ValidationError(f"dataset name {name!r} is not allowed (letters, digits, . _ -)")
    return name


def _check_web_url(text: str) -> None:
    """ValidationError for a web directory URL without a host, with a bad port or a
    control character (a path may hold any character its file system allows)."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise ValidationError(f"SOURCE {text!r} holds a control character")
    try:
        parts = urlsplit(text)
        port = parts.port  # ValueError when it is not a number in 0..65535
    except ValueError as exc:
        raise ValidationError(f"SOURCE {text!r}: {exc}") from None
    if not parts.hostname or port == 0:
        raise ValidationError(
            f"SOURCE {text!r}: no host, or port 0 (expected http(s)://HOST/PATH/)"
        )


class LocalChunkSource:
    """A `ChunkSource` over a local or mounted directory; chunks are read in place."""

    def __init__(self, dataset: ServedDataset) -> None:
        self.dataset = dataset

    async def fetch_manifest(self) -> Manifest:
        return self.dataset.manifest

    async def fetch_chunk(self, chunk_id: str, length_bytes: int) -> RawChunk:
        try:
            data = await asyncio.to_thread(self.dataset.read_chunk, chunk_id)
        except IntegrityError as exc:
            raise DatasetChangedError(f"SOURCE changed during the sync: {exc}") from exc
        return RawChunk(data, "identity", len(data))

    async def fetch_chunks(self, wanted: Sequence[tuple[str, int]]) -> AsyncIterator[RawChunk]:
        for chunk_id, length in wanted:
            yield await self.fetch_chunk(chunk_id, length)


@dataclass(frozen=True)
class PathSource(Source):
    """A local or mounted directory, chunked here and read in place."""

    kind: ClassVar[str] = "path"
    recut_on_open: ClassVar[bool] = True

    @asynccontextmanager
    async def open(self, opts: SourceOptions) -> AsyncIterator[OpenedSource]:
        if not await asyncio.to_thread(Path(self.text).is_dir):
            raise StorageError(f"SOURCE {self.text} is not a readable directory")
        # Imported here: a network sync has no use for dataset loading.
        from netopt.dataplane.served import load_dataset

        dataset = await asyncio.to_thread(load_dataset, self.text, self.name, opts.avg_chunk_bytes)
        yield OpenedSource(self.kind, self.name, dataset.manifest, LocalChunkSource(dataset), 2)


@dataclass(frozen=True)
class NetoptSource(Source):
    """A ``netopt serve`` server or a node's agent: its manifest, and a plan for the link."""

    url: DatasetUrl
    """Where it is served; ``url.name`` is the dataset asked for (``name`` may differ
    with ``--name``)."""

    kind: ClassVar[str] = "netopt"

    @asynccontextmanager
    async def open(self, opts: SourceOptions) -> AsyncIterator[OpenedSource]:
        client = replace(opts.client, streams=MAX_CONNECTIONS)
        if opts.cache_dir is not None and client.known_manifests is None:
            held = await asyncio.to_thread(known_manifests, opts.cache_dir, self.url.name)
            client = replace(client, known_manifests=held)
        if client.known_manifests is not None and client.known_manifests.ids:
            opts = replace(opts, lead=False)  # a version in hand: a delta, not a cold sync
        async with HttpChunkSource(self.url, client) as source:
            yield await self._opened(opts, source)

    async def _opened(self, opts: SourceOptions, source: HttpChunkSource) -> OpenedServed:
        """Fetch info and manifest through ``source`` (entered) and plan; the source then
        fetches chunks over the connections the set-up opened."""
        url = self.url
        trace.mark("open_source")
        cpu = opts.client_cpu
        if cpu is None:
            cpu = await asyncio.to_thread(load_cpu_profile)
        trace.mark("cpu_profile")
        lookup = None
        if opts.coordinator is not None and opts.link_rate_bps is None:
            # Beside the info and manifest requests: the figures are there when they are.
            lookup = asyncio.ensure_future(measured_link(opts.coordinator, url.host, url.port))
        try:
            info, manifest = await fetch_info_and_manifest(
                source,
                opts.streams or opts.warm_connections,
                partial(_lead, opts, source, cpu) if opts.lead else None,
            )
            trace.mark("manifest_parsed")
            measured = await _looked_up(lookup)
        finally:
            if lookup is not None:
                lookup.cancel()
        if info.manifest_id != manifest.manifest_id:
            # The two were answered by different versions: the files changed in between.
            raise DatasetChangedError(f"{url}: the dataset changed between its info and manifest")
        figures = link_figures_for(
            info,
            rate_bps=opts.link_rate_bps,
            loss_ratio=opts.link_loss_ratio,
            measured=measured,
            rate_limit_bps=opts.client.rate_limit_bps,
        )
        overhead_bytes = source.meta_wire_bytes
        plan_with = partial(
            plan_for,
            info,
            None,
            figures=figures,
            max_streams=opts.max_streams,
            meta_bytes=overhead_bytes,
            files=len(manifest.files),
            fetch_bytes=manifest.unique_bytes,
        )
        plan = plan_with(cpu)
        file_cost_s = 0.0
        file_cost_dir = opts.file_cost_dir if cpu.per_file_s is None else None
        if file_cost_dir is not None:
            from netopt.cache.filecost import per_file_cost_s  # it syncs: syncer imports us

            looked_s = time.monotonic()
            per_file_s = await asyncio.to_thread(
                per_file_cost_s, file_cost_dir, len(manifest.files), plan.work_s
            )
            file_cost_s = time.monotonic() - looked_s
            if per_file_s is not None:
                cpu = replace(cpu, per_file_s=per_file_s)
                trace.mark("file_cost")
                plan = plan_with(cpu)
        trace.mark("plan_made")
        level = opts.zstd_level
        source.zstd_level = plan.zstd_level if level is None else (level or None)
        if level is None:
            start_adapting(source, info, cpu, figures)
        streams = opts.streams or plan.streams
        # Streams the plan chose: a small sync's parts may use every warm connection.
        parts = 0 if opts.streams else part_connections(streams, source.warm_ready)
        return OpenedServed(
            self.kind, url.name, manifest, source, streams, overhead_bytes, plan, figures,
            part_connections=parts, served=source,
            file_cost_dir=file_cost_dir, file_cost_s=file_cost_s,
            replan=lambda fetch_bytes, files: plan_with(cpu, fetch_bytes=fetch_bytes, files=files),
        )  # fmt: skip


def _lead(opts: SourceOptions, source: HttpChunkSource, cpu: CpuProfile, info: DatasetInfo) -> None:
    """Start ``source``'s lead (`netopt.dataplane.leadplan`) for ``info``'s version, at the
    level and over the streams a plan made from the info alone chooses (the plan made
    once the manifest is in counts its files and chunks; the level may then move)."""
    if not info.stream_lead or not is_hash_id(info.manifest_id):
        return
    figures = link_figures_for(
        info,
        rate_bps=opts.link_rate_bps,
        loss_ratio=opts.link_loss_ratio,
        rate_limit_bps=opts.client.rate_limit_bps,
    )
    plan = plan_for(
        info, None, cpu, figures=figures, max_streams=opts.max_streams, files=info.files
    )
    ranges = lead_ranges(info.chunks, info.total_bytes, opts.streams or plan.streams)
    if not ranges:
        return
    level = plan.zstd_level if opts.zstd_level is None else opts.zstd_level
    source.zstd_level = level or None
    source.use_routes_of(info)  # a context and bundles: as the sync's own streams ask
    trace.mark("lead_start")
    source.start_lead(info.manifest_id, ranges)


@dataclass(frozen=True)
class ManifestUrlSource(NetoptSource):
    """A netopt server named by its manifest URL, ``http(s)://HOST:PORT/v1/datasets/NAME``:
    the scheme is the URL's own rather than the cluster's TLS setting."""

    kind: ClassVar[str] = "http-manifest"


async def _looked_up(
    lookup: asyncio.Future[tuple[LinkProfile, str] | str] | None,
) -> tuple[LinkProfile, str] | str | None:
    """The coordinator's answer, waiting `LOOKUP_TIMEOUT_S` at most; None without a lookup."""
    if lookup is None:
        return None
    try:
        return await asyncio.wait_for(asyncio.shield(lookup), LOOKUP_TIMEOUT_S)
    except TimeoutError:
        return f"the coordinator did not answer within {LOOKUP_TIMEOUT_S:g} s"


def _opened_files(kind: str, name: str, files: RemoteDataset) -> OpenedSource:
    return OpenedSource(
        kind, name, files.manifest, files.source, _REMOTE_FILES_STREAMS, files.wire_bytes
    )


@dataclass(frozen=True)
class WebDirSource(Source):
    """A web server's directory listing: crawled, downloaded and chunked here."""

    kind: ClassVar[str] = "http-dir"

    @asynccontextmanager
    async def open(self, opts: SourceOptions) -> AsyncIterator[OpenedSource]:
        from netopt.cache.httpdir import open_http_dir

        args = (self.text, self.name, opts.client, opts.avg_chunk_bytes, opts.state_dir)
        async with open_http_dir(*args, opts.retry) as files:
            yield _opened_files(self.kind, self.name, files)


@dataclass(frozen=True)
class S3Source(Source):
    """Objects under a bucket prefix of an S3-compatible service, chunked here."""

    bucket: S3Url

    kind: ClassVar[str] = "s3"

    @asynccontextmanager
    async def open(self, opts: SourceOptions) -> AsyncIterator[OpenedSource]:
        from netopt.cache.s3 import open_s3

        args = (self.bucket, self.name, opts.client, opts.s3, opts.avg_chunk_bytes, opts.state_dir)
        async with open_s3(*args) as files:
            yield _opened_files(self.kind, self.name, files)
