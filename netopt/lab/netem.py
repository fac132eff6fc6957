"""The kernel backend: links emulated by ``netem`` qdiscs on veth pairs.

Used where the kernel has netem (``emulator: auto`` detects it; this project's
CI kernels do not, and use :mod:`netopt.lab.relay`). Each end of a link gets a
netem qdisc with the link's rate, delay, jitter and loss; offloads are turned
off so that loss applies to real packets, not 64 KB super-packets. A cut link
is netem with 100% loss. netem counts random loss and queue overflow together,
so its drops are all reported as ``loss`` (``link_down`` while cut).
"""

from __future__ import annotations

import json
import math

from netopt.config.lab import LinkShape
from netopt.lab import netns
from netopt.lab.addressing import LabPlan, LinkPlan
from netopt.lab.counters import DirectionCounters, LinkCounters

__all__ = [
    "choose_emulator",
    "configure_netem_link",
    "netem_args",
    "netem_link_counters",
    "set_netem_link",
]

_MTU_BYTES = 1500


def choose_emulator(requested: str, kernel_has_netem: bool) -> str:
    """``"netem"`` or ``"relay"`` for a topology's ``emulator`` setting.

    Raises ValueError when netem is requested but the kernel lacks it.
    """
    if requested == "relay":
        return "relay"
    if kernel_has_netem:
        return "netem"
    if requested == "netem":
        raise ValueError(
            "emulator: netem was requested but this kernel has no netem qdisc "
            "(use emulator: auto or relay)"
        )
    return "relay"


def netem_args(shape: LinkShape, *, fraction: float = 1.0, up: bool = True) -> list[str]:
    """``tc qdisc`` arguments (after ``root``) of one direction of ``shape``.

    ``fraction`` scales delay and jitter (and spreads the loss) for one hop of a
    path the shape describes end to end. The packet limit holds the queue plus
    everything in flight (netem keeps delayed packets in its queue).
    """
    delay_ms = shape.delay_ms * fraction
    jitter_ms = shape.jitter_ms * fraction
    loss_ratio = 1.0 if not up else 1.0 - (1.0 - shape.loss_ratio) ** fraction
    in_flight_bytes = shape.rate_bps / 8 * (delay_ms + jitter_ms) / 1000
    limit_packets = max(100, math.ceil((shape.queue_bytes + in_flight_bytes) / _MTU_BYTES))
    args = ["netem", "delay", f"{delay_ms:.3f}ms"]
    if jitter_ms > 0:
        args.append(f"{jitter_ms:.3f}ms")
    args += ["loss", "random", f"{loss_ratio * 100:.6f}%"]
    args += ["rate", f"{int(shape.rate_bps)}bit", "limit", str(limit_packets)]
    return args


def _no_offloads(ns: str, ifname: str) -> None:
    argv = ["ethtool", "-K", ifname, "tso", "off", "gso", "off", "gro", "off"]
    netns.run(netns.netns_exec_argv(ns, argv), check=False)


def configure_netem_link(plan: LabPlan, link: LinkPlan) -> None:
    """Join two regions' routers with a veth pair shaped by netem at both ends."""
    ns_a, ns_b = plan.region(link.a).netns, plan.region(link.b).netns
    veth = f"veth peer name {link.ifname} netns {ns_b}"
    netns.ip_batch(None, [f"link add name {link.ifname} netns {ns_a} type {veth}"])
    for here, there in ((link.a, link.b), (link.b, link.a)):
        ns = plan.region(here).netns
        _no_offloads(ns, link.ifname)
        netns.run(
            ["tc", "-n", ns, "qdisc", "add", "dev", link.ifname, "root", *netem_args(link.spec)]
        )
        netns.ip_batch(
            ns,
            [
                f"link set {link.ifname} up",
                f"route add {plan.region(there).subnet} dev {link.ifname}",
            ],
        )


def set_netem_link(plan: LabPlan, link: LinkPlan, up: bool) -> None:
    """Cut (100% loss) or restore a netem link, both directions."""
    for region in (link.a, link.b):
        ns = plan.region(region).netns
        args = netem_args(link.spec, up=up)
        netns.run(["tc", "-n", ns, "qdisc", "change", "dev", link.ifname, "root", *args])


def _qdisc_counters(ns: str, ifname: str, up: bool) -> DirectionCounters:
    proc = netns.run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", ifname, "root"])
    stats: dict[str, object] = next(
        (q for q in json.loads(proc.stdout or "[]") if q.get("kind") == "netem"), {}
    )
    drops = int(str(stats.get("drops", 0)))
    return DirectionCounters(
        packets=int(str(stats.get("packets", 0))),
        bytes=int(str(stats.get("bytes", 0))),
        drops_loss=drops if up else 0,
        drops_link_down=0 if up else drops,
    )


def netem_link_counters(plan: LabPlan, link: LinkPlan, up: bool) -> LinkCounters:
    """Counters of a netem link read from its two qdiscs."""
    return LinkCounters(
        a=link.a,
        b=link.b,
        up=up,
        a_to_b=_qdisc_counters(plan.region(link.a).netns, link.ifname, up),
        b_to_a=_qdisc_counters(plan.region(link.b).netns, link.ifname, up),
    )
