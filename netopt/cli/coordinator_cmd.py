"""``netopt coordinator`` (run the service) and ``netopt status`` (nodes and links)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import click

from netopt.cli.output import console, print_json, print_table
from netopt.cli.tls_opts import client_tls_options, service_tls_options, with_tls_options
from netopt.config import cli_token, load_settings
from netopt.config.services import DEFAULT_COORDINATOR_PORT
from netopt.wire.answers import LinksAnswer, LinkView, NodesAnswer
from netopt.wire.client import CoordinatorClient, read_answer

__all__ = ["CoordinatorStatus", "coordinator_command", "fetch_status", "status_command"]


@dataclass(frozen=True)
class CoordinatorStatus:
    """What ``netopt status`` shows: the two answers checked (``nodes``, ``links``) and
    the document ``--json`` prints (the answers' lists as the coordinator sent them)."""

    document: dict[str, Any]
    nodes: NodesAnswer
    links: LinksAnswer


@click.command("coordinator")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="Coordinator YAML file (see configs/coordinator.yaml) [default: "
    "/etc/netopt/coordinator.yaml, else $XDG_CONFIG_HOME/netopt/coordinator.yaml].",
)
@service_tls_options
def coordinator_command(
    config_file: str | None, tls_cert: str | None, tls_key: str | None, tls_ca: str | None
) -> int:
    """Run the coordinator until SIGTERM or SIGINT (then shut down cleanly)."""
    from netopt.config.discovery import find_config
    from netopt.coordinator.server import run_coordinator

    config_file = find_config("coordinator", config_file)

    settings = load_settings(config_file, "coordinator")
    settings = with_tls_options(settings, tls_cert, tls_key, tls_ca)
    return run_coordinator(settings)


async def fetch_status(url: str, token: str, window_s: float) -> CoordinatorStatus:
    """Nodes and the link matrix from the coordinator at ``url``, checked (netopt errors on
    failure; a malformed answer is a ProtocolError naming the field)."""
    async with CoordinatorClient(url, token) as client:
        nodes = await client.get("/api/v1/nodes")
        links = await client.get("/api/v1/links", window_s=window_s)
    return CoordinatorStatus(
        {"nodes": nodes["nodes"], "links": links["links"], "window_s": window_s},
        read_answer(NodesAnswer.from_dict, nodes, "nodes answer", url),
        read_answer(LinksAnswer.from_dict, links, "links answer", url),
    )


@click.command("status")
@click.option(
    "--coordinator",
    "url",
    default=f"http://127.0.0.1:{DEFAULT_COORDINATOR_PORT}",
    show_default=True,
    envvar="NETOPT_COORDINATOR",
    help="Coordinator URL (also NETOPT_COORDINATOR).",
)
@click.option("--token-file", type=click.Path(dir_okay=False), help="File holding the token.")
@click.option(
    "--window-s",
    type=click.FloatRange(1),
    default=300.0,
    show_default=True,
    help="The measurement window the link figures cover.",
)
@click.option(
    "--agent",
    "agent_url",
    help="Show this node agent's training jobs (step meters) instead: data wait, exposed "
    "communication and compute as shares of step time. No token.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@client_tls_options()
def status_command(
    url: str, token_file: str | None, window_s: float, agent_url: str | None, as_json: bool
) -> int:
    """Show nodes (with liveness) and links (RTT, loss, bandwidth). Token: NETOPT_TOKEN."""
    if agent_url is not None:
        return _train_status(agent_url, as_json)
    status = asyncio.run(fetch_status(url, cli_token(token_file), window_s))
    if as_json:
        print_json(status.document)
        return 0
    nodes = status.nodes.nodes
    print_table(
        f"nodes ({len(nodes)})",
        ["node", "region", "state", "age s", "host", "cpus", "version"],
        [
            [n.node, n.region, n.state, None if n.age_s is None else round(n.age_s, 1), n.host,
             n.cpu_count, n.netopt_version]
            for n in nodes
        ],
    )  # fmt: skip
    if not status.links.links:
        console.print(f"no link summaries in the last {window_s:g} s")
        return 0
    print_table(
        f"links (last {window_s:g} s)",
        [
            "src",
            "dst",
            "rtt p50 ms",
            "rtt p99 ms",
            "loss (95% interval)",
            "single Mbit/s",
            "aggr Mbit/s",
            "n",
        ],
        [_link_row(link) for link in status.links.links],
    )
    return 0


def _link_row(link: LinkView) -> list[Any]:
    from netopt.measure.losstext import loss_text

    window, bw = link.window, link.bandwidth
    rtt = window.rtt_p50_ms
    return [
        link.src,
        link.dst,
        None if rtt is None else rtt.p50,
        None if rtt is None else rtt.p99,
        loss_text(window.loss_ratio, window.probes_sent),
        None if bw.single_stream_bps is None else bw.single_stream_bps / 1e6,
        None if bw.aggregate_bps is None else bw.aggregate_bps / 1e6,
        link.summary_count,
    ]


def _train_status(agent_url: str, as_json: bool) -> int:
    from netopt.cli.train_status import fetch_train_jobs, train_rows

    jobs = fetch_train_jobs(agent_url)
    if as_json:
        print_json({"jobs": [job.__dict__ for job in jobs]})
        return 0
    if not jobs:
        console.print(f"no training jobs at {agent_url}")
        return 0
    print_table(
        f"training jobs ({len(jobs)})",
        ["job", "rank", "steps", "step s", "data wait", "exposed comm", "compute"],
        train_rows(jobs),
    )
    return 0
