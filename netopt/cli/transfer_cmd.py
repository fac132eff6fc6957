"""``netopt serve``, ``netopt sync`` and ``netopt plan``: move datasets across slow links."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import signal
from pathlib import Path
from typing import Any, cast

import click
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from netopt.cli.output import console, err_console, print_json
from netopt.dataplane.client import ClientOptions, sync_url
from netopt.dataplane.server import ServeSettings, create_app, load_dataset, start_server
from netopt.dataplane.sync import SyncProgress, SyncSummary
from netopt.errors import StorageError, ValidationError
from netopt.transfer.planner import LinkProfile, TransferPlan, plan_transfer
from netopt.transfer.profile import load_cpu_profile, sample_file

__all__ = ["plan_command", "run_plan", "run_serve", "serve_command", "sync_command"]

CC_CHOICES = ("bbr", "cubic", "reno", "default")
DEFAULT_SERVE_PORT = 7470


def _cc(value: str) -> str | None:
    return None if value == "default" else value


def _read_token(token_file: str | None) -> str | None:
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise StorageError(f"cannot read token file {token_file}: {exc}") from exc
        if len(token) < 16:
            raise ValidationError(f"token in {token_file} is shorter than 16 characters")
        return token
    env = os.environ.get("NETOPT_TOKEN")
    return env.strip() if env else None


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
) -> int:
    """Serve ``directory`` as dataset ``name`` until SIGINT or SIGTERM."""
    dataset = await asyncio.to_thread(load_dataset, directory, name, avg_chunk_bytes)
    cpu = await asyncio.to_thread(load_cpu_profile, codec_cache)
    # Clients plan with the cores this server will actually compress on.
    cpu = dataclasses.replace(cpu, cores=settings.worker_threads)
    app = create_app(settings, {name: dataset}, cpu)
    runner, bound = await start_server(app, host, port)
    shown = f"[{host}]" if ":" in host else host
    console.print(
        f"serving netopt://{shown}:{bound}/{name} ({len(dataset.manifest.files)} files, "
        f"{dataset.manifest.total_bytes} bytes, {len(dataset.index)} chunks)"
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


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
) -> int:
    """Serve DIRECTORY as a dataset at netopt://HOST:PORT/NAME.

    A token is required: from --token-file or NETOPT_TOKEN; when neither is set a
    random token is generated and printed (pass it to clients as NETOPT_TOKEN).
    """
    host, port = _parse_bind(bind)
    dataset_name = name or Path(directory).resolve().name
    token = None if no_auth else _read_token(token_file)
    if token is None and not no_auth:
        token = secrets.token_urlsafe(24)
        err_console.print(f"generated token (give clients NETOPT_TOKEN={token})")
    settings = ServeSettings(
        token=token, congestion_control=_cc(cc), worker_threads=threads or os.cpu_count() or 1
    )
    return asyncio.run(
        run_serve(directory, dataset_name, host, port, settings, chunk_size_bytes, codec_cache)
    )


class _Bar:
    """A rich progress bar fed by sync progress snapshots (rate, ETA, compression ratio)."""

    def __init__(self, enabled: bool) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("ratio {task.fields[ratio]}"),
            console=err_console,
            disable=not enabled,
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
@click.argument("url")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
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
    default="bbr",
    show_default=True,
    help="TCP congestion control of this client's sockets.",
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
    help="Link rate for the plan (default: assume 1000).",
)
@click.option(
    "--link-loss",
    type=click.FloatRange(0, 0.5),
    default=0.0,
    show_default=True,
    help="Link loss ratio for the plan.",
)
@click.option("--token-file", type=click.Path(dir_okay=False), help="File holding the token.")
def sync_command(
    url: str,
    dest: str,
    as_json: bool,
    streams: int | None,
    rate_limit_mbps: float | None,
    cc: str,
    level: int | None,
    link_rate_mbps: float | None,
    link_loss: float,
    token_file: str | None,
) -> int:
    """Fetch the dataset at URL (netopt://HOST:PORT/NAME) into DEST; resumable."""
    options = ClientOptions(
        token=_read_token(token_file),
        congestion_control=_cc(cc),
        rate_limit_bps=rate_limit_mbps * 1e6 if rate_limit_mbps else None,
    )
    bar = _Bar(enabled=not as_json and err_console.is_terminal)
    plans: list[TransferPlan] = []
    link_rate_bps = link_rate_mbps * 1e6 if link_rate_mbps else None

    async def go() -> tuple[SyncSummary, TransferPlan]:
        return await sync_url(
            url,
            dest,
            options,
            streams=streams,
            zstd_level=level,
            link_rate_bps=link_rate_bps,
            link_loss_ratio=link_loss,
            on_plan=plans.append,
            on_progress=bar.update,
        )

    with bar.progress:
        summary, plan = asyncio.run(go())
    data = {**summary.to_dict(), "plan": plan.to_dict()}
    if as_json:
        print_json(data)
    else:
        console.print(
            f"{summary.files} files ({summary.files_written} written, "
            f"{summary.files_skipped} up to date): {summary.logical_bytes} bytes, "
            f"{summary.wire_bytes} on the wire (ratio {summary.compression_ratio:.2f}), "
            f"{summary.seconds:.2f} s, {summary.throughput_bps / 1e6:.1f} Mbit/s effective, "
            f"{summary.goodput_bps / 1e6:.1f} Mbit/s on the wire"
        )
    return 0


def run_plan(
    rate_mbps: float,
    rtt_ms: float,
    loss_ratio: float,
    sample: str,
    cc: str,
    size_bytes: int | None,
    codec_cache: str | None,
    max_streams: int,
) -> TransferPlan:
    """Sample ``sample``, load this node's codec profile and plan the transfer."""
    try:
        size = size_bytes if size_bytes is not None else os.path.getsize(sample)
    except OSError as exc:
        raise StorageError(f"cannot read {sample}: {exc}") from exc
    profile = sample_file(sample)
    cpu = load_cpu_profile(codec_cache)
    link = LinkProfile(
        rate_bps=rate_mbps * 1e6,
        rtt_ms=rtt_ms,
        loss_ratio=loss_ratio,
        congestion_control=cast(Any, cc),
    )
    return plan_transfer(size, profile, link, cpu, max_streams=max_streams)


@click.command("plan")
@click.option("--rate-mbps", type=click.FloatRange(min=0.001), required=True)
@click.option("--rtt-ms", type=click.FloatRange(min=0.001), required=True)
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
@click.option("--max-streams", type=click.IntRange(1, 64), default=64, show_default=True)
@click.option("--codec-cache", type=click.Path(dir_okay=False), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_command(
    rate_mbps: float,
    rtt_ms: float,
    loss_ratio: float,
    sample: str,
    cc: str,
    size_bytes: int | None,
    max_streams: int,
    codec_cache: str | None,
    as_json: bool,
) -> int:
    """Plan a transfer (codec, chunk size, streams, predicted time) over a described link."""
    plan = run_plan(rate_mbps, rtt_ms, loss_ratio, sample, cc, size_bytes, codec_cache, max_streams)
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
