"""``netopt doctor``: find what slows a training cluster down, and say how to fix it.

    netopt doctor [--peers HOST,...] [--links FILE] [--coordinator URL [--nodes A,B]]
                  [--dataset-dir DIR] [--json] [--apply [--undo-file F]]
    netopt doctor --undo FILE
    netopt doctor --listen [--bind ADDR] [--listen-s S]

Nothing changes without ``--apply`` (root only; writes an undo file first).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from netopt.cli.output import console, err_console, print_json
from netopt.cli.tls_opts import client_tls_options
from netopt.config import LinksSettings, cli_token, load_settings
from netopt.doctor import apply as apply_mod
from netopt.doctor import ports
from netopt.doctor.findings import DoctorReport
from netopt.doctor.run import DoctorOptions, run_doctor
from netopt.doctor.sysctl import read_sysctl
from netopt.errors import ConfigError, UsageError
from netopt.tlsconf import current_client_tls

if TYPE_CHECKING:
    from netopt.wire.answers import NodeView  # aiohttp: only --coordinator loads it

__all__ = ["doctor_command"]


def _split(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())


def _from_coordinator(
    url: str, token: str | None, node: str, wanted: tuple[str, ...]
) -> tuple[LinksSettings, tuple[str, ...]]:
    from netopt.cli.coordinator_links import fetch_coordinator_links

    if token is None:
        raise ConfigError(
            "no token given", key_path="token", expected="NETOPT_TOKEN or --token-file"
        )
    fetched = fetch_coordinator_links(url, token)
    peers = []
    for entry in fetched.nodes_answer.live():
        if entry.node == node or (wanted and entry.node not in wanted):
            continue
        address = _peer_address(entry)
        if address is not None:
            peers.append(address)
    return fetched.settings, tuple(peers)


def _peer_address(entry: NodeView) -> str | None:
    """Where to reach a registered node from here: the host it registered with (what it
    advertised, or the address the coordinator saw), else its first NIC address that is
    not loopback (a node's first NIC is often ``lo``); loopback only when that is all it
    has (a cluster on one host)."""
    import ipaddress

    candidates = entry.addresses()
    for candidate in candidates:
        try:
            if ipaddress.ip_address(candidate).is_loopback:
                continue
        except ValueError:
            pass  # a host name: use it
        return candidate
    return candidates[0] if candidates else None


def _print_report(report: DoctorReport) -> None:
    if not report.findings:
        console.print("[green]no problems found[/green] by the checks that ran")
    for i, finding in enumerate(report.findings, 1):
        colour = {"critical": "red", "warning": "yellow", "info": "cyan"}[finding.severity]
        can = "netopt can apply it (--apply)" if finding.auto_fixable else "apply by hand"
        console.print(
            f"[bold]{i}. [{colour}]{finding.severity}[/{colour}] (impact {finding.impact:g})"
            f"[/bold] {finding.title}",
            markup=True,
        )
        console.print(f"   evidence: {finding.evidence}", markup=False)
        console.print(f"   fix ({can}): {finding.fix}", markup=False)
    for skipped in report.skipped:
        console.print(f"not checked: {skipped.reason}", markup=False)


def _serve(bind: str, master_port: int, listen_s: float) -> int:
    specs = ports.required_ports(master_port, ports.ephemeral_range())

    async def serve() -> tuple[list[int], list[int]]:
        ready = asyncio.Event()
        task = asyncio.create_task(ports.serve_ports(bind, specs, listen_s, ready))
        await ready.wait()
        listened = [s.port for s in specs]
        sys.stdout.write(f"listening on {bind} tcp {','.join(map(str, listened))}\n")
        sys.stdout.flush()
        return await task

    _listened, busy = asyncio.run(serve())
    if busy:
        err_console.print(f"ports already in use (still reachable tests): {busy}")
    return 0


def _cluster(
    url: str,
    token: str,
    nodes: tuple[str, ...],
    master_port: int,
    check_mtu: bool,
    as_json: bool,
) -> int:
    from netopt.doctor.cluster import run_cluster_doctor

    merged = asyncio.run(run_cluster_doctor(url, token, nodes, master_port, check_mtu))
    if as_json:
        print_json(merged)
        return 0
    console.print(f"doctor on {len(merged['nodes'])} nodes: {', '.join(merged['nodes'])}")
    if not merged["findings"]:
        console.print("[green]no problems found[/green] by the checks that ran")
    for i, f in enumerate(merged["findings"], 1):
        console.print(
            f"{i}. {f['severity']} (impact {f['impact']:g}) [{f['node']}] {f['title']}",
            markup=False,
        )
        console.print(f"   evidence: {f['evidence']}", markup=False)
        console.print(f"   fix: {f['fix']}", markup=False)
    for s in merged["not_checked"]:
        console.print(f"not checked on {s['node']}: {s['reason']}", markup=False)
    return 0


def _apply(report: DoctorReport, undo_file: Path | None, as_json: bool) -> dict[str, Any]:
    names = {n for f in report.findings for n, _ in f.sysctls}
    current = {name: read_sysctl(name) for name in names}
    changes = apply_mod.plan_changes(report.findings, current)
    path = undo_file or Path(f"netopt-doctor-undo-{time.strftime('%Y%m%dT%H%M%S')}.json")
    if not changes:
        return {"undo_file": None, "changes": []}
    results = apply_mod.apply_changes(changes, path)
    if not as_json:
        for result in results:
            c = result.change
            state = f"FAILED: {result.error}" if result.error else "set"
            console.print(f"{state}: {c.name}: {c.old!r} -> {c.new!r}", markup=False)
        console.print(f"undo file: {path} (netopt doctor --undo {path})", markup=False)
    return {"undo_file": str(path), "changes": [r.to_dict() for r in results]}


@click.command("doctor")
@click.option("--node", help="This node's name (default: the host name).")
@click.option("--peers", help="Comma-separated peers (host or address) to check from here.")
@click.option("--links", "links_file", type=click.Path(dir_okay=False), help="Links file.")
@click.option(
    "--coordinator",
    help="Coordinator URL: links and peers from its registry (else NETOPT_COORDINATOR, "
    "unless --links).",
)
@click.option("--nodes", help="With --coordinator: only these nodes (comma-separated).")
@click.option(
    "--via-agents",
    is_flag=True,
    help="With --coordinator: run the doctor on every node through its agent.",
)
@click.option("--token-file", type=click.Path(dir_okay=False), help="Cluster token file.")
@click.option(
    "--dataset-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Measure the read speed of this dataset directory (64 MB, at most 2 s).",
)
@click.option(
    "--master-port",
    type=click.IntRange(1, 65535),
    default=29500,
    show_default=True,
    help="The rendezvous port (MASTER_PORT) to check is free here and reachable at peers.",
)
@click.option("--no-mtu", is_flag=True, help="Skip the path MTU search.")
@click.option("--apply", "do_apply", is_flag=True, help="Apply safe sysctl fixes (root).")
@click.option(
    "--undo-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --apply: where to write the undo file (the values before the change).",
)
@click.option(
    "--undo",
    "undo",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Restore the settings an --apply changed, from its undo file.",
)
@click.option("--listen", is_flag=True, help="Serve the port-reachability listener.")
@click.option("--bind", help="With --listen: the address peers connect to (0.0.0.0: all).")
@click.option(
    "--listen-s",
    type=click.FloatRange(0.1, 86400),
    default=300.0,
    show_default=True,
    help="With --listen: how long to serve.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@client_tls_options()
def doctor_command(
    node: str | None,
    peers: str | None,
    links_file: str | None,
    coordinator: str | None,
    nodes: str | None,
    via_agents: bool,
    token_file: str | None,
    dataset_dir: Path | None,
    master_port: int,
    no_mtu: bool,
    do_apply: bool,
    undo_file: Path | None,
    undo: Path | None,
    listen: bool,
    bind: str | None,
    listen_s: float,
    as_json: bool,
) -> int:
    """Diagnose this node and its links; print findings ranked by expected impact."""
    from netopt.config.discovery import coordinator_url

    if links_file is None:
        coordinator = coordinator_url(coordinator)
    if listen:
        if not bind:
            raise UsageError("--listen needs --bind ADDR: the address peers connect to")
        return _serve(bind, master_port, listen_s)
    if via_agents:
        if not coordinator:
            raise UsageError("--via-agents needs --coordinator URL")
        if do_apply:
            raise UsageError("--apply changes this node only: run it on each node")
        cluster_token = cli_token(token_file)
        return _cluster(coordinator, cluster_token, _split(nodes), master_port, not no_mtu, as_json)
    if undo is not None:
        results = apply_mod.undo_changes(undo)
        if as_json:
            print_json({"undo_file": str(undo), "restored": [r.to_dict() for r in results]})
        else:
            for r in results:
                state = f"FAILED: {r.error}" if r.error else "restored"
                console.print(f"{state}: {r.change.name} = {r.change.new!r}", markup=False)
        return 1 if any(r.error for r in results) else 0
    if do_apply:
        apply_mod.require_root("--apply")
    if nodes and not coordinator:
        raise UsageError("--nodes needs --coordinator")
    name = node or socket.gethostname()
    token = cli_token(token_file, required=False)
    links = load_settings(links_file, "links") if links_file else None
    peer_list = _split(peers)
    if coordinator:
        links, found = _from_coordinator(coordinator, token, name, _split(nodes))
        peer_list = tuple(dict.fromkeys(peer_list + found))
    assert links is None or isinstance(links, LinksSettings)
    report = run_doctor(
        DoctorOptions(
            node=name,
            peers=peer_list,
            links=links,
            dataset_dir=dataset_dir,
            master_port=master_port,
            token=token,
            check_mtu=not no_mtu,
            cert_files=tuple(
                p for p in (current_client_tls().cert_file, current_client_tls().ca_file) if p
            ),
        )
    )
    applied = _apply(report, undo_file, as_json) if do_apply else None
    if as_json:
        print_json(report.to_dict() | ({"applied": applied} if applied is not None else {}))
    else:
        _print_report(report)
    return 0
