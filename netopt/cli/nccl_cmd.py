"""``netopt nccl-env``: an NCCL/Gloo environment file from measured links.

Exit codes: 0 ok, 2 bad input (unknown node, a pair without figures, contradictory
options), 1 a file could not be written.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import click
from rich.table import Table

from netopt.cli.output import console, err_console
from netopt.config import LinksSettings, cli_token, load_settings, parse_settings
from netopt.errors import UsageError, ValidationError
from netopt.fsutil import atomic_write_bytes
from netopt.nccl import domains
from netopt.nccl.model import (
    EnvValue,
    NcclSettings,
    NcclVersion,
    NodeInfo,
    TuneOptions,
    parse_version,
)
from netopt.nccl.render import FORMATS, Format, render, render_per_node_files, render_tuner_csv
from netopt.nccl.tuner import tune_nccl

__all__ = ["NcclEnvRequest", "nccl_env", "run_nccl_env", "select_nodes"]

DEFAULT_NCCL_VERSION = "2.21.5"
DEFAULT_TORCH_VERSION = "2.4"


@dataclass(frozen=True)
class NcclEnvRequest:
    """The parsed command line of ``nccl-env``."""

    nodes: tuple[str, ...]
    links_file: str | None
    nccl_version: NcclVersion
    torch_version: NcclVersion
    fmt: Format
    per_node: str
    output: str | None
    tuner_csv: str | None
    options: TuneOptions
    coordinator: str | None = None
    token_file: str | None = None
    window_s: float = 3600.0


def select_nodes(settings: LinksSettings, wanted: tuple[str, ...]) -> tuple[NodeInfo, ...]:
    """The links file's nodes named in ``wanted``, in that order.

    Raises ValidationError for an unknown or repeated name (listing the known ones).
    """
    known = {n.name: n for n in settings.node_infos()}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ValidationError(
            f"unknown node{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"(the links file has {', '.join(known)})"
        )
    if len(set(wanted)) != len(wanted):
        raise ValidationError(f"--nodes names a node twice: {','.join(wanted)}")
    return tuple(known[name] for name in wanted)


def run_nccl_env(request: NcclEnvRequest) -> NcclSettings:
    """Load the links (file or coordinator), tune, write the outputs. Returns the settings."""
    if request.coordinator is not None:
        settings = _links_from_coordinator(
            request.coordinator, request.token_file, request.window_s
        )
    else:
        assert request.links_file is not None
        settings = load_settings(request.links_file, "links")
    nodes = select_nodes(settings, request.nodes)
    result = tune_nccl(nodes, settings.link_figures(), request.nccl_version, request.options)
    if request.tuner_csv:
        path = str(Path(request.tuner_csv).resolve())
        reason = "example tuner plugin CSV (load libnccl-tuner-example.so via NCCL_TUNER_PLUGIN)"
        extra = EnvValue("NCCL_TUNER_CONFIG_FILE", path, reason)
        result = _with_common(result, extra)
        atomic_write_bytes(request.tuner_csv, render_tuner_csv(result).encode())
    domains.check_settings(result, request.torch_version)
    if request.per_node == "files":
        assert request.output is not None
        out = Path(request.output)
        for node, text in render_per_node_files(result).items():
            atomic_write_bytes(out.with_name(f"{out.stem}.{node}{out.suffix}"), text.encode())
        return result
    text = render(result, request.fmt)
    if request.output:
        atomic_write_bytes(request.output, text.encode())
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return result


def _links_from_coordinator(url: str, token_file: str | None, window_s: float) -> LinksSettings:
    import asyncio
    import time

    import yaml

    from netopt.coordinator.client import CoordinatorClient
    from netopt.nccl.from_coordinator import links_from_coordinator

    async def fetch() -> tuple[dict[str, object], dict[str, object]]:
        async with CoordinatorClient(url, cli_token(token_file)) as client:
            return await client.get("/api/v1/nodes"), await client.get(
                "/api/v1/links", window_s=window_s
            )

    nodes, links = asyncio.run(fetch())
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    document, notes = links_from_coordinator(nodes, links, when)
    for note in notes:
        err_console.print(f"note: {note}")
    parsed = parse_settings(yaml.safe_dump(document), f"coordinator {url}", "links", env={})
    assert isinstance(parsed, LinksSettings)
    return parsed


def _with_common(settings: NcclSettings, value: EnvValue) -> NcclSettings:
    return replace(settings, common=(*settings.common, value))


def _explain(settings: NcclSettings, to_stdout: bool) -> None:
    sizes = sorted({p.size_bytes for p in settings.predictions})
    algorithms = list(dict.fromkeys(p.algorithm for p in settings.predictions))
    times = {(p.algorithm, p.size_bytes): p.time_s for p in settings.predictions}
    table = Table(title="predicted all-reduce time (alpha-beta model, NCCL sockets as tuned)")
    table.add_column("size", justify="right")
    for algorithm in algorithms:
        table.add_column(f"{algorithm} ms", justify="right")
    table.add_column("fastest")
    for size in sizes:
        best = min(algorithms, key=lambda a: times[(a, size)])
        cells = [f"{times[(a, size)] * 1000:,.1f}" for a in algorithms]
        table.add_row(_size(size), *cells, best)
    target = console if to_stdout else err_console
    target.print(table)
    target.print(f"advice: {settings.advice.hook_reason}")
    for note in settings.advice.notes:
        target.print(f"note: {note}")


def _size(size: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


@click.command("nccl-env")
@click.option("--nodes", required=True, help="Comma-separated node names, in rank order.")
@click.option(
    "--links",
    "links_file",
    type=click.Path(dir_okay=False),
    help="Links file with nodes, NICs and measured pairs (see configs/links-example.yaml).",
)
@click.option(
    "--coordinator",
    help="Take nodes, NICs and link figures from this coordinator (instead of --links).",
)
@click.option("--token-file", type=click.Path(dir_okay=False), help="Coordinator token file.")
@click.option(
    "--window-s",
    type=click.FloatRange(1),
    default=3600.0,
    show_default=True,
    help="With --coordinator: the measurement window to use.",
)
@click.option("--nccl-version", default=DEFAULT_NCCL_VERSION, show_default=True)
@click.option("--torch-version", default=DEFAULT_TORCH_VERSION, show_default=True)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="env", show_default=True)
@click.option(
    "--per-node",
    type=click.Choice(["switch", "files"]),
    default="switch",
    show_default=True,
    help="Per-node values (interfaces) as a hostname switch, or one env file per node.",
)
@click.option("--explain", is_flag=True, help="Print the predicted all-reduce times.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here, not stdout.")
@click.option("--params", type=int, help="Model parameter count (for the DDP hook advice).")
@click.option("--step-compute-ms", type=float, help="Compute time per training step, ms.")
@click.option("--bucket-mib", type=float, default=25.0, show_default=True, help="DDP bucket.")
@click.option(
    "--tuner-csv",
    type=click.Path(dir_okay=False),
    help="Also write a CSV for NCCL's example tuner plugin and point NCCL_TUNER_CONFIG_FILE at it.",
)
def nccl_env(
    nodes: str,
    links_file: str | None,
    coordinator: str | None,
    token_file: str | None,
    window_s: float,
    nccl_version: str,
    torch_version: str,
    fmt: str,
    per_node: str,
    explain: bool,
    output: str | None,
    params: int | None,
    step_compute_ms: float | None,
    bucket_mib: float,
    tuner_csv: str | None,
) -> int:
    """Write NCCL/Gloo environment variables for --nodes, each preceded by its reason."""
    if (links_file is None) == (coordinator is None):
        raise UsageError("give exactly one of --links FILE and --coordinator URL")
    version = parse_version(nccl_version)
    torch = parse_version(torch_version, "PyTorch version")
    if per_node == "files" and fmt != "env":
        raise UsageError(
            f"--per-node files writes env files: it cannot be combined with --format {fmt}"
        )
    if per_node == "files" and not output:
        raise UsageError("--per-node files needs -o FILE (node files are named FILE.<node>)")
    if tuner_csv and not domains.reads("NCCL_TUNER_CONFIG_FILE", version, torch):
        raise UsageError(f"--tuner-csv needs NCCL 2.19.3+ (tuner plugins); got {nccl_version}")
    if bucket_mib <= 0:
        raise UsageError(f"--bucket-mib {bucket_mib:g} must be positive")
    names = tuple(n.strip() for n in nodes.split(",") if n.strip())
    request = NcclEnvRequest(
        nodes=names,
        links_file=links_file,
        nccl_version=version,
        torch_version=torch,
        fmt=cast(Format, fmt),
        per_node=per_node,
        output=output,
        tuner_csv=tuner_csv,
        options=TuneOptions(
            params=params,
            step_compute_ms=step_compute_ms,
            bucket_bytes=int(bucket_mib * 2**20),
            torch_version=torch,
            tuner_csv=bool(tuner_csv),
        ),
        coordinator=coordinator,
        token_file=token_file,
        window_s=window_s,
    )
    result = run_nccl_env(request)
    if explain:
        _explain(result, to_stdout=bool(output))
    return 0
