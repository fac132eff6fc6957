"""The data-plane client: fetch a served dataset (``netopt://HOST:PORT/NAME``) into a directory.

`sync_url` fetches the dataset's info and manifest (in parallel, each request hedged
against a lost SYN, while the data connections of the
`netopt.dataplane.httpsource.HttpChunkSource` open), plans the transfer (`plan_for`),
and runs the sync engine with resume state in ``DEST/.netopt-sync/``. The source and
its options live in `netopt.dataplane.httpsource` and are re-exported here.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

from netopt.dataplane import prefetch, trace
from netopt.dataplane.chunkio import DirChunkSink
from netopt.dataplane.httpsource import (
    ClientOptions,
    DatasetInfo,
    DatasetUrl,
    HttpChunkSource,
    parse_dataset_url,
)
from netopt.dataplane.manifestversions import NotModified
from netopt.dataplane.prefetch import WARM_CONNECTIONS
from netopt.dataplane.sync import first_error, sync_manifest
from netopt.dataplane.synctypes import ProgressCallback, SyncOptions, SyncSummary
from netopt.errors import NetoptError, ProtocolError
from netopt.transfer.adapt import LevelAdapter, level_models
from netopt.transfer.figures import Figure, LinkFigures, choose_figures
from netopt.transfer.manifest import STATE_DIR_NAME, Manifest
from netopt.transfer.planner import CpuProfile, LinkProfile, TransferPlan, pair_cpu_profile
from netopt.transfer.planner import plan_transfer as _plan_transfer
from netopt.transfer.profile import load_cpu_profile

__all__ = [
    "ClientOptions",
    "DatasetInfo",
    "DatasetUrl",
    "HttpChunkSource",
    "fetch_info_and_manifest",
    "link_figures_for",
    "parse_dataset_url",
    "part_connections",
    "plan_for",
    "start_adapting",
    "sync_url",
]

_T = TypeVar("_T")
MAX_CONNECTIONS = 64
"""Connections one source may hold (the sync engine's streams use fewer)."""
HEDGE_DELAY_S = 0.5
"""After this long without an answer, the info and manifest requests are sent again."""
WARM_GRACE_RTTS = 0.25
WARM_GRACE_MIN_S = 0.02
"""`warm_grace_s`: on the lab's 140 ms link the 16 warm-up connections that did not lose a
packet opened within 7-12 ms of each other; one that did came 130-600 ms after."""


def link_figures_for(
    info: DatasetInfo,
    *,
    rate_bps: float | None = None,
    loss_ratio: float | None = None,
    measured: tuple[LinkProfile, str] | str | None = None,
    rate_limit_bps: float | None = None,
) -> LinkFigures:
    """The figures to plan a fetch of ``info``'s dataset with: its measured RTT, the flags'
    rate and loss, else the coordinator's ``measured`` link (profile and note; a string:
    why there is none), else guesses."""
    link, note = measured if isinstance(measured, tuple) else (None, "coordinator")
    figures = choose_figures(
        Figure(info.rtt_ms, info.rtt_source),
        rate_flag_bps=rate_bps,
        loss_flag=loss_ratio,
        measured=link,
        measured_source=note,
        rate_limit_bps=rate_limit_bps,
    )
    return replace(figures, notes=(measured,)) if isinstance(measured, str) else figures


def plan_for(
    info: DatasetInfo,
    link: LinkProfile | None,
    client_cpu: CpuProfile,
    *,
    rate_bps: float | None = None,
    loss_ratio: float | None = None,
    max_streams: int = 64,
    startup_s: float | None = None,
    figures: LinkFigures | None = None,
    meta_bytes: int = 0,
    files: int = 0,
    fetch_bytes: int | None = None,
) -> TransferPlan:
    """Plan a fetch of ``info``'s dataset: the server compresses, this node decompresses.

    Without ``link``, the link is ``figures`` (default: `link_figures_for` the RTT
    measured and ``rate_bps`` / ``loss_ratio``, a 1 Gbit/s lossless guess without them),
    running the server's congestion control; the plan's first reason says which
    figures it used and where each came from. The predicted time counts ``startup_s``
    of process start-up (default: the CLI start-up calibrated in ``client_cpu``; pass 0
    from a long-running process) and the round trips ``meta_bytes`` (the info and
    manifest as they came over the wire) took, and ``files`` (the manifest's) at the
    client's measured per-file cost (`CpuProfile.per_file_s`, none when not measured).
    ``fetch_bytes``: the bytes to fetch, the manifest's chunks each once (default: the
    dataset's size; a tree whose files share chunks fetches less: the lab's image
    corpus, 12 % of it repeated, was predicted 24 % too slow by its size).
    """
    cc = info.congestion_control if info.congestion_control in ("bbr", "cubic", "reno") else "bbr"
    notes: tuple[str, ...] = ()
    if link is None:
        figures = figures or link_figures_for(info, rate_bps=rate_bps, loss_ratio=loss_ratio)
        link = figures.link(cast(Any, cc))
        notes = (figures.describe(),)
    plan = _plan_transfer(
        info.total_bytes if fetch_bytes is None else fetch_bytes,
        info.sample,
        link,
        pair_cpu_profile(info.server_cpu, client_cpu),
        max_streams=max_streams,
        startup_s=client_cpu.startup_s if startup_s is None else startup_s,
        meta_bytes=meta_bytes,
        files=files,
        per_file_s=client_cpu.per_file_s or 0.0,
    )
    return replace(plan, reasons=(*notes, *plan.reasons))


def start_adapting(
    source: HttpChunkSource,
    info: DatasetInfo,
    client_cpu: CpuProfile,
    figures: LinkFigures | None,
) -> None:
    """Let ``source``'s level follow the link from its current level (see
    `netopt.transfer.adapt`), where the server takes a level per streamed chunk."""
    if not info.stream_levels:
        return
    known_bps = figures.rate_bps.value if figures is not None and figures.rate_known else None
    source.adapter = LevelAdapter(
        level_models(info.sample, info.server_cpu, client_cpu),
        source.zstd_level or 0,
        known_bps,
        time.monotonic(),
    )


async def sync_url(
    url: str,
    dest: str | os.PathLike[str],
    client: ClientOptions,
    *,
    streams: int | None = None,
    zstd_level: int | None = None,
    link: LinkProfile | None = None,
    link_rate_bps: float | None = None,
    link_loss_ratio: float | None = None,
    client_cpu: CpuProfile | None = None,
    sync_options: SyncOptions | None = None,
    on_plan: Callable[[TransferPlan], None] | None = None,
    on_progress: ProgressCallback | None = None,
    startup_s: float | None = None,
) -> tuple[SyncSummary, TransferPlan]:
    """Fetch the dataset at ``url`` into ``dest``; resumable, see `sync_manifest`.

    ``streams`` / ``zstd_level`` override the plan (``zstd_level=0`` turns
    compression off); ``link`` (or ``link_rate_bps`` / ``link_loss_ratio`` at the
    measured RTT) describes the path for the plan; unless ``zstd_level`` is given, the
    level then follows the link while the sync runs. Resume state lives in
    ``dest/.netopt-sync/`` and is removed after a complete sync. Raises
    PeerUnreachableError when the server cannot be reached, AuthenticationError
    for a refused token, and whatever `sync_manifest` raises. ``startup_s``: see
    `plan_for`.
    """
    target = parse_dataset_url(url)
    cpu = client_cpu if client_cpu is not None else await asyncio.to_thread(load_cpu_profile)
    started_s = time.monotonic()
    # The data connections open while the info and manifest travel: they are warm when
    # the plan is ready.
    async with HttpChunkSource(target, replace(client, streams=MAX_CONNECTIONS)) as source:
        info, manifest = await fetch_info_and_manifest(source, streams or WARM_CONNECTIONS)
        overhead_bytes = source.meta_wire_bytes
        figures = None
        if link is None:
            figures = link_figures_for(
                info,
                rate_bps=link_rate_bps,
                loss_ratio=link_loss_ratio,
                rate_limit_bps=client.rate_limit_bps,
            )
        plan = plan_for(
            info,
            link,
            cpu,
            startup_s=startup_s,
            figures=figures,
            meta_bytes=overhead_bytes,
            files=len(manifest.files),
            fetch_bytes=manifest.unique_bytes,
        )
        if on_plan is not None:
            on_plan(plan)
        n_streams = streams or plan.streams
        source.zstd_level = plan.zstd_level if zstd_level is None else (zstd_level or None)
        if zstd_level is None:
            start_adapting(source, info, cpu, figures)
        state_dir = Path(dest) / STATE_DIR_NAME
        # No fsync per chunk: the store only serves resumption, and `get` re-verifies.
        sink = await asyncio.to_thread(partial(DirChunkSink, state_dir / "chunks", fsync=False))
        # Streams the plan chose: a small sync's parts may use every warm connection.
        parts = 0 if streams else part_connections(n_streams, source.warm_ready)
        opts = replace(sync_options or SyncOptions(), streams=n_streams, part_connections=parts)
        summary = await sync_manifest(manifest, source, sink, dest, opts, on_progress=on_progress)
    await asyncio.to_thread(shutil.rmtree, state_dir, ignore_errors=True)
    # Count the info and manifest requests too: they are part of what the sync cost.
    total = replace(
        summary,
        wire_bytes=summary.wire_bytes + overhead_bytes,
        seconds=time.monotonic() - started_s,
    )
    return total, plan


async def _hedged(request: Callable[[], Awaitable[_T]], delay_s: float = HEDGE_DELAY_S) -> _T:
    """``request()``, and a second copy of it when the first has not answered within
    ``delay_s``: the first answer wins. A lost SYN costs TCP a 1 s timeout; on a lossy
    link the copy, on a new connection, usually answers long before. Raises the first
    copy's error when both fail."""
    first = asyncio.ensure_future(request())
    tries = [first]
    try:
        done, _ = await asyncio.wait({first}, timeout=delay_s)
        if done:
            return first.result()
        trace.count("hedged_requests")
        tries.append(asyncio.ensure_future(request()))
        errors: list[BaseException] = []
        for next_done in asyncio.as_completed(tries):
            try:
                return await next_done
            except NetoptError as exc:
                errors.append(exc)
        raise errors[0]
    finally:
        for task in tries:
            task.cancel()
        await asyncio.gather(*tries, return_exceptions=True)


InfoHook = Callable[[DatasetInfo], None]
"""Called with the dataset's info as soon as it is in, before the manifest (a lead
starts there: `netopt.dataplane.lead`)."""


async def fetch_info_and_manifest(
    source: HttpChunkSource, connections: int, on_info: InfoHook | None = None
) -> tuple[DatasetInfo, Manifest]:
    """`_fetch_info_and_manifest`, calling ``on_info`` (once) with the info as soon as
    it is in, checked as the normal path checks it, when it comes before the manifest."""
    if on_info is None:
        return await _fetch_info_and_manifest(source, connections, None)
    called = False

    def once(info: DatasetInfo) -> None:
        nonlocal called
        if not called and info.name == source.url.name:
            called = True
            on_info(info)

    watcher = asyncio.ensure_future(_prefetched_info(source, once))
    try:
        return await _fetch_info_and_manifest(source, connections, once)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


INFO_POLLS_MAX = 2000
"""How often `_prefetched_info` looks for the prefetch's info (every
`prefetch.LATE_POLL_S`: 10 s), unless the manifest came first (it is cancelled then)."""


async def _prefetched_info(source: HttpChunkSource, on_info: InfoHook) -> None:
    """``on_info`` with the start-up prefetch's info once it is in (there is none without
    a prefetch, and none that does not validate)."""
    url, token = source.url, source.options.token
    if not prefetch.prefetching(url.host, url.port, url.name, token):
        return
    for _ in range(INFO_POLLS_MAX):
        got = prefetch.peek_info(url.host, url.port, url.name, token)
        if got is not None:
            break
        await asyncio.sleep(prefetch.LATE_POLL_S)
    else:
        return
    doc, first_byte_s = got
    rtt_s = prefetch.handshake_rtt_s(url.host, url.port) or first_byte_s
    try:
        info = source.info_from_dict(doc, rtt_s * 1000)
    except ProtocolError:
        return  # the normal path reports it
    on_info(info)


async def _fetch_info_and_manifest(
    source: HttpChunkSource, connections: int, on_info: InfoHook | None
) -> tuple[DatasetInfo, Manifest]:
    """The dataset's info and manifest, in parallel over a short-lived session of their
    own, while ``source`` opens ``connections`` data connections; returned once those are
    open, or once the rest are late (`HttpChunkSource.warmed`, `warm_grace_s`): late ones
    go on opening. ``source.meta_wire_bytes`` then holds what the two requests took on
    the wire.

    Answers that `netopt.dataplane.prefetch` fetched while the process was starting are
    used when they are there; the data connections then come connected from it too.

    Raises what `HttpChunkSource.fetch_info` / `fetch_manifest` raise.
    """
    url, token = source.url, source.options.token
    source.owns_prefetch = True
    warming = prefetch.sockets_need_tls(url.host, url.port)
    if warming:
        # Under TLS the prefetched sockets carry no TLS session yet: their handshakes
        # start now, while the prefetch's answers are awaited, not at the first chunk.
        # Closing ``source`` ends a warm-up still running.
        source.start_warm_up(connections)
    early = await prefetch.take_meta(url.host, url.port, url.name, token)
    if early is not None:
        if source.lead is not None:
            source.lead.widen()  # the manifest is in: the link idles while it is parsed
        return await _prefetched(source, early)
    # Asked again, normally; the prefetch's answers still count if they come first.
    normal = asyncio.ensure_future(_asked_normally(source, connections, warming, on_info))
    late = asyncio.ensure_future(prefetch.late_meta(url.host, url.port, url.name, token))
    try:
        await asyncio.wait({normal, late}, return_when=asyncio.FIRST_COMPLETED)
        answer = late.result() if late.done() else None
        if answer is None:
            return await normal
        normal.cancel()
        await asyncio.gather(normal, return_exceptions=True)
        trace.count("prefetched_meta_late")
        if not source.warm_up_started:
            source.start_warm_up(connections)
        if source.lead is not None:
            source.lead.widen()
        return await _prefetched(source, answer)
    finally:
        for task in (normal, late):
            task.cancel()
        await asyncio.gather(normal, late, return_exceptions=True)


async def _prefetched(
    source: HttpChunkSource, early: prefetch.MetaAnswer
) -> tuple[DatasetInfo, Manifest]:
    """`fetch_info_and_manifest` from the prefetch's answers (validated as the normal
    path's are)."""
    source.meta_wire_bytes = early.wire_bytes
    info = source.info_from_dict(early.info, early.rtt_s * 1000, early.rtt_source)
    source.rtt_s = info.rtt_ms / 1000  # what the stall timeout is derived from
    if isinstance(early.manifest, NotModified):
        manifest = await source.known_manifest(early.manifest)
    else:
        manifest = source.manifest_from_doc(early.manifest)
    await source.warmed(warm_grace_s(source.rtt_s))
    trace.mark("info_manifest")
    return _asked_for(source, info, manifest)


async def _asked_normally(
    source: HttpChunkSource, connections: int, warming: bool, on_info: InfoHook | None = None
) -> tuple[DatasetInfo, Manifest]:
    """`fetch_info_and_manifest` over a short-lived session of its own; starts the
    warm-up unless it runs already (``warming``); ``on_info`` with the info when it
    comes before the manifest."""
    async with HttpChunkSource(source.url, replace(source.options, streams=4)) as meta:
        try:
            async with asyncio.TaskGroup() as tg:
                info_task = tg.create_task(_hedged(meta.fetch_info))
                manifest_task = tg.create_task(_hedged(meta.fetch_manifest))

                def info_in(task: asyncio.Task[DatasetInfo]) -> None:
                    if on_info is None or task.cancelled() or manifest_task.done():
                        return
                    if task.exception() is None:
                        on_info(task.result())

                info_task.add_done_callback(info_in)
                if not warming:  # after the two: they connect first
                    source.start_warm_up(connections)
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        source.meta_wire_bytes = meta.wire_bytes
    info = info_task.result()
    await source.warmed(warm_grace_s(info.rtt_ms / 1000))
    trace.mark("info_manifest")
    # The data connections' handshakes and warm-up requests measured the round trip too.
    measured = source.round_trip()
    if measured is not None and measured[0] * 1000 < info.rtt_ms:
        info = replace(info, rtt_ms=measured[0] * 1000, rtt_source=measured[1])
    source.rtt_s = info.rtt_ms / 1000  # what the stall timeout is derived from
    return _asked_for(source, info, manifest_task.result())


def warm_grace_s(rtt_s: float) -> float:
    """How long the set-up waits for the rest of the warm-up once one connection is open
    (see `HttpChunkSource.warmed`): `WARM_GRACE_RTTS` of the round trip, at least
    `WARM_GRACE_MIN_S`."""
    return max(WARM_GRACE_MIN_S, WARM_GRACE_RTTS * rtt_s)


def part_connections(plan_streams: int, warm_ready: int) -> int:
    """The connections a sync of fewer chunks than streams spreads its chunks' parts over
    (`SyncOptions.part_connections`): the warm-up's open ones when it opened some (a part
    beyond them would open a connection of its own: two round trips more under TLS),
    else the plan's streams, at least `WARM_CONNECTIONS`."""
    return warm_ready if warm_ready > 0 else max(plan_streams, WARM_CONNECTIONS)


def _asked_for(
    source: HttpChunkSource, info: DatasetInfo, manifest: Manifest
) -> tuple[DatasetInfo, Manifest]:
    """``(info, manifest)`` when both name the dataset ``source``'s URL asked for (then
    ``source`` may cut chunks into the parts the info offers); ProtocolError otherwise
    (the cache files a manifest under its name, so a server must not choose it)."""
    url = source.url
    for what, name in (("dataset info", info.name), ("manifest", manifest.name)):
        if name != url.name:
            raise ProtocolError(
                f"{url}: the server's {what} names dataset {name[:200]!r}, not {url.name!r}; "
                "refusing it (nothing was written)"
            )
    source.use_routes_of(info)
    return info, manifest
