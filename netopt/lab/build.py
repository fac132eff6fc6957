"""Execute a :class:`~netopt.lab.addressing.LabPlan`: namespaces, wiring, shaping, relays.

Two ways to emulate a link, chosen per lab (``emulator`` in the topology):

- ``netem`` (kernels that have it): a veth pair with a netem qdisc on each end;
- ``relay`` (kernels without netem, like this project's CI machines): a TUN
  device at each end and a :mod:`netopt.lab.relay` process between them.

Intra-region hops that only limit the rate use a tbf qdisc on both ends of a
node's veth (nodes hang off a bridge in their region's router namespace). An
intra-region shape with delay, jitter or loss puts each node on its own
emulated hop to the router instead (half the delay each way, so node to node
sees the configured figure).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from netopt.config.lab import LinkShape
from netopt.errors import LabError
from netopt.lab import netns
from netopt.lab.addressing import (
    BRIDGE_IFNAME,
    LabPlan,
    LinkPlan,
    RegionPlan,
    hosts_file_text,
)
from netopt.lab.emulator import DirectionShape
from netopt.lab.relay import Endpoint, RelaySpec
from netopt.lab.state import RelayRecord

__all__ = [
    "RelayProcess",
    "configure_emulated_region",
    "configure_link",
    "configure_region",
    "create_namespaces",
    "install_hosts_files",
    "link_relay_spec",
    "node_relay_specs",
    "start_relays",
    "tbf_args",
    "wait_ready",
]

# The lab is IPv4 only: lab devices get no IPv6 (no stray router solicitations in
# the byte counters); loopback keeps ::1.
_NO_IPV6 = "net.ipv6.conf.default.disable_ipv6=1"
_ROUTER_SYSCTLS = ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", _NO_IPV6)
_NODE_SYSCTLS = ("net.ipv4.conf.all.rp_filter=0", _NO_IPV6)
_TXQUEUELEN = 1000
_READY_TIMEOUT_S = 15.0


@dataclass
class RelayProcess:
    """A started relay: its spec, process and (once known) readiness."""

    spec: RelaySpec
    proc: subprocess.Popen[bytes]
    link: str | None

    @property
    def record(self) -> RelayRecord:
        """What the state file keeps about this relay."""
        return RelayRecord(self.spec.label, self.proc.pid, self.spec.control_path, self.link)


def _sysctl(ns: str, settings: tuple[str, ...]) -> None:
    netns.run(netns.netns_exec_argv(ns, ["sysctl", "-q", "-w", *settings]))


def create_namespaces(plan: LabPlan) -> None:
    """Create every namespace of ``plan`` with loopback up and its sysctls set."""
    for region in plan.regions:
        netns.add_netns(region.netns)
        _sysctl(region.netns, _ROUTER_SYSCTLS)
    for node in plan.nodes:
        netns.add_netns(node.netns)
        _sysctl(node.netns, _NODE_SYSCTLS)


def tbf_args(shape: LinkShape) -> list[str]:
    """``tc qdisc`` arguments of a token bucket at ``shape``'s rate.

    The bucket holds 1 ms of the rate (at least 32 KiB, so a full-size packet
    always fits) and the queue ``shape.queue_bytes``.
    """
    rate_bps = int(shape.rate_bps)
    burst_bytes = max(32 * 1024, rate_bps // 8 // 1000)
    return [
        "tbf",
        "rate",
        f"{rate_bps}bit",
        "burst",
        str(burst_bytes),
        "limit",
        str(shape.queue_bytes),
    ]


def configure_region(
    plan: LabPlan, region: RegionPlan, qdisc_args: Sequence[str], *, offloads: bool = True
) -> None:
    """Wire a region with nodes on a bridge and ``qdisc_args`` on both ends of each veth.

    ``qdisc_args`` is a rate limiter (:func:`tbf_args`) or, where the kernel has
    it, a netem hop; netem wants ``offloads=False`` so loss hits real packets.
    """
    router = region.netns
    commands = [f"link add {BRIDGE_IFNAME} type bridge", f"link set {BRIDGE_IFNAME} up"]
    commands.append(f"addr add {region.router_address}/24 dev {BRIDGE_IFNAME}")
    netns.ip_batch(router, commands)
    nodes = [plan.node(n) for n in region.nodes]
    netns.ip_batch(
        None,
        [
            f"link add name {n.ifname} netns {n.netns} type veth peer name {n.router_port} "
            f"netns {router}"
            for n in nodes
        ],
    )
    netns.ip_batch(
        router,
        [f"link set {n.router_port} master {BRIDGE_IFNAME} up" for n in nodes],
    )
    qdisc = " ".join(qdisc_args)
    netns.run(
        ["tc", "-n", router, "-batch", "-"],
        input_text="".join(f"qdisc add dev {n.router_port} root {qdisc}\n" for n in nodes),
    )
    for n in nodes:
        netns.ip_batch(
            n.netns,
            [
                f"addr add {n.address}/24 dev {n.ifname}",
                f"link set {n.ifname} up",
                f"route add default via {region.router_address}",
            ],
        )
        netns.run(["tc", "-n", n.netns, "qdisc", "add", "dev", n.ifname, "root", *qdisc_args])
        if not offloads:
            for ns, ifname in ((n.netns, n.ifname), (router, n.router_port)):
                argv = ["ethtool", "-K", ifname, "tso", "off", "gso", "off", "gro", "off"]
                netns.run(netns.netns_exec_argv(ns, argv), check=False)


def node_relay_specs(
    plan: LabPlan, region: RegionPlan, directory: Path, owner_pid: int | None
) -> list[RelaySpec]:
    """Relays for a region with intra-region delay/loss: one per node, to the router."""
    hop = DirectionShape.from_link(region.intra, fraction=0.5)
    specs = []
    for name in region.nodes:
        node = plan.node(name)
        label = f"node-{name}"
        specs.append(
            RelaySpec(
                label=label,
                a=Endpoint(node.netns, node.ifname),
                b=Endpoint(region.netns, node.router_port),
                a_to_b=hop,
                b_to_a=hop,
                control_path=str(directory / f"{label}.sock"),
                seed=plan.topology.seed,
                watch_pid=owner_pid,
            )
        )
    return specs


def configure_emulated_region(plan: LabPlan, region: RegionPlan) -> None:
    """Addresses and routes of a region whose nodes sit on relays (their TUNs exist)."""
    router_commands = [f"addr add {region.router_address}/32 dev lo"]
    for name in region.nodes:
        node = plan.node(name)
        router_commands += [
            f"link set {node.router_port} txqueuelen {_TXQUEUELEN} up",
            f"route add {node.address}/32 dev {node.router_port}",
        ]
        netns.ip_batch(
            node.netns,
            [
                f"addr add {node.address}/24 dev {node.ifname}",
                f"link set {node.ifname} txqueuelen {_TXQUEUELEN} up",
                f"route add default dev {node.ifname}",
            ],
        )
    netns.ip_batch(region.netns, router_commands)


def link_relay_spec(
    plan: LabPlan, link: LinkPlan, directory: Path, owner_pid: int | None
) -> RelaySpec:
    """The relay of one inter-region link (the same shape both ways)."""
    shape = DirectionShape.from_link(link.spec)
    label = f"link-{link.key}"
    return RelaySpec(
        label=label,
        a=Endpoint(plan.region(link.a).netns, link.ifname),
        b=Endpoint(plan.region(link.b).netns, link.ifname),
        a_to_b=shape,
        b_to_a=shape,
        control_path=str(directory / f"{label}.sock"),
        seed=plan.topology.seed,
        watch_pid=owner_pid,
    )


def configure_link(plan: LabPlan, link: LinkPlan) -> None:
    """Bring a link's devices up and route each region's /24 over it."""
    for here, there in ((link.a, link.b), (link.b, link.a)):
        netns.ip_batch(
            plan.region(here).netns,
            [
                f"link set {link.ifname} txqueuelen {_TXQUEUELEN} up",
                f"route add {plan.region(there).subnet} dev {link.ifname}",
            ],
        )


def _relay_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def start_relays(
    specs: list[RelaySpec], links: list[str | None], directory: Path
) -> list[RelayProcess]:
    """Start one relay process per spec (all at once); they run in their own sessions.

    Call :func:`wait_ready` next. ``links`` gives each spec's link key (None for a hop).
    """
    started = []
    env = _relay_env()
    for spec, link in zip(specs, links, strict=True):
        spec_path = directory / f"{spec.label}.json"
        spec_path.write_text(spec.to_json(), encoding="utf-8")
        with open(directory / f"{spec.label}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "netopt.lab.relay", str(spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                env=env,
            )
        started.append(RelayProcess(spec, proc, link))
    return started


def wait_ready(relays: list[RelayProcess], directory: Path) -> None:
    """Wait until every relay printed ``ready``; LabError (with its log) if one fails."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    for relay in relays:
        stdout = relay.proc.stdout
        assert stdout is not None
        remaining_s = max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([stdout], [], [], remaining_s)
        line = stdout.readline() if ready else b""
        stdout.close()
        if line.strip() != b"ready":
            log = (directory / f"{relay.spec.label}.log").read_text(errors="replace")
            raise LabError(f"relay {relay.spec.label} did not start: {log.strip()[-800:]}")


def install_hosts_files(plan: LabPlan) -> None:
    """Every node resolves every node's name (``/etc/netns/<ns>/hosts``)."""
    text = hosts_file_text(plan)
    for node in plan.nodes:
        netns.write_hosts_file(node.netns, text)
