"""``netopt sync`` through the node's cache: plan, residency check, delta sync, eviction.

The cache is the sync engine's `ChunkSink`: chunks already cached are never
fetched again (delta sync, and resume after a crash), files in DEST are
written from cached chunks (temp name, made durable in batches, rename), and
reads feed the cache's access statistics before eviction brings it back under
capacity. A sync reports success only once every file it wrote and every chunk
it stored is durable (`Cache.flush`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netopt.cache.openretry import check_riding_out, open_riding_out
from netopt.cache.residency import check_residency, find_spec
from netopt.cache.sources import OpenedSource, Source, SourceOptions, parse_source
from netopt.cache.store import Cache
from netopt.cache.synctotals import SyncTotals, record_sync
from netopt.config.datasets import DatasetsSettings
from netopt.dataplane import trace
from netopt.dataplane.assemble import TMP_SUFFIX, tmp_stem
from netopt.dataplane.chunkio import ChunkSource
from netopt.dataplane.sync import sync_manifest
from netopt.dataplane.synctypes import ProgressCallback, SyncOptions, SyncSummary
from netopt.errors import DatasetChangedError, StorageError
from netopt.fsutil import nearest_existing
from netopt.transfer.manifest import STATE_DIR_NAME, Manifest
from netopt.transfer.planner import TransferPlan

if TYPE_CHECKING:
    # Region sharing is imported when a sync uses it: a plain sync starts faster.
    from netopt.cache.shared import RegionSharing, SharingOptions

log = logging.getLogger(__name__)

MAX_VERSION_RESTARTS = 3
"""Times a sync starts again on a new version of a changing origin before it gives up."""
SHARING_WARM_CONNECTIONS = 8
"""Set-up connections to the origin of a sync with region sharing (else
`netopt.dataplane.prefetch.WARM_CONNECTIONS`, 32): its chunks come mostly from in-region
peers, and each TLS connection's handshake crosses the border too (~2 KB: in the lab's
three-node sharing test 16 a node put the border at 1.0525 x the data, 8 at 1.046)."""

__all__ = [
    "CacheSink",
    "SyncPlan",
    "SyncReport",
    "SyncRequest",
    "plan_sync",
    "run_sync",
    "scan_dest",
]


class CacheSink:
    """The cache as the sync engine's `ChunkSink`; reads count as accesses.

    ``on_placed(chunk_id)`` runs on the event loop once a stored chunk is durable in
    the cache's ``chunks/``, where the node's agent serves it to peers (region sharing
    reports it then, not before)."""

    def __init__(self, cache: Cache, on_placed: Callable[[str], None] | None = None) -> None:
        self.cache = cache
        self.on_placed = on_placed

    async def has(self, chunk_id: str) -> bool:
        return self.cache.has(chunk_id)

    async def put(self, chunk_id: str, data: bytes) -> None:
        await asyncio.to_thread(self.blocking_put(chunk_id), data)

    async def get(self, chunk_id: str) -> bytes:
        return await asyncio.to_thread(self.cache.read, chunk_id)

    def blocking_put(self, chunk_id: str) -> Callable[[bytes], None]:
        """`put` as a plain function for a pool thread (made on the loop; see
        `netopt.dataplane.held.BlockingPut`)."""
        placed = self._placed_reporter()(chunk_id)
        cache = self.cache
        return lambda data: cache.put(chunk_id, data, placed)

    def blocking_put_group(self) -> Callable[[Sequence[tuple[str, bytes]]], None]:
        """`blocking_put` for a group of chunks in one call (`Cache.put_many`: one write
        for the small ones; see `netopt.dataplane.held.GroupPut`)."""
        placed_for = self._placed_reporter()
        cache = self.cache
        return lambda items: cache.put_many([(cid, data, placed_for(cid)) for cid, data in items])

    def _placed_reporter(self) -> Callable[[str], Callable[[], None] | None]:
        """Made on the loop: chunk name -> what reports it durable (`on_placed` on the
        loop), None without an ``on_placed``."""
        if self.on_placed is None:
            return lambda _chunk_id: None
        loop, report = asyncio.get_running_loop(), self.on_placed

        def reporter(chunk_id: str) -> Callable[[], None]:
            def placed() -> None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody asks
                    loop.call_soon_threadsafe(report, chunk_id)

            return placed

        return reporter


@dataclass(frozen=True)
class SyncPlan:
    """What a sync will do, before any chunk moves (bytes are logical)."""

    files_total: int
    files_to_write: int
    bytes_to_write: int
    chunks_to_fetch: int
    bytes_to_fetch: int
    chunks_reused: int
    bytes_reused: int

    def to_dict(self) -> dict[str, int]:
        """The plan as JSON-able data."""
        return dict(self.__dict__)


def plan_sync(
    manifest: Manifest, dest_files: Mapping[str, tuple[int, int]], cached: Set[str]
) -> SyncPlan:
    """Plan a sync: files whose (size, mtime_ns) in DEST differ are written; their
    chunks come from the cache when ``cached`` holds them, else from the source.
    """
    pending = [f for f in manifest.files if dest_files.get(f.path) != (f.size_bytes, f.mtime_ns)]
    needed: dict[str, int] = {}
    for entry in pending:
        for ref in entry.chunks:
            needed.setdefault(ref.chunk_id, ref.length_bytes)
    fetch = {c: n for c, n in needed.items() if c not in cached}
    return SyncPlan(
        files_total=len(manifest.files),
        files_to_write=len(pending),
        bytes_to_write=sum(f.size_bytes for f in pending),
        chunks_to_fetch=len(fetch),
        bytes_to_fetch=sum(fetch.values()),
        chunks_reused=len(needed) - len(fetch),
        bytes_reused=sum(needed.values()) - sum(fetch.values()),
    )


def _transfer_plan(opened: OpenedSource, plan: SyncPlan) -> TransferPlan | None:
    """The source's transfer plan, made again for what ``plan`` fetches and writes when
    that is less than the whole manifest (the source planned before the cache and DEST
    were looked at): a re-sync that finds everything in place predicts its own time, not
    a full fetch's."""
    first = opened.plan
    if first is None or opened.replan is None:
        return first
    if (plan.bytes_to_fetch, plan.files_to_write) == (
        opened.manifest.unique_bytes,
        plan.files_total,
    ):
        return first  # nothing was in hand: what the source planned
    return opened.replan(plan.bytes_to_fetch, plan.files_to_write)


def check_space(cache_dir: Path, dest: Path, plan: SyncPlan) -> None:
    """StorageError when the disks cannot hold the chunks to fetch and the files to write.

    Checked before any chunk moves, so a sync that cannot fit fails at once with
    the figures; a disk that fills up during the sync still fails cleanly in put.
    """
    dest_at = nearest_existing(dest.resolve())
    cache_st, dest_st = os.statvfs(cache_dir), os.statvfs(dest_at)
    need = {cache_dir: plan.bytes_to_fetch}
    if os.stat(cache_dir).st_dev == os.stat(dest_at).st_dev:
        need[cache_dir] += plan.bytes_to_write
    else:
        need[dest_at] = plan.bytes_to_write
    for where, need_bytes in need.items():
        st = cache_st if where == cache_dir else dest_st
        free_bytes = st.f_bavail * st.f_frsize
        if need_bytes > free_bytes:
            raise StorageError(
                f"not enough space on the disk of {where}: the sync needs {need_bytes} bytes, "
                f"{free_bytes} are free (the cache is unchanged)"
            )


def _stale_of(name: str) -> str | None:
    """The stem (`assemble.tmp_stem`) of the file a leftover temporary name
    (``.STEM.TOKEN.netopt-tmp``) belongs to, or None."""
    if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
        return None
    stem = name[1 : -len(TMP_SUFFIX)]
    return stem.rpartition(".")[0] or None


def scan_dest(dest: Path, manifest: Manifest) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of the manifest's regular files present in DEST; removes leftovers
    (``*.netopt-tmp``) of an interrupted sync.

    Each directory is listed once (``scandir``) for all of its files: a glob and two
    stats per file made a re-sync of a tree of many small files cost O(files x dir size).
    """
    out: dict[str, tuple[int, int]] = {}
    if not dest.is_dir():
        return out
    dest_real = dest.resolve()
    # Grouped by the path's directory as a string: path objects per file cost a second
    # of a 100,000-file tree's start.
    by_rel_dir: dict[str, dict[str, str]] = {}
    for entry in manifest.files:
        rel_dir, _, name = entry.path.rpartition("/")
        by_rel_dir.setdefault(rel_dir, {})[name] = entry.path
    for rel_dir, names in by_rel_dir.items():
        parent = dest / rel_dir if rel_dir else dest
        stems = {tmp_stem(name): name for name in names}
        real = parent.resolve()
        if real != dest_real and dest_real not in real.parents:
            continue  # a symlink in DEST leads outside: touch nothing there (the sync refuses it)
        try:
            with os.scandir(parent) as listing:
                for item in listing:
                    owner = _stale_of(item.name)
                    if owner is not None and owner in stems:
                        with contextlib.suppress(OSError):
                            os.unlink(item.path)
                        continue
                    path = names.get(item.name)
                    if path is None:
                        continue
                    with contextlib.suppress(OSError):
                        st = item.stat(follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            out[path] = (st.st_size, st.st_mtime_ns)
        except OSError:
            continue  # not there yet (or not a directory): nothing of it is present
    return out


@dataclass(frozen=True)
class SyncRequest:
    """Everything ``netopt sync`` was asked to do."""

    source: str
    dest: str
    cache_dir: str
    capacity_bytes: int | None = None
    dry_run: bool = False
    region: str | None = None
    catalogue: DatasetsSettings | None = None
    source_options: SourceOptions = field(default_factory=SourceOptions)
    sync_options: SyncOptions | None = None
    sharing: SharingOptions | None = None
    """Share chunks within the region through the coordinator's catalogue."""


@dataclass(frozen=True)
class SyncReport:
    """What ``netopt sync`` did (or, with ``dry_run``, would do)."""

    dataset: str
    source_kind: str
    manifest_id: str
    plan: SyncPlan
    dry_run: bool
    seconds: float
    overhead_bytes: int = 0
    summary: SyncSummary | None = None
    transfer_plan: TransferPlan | None = None
    evicted_chunks: int = 0
    sharing: dict[str, Any] | None = None
    version_restarts: int = 0
    """Times the sync started again because the origin published a new version."""
    link_figures: dict[str, object] | None = None
    """The link figures the transfer plan used, each with where it came from."""
    levels_over_time: list[dict[str, float | int | None]] | None = None
    """The adaptive level's measurement windows: time, level, goodput (see
    `netopt.transfer.adapt`)."""
    file_cost_dir: str | None = None
    """Where the per-file cost was looked up (`OpenedSource.file_cost_dir`)."""
    file_cost_s: float = 0.0
    """Seconds spent finding the per-file cost (`OpenedSource.file_cost_s`)."""

    @property
    def wire_bytes(self) -> int:
        """Bytes moved from the source (chunk payloads plus set-up requests)."""
        return self.overhead_bytes + (self.summary.wire_bytes if self.summary else 0)

    def to_dict(self) -> dict[str, object]:
        """The JSON summary of ``netopt sync --json``."""
        s = self.summary
        written = s.logical_bytes if s else 0
        out: dict[str, object] = {
            "dataset": self.dataset,
            "source_kind": self.source_kind,
            "manifest_id": self.manifest_id,
            "dry_run": self.dry_run,
            "files": self.plan.files_total,
            "files_written": s.files_written if s else 0,
            "files_skipped": self.plan.files_total - self.plan.files_to_write,
            "wire_bytes": self.wire_bytes,
            "fetched_logical_bytes": s.fetched_logical_bytes if s else 0,
            "reused_bytes": self.plan.bytes_reused,
            "logical_bytes": written,
            "chunks_fetched": s.chunks_fetched if s else 0,
            "chunks_reused": self.plan.chunks_reused,
            "chunk_retries": s.chunk_retries if s else 0,
            "link_returns": s.link_returns if s else 0,
            "compression_ratio": round(s.compression_ratio, 3) if s else 1.0,
            "goodput_mbps": round(s.goodput_bps / 1e6, 2) if s else 0.0,
            "evicted_chunks": self.evicted_chunks,
            "version_restarts": self.version_restarts,
            "seconds": round(self.seconds, 3),
            "throughput_mbps": round(written * 8 / self.seconds / 1e6, 2) if self.seconds else 0.0,
            "plan": self.plan.to_dict(),
        }
        if self.transfer_plan is not None:
            out["transfer_plan"] = self.transfer_plan.to_dict()
        if self.link_figures is not None:
            out["link_figures"] = self.link_figures
        if self.levels_over_time is not None:
            out["levels_over_time"] = self.levels_over_time
        if self.sharing is not None:
            out["sharing"] = self.sharing
        return out


async def _sync_into_cache(
    req: SyncRequest,
    opened: OpenedSource,
    cache: Cache,
    on_progress: ProgressCallback | None,
    dest_files: dict[str, tuple[int, int]],
) -> tuple[SyncSummary, int, dict[str, Any] | None]:
    manifest = opened.manifest
    await asyncio.to_thread(cache.add_manifest, manifest)
    trace.mark("manifest_stored")
    cache.in_use = set(manifest.unique_chunks())
    opts = replace(
        req.sync_options or SyncOptions(),
        streams=opened.streams,
        part_connections=opened.part_connections,
    )
    source: ChunkSource = opened.source
    sink = CacheSink(cache)
    shared: dict[str, Any] | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            sharing: RegionSharing | None = None
            if req.sharing is not None:
                from netopt.cache.shared import join_region

                joined = await join_region(req.sharing, manifest, source, cache.has, stack)
                if isinstance(joined, str):
                    shared = {"enabled": False, "reason": joined}
                else:
                    sharing, source = joined.sharing, joined.source
                    sink = CacheSink(cache, sharing.stored)
                    opts = replace(opts, start_fraction=sharing.stats.start_fraction)
            summary = await sync_manifest(
                manifest, source, sink, req.dest, opts, on_progress=on_progress, present=dest_files
            )
            # Durable before success is reported (and before peers are told the last ones).
            await asyncio.to_thread(cache.flush)
            if sharing is not None:
                await sharing.flush()
                shared = {"enabled": True, **sharing.stats.to_dict()}
    finally:
        cache.in_use = set()
    evicted = await asyncio.to_thread(cache.evict_to)
    return summary, len(evicted), shared


async def run_sync(req: SyncRequest, on_progress: ProgressCallback | None = None) -> SyncReport:
    """Sync SOURCE into DEST through the cache at ``req.cache_dir``.

    Refuses with ValidationError for a bad SOURCE (`parse_source`) and with
    ResidencyError when the catalogue forbids this region, both before contacting the
    source; raises what `Source.open` and `sync_manifest` raise, and
    StorageError for a full disk or a cache too small for the dataset. A sync
    killed at any point leaves the cache consistent; the next one fetches only
    the chunks not yet cached.

    When the origin publishes a new version during the sync (its files changed),
    the sync starts again on that version, keeping every chunk it already has, up
    to `MAX_VERSION_RESTARTS` times; then DatasetChangedError. A sync from a
    ``netopt serve`` origin reports success only if the version it wrote is still
    the origin's current one when it ends.
    """
    started_s = time.monotonic()
    source = parse_source(req.source, req.source_options.name)
    name = source.name
    if req.catalogue is not None:
        check_residency(find_spec(req.catalogue, name, req.source), req.region)
    source_options = req.source_options
    if source_options.state_dir is None:
        source_options = replace(source_options, state_dir=str(Path(req.cache_dir) / "sources"))
    if source_options.cache_dir is None:
        source_options = replace(source_options, cache_dir=req.cache_dir)
    if source_options.file_cost_dir is None:
        # On the destination's filesystem, in its state directory; a dry run writes nothing
        # there, so it measures beside the cache.
        where = Path(req.cache_dir) if req.dry_run else Path(req.dest) / STATE_DIR_NAME
        source_options = replace(source_options, file_cost_dir=str(where))
    if req.sharing is not None:
        # Most chunks come from in-region peers: fewer connections cross to the origin.
        source_options = replace(source_options, warm_connections=SHARING_WARM_CONNECTIONS)
    if req.sync_options is not None:
        source_options = replace(source_options, retry=req.sync_options)
    cold = req.sharing is None and not req.dry_run
    if cold and await asyncio.to_thread(_holds_nothing, req.dest):
        # Nothing of it here: its first chunks may come while its manifest does.
        source_options = replace(source_options, lead=True)
    try:
        report = await _run_sync_restarting(req, source, source_options, on_progress, started_s)
    except Exception:
        if not req.dry_run:
            failed = SyncTotals(runs_failed=1, seconds=time.monotonic() - started_s)
            await asyncio.to_thread(record_sync, req.cache_dir, name, failed)
        raise
    if not report.dry_run:
        await asyncio.to_thread(record_sync, req.cache_dir, name, _totals_of(report))
        await asyncio.to_thread(_keep_file_cost, report)
    return report


def _holds_nothing(dest: str | os.PathLike[str]) -> bool:
    """True when ``dest`` is missing or holds nothing but the sync's own state directory
    (`STATE_DIR_NAME`): a sync into it writes every file."""
    try:
        with os.scandir(dest) as entries:
            return all(entry.name == STATE_DIR_NAME for entry in entries)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _keep_file_cost(report: SyncReport) -> None:
    """What a sync showed of its per-file cost (`netopt.cache.filecost.observed_per_file_s`),
    kept where it was looked up (`netopt.cache.filecost.keep_observed`). A sync that
    started again on a new version (two passes in its time) shows nothing."""
    plan, where = report.transfer_plan, report.file_cost_dir
    if where is None or plan is None or report.summary is None or report.version_restarts:
        return
    from netopt.cache import filecost  # it imports us

    work_s = report.seconds - report.file_cost_s
    per_file_s = filecost.observed_per_file_s(plan, work_s, report.summary.files_written)
    if per_file_s is not None:
        filecost.keep_observed(where, per_file_s)


def _totals_of(report: SyncReport) -> SyncTotals:
    """One sync's figures for the cache's sync totals."""
    s = report.summary
    from_peers = int(report.sharing.get("wire_bytes_from_peers", 0)) if report.sharing else 0
    return SyncTotals(
        runs_ok=1,
        written_bytes=s.logical_bytes if s else 0,
        reused_bytes=report.plan.bytes_reused,
        fetched_bytes=s.fetched_logical_bytes if s else 0,
        origin_wire_bytes=max(0, report.wire_bytes - from_peers),
        peer_wire_bytes=from_peers,
        seconds=report.seconds,
    )


async def _run_sync_restarting(
    req: SyncRequest,
    source: Source,
    source_options: SourceOptions,
    on_progress: ProgressCallback | None,
    started_s: float,
) -> SyncReport:
    """`_run_sync_once`, started again on each new version the origin publishes meanwhile."""
    for restart in range(MAX_VERSION_RESTARTS + 1):
        try:
            report = await _run_sync_once(req, source, source_options, on_progress)
        except DatasetChangedError as exc:
            if restart == MAX_VERSION_RESTARTS:
                raise DatasetChangedError(
                    f"{exc}; the dataset changed {restart + 1} times during the sync, "
                    "re-run it once the origin's files stop changing"
                ) from exc
            log.warning("%s: starting again on the new version", exc)
            continue
        return replace(report, seconds=time.monotonic() - started_s, version_restarts=restart)
    raise AssertionError("unreachable")  # pragma: no cover


async def _run_sync_once(
    req: SyncRequest,
    source: Source,
    source_options: SourceOptions,
    on_progress: ProgressCallback | None,
) -> SyncReport:
    """One pass of `run_sync` on the version the source offers now."""
    async with open_riding_out(source, source_options, req.sync_options or SyncOptions()) as opened:
        cache = await asyncio.to_thread(Cache.open, req.cache_dir, req.capacity_bytes)
        trace.mark("cache_opened")
        try:
            dest_files = await asyncio.to_thread(scan_dest, Path(req.dest), opened.manifest)
            trace.mark("dest_listed")
            plan = plan_sync(opened.manifest, dest_files, set(cache.sizes_bytes))
            summary: SyncSummary | None = None
            evicted = 0
            shared: dict[str, Any] | None = None
            if not req.dry_run:
                await asyncio.to_thread(check_space, cache.root, Path(req.dest), plan)
                summary, evicted, shared = await _sync_into_cache(
                    req, opened, cache, on_progress, dest_files
                )
                await check_riding_out(
                    opened, req.sharing is not None, req.sync_options or SyncOptions()
                )
        except BaseException:
            # Keep the first error (a full disk also fails the index write).
            with contextlib.suppress(StorageError):
                await asyncio.to_thread(cache.close)
            raise
        await asyncio.to_thread(cache.close)
    return SyncReport(
        dataset=opened.manifest.name,
        source_kind=opened.kind,
        manifest_id=opened.manifest.manifest_id,
        plan=plan,
        dry_run=req.dry_run,
        seconds=0.0,
        overhead_bytes=opened.overhead_bytes,
        summary=summary,
        transfer_plan=_transfer_plan(opened, plan),
        evicted_chunks=evicted,
        sharing=shared,
        link_figures=opened.link_figures.to_dict() if opened.link_figures else None,
        levels_over_time=opened.levels_over_time(),
        file_cost_dir=opened.file_cost_dir,
        file_cost_s=opened.file_cost_s,
    )
