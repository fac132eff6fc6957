"""``netopt sync``: fetch a dataset into a directory through the node's chunk cache.

The node's settings (cache, region, coordinator, token, transfer defaults) are
resolved once (`netopt.config.node.resolve_node`); the sync itself is
`netopt.cache.syncer.run_sync`.
"""

from __future__ import annotations

import contextlib
import sys
from functools import partial
from typing import TYPE_CHECKING

import click

from netopt.cli.options import CC_CHOICES, congestion_control
from netopt.cli.tls_opts import client_tls_options
from netopt.errors import UsageError, ValidationError
from netopt.tokens import cli_token, resolve_token

if TYPE_CHECKING:
    # The rest is imported where used: ``netopt sync`` starts its first requests (see
    # netopt.dataplane.prefetch) before it imports asyncio, aiohttp, the config loader,
    # rich and the sync engine, and not every sync needs region sharing or a progress
    # bar. Importing them first put 0.1 s of imports before those requests.
    from netopt.cache.shared import SharingOptions
    from netopt.config.node import NodeSettings
    from netopt.dataplane.synctypes import SyncProgress
    from netopt.transfer.linklookup import CoordinatorRef

__all__ = ["link_coordinator", "sharing_options", "sync_command"]


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

        from netopt.cli.output import err_console

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
    help="How long opening the source, and then each chunk, is retried while the source "
    "or the link is down (a restart, an outage) before the sync fails.",
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
        from netopt.cachepaths import default_cache_dir, stored_manifest_ids
        from netopt.dataplane import prefetch
        from netopt.dataplane.manifestversions import KNOWN_VERSIONS_MAX

        warm_cc = congestion_control(cc or "bbr")
        if prefetch.start(
            source,
            token,
            streams or prefetch.WARM_CONNECTIONS,
            warm_cc,
            known=partial(
                stored_manifest_ids, cache_dir or default_cache_dir(), limit=KNOWN_VERSIONS_MAX
            ),
        ):
            click.get_current_context().call_on_close(prefetch.discard)

    from netopt.cache.s3url import S3Options
    from netopt.cache.sources import SourceOptions
    from netopt.cache.syncer import SyncRequest, run_sync
    from netopt.config.node import resolve_node
    from netopt.dataplane.httpsource import ClientOptions
    from netopt.dataplane.synctypes import SyncOptions

    here = resolve_node(
        config_file,
        cache_dir=cache_dir,
        capacity=capacity,
        region=region,
        coordinator_url=coordinator_url,
        node=node,
        token=token,
        datasets_file=datasets_file,
        agent_token=True,
    )
    sharing = sharing_options(share, here, explicit_coordinator=coordinator_url is not None)
    # The node's agent config sets this node's transfer defaults (options win).
    if streams is not None and streams > here.max_parallel_streams:
        raise UsageError(
            f"--streams {streams} is over {config_file}'s cache.max_parallel_streams "
            f"({here.max_parallel_streams})"
        )
    rate_limit_mbps = rate_limit_mbps or here.rate_limit_mbps
    client = ClientOptions(
        # The cluster's token opens peers' and netopt servers' data planes alike; without
        # sharing, only a token given here goes to the source.
        token=token or (sharing.token if sharing is not None else None),
        congestion_control=congestion_control(cc or here.congestion_control or "bbr"),
        rate_limit_bps=rate_limit_mbps * 1e6 if rate_limit_mbps else None,
    )
    request = SyncRequest(
        sharing=sharing,
        source=source,
        dest=dest,
        cache_dir=here.cache_dir,
        capacity_bytes=here.capacity_bytes,
        dry_run=dry_run,
        region=here.region,
        catalogue=here.catalogue,
        sync_options=SyncOptions(retry_window_s=retry_window_s),
        source_options=SourceOptions(
            client=client,
            name=name,
            avg_chunk_bytes=chunk_size_bytes,
            streams=streams,
            max_streams=here.max_parallel_streams,
            zstd_level=level,
            link_rate_bps=link_rate_mbps * 1e6 if link_rate_mbps else None,
            link_loss_ratio=link_loss,
            coordinator=link_coordinator(sharing, here),
            s3=S3Options(endpoint_url=s3_endpoint_url, region=s3_region, profile=s3_profile),
        ),
    )
    import asyncio

    from netopt.cli.output import print_json
    from netopt.dataplane.sync import gc_batch_thresholds

    bar = _Bar() if not as_json and not dry_run and _stderr_is_terminal() else None

    with bar.progress if bar is not None else contextlib.nullcontext(), gc_batch_thresholds():
        report = asyncio.run(run_sync(request, on_progress=bar.update if bar else None))
    if as_json:
        print_json(report.to_dict())
        return 0
    from netopt.cli.output import console

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


def _stderr_is_terminal() -> bool:
    """Whether a progress bar goes to stderr: rich's own rule, asked only when stderr is
    a terminal at all (rich is not loaded otherwise)."""
    if not sys.stderr.isatty():
        return False
    from netopt.cli.output import err_console

    return err_console.is_terminal


def link_coordinator(sharing: SharingOptions | None, here: NodeSettings) -> CoordinatorRef | None:
    """Where the sync looks up the measured link to a netopt server's node: the sharing
    coordinator, else --coordinator, coordinator_url of --config or NETOPT_COORDINATOR
    (this node: --node, the config's node, else found by its address); None without one
    or without a token for it."""
    from netopt.config.discovery import coordinator_url as default_coordinator_url
    from netopt.transfer.linklookup import CoordinatorRef

    if sharing is not None:
        return CoordinatorRef(sharing.coordinator_url, sharing.token, sharing.node)
    url = default_coordinator_url(here.coordinator_url)
    if url is None or here.token is None:
        return None
    return CoordinatorRef(url, here.token, here.node)


def sharing_options(
    share: bool | None, here: NodeSettings, *, explicit_coordinator: bool
) -> SharingOptions | None:
    """Region sharing settings from ``--share`` and the node's settings; None when off.

    Sharing is on by default when an agent config or ``--coordinator`` is given
    (``explicit_coordinator``). Raises ValidationError when sharing is asked for but
    the node, coordinator or token is missing (naming the option that would give it),
    ConfigError when ``--share`` is given with an agent config that holds no token.
    """
    if share is False or (share is None and here.config_file is None and not explicit_coordinator):
        return None
    if share and here.config_file is not None and here.token is None:
        # Asked for explicitly: the agent config must hold the token (raises, naming it).
        resolve_token(None, None, here.config_file)
    missing = [
        option
        for option, value in (("--coordinator", here.coordinator_url), ("--node", here.node),
                              ("--token-file or NETOPT_TOKEN", here.token))
        if value is None
    ]  # fmt: skip
    if missing and share is None:
        return None  # sharing was not asked for explicitly: a plain sync
    if missing:
        raise ValidationError(f"sharing needs {', '.join(missing)} (or --config AGENT.yaml)")
    assert here.coordinator_url is not None
    assert here.node is not None
    assert here.token is not None
    from netopt.cache.shared import SharingOptions

    return SharingOptions(coordinator_url=here.coordinator_url, token=here.token, node=here.node)
