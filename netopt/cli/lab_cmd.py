"""``netopt lab up|down|status|exec|link``: emulated multi-region clusters on one machine.

Every command needs CAP_NET_ADMIN (root); without it they exit 2 saying so.
"""

from __future__ import annotations

from typing import Any

import click

from netopt.cli.output import console, print_json, print_table
from netopt.errors import LabError
from netopt.lab import Lab
from netopt.lab.netns import require_net_admin
from netopt.lab.state import find_lab, list_labs, teardown

__all__ = ["lab_group", "run_lab_down", "run_lab_status", "run_lab_up"]

_lab_option = click.option(
    "--lab", "lab_name", default=None, help="Lab name or prefix (default: the only lab up)."
)


@click.group("lab")
def lab_group() -> None:
    """Emulated multi-region clusters in network namespaces (needs root)."""


def run_lab_up(topology_path: str, prefix: str | None) -> dict[str, Any]:
    """Build the lab of ``topology_path`` and leave it running; return its description."""
    require_net_admin("netopt lab up")
    lab = Lab.start(topology_path, prefix=prefix, detach=True)
    return lab.describe()


@lab_group.command("up")
@click.argument("topology", type=click.Path(dir_okay=False))
@click.option("--prefix", default=None, help="Namespace prefix (default: random, nl + 6 hex).")
@click.option("--json", "as_json", is_flag=True, help="Print the lab as JSON.")
def up(topology: str, prefix: str | None, as_json: bool) -> int:
    """Build the lab in TOPOLOGY and leave it running until `netopt lab down`."""
    info = run_lab_up(topology, prefix)
    if as_json:
        print_json(info)
        return 0
    console.print(f"lab {info['name']} is up (prefix {info['prefix']})")
    _print_nodes(info)
    return 0


def run_lab_down(name: str | None, everything: bool) -> list[str]:
    """Tear down the named lab (or every lab); return the prefixes removed.

    Raises LabError if something could not be removed.
    """
    require_net_admin("netopt lab down")
    states = list_labs() if everything else [find_lab(name)]
    removed, problems = [], []
    for state in states:
        left = teardown(state)
        problems += left
        if not left:
            removed.append(state.prefix)
    if problems:
        raise LabError("; ".join(problems))
    return removed


@lab_group.command("down")
@click.argument("name", required=False)
@click.option("--all", "everything", is_flag=True, help="Tear down every lab on this machine.")
def down(name: str | None, everything: bool) -> int:
    """Tear down lab NAME (its name or prefix; default: the only lab up)."""
    removed = run_lab_down(name, everything)
    console.print("removed: " + (", ".join(removed) if removed else "nothing (no lab was up)"))
    return 0


def run_lab_status(name: str | None) -> list[dict[str, Any]]:
    """Every lab (or the named one): nodes, addresses, links and their counters."""
    require_net_admin("netopt lab status")
    states = list_labs()
    if name is not None:
        states = [s for s in states if name in (s.name, s.prefix)]
    result = []
    for state in states:
        lab = Lab.attach(state.prefix)
        info = lab.describe()
        info["stale"] = state.stale
        info["counters"] = None
        if state.ready and not state.stale:
            try:
                info["counters"] = lab.counters().to_dict()
            except LabError as exc:
                info["counters_error"] = str(exc)
        result.append(info)
    return result


@lab_group.command("status")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the labs as JSON.")
def status(name: str | None, as_json: bool) -> int:
    """Show running labs: nodes, addresses, links and byte counters."""
    labs = run_lab_status(name)
    if as_json:
        print_json(labs)
        return 0
    if not labs:
        console.print("no lab is up")
        return 0
    for info in labs:
        state = "stale (owner gone)" if info["stale"] else ("up" if info["ready"] else "building")
        console.print(f"lab {info['name']} (prefix {info['prefix']}): {state}")
        _print_nodes(info)
        _print_links(info)
    return 0


@lab_group.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@_lab_option
def exec_(node: str, command: tuple[str, ...], lab_name: str | None) -> int:
    """Run COMMAND inside NODE's namespace: `netopt lab exec hk-1 -- ping us-1`."""
    require_net_admin("netopt lab exec")
    lab = Lab.attach(lab_name)
    return lab.exec(node, list(command), timeout_s=None, check=False, capture=False).returncode


@lab_group.command("link")
@click.argument("region_a")
@click.argument("region_b")
@click.option("--up/--down", "up", required=True, help="Restore or cut the link.")
@_lab_option
def link(region_a: str, region_b: str, up: bool, lab_name: str | None) -> int:
    """Cut (--down) or restore (--up) the link between REGION_A and REGION_B."""
    require_net_admin("netopt lab link")
    Lab.attach(lab_name).set_link(region_a, region_b, up)
    console.print(f"link {region_a}-{region_b} is {'up' if up else 'down'}")
    return 0


def _print_nodes(info: dict[str, Any]) -> None:
    rows = [[n["name"], n["region"], n["address"], n["netns"]] for n in info["nodes"]]
    print_table(None, ["node", "region", "address", "namespace"], rows)


def _print_links(info: dict[str, Any]) -> None:
    counters = {c["link"]: c for c in (info.get("counters") or {}).get("links", [])}
    rows = []
    for spec in info["links"]:
        a, b = spec["between"]
        entry = counters.get(f"{a}-{b}", {})
        for src, dst in ((a, b), (b, a)):
            direction = entry.get(f"{src}->{dst}", {})
            drops = direction.get("drops", {})
            rows.append(
                [
                    f"{src}->{dst}",
                    spec["rate_mbps"],
                    spec["delay_ms"],
                    spec["loss_ratio"],
                    "up" if entry.get("up", True) else "DOWN",
                    direction.get("packets"),
                    direction.get("bytes"),
                    drops.get("loss"),
                    drops.get("queue"),
                    drops.get("link_down"),
                ]
            )
    columns = ["link", "Mbit/s", "delay ms", "loss", "state", "packets", "bytes"]
    print_table(None, [*columns, "lost", "queue drops", "down drops"], rows)
