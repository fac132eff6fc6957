"""Where ``netopt sync`` reads a dataset from: SOURCE strings turned into `ChunkSource`s.

- a local or mounted directory: chunked here (FastCDC, BLAKE3), read in place;
- ``netopt://HOST:PORT/NAME``: a ``netopt serve`` server or another agent;
- ``http(s)://HOST:PORT/v1/datasets/NAME[/manifest]``: the same server named by its
  manifest URL;
- ``http(s)://HOST/PATH/``: a directory listing served by any web server (see
  `netopt.cache.httpdir`);
- ``s3://BUCKET[/PREFIX]``: objects of an S3-compatible service (see `netopt.cache.s3`).

Each opened source carries its manifest, the transfer plan when the server
offered one, and the bytes the set-up requests took on the wire.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from netopt.cache.s3 import S3Options
from netopt.dataplane import trace
from netopt.dataplane.chunkio import ChunkSource, RawChunk
from netopt.dataplane.client import (
    MAX_CONNECTIONS,
    fetch_info_and_manifest,
    link_figures_for,
    plan_for,
    start_adapting,
)
from netopt.dataplane.httpsource import (
    ClientOptions,
    DatasetUrl,
    HttpChunkSource,
    parse_dataset_url,
)
from netopt.dataplane.prefetch import WARM_CONNECTIONS
from netopt.errors import DatasetChangedError, IntegrityError, StorageError, ValidationError
from netopt.names import is_dataset_name
from netopt.transfer.figures import LinkFigures
from netopt.transfer.linklookup import LOOKUP_TIMEOUT_S, CoordinatorRef, measured_link
from netopt.transfer.manifest import Manifest
from netopt.transfer.planner import CpuProfile, LinkProfile, TransferPlan
from netopt.transfer.profile import load_cpu_profile

if TYPE_CHECKING:
    from netopt.dataplane.served import ServedDataset

__all__ = [
    "LocalChunkSource",
    "OpenedSource",
    "SourceOptions",
    "open_source",
    "source_kind",
    "source_name",
]

_MANIFEST_URL_RE = re.compile(
    r"^(https?)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})/v1/datasets/([^/?#]+)(/manifest)?/?$"
)


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
    state_dir: str | None = None
    """Where sources without manifests remember how their files were chunked (web dirs, S3)."""
    s3: S3Options = field(default_factory=S3Options)


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


@dataclass(frozen=True)
class _HttpsDatasetUrl(DatasetUrl):
    scheme: str = "http"

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def source_kind(spec: str) -> str:
    """``path``, ``netopt``, ``http-manifest``, ``http-dir`` or ``s3`` for a SOURCE string."""
    if spec.startswith("netopt://"):
        return "netopt"
    if spec.startswith(("http://", "https://")):
        return "http-manifest" if _MANIFEST_URL_RE.match(spec) else "http-dir"
    if spec.startswith("s3://"):
        return "s3"
    if "://" in spec:
        raise ValidationError(
            f"SOURCE {spec!r}: unknown scheme (path, netopt://, http(s)://, s3://)"
        )
    return "path"


def source_name(spec: str, name: str | None = None) -> str:
    """The dataset name a SOURCE stands for (``name`` wins); ValidationError if not allowed."""
    kind = source_kind(spec)
    if name is None:
        if kind == "netopt":
            name = parse_dataset_url(spec).name
        elif kind == "http-manifest":
            match = _MANIFEST_URL_RE.match(spec)
            assert match is not None
            name = match.group(4)
        else:
            name = spec.rstrip("/").rsplit("/", 1)[-1] or "dataset"
    if not is_dataset_name(name):
        raise ValidationError(f"dataset name {name!r} is not allowed (letters, digits, . _ -)")
    return name


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


async def _open_served(
    url: DatasetUrl, kind: str, opts: SourceOptions, source: HttpChunkSource
) -> OpenedSource:
    """Fetch info and manifest through ``source`` (entered) and plan; the source then
    fetches chunks over the connections the set-up opened."""
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
        info, manifest = await fetch_info_and_manifest(source, opts.streams or WARM_CONNECTIONS)
        measured = await _looked_up(lookup)
    finally:
        if lookup is not None:
            lookup.cancel()
    if info.manifest_id != manifest.manifest_id:
        # The two were answered by different versions: the files changed in between.
        raise DatasetChangedError(f"{url}: the dataset changed between its info and manifest")
    overhead_bytes = source.meta_wire_bytes
    figures = link_figures_for(
        info,
        rate_bps=opts.link_rate_bps,
        loss_ratio=opts.link_loss_ratio,
        measured=measured,
        rate_limit_bps=opts.client.rate_limit_bps,
    )
    plan = plan_for(info, None, cpu, figures=figures, max_streams=opts.max_streams)
    streams = opts.streams or plan.streams
    source.zstd_level = plan.zstd_level if opts.zstd_level is None else (opts.zstd_level or None)
    if opts.zstd_level is None:
        start_adapting(source, info, cpu, figures)
    return OpenedSource(kind, url.name, manifest, source, streams, overhead_bytes, plan, figures)


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


@asynccontextmanager
async def open_source(spec: str, opts: SourceOptions) -> AsyncIterator[OpenedSource]:
    """Open SOURCE: fetch (or build) its manifest and plan; close connections on exit.

    Raises ValidationError for an unknown SOURCE (or a missing bucket),
    PathTraversalError for an unsafe remote name, StorageError for an unreadable
    path, PeerUnreachableError / NetworkError / AuthenticationError for servers,
    DependencyError for s3:// without the ``s3`` extra.
    """
    kind = source_kind(spec)
    name = source_name(spec, opts.name)
    if kind == "path":
        if not await asyncio.to_thread(Path(spec).is_dir):
            raise StorageError(f"SOURCE {spec} is not a readable directory")
        # Imported here: a network sync has no use for dataset loading (start-up time
        # counts on short syncs).
        from netopt.dataplane.served import load_dataset

        dataset = await asyncio.to_thread(load_dataset, spec, name, opts.avg_chunk_bytes)
        yield OpenedSource(kind, name, dataset.manifest, LocalChunkSource(dataset), 2)
        return
    if kind == "http-dir":
        from netopt.cache.httpdir import open_http_dir

        args = (spec, name, opts.client, opts.avg_chunk_bytes, opts.state_dir)
        async with open_http_dir(*args) as opened_dir:
            yield opened_dir
        return
    if kind == "s3":
        from netopt.cache.s3 import open_s3

        s3_args = (spec, name, opts.client, opts.s3, opts.avg_chunk_bytes, opts.state_dir)
        async with open_s3(*s3_args) as opened_s3:
            yield opened_s3
        return
    if kind == "netopt":
        url = parse_dataset_url(spec)
    else:
        match = _MANIFEST_URL_RE.match(spec)
        assert match is not None
        scheme, host, port, served_name, _ = match.groups()
        checked = parse_dataset_url(f"netopt://{host}:{port}/{served_name}")
        url = _HttpsDatasetUrl(checked.host, checked.port, checked.name, scheme)
    async with HttpChunkSource(url, replace(opts.client, streams=MAX_CONNECTIONS)) as source:
        yield await _open_served(url, kind, opts, source)
