"""``netopt serve``, ``netopt sync`` and ``netopt plan``: move datasets across slow links."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import signal
import ssl
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from netopt.cli.output import console, err_console, print_json
from netopt.cli.tls_opts import client_tls_options, serve_tls_options
from netopt.config import TlsSettings, cli_token, load_settings, resolve_token
from netopt.errors import NetoptError, StorageError, UsageError, ValidationError
from netopt.tlsconf import certificate_watch, listener_context

if TYPE_CHECKING:
    # The rest is imported where used. ``netopt sync`` starts its first requests (see
    # netopt.dataplane.prefetch) before it imports aiohttp and the sync engine, and not
    # every command needs the server (aiohttp.web), region sharing or a progress bar.
    from netopt.cache.shared import SharingOptions
    from netopt.dataplane.frames import FrameStore
    from netopt.dataplane.handlers import ServeSettings
    from netopt.dataplane.served import ServedDataset
    from netopt.dataplane.synctypes import SyncProgress
    from netopt.transfer.linklookup import CoordinatorRef
    from netopt.transfer.planner import LinkProfile, TransferPlan

__all__ = ["plan_command", "run_plan", "run_serve", "serve_command", "sync_command"]

CC_CHOICES = ("bbr", "cubic", "reno", "default")
DEFAULT_SERVE_PORT = 7470


def _cc(value: str) -> str | None:
    return None if value == "default" else value


def _parse_bind(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValidationError(f"--bind {bind!r}: expected ADDR:PORT, e.g. 127.0.0.1:7470")
    return host.strip("[]") or "127.0.0.1", int(port)


async def run_serve(
    directory: str,
    name: str,
    host: str,
    port: int,
    settings: ServeSettings,
    avg_chunk_bytes: int,
    codec_cache: str | None,
    precompress_level: int | None = None,
    frames_dir: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    tls: TlsSettings | None = None,
) -> int:
    """Serve ``directory`` as dataset ``name`` until SIGINT or SIGTERM (over TLS with
    ``ssl_context``); with ``precompress_level``, compress every chunk once at that level
    meanwhile."""
    from netopt.dataplane.frames import FrameStore, frames_dir_for
    from netopt.dataplane.origin import LiveDataset
    from netopt.dataplane.server import create_app, start_server
    from netopt.transfer.profile import load_cpu_profile

    live = await asyncio.to_thread(LiveDataset.load, directory, name, avg_chunk_bytes)
    store: FrameStore | None = None
    if precompress_level is not None:
        xdg_cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        base = Path(frames_dir or Path(xdg_cache) / "netopt" / "frames")
        where = frames_dir_for(base, name, live.manifest.manifest_id, precompress_level)
        store = FrameStore(where, precompress_level, len(live.index))
        live.with_frames(store)
    dataset = live.current
    cpu = await asyncio.to_thread(load_cpu_profile, codec_cache)
    # Clients plan with the cores this server will actually compress on.
    cpu = dataclasses.replace(cpu, cores=settings.worker_threads)
    app = create_app(settings, {name: live}, cpu)
    runner, bound = await start_server(app, host, port, ssl_context=ssl_context)
    shown = f"[{host}]" if ":" in host else host
    serving = (
        f"serving netopt://{shown}:{bound}/{name} ({len(dataset.manifest.files)} files, "
        f"{dataset.manifest.total_bytes} bytes, {len(dataset.index)} chunks; "
        f"changes noticed by {live.watching})"
    )
    console.print(serving)
    logging.getLogger("netopt.serve").info("%s", serving)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    building = None
    watch = loop.create_task(certificate_watch(ssl_context, tls or TlsSettings(), "netopt serve"))
    if store is not None:
        # A one-off publishing step: it may use every core, unlike serving.
        building = loop.create_task(_precompress(store, dataset, os.cpu_count() or 1))
    try:
        await stop.wait()
    finally:
        watch.cancel()
        if building is not None:
            building.cancel()
        await runner.cleanup()
        live.close()
    return 0


async def _precompress(store: FrameStore, dataset: ServedDataset, workers: int) -> None:
    """Build ``store`` in threads and say how it went (a failure leaves serving as it was:
    chunks without a frame are compressed on the fly)."""
    started = time.monotonic()
    err_console.print(
        f"precompressing {store.chunks} chunks at zstd {store.level} into {store.root}"
    )
    ids = list(dataset.index)
    files = [dataset.root / f.path for f in dataset.manifest.files if f.size_bytes > 0]
    try:
        await asyncio.to_thread(store.build, ids, dataset.read_chunk, workers)
        await asyncio.to_thread(store.sample, files)
    except NetoptError as exc:
        err_console.print(f"precompression stopped: {exc}; serving on-the-fly compression")
        return
    err_console.print(
        f"precompressed {store.ready} chunks at zstd {store.level} in "
        f"{time.monotonic() - started:.1f} s (ratio {store.ratio():.2f}, "
        f"{store.sampled_ratio:.2f} on the sample)"
    )


@click.command("serve")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--name", default=None, help="Dataset name (default: the directory's name).")
@click.option(
    "--bind",
    default=f"127.0.0.1:{DEFAULT_SERVE_PORT}",
    show_default=True,
    help="ADDR:PORT to listen on (port 0: any free port).",
)
@click.option("--token-file", type=click.Path(dir_okay=False), help="File holding the token.")
@click.option("--no-auth", is_flag=True, help="Serve without a token (trusted networks only).")
@click.option(
    "--cc",
    type=click.Choice(CC_CHOICES),
    default="bbr",
    show_default=True,
    help="TCP congestion control of the server's (sending) sockets.",
)
@click.option(
    "--chunk-size",
    "chunk_size_bytes",
    type=click.IntRange(64 * 1024, 64 * 1024**2),
    default=1024 * 1024,
    show_default=True,
    help="Average chunk size in bytes.",
)
@click.option(
    "--codec-cache",
    type=click.Path(dir_okay=False),
    default=None,
    help="Codec speed cache (default ~/.cache/netopt/codec.json).",
)
@click.option(
    "--threads",
    type=click.IntRange(1, 256),
    default=None,
    help="Threads for reading and compressing chunks (default: the CPU count).",
)
@click.option(
    "--precompress",
    "precompress_level",
    type=click.IntRange(1, 19),
    default=None,
    help="Compress every chunk once at this zstd level (e.g. 19) and serve the stored "
    "frames; clients plan with that level once all are done.",
)
@click.option(
    "--frames-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where precompressed frames are kept (default ~/.cache/netopt/frames).",
)
@serve_tls_options
def serve_command(
    directory: str,
    name: str | None,
    bind: str,
    token_file: str | None,
    no_auth: bool,
    cc: str,
    chunk_size_bytes: int,
    codec_cache: str | None,
    threads: int | None,
    precompress_level: int | None,
    frames_dir: str | None,
    tls: TlsSettings,
) -> int:
    """Serve DIRECTORY as a dataset at netopt://HOST:PORT/NAME.

    A token is required: from --token-file or NETOPT_TOKEN; when neither is set a
    random token is generated and printed (pass it to clients as NETOPT_TOKEN).
    """
    host, port = _parse_bind(bind)
    ssl_context = listener_context(tls, host, "netopt serve")
    dataset_name = name or Path(directory).resolve().name
    token = None if no_auth else cli_token(token_file, required=False)
    if token is None and not no_auth:
        token = secrets.token_urlsafe(24)
        err_console.print(f"generated token (give clients NETOPT_TOKEN={token})")
    from netopt.dataplane.handlers import ServeSettings

    settings = ServeSettings(
        token=token, congestion_control=_cc(cc), worker_threads=threads or os.cpu_count() or 1
    )
    return asyncio.run(
        run_serve(
            directory, dataset_name, host, port, settings, chunk_size_bytes, codec_cache,
            precompress_level, frames_dir, ssl_context, tls,
        )
    )  # fmt: skip


class _Bar:
    """A rich progress bar fed by sync progress snapshots (rate, ETA, compression ratio)."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("ratio {task.fields[ratio]}"),
            console=err_console,
        )
        self.task = self.progress.add_task("sync", total=None, ratio="-")

    def update(self, snap: SyncProgress) -> None:
        ratio = snap.fetched_logical_bytes / snap.wire_bytes if snap.wire_bytes else 1.0
        self.progress.update(
            self.task,
            total=snap.logical_total_bytes,
            completed=snap.logical_done_bytes,
            ratio=f"{ratio:.2f}x",
        )


@click.command("sync")
@click.argument("source")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--dry-run", is_flag=True, help="Show the plan and the bytes to move; move nothing.")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Chunk cache (default: cache.dir of --config, else ~/.cache/netopt/cache).",
)
@click.option(
    "--capacity",
    "capacity",
    default=None,
    help="Cache capacity, e.g. 50GiB (default: cache.capacity_bytes of --config, else kept).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Agent config: cache.dir, cache.capacity_bytes and region come from it.",
)
@click.option(
    "--datasets",
    "datasets_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Dataset catalogue (datasets.yaml) whose residency rules apply.",
)
@click.option("--region", default=None, help="This node's region (default: from --config).")
@click.option("--name", default=None, help="Dataset name (default: from SOURCE).")
@click.option(
    "--streams",
    type=click.IntRange(1, 64),
    default=None,
    help="Parallel connections (default: from the plan).",
)
@click.option(
    "--rate-limit-mbps",
    type=click.FloatRange(min=0.01),
    default=None,
    help="Bandwidth limit in Mbit/s (on the wire).",
)
@click.option(
    "--cc",
    type=click.Choice(CC_CHOICES),
    default=None,
    help="TCP congestion control of this client's sockets [default: --config's "
    "cache.congestion_control, else bbr].",
)
@click.option(
    "--level",
    type=click.IntRange(0, 19),
    default=None,
    help="zstd level (0: off; default: from the plan).",
)
@click.option(
    "--link-rate-mbps",
    type=click.FloatRange(min=0.001),
    default=None,
    help="Link rate for the plan (default: the coordinator's measurement of the link to the "
    "server's node, else this client's --rate-limit-mbps, else a 1000 Mbit/s guess; unless "
    "--level is given, the level adapts to the link while the sync runs).",
)
@click.option(
    "--link-loss",
    type=click.FloatRange(0, 0.5),
    default=None,
    help="Link loss ratio for the plan (default: the coordinator's measurement, else 0).",
)
@click.option(
    "--chunk-size",
    "chunk_size_bytes",
    type=click.IntRange(64 * 1024, 64 * 1024**2),
    default=1024 * 1024,
    show_default=True,
    help="Average chunk size in bytes when chunking a path or a web directory here.",
)
@click.option(
    "--retry-window-s",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="How long a chunk is retried while the source or the link is down (a restart, "
    "an outage) before the sync fails.",
)
@click.option("--token-file", type=click.Path(dir_okay=False), help="File holding the token.")
@click.option(
    "--share/--no-share",
    default=None,
    help="Fetch chunks from in-region peers through the coordinator's catalogue, crossing "
    "the border once per region (default: on when --config or --coordinator is given).",
)
@click.option(
    "--coordinator",
    "coordinator_url",
    default=None,
    help="Coordinator URL for sharing (default: coordinator_url of --config).",
)
@click.option("--node", default=None, help="This node's name for sharing (default: from --config).")
@click.option(
    "--s3-endpoint-url",
    default=None,
    help="s3://: the S3-compatible endpoint, e.g. https://minio.local:9000 (default: AWS).",
)
@click.option("--s3-region", default=None, help="s3://: the region (default: env or profile).")
@click.option(
    "--s3-profile",
    default=None,
    help="s3://: the AWS config profile (default: AWS_ACCESS_KEY_ID etc. from the env).",
)
@client_tls_options(agent_config="config_file")
def sync_command(
    source: str,
    dest: str,
    as_json: bool,
    dry_run: bool,
    cache_dir: str | None,
    capacity: str | None,
    config_file: str | None,
    datasets_file: str | None,
    region: str | None,
    name: str | None,
    streams: int | None,
    rate_limit_mbps: float | None,
    cc: str | None,
    level: int | None,
    link_rate_mbps: float | None,
    link_loss: float | None,
    chunk_size_bytes: int,
    retry_window_s: float,
    token_file: str | None,
    share: bool | None,
    coordinator_url: str | None,
    node: str | None,
    s3_endpoint_url: str | None,
    s3_region: str | None,
    s3_profile: str | None,
) -> int:
    """Fetch SOURCE into DEST through the node's chunk cache; resumable, delta re-syncs.

    With --config (the node's agent config) or --coordinator, chunks come from
    in-region peers that hold them and cross the border once per region; the
    node's agent then serves what this sync stored (use the agent's cache dir).

    SOURCE is a directory, netopt://HOST:PORT/NAME, a netopt manifest URL
    (http(s)://HOST:PORT/v1/datasets/NAME), a web server's directory listing
    (http(s)://HOST/PATH/) or an S3-compatible bucket prefix (s3://BUCKET/PREFIX;
    credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or --s3-profile).
    Exit codes: 0 ok, 1 failure, 2 bad input or a
    residency refusal.
    """
    token = cli_token(token_file, required=False)
    if source.startswith("netopt://") and config_file is None and coordinator_url is None:
        from netopt.dataplane import prefetch

        if prefetch.start(source, token, streams or prefetch.WARM_CONNECTIONS, _cc(cc or "bbr")):
            click.get_current_context().call_on_close(prefetch.discard)

    from netopt.cache.s3 import S3Options
    from netopt.cache.sources import SourceOptions
    from netopt.cache.syncer import SyncRequest, run_sync
    from netopt.cli.cache_cmd import resolve_cache
    from netopt.dataplane.httpsource import ClientOptions
    from netopt.dataplane.synctypes import SyncOptions

    sharing = _sharing_options(share, config_file, coordinator_url, node, token)
    max_streams = 64
    if config_file is not None:
        # The node's agent config sets this node's transfer defaults (options win).
        cache = load_settings(config_file, "agent").cache
        rate_limit_mbps = rate_limit_mbps or cache.rate_limit_mbps
        max_streams = cache.max_parallel_streams
        if streams is not None and streams > max_streams:
            raise UsageError(
                f"--streams {streams} is over {config_file}'s cache.max_parallel_streams "
                f"({max_streams})"
            )
        cc = cc or cache.congestion_control
    cc = cc or "bbr"
    client = ClientOptions(
        # The cluster's token opens peers' and netopt servers' data planes alike.
        token=token or (sharing.token if sharing is not None else None),
        congestion_control=_cc(cc),
        rate_limit_bps=rate_limit_mbps * 1e6 if rate_limit_mbps else None,
    )
    where = resolve_cache(cache_dir, capacity, config_file, region, datasets_file)
    request = SyncRequest(
        sharing=sharing,
        source=source,
        dest=dest,
        cache_dir=where.cache_dir,
        capacity_bytes=where.capacity_bytes,
        dry_run=dry_run,
        region=where.region,
        catalogue=where.catalogue,
        sync_options=SyncOptions(retry_window_s=retry_window_s),
        source_options=SourceOptions(
            client=client,
            name=name,
            avg_chunk_bytes=chunk_size_bytes,
            streams=streams,
            max_streams=max_streams,
            zstd_level=level,
            link_rate_bps=link_rate_mbps * 1e6 if link_rate_mbps else None,
            link_loss_ratio=link_loss,
            coordinator=_link_coordinator(sharing, config_file, coordinator_url, node, token),
            s3=S3Options(endpoint_url=s3_endpoint_url, region=s3_region, profile=s3_profile),
        ),
    )
    bar = _Bar() if not as_json and not dry_run and err_console.is_terminal else None
    with bar.progress if bar is not None else contextlib.nullcontext():
        report = asyncio.run(run_sync(request, on_progress=bar.update if bar else None))
    if as_json:
        print_json(report.to_dict())
        return 0
    plan = report.plan
    if dry_run:
        console.print(
            f"{report.dataset}: {plan.files_to_write} of {plan.files_total} files to write "
            f"({plan.bytes_to_write} bytes): {plan.bytes_to_fetch} bytes to fetch in "
            f"{plan.chunks_to_fetch} chunks, {plan.bytes_reused} bytes from the cache"
        )
        return 0
    summary = report.summary
    assert summary is not None
    console.print(
        f"{summary.files} files ({summary.files_written} written, "
        f"{summary.files_skipped} up to date): {summary.logical_bytes} bytes, "
        f"{report.wire_bytes} on the wire (ratio {summary.compression_ratio:.2f}), "
        f"{plan.bytes_reused} reused from the cache, {report.seconds:.2f} s, "
        f"{summary.throughput_bps / 1e6:.1f} Mbit/s effective"
    )
    return 0


def _link_coordinator(
    sharing: SharingOptions | None,
    config_file: str | None,
    coordinator_url: str | None,
    node: str | None,
    token: str | None,
) -> CoordinatorRef | None:
    """Where the sync looks up the measured link to a netopt server's node: the sharing
    coordinator, else --coordinator, coordinator_url of --config or NETOPT_COORDINATOR
    (this node: --node, the config's node, else found by its address); None without one
    or without a token for it."""
    from netopt.transfer.linklookup import CoordinatorRef

    if sharing is not None:
        return CoordinatorRef(sharing.coordinator_url, sharing.token, sharing.node)
    if config_file is not None:
        agent = load_settings(config_file, "agent")
        coordinator_url = coordinator_url or agent.coordinator_url
        node = node or agent.node
        if token is None and (agent.token or agent.token_file):
            token = resolve_token(agent.token, agent.token_file)
    coordinator_url = coordinator_url or os.environ.get("NETOPT_COORDINATOR") or None
    if coordinator_url is None or token is None:
        return None
    return CoordinatorRef(coordinator_url, token, node)


def _sharing_options(
    share: bool | None,
    config_file: str | None,
    coordinator_url: str | None,
    node: str | None,
    token: str | None,
) -> SharingOptions | None:
    """Region sharing settings from the options and the agent config; None when off.

    Raises ValidationError when sharing is asked for but the node, coordinator or
    token is missing (naming the option that would give it).
    """
    if share is False or (share is None and config_file is None and coordinator_url is None):
        return None
    if config_file is not None:
        agent = load_settings(config_file, "agent")
        coordinator_url = coordinator_url or agent.coordinator_url
        node = node or agent.node
        if token is None and (agent.token or agent.token_file or share):
            token = resolve_token(agent.token, agent.token_file)
    missing = [
        option
        for option, value in (("--coordinator", coordinator_url), ("--node", node),
                              ("--token-file or NETOPT_TOKEN", token))
        if value is None
    ]  # fmt: skip
    if missing and share is None:
        return None  # sharing was not asked for explicitly: a plain sync
    if missing:
        raise ValidationError(f"sharing needs {', '.join(missing)} (or --config AGENT.yaml)")
    assert coordinator_url is not None
    assert node is not None
    assert token is not None
    from netopt.cache.shared import SharingOptions

    return SharingOptions(coordinator_url=coordinator_url, token=token, node=node)


def run_plan(
    rate_mbps: float,
    rtt_ms: float,
    loss_ratio: float,
    sample: str,
    cc: str,
    size_bytes: int | None,
    codec_cache: str | None,
    max_streams: int,
    link: LinkProfile | None = None,
) -> TransferPlan:
    """Sample ``sample``, load this node's codec profile and plan the transfer.

    ``link`` (e.g. from the coordinator) replaces the rate/RTT/loss figures.
    """
    from netopt.transfer.planner import LinkProfile, plan_transfer
    from netopt.transfer.profile import load_cpu_profile, sample_file

    try:
        size = size_bytes if size_bytes is not None else os.path.getsize(sample)
    except OSError as exc:
        raise StorageError(f"cannot read {sample}: {exc}") from exc
    profile = sample_file(sample)
    cpu = load_cpu_profile(codec_cache)
    link = link or LinkProfile(
        rate_bps=rate_mbps * 1e6,
        rtt_ms=rtt_ms,
        loss_ratio=loss_ratio,
        congestion_control=cast(Any, cc),
    )
    return plan_transfer(size, profile, link, cpu, max_streams=max_streams, startup_s=cpu.startup_s)


def _coordinator_link(
    url: str,
    to_node: str,
    from_node: str | None,
    config: str | None,
    token_file: str | None,
    window_s: float,
    cc: str,
) -> tuple[LinkProfile, tuple[str, ...]]:
    from netopt.transfer.coordinator_link import fetch_link_profile, local_node_name

    src = local_node_name(from_node, config)
    token = cli_token(token_file)
    return asyncio.run(
        fetch_link_profile(
            url, token, src, to_node, window_s=window_s, congestion_control=cast(Any, cc)
        )
    )


@click.command("plan")
@click.option(
    "--rate-mbps",
    type=click.FloatRange(min=0.001),
    default=None,
    help="The link's rate, Mbit/s (with --rtt-ms).",
)
@click.option(
    "--rtt-ms",
    type=click.FloatRange(min=0.001),
    default=None,
    help="The link's round-trip time, ms (with --rate-mbps).",
)
@click.option(
    "--coordinator",
    default=None,
    help="Take the link figures from this coordinator (else NETOPT_COORDINATOR, with --to).",
)
@click.option("--to", "to_node", default=None, help="With --coordinator: the receiving node.")
@click.option(
    "--from",
    "from_node",
    default=None,
    help="With --coordinator: this (sending) node (default: node of --config).",
)
@click.option(
    "--config",
    "agent_config",
    type=click.Path(dir_okay=False),
    default=None,
    help="Agent config naming this node (with --coordinator).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Coordinator token file (default: NETOPT_TOKEN).",
)
@click.option(
    "--window-s",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="With --coordinator: the measurement window.",
)
@click.option(
    "--loss",
    "loss_ratio",
    type=click.FloatRange(0, 0.5),
    default=0.0,
    show_default=True,
    help="Packet loss ratio (0.01 = 1%).",
)
@click.option(
    "--sample",
    type=click.Path(exists=True, dir_okay=False),
    required=True,
    help="A file like the data to send.",
)
@click.option(
    "--cc",
    type=click.Choice(("bbr", "cubic", "reno")),
    default="bbr",
    show_default=True,
    help="Congestion control of the sending sockets.",
)
@click.option(
    "--size-bytes",
    type=click.IntRange(min=0),
    default=None,
    help="Transfer size (default: the sample's size).",
)
@click.option(
    "--max-streams",
    type=click.IntRange(1, 64),
    default=64,
    show_default=True,
    help="The most parallel connections the plan may take.",
)
@click.option(
    "--codec-cache",
    type=click.Path(dir_okay=False),
    default=None,
    help="Codec speed cache (default ~/.cache/netopt/codec.json).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@client_tls_options()
def plan_command(
    rate_mbps: float | None,
    rtt_ms: float | None,
    coordinator: str | None,
    to_node: str | None,
    from_node: str | None,
    agent_config: str | None,
    token_file: str | None,
    window_s: float,
    loss_ratio: float,
    sample: str,
    cc: str,
    size_bytes: int | None,
    max_streams: int,
    codec_cache: str | None,
    as_json: bool,
) -> int:
    """Plan a transfer (codec, chunk size, streams, predicted time) over a link.

    The link is described (--rate-mbps, --rtt-ms, --loss) or measured: --coordinator
    URL --to NODE [--from NODE | --config AGENT_CONFIG] takes the pair's figures from
    the coordinator (exit 2 naming the pair when it has none).
    """
    from netopt.config.discovery import coordinator_url

    link: LinkProfile | None = None
    if to_node is not None:
        coordinator = coordinator_url(coordinator)
    if coordinator is not None or to_node is not None:
        if coordinator is None or to_node is None:
            raise ValidationError("--coordinator URL and --to NODE go together")
        link, notes = _coordinator_link(
            coordinator, to_node, from_node, agent_config, token_file, window_s, cc
        )
    elif rate_mbps is None or rtt_ms is None:
        raise ValidationError("give --rate-mbps and --rtt-ms, or --coordinator URL --to NODE")
    plan = run_plan(
        rate_mbps or 0.0, rtt_ms or 0.0, loss_ratio, sample, cc, size_bytes, codec_cache,
        max_streams, link,
    )  # fmt: skip
    if link is not None:
        plan = dataclasses.replace(plan, reasons=(*notes, *plan.reasons))
    if as_json:
        print_json(plan.to_dict())
        return 0
    level = f"zstd {plan.zstd_level}" if plan.zstd_level else "off"
    console.print(
        f"compression {level} (ratio {plan.expected_ratio:.2f}), {plan.streams} streams, "
        f"{plan.chunk_size_bytes // 1024} KiB chunks, predicted {plan.predicted_time_s:.1f} s "
        f"({plan.logical_rate_bps / 1e6:.1f} Mbit/s logical), bottleneck {plan.bottleneck}"
    )
    for reason in plan.reasons:
        console.print(f"  - {reason}")
    return 0
