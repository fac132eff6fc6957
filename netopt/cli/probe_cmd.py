"""``netopt probe``: measure one link, or serve the reflector and bulk sink.

    netopt probe serve [--bind ADDR:PORT] [--token-file F]
    netopt probe TARGET [--duration S] [--rate PPS] [--bandwidth] [--streams N]
                        [--cc cubic|bbr] [--iperf3] [--json]

The token comes from ``--token-file`` or the ``NETOPT_TOKEN`` environment variable.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import signal
import sys
from dataclasses import replace
from typing import Any, Literal, cast

import click

from netopt.cli.output import console, err_console, print_json, print_table
from netopt.config import ProbeSettings, cli_token
from netopt.config.services import DEFAULT_PROBE_PORT
from netopt.errors import ValidationError
from netopt.measure.samples import ProbeTarget
from netopt.measure.service import (
    BandwidthOptions,
    ProbeReport,
    ProbeServer,
    run_probe,
    serve_until,
)

__all__ = ["parse_address", "probe_group"]


def parse_address(text: str, default_port: int = DEFAULT_PROBE_PORT) -> tuple[str, int]:
    """``HOST``, ``HOST:PORT``, ``[V6]:PORT`` or a bare IPv6 address -> (host, port).

    Raises ValidationError for a bad port or an empty host.
    """
    host, port_text = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    if not host:
        raise ValidationError(f"{text!r} has no host")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValidationError(f"{text!r} is not HOST[:PORT]") from None
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValidationError(f"{text!r} has a bad port (expected 0..65535)")
    return host, int(port_text)


class _ProbeGroup(click.Group):
    """A group whose first argument is a subcommand or, otherwise, the TARGET to measure."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["measure", *args]
        return super().parse_args(ctx, args)


@click.group("probe", cls=_ProbeGroup)
def probe_group() -> None:
    """Measure a link (RTT, jitter, loss, bandwidth), or serve probes with `probe serve`.

    `netopt probe TARGET [options]` (short for `netopt probe measure TARGET`) measures
    TARGET (HOST[:PORT], port 7471 by default); see `netopt probe measure --help`.
    """


_token_option = click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="File holding the cluster token (or set NETOPT_TOKEN).",
)


@probe_group.command("serve")
@click.option(
    "--bind",
    default=f"127.0.0.1:{DEFAULT_PROBE_PORT}",
    show_default=True,
    help="ADDR:PORT for the UDP reflector and the TCP bulk sink (port 0: any free port).",
)
@_token_option
@click.option("--json", "as_json", is_flag=True, help="Print counters as JSON on exit.")
def serve(bind: str, token_file: str | None, as_json: bool) -> int:
    """Answer probes (UDP) and bandwidth tests (TCP) until interrupted (SIGINT/SIGTERM)."""
    host, port = parse_address(bind)
    token = cli_token(token_file)
    counters = asyncio.run(_serve(token, host, port))
    if as_json:
        print_json(counters)
    else:
        err_console.print(f"stopped; counters: {json.dumps(counters)}")
    return 0


async def _serve(token: str, host: str, port: int) -> dict[str, Any]:
    server = await ProbeServer.start(token, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    shown = f"[{host}]" if ":" in host else host
    # Tests and scripts read this line to learn the port.
    sys.stderr.write(f"netopt probe serve: udp reflector and tcp sink on {shown}:{server.port}\n")
    sys.stderr.flush()
    try:
        await serve_until(server, stop)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return server.counters()


@probe_group.command("measure")
@click.argument("target")
@click.option(
    "--duration",
    "duration_s",
    type=click.FloatRange(0.05, 3600),
    default=10.0,
    show_default=True,
    help="Seconds of UDP probing.",
)
@click.option(
    "--rate",
    "rate_pps",
    type=click.FloatRange(0.1, 10_000),
    default=None,
    help="Probes per second [default: 30].",
)
@click.option(
    "--spacing",
    type=click.Choice(["fixed", "poisson"]),
    default=None,
    help="Probe spacing [default: poisson].",
)
@click.option(
    "--padding",
    "padding_bytes",
    type=click.IntRange(0, 1400),
    default=None,
    help="Padding bytes per probe [default: 0].",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(0.01, 60),
    default=None,
    help="Seconds to wait for an answer [default: 2].",
)
@click.option("--bandwidth", is_flag=True, help="Also run bulk-TCP tests (1 and N streams).")
@click.option(
    "--bandwidth-duration",
    "bandwidth_duration_s",
    type=click.FloatRange(0.2, 120),
    default=5.0,
    show_default=True,
    help="Seconds per bulk-TCP test.",
)
@click.option(
    "--streams",
    type=click.IntRange(1, 64),
    default=None,
    help="Parallel streams for the N-stream test [default: from RTT and loss].",
)
@click.option(
    "--cc",
    "congestion_control",
    type=click.Choice(["bbr", "cubic", "reno"]),
    default="bbr",
    show_default=True,
    help="Congestion control of the test streams.",
)
@click.option(
    "--iperf3",
    "use_iperf3",
    is_flag=True,
    help="Also run `iperf3 -J` against an `iperf3 -s` on the target.",
)
@click.option(
    "--iperf3-port",
    type=click.IntRange(1, 65535),
    default=5201,
    show_default=True,
    help="With --iperf3: the iperf3 server's port on the target.",
)
@_token_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def measure(
    target: str,
    duration_s: float,
    rate_pps: float | None,
    spacing: str | None,
    padding_bytes: int | None,
    timeout_s: float | None,
    bandwidth: bool,
    bandwidth_duration_s: float,
    streams: int | None,
    congestion_control: str,
    use_iperf3: bool,
    iperf3_port: int,
    token_file: str | None,
    as_json: bool,
) -> int:
    """Measure TARGET (HOST[:PORT]) and print a table, or JSON with --json."""
    host, port = parse_address(target)
    token = cli_token(token_file)
    settings = ProbeSettings(port=port)
    changes: dict[str, Any] = {
        "rate_pps": rate_pps,
        "spacing": spacing,
        "padding_bytes": padding_bytes,
        "timeout_s": timeout_s,
    }
    settings = replace(settings, **{k: v for k, v in changes.items() if v is not None})
    cc = cast(Literal["bbr", "cubic", "reno"], congestion_control)
    options = BandwidthOptions(
        bulk=bandwidth,
        streams=streams,
        congestion_control=cc,
        duration_s=bandwidth_duration_s,
        max_streams=settings.max_streams,
        iperf3=use_iperf3,
        iperf3_port=iperf3_port,
    )
    report = asyncio.run(
        run_probe(
            ProbeTarget(host, port), settings, token, duration_s=duration_s, bandwidth=options
        )
    )
    if as_json:
        print_json(report.to_dict())
    else:
        _print_report(report)
    return 0


def _print_report(report: ProbeReport) -> None:
    data = report.to_dict()
    rows: list[tuple[str, Any]] = []
    for key, value in data.items():
        if key == "outages":
            rows.append(("outages", len(value)))
            for i, outage in enumerate(value):
                rows.append((f"outages[{i}]", outage))
        elif key in ("bandwidth", "iperf3") and isinstance(value, dict):
            for sub, subvalue in value.items():
                if not isinstance(subvalue, dict):
                    rows.append((f"{key}.{sub}", subvalue))
        elif isinstance(value, dict):
            rows.extend((f"{key}.{sub}", subvalue) for sub, subvalue in value.items())
        elif value is not None:
            rows.append((key, value))
    print_table(f"link {data['target']} ({data['method']})", ["metric", "value"], rows)
    if data["method"] == "tcp-connect":
        console.print("note: UDP got no answer; RTT is from TCP connects (includes handshake)")
