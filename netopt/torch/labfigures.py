"""Link figures for the cost model from a running lab: its configured shapes plus one
measured single-stream TCP goodput per region pair (``iperf3``, a few seconds)."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from netopt.config import LabTopology
from netopt.errors import LabError
from netopt.nccl.model import LinkFigures, NodeInfo

__all__ = ["LabHandle", "lab_link_figures", "lab_nodes", "measure_single_stream"]

INTRA_GOODPUT_RATIO = 0.95
"""TCP goodput / line rate on an unlossy emulated link (the lab's relay: 95.6 of 100)."""


class LabHandle(Protocol):
    """What these helpers need from netopt.lab.Lab."""

    def address(self, node: str) -> str: ...
    def region_of(self, node: str) -> str: ...
    def ground_truth_rtt_ms(self, node_a: str, node_b: str) -> float: ...
    def popen(self, node: str, argv: Sequence[str], **popen_kwargs: Any) -> Any: ...
    def exec(
        self, node: str, argv: Sequence[str], *, timeout_s: float | None = ..., check: bool = ...
    ) -> Any: ...


def measure_single_stream(
    lab: LabHandle, src: str, dst: str, seconds: int = 4
) -> tuple[float, str]:
    """One TCP flow ``src`` -> ``dst`` with iperf3 for ``seconds``: (Mbit/s received, cc).

    Raises LabError when iperf3 fails or prints no result.
    """
    port = str(30000 + secrets.randbelow(20000))
    server = lab.popen(
        dst, ["iperf3", "-s", "-1", "-p", port], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        for _ in range(50):  # the server needs a moment to listen
            argv = ["iperf3", "-c", lab.address(dst), "-p", port, "-t", str(seconds), "-J"]
            probe = lab.exec(src, argv, check=False, timeout_s=seconds + 30)
            if probe.returncode == 0:
                break
            time.sleep(0.1)
        else:
            raise LabError(f"iperf3 {src} -> {dst} failed: {(probe.stdout or '')[-500:]}")
        report = json.loads(probe.stdout)
        end = report["end"]
        mbps = float(end["sum_received"]["bits_per_second"]) / 1e6
        return mbps, str(end.get("sender_tcp_congestion") or "unknown")
    except (KeyError, ValueError) as exc:
        raise LabError(f"iperf3 {src} -> {dst} gave no result: {exc}") from None
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(timeout=5)


def lab_nodes(topology: LabTopology, names: Sequence[str]) -> tuple[NodeInfo, ...]:
    """The lab's nodes (no NIC list: the bench binds Gloo to the lab interface)."""
    return tuple(NodeInfo(name=n, region=topology.region_of(n)) for n in names)


def lab_link_figures(
    lab: LabHandle,
    topology: LabTopology,
    names: Sequence[str],
    single_stream: Mapping[frozenset[str], tuple[float, str]],
) -> tuple[LinkFigures, ...]:
    """Figures for every pair of ``names``: configured rate, loss and RTT; the measured
    single stream for cross-region pairs (``single_stream`` by region pair), and
    95% of the rate inside a region."""
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ra, rb = topology.region_of(a), topology.region_of(b)
            if ra == rb:
                shape = topology.intra_shape(ra)
                flow_mbps, cc = shape.rate_mbps * INTRA_GOODPUT_RATIO, "cubic"
                loss = shape.loss_ratio
                rate = shape.rate_mbps
            else:
                link = topology.link_between(ra, rb)
                if link is None:
                    raise LabError(f"the lab has no link between {ra} and {rb}")
                flow_mbps, cc = single_stream[frozenset((ra, rb))]
                loss, rate = link.loss_ratio, link.rate_mbps
            out.append(
                LinkFigures(
                    a=a,
                    b=b,
                    rtt_ms=lab.ground_truth_rtt_ms(a, b),
                    loss_ratio=loss,
                    single_stream_mbps=min(flow_mbps, rate),
                    link_mbps=rate,
                    congestion_control=cc,
                )
            )
    return tuple(out)
