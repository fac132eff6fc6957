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
from netopt.cli.tls_opts import client_tls_options
from netopt.config import LinksSettings, cli_token, load_settings
from netopt.errors import UsageError, ValidationError
from netopt.fsutil import atomic_write_bytes
from netopt.nccl import domains
from netopt.nccl.from_links import link_figures, node_infos
from netopt.nccl.model import (
    EnvValue,
    NcclSettings,
    NcclVersion,
    NodeInfo,
    TuneOptions,
    parse_version,
)
from netopt.nccl.render import (
    FORMATS,
    Format,
    differing_keys,
    render,
    render_node,
    render_per_node_files,
    render_tuner_csv,
)
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
    per_node: str | None
    output: str | None
    tuner_csv: str | None
    options: TuneOptions
    coordinator: str | None = None
    token_file: str | None = None
    window_s: float = 3600.0
    node: str | None = None
    versions_note: str = ""


def select_nodes(settings: LinksSettings, wanted: tuple[str, ...]) -> tuple[NodeInfo, ...]:
    """The links file's nodes named in ``wanted``, in that order.

    Raises ValidationError for an unknown or repeated name (listing the known ones).
    """
    known = {n.name: n for n in node_infos(settings)}
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
    result = tune_nccl(nodes, link_figures(settings), request.nccl_version, request.options)
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
    if request.node is not None:
        if request.node not in result.nodes:
            raise UsageError(
                f"--node {request.node} is not one of --nodes {','.join(result.nodes)}"
            )
        text = render_node(result, request.node, request.fmt)
    else:
        differ = differing_keys(result)
        if differ and request.per_node != "switch" and request.fmt in ("env", "slurm"):
            raise UsageError(
                f"{', '.join(differ)} differ between the nodes, so one plain file cannot hold "
                "them: choose --node NAME (that node's file), --per-node files (one file per "
                "node, -o FILE), or --per-node switch (a shell file with a hostname case)"
            )
        text = render(result, request.fmt, switch=request.per_node == "switch")
    if request.versions_note and request.fmt != "json":
        first, _, rest = text.partition("\n")
        text = f"{first}\n# versions: {request.versions_note}\n{rest}"
    if request.output:
        atomic_write_bytes(request.output, text.encode())
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return result


def installed_versions() -> tuple[str | None, str | None]:
    """(NCCL, PyTorch) versions of the torch this Python imports; None where unknown."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None, None
    try:
        import torch
    except Exception:  # a broken install is "not installed" here
        return None, None
    torch_version = str(torch.__version__).split("+")[0]
    try:
        raw = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # a CPU build has no NCCL and raises
    except Exception:
        return None, torch_version
    if isinstance(raw, tuple):
        return ".".join(map(str, raw)), torch_version
    number = int(raw)  # old torch: 2.18.3 as 21803
    return f"{number // 10000}.{number // 100 % 100}.{number % 100}", torch_version


def _versions(nccl: str | None, torch: str | None) -> tuple[str, str, str]:
    """The versions to tune for and a note saying where each came from."""
    found_nccl, found_torch = (
        installed_versions() if nccl is None or torch is None else (None, None)
    )

    def pick(given: str | None, found: str | None, default: str, missing: str) -> tuple[str, str]:
        if given is not None:
            return given, "given"
        if found is not None:
            return found, "installed"
        return default, f"default: {missing}"

    nccl_value, nccl_from = pick(nccl, found_nccl, DEFAULT_NCCL_VERSION, "no torch with NCCL here")
    torch_value, torch_from = pick(torch, found_torch, DEFAULT_TORCH_VERSION, "no torch here")
    note = f"NCCL {nccl_value} ({nccl_from}), PyTorch {torch_value} ({torch_from})"
    return nccl_value, torch_value, note


def _links_from_coordinator(url: str, token_file: str | None, window_s: float) -> LinksSettings:
    from netopt.cli.coordinator_links import fetch_coordinator_links

    fetched = fetch_coordinator_links(url, cli_token(token_file), window_s)
    for note in fetched.notes:
        err_console.print(f"note: {note}")
    return fetched.settings


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
    help="Take nodes, NICs and link figures from this coordinator (instead of --links; "
    "else NETOPT_COORDINATOR).",
)
@click.option("--token-file", type=click.Path(dir_okay=False), help="Coordinator token file.")
@click.option(
    "--window-s",
    type=click.FloatRange(1),
    default=3600.0,
    show_default=True,
    help="With --coordinator: the measurement window to use.",
)
@click.option(
    "--nccl-version",
    help="NCCL version the job runs [default: the installed torch's NCCL, else "
    f"{DEFAULT_NCCL_VERSION}].",
)
@click.option(
    "--torch-version",
    help="PyTorch version the job runs "
    f"[default: the installed torch, else {DEFAULT_TORCH_VERSION}].",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="env",
    show_default=True,
    help="env: plain KEY=VALUE; slurm: export lines; k8s: ConfigMaps; json: everything.",
)
@click.option("--node", help="Write only this node's values (common and its own): a plain file.")
@click.option(
    "--per-node",
    type=click.Choice(["switch", "files"]),
    help="Where values differ per node (interfaces): a shell file with a hostname case "
    "switch, or one env file per node (-o FILE gives FILE.<node>).",
)
@click.option("--explain", is_flag=True, help="Print the predicted all-reduce times.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here, not stdout.")
@click.option("--params", type=int, help="Model parameter count (for the DDP hook advice).")
@click.option("--step-compute-ms", type=float, help="Compute time per training step, ms.")
@click.option("--bucket-mib", type=float, default=25.0, show_default=True, help="DDP bucket.")
@click.option(
    "--backend",
    type=click.Choice(["nccl", "gloo"]),
    default="nccl",
    show_default=True,
    help="The process group's backend the hook and bucket advice is for (gloo: one flow "
    "a pair, each message waits for its receiver's ready notice).",
)
@click.option(
    "--tuner-csv",
    type=click.Path(dir_okay=False),
    help="Also write a CSV for NCCL's example tuner plugin and point NCCL_TUNER_CONFIG_FILE at it.",
)
@client_tls_options()
def nccl_env(
    nodes: str,
    links_file: str | None,
    coordinator: str | None,
    token_file: str | None,
    window_s: float,
    nccl_version: str | None,
    torch_version: str | None,
    fmt: str,
    node: str | None,
    per_node: str | None,
    explain: bool,
    output: str | None,
    params: int | None,
    step_compute_ms: float | None,
    bucket_mib: float,
    backend: str,
    tuner_csv: str | None,
) -> int:
    """Write NCCL/Gloo environment variables for --nodes, each preceded by its reason."""
    from netopt.config.discovery import coordinator_url

    if links_file is None:
        coordinator = coordinator_url(coordinator)
    if (links_file is None) == (coordinator is None):
        raise UsageError("give exactly one of --links FILE and --coordinator URL")
    if node is not None and per_node is not None:
        raise UsageError("--node writes one node's file: it cannot be combined with --per-node")
    if node is not None and fmt not in ("env", "slurm"):
        raise UsageError(f"--node writes an env or slurm file, not --format {fmt}")
    nccl_version, torch_version, versions_note = _versions(nccl_version, torch_version)
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
            backend=backend,
        ),
        coordinator=coordinator,
        token_file=token_file,
        window_s=window_s,
        node=node,
        versions_note=versions_note,
    )
    result = run_nccl_env(request)
    if explain:
        _explain(result, to_stdout=bool(output))
    return 0
