"""``netopt plan``: plan a transfer (codec, chunk size, streams, predicted time) over a link.

The link is described by options or measured by a coordinator; the plan itself is
`netopt.transfer.planner.plan_transfer` (pure).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import TYPE_CHECKING, Any, cast

import click

from netopt.cli.output import console, print_json
from netopt.cli.tls_opts import client_tls_options
from netopt.config import cli_token
from netopt.errors import StorageError, ValidationError

if TYPE_CHECKING:
    from netopt.transfer.planner import LinkProfile, TransferPlan

__all__ = ["plan_command", "run_plan"]


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
