"""The emulated links deliver their configured figures, measured with ping and iperf3.

One lab (three regions, one node each) serves every test here:

- a <-> b: 100 Mbit/s, 20 ms one-way, no loss (RTT; bbr and cubic rate)
- a <-> c: 300 Mbit/s, 5 ms one-way, no loss (bbr rate at the top of the range)
- b <-> c: 50 Mbit/s, 10 ms one-way, 2% loss per direction (loss)
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from netopt.config import LabTopology, parse_settings
from netopt.lab import Lab
from netopt.lab.measure import (
    binomial_interval,
    ip_rate_mbps,
    iperf3_json,
    ping_avg_ms,
    udp_receive_buffer_drops,
)
from netopt.lab.netns import has_net_admin
from tests.lab.conftest import NEEDS_ROOT

pytestmark = pytest.mark.lab

TOPOLOGY = """\
kind: lab
name: accuracy
seed: 11
regions:
  a: {nodes: [a-1]}
  b: {nodes: [b-1]}
  c: {nodes: [c-1]}
links:
  - {between: [a, b], rate_mbps: 100, delay_ms: 20}
  - {between: [a, c], rate_mbps: 300, delay_ms: 5}
  - {between: [b, c], rate_mbps: 50, delay_ms: 10, loss_ratio: 0.02}
"""

RATE_TOLERANCE = 0.07
RTT_ABOVE_MS, RTT_BELOW_MS = 2.0, 0.2


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if not has_net_admin():
        pytest.skip(NEEDS_ROOT)
    topology = parse_settings(TOPOLOGY, "accuracy.yaml", "lab", env={})
    assert isinstance(topology, LabTopology)
    with Lab.start(topology) as built:
        for node in ("b-1", "c-1"):
            built.popen(
                node,
                ["iperf3", "-s", "-p", "5201"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(0.3)
        yield built


@pytest.mark.parametrize(("src", "dst"), [("a-1", "b-1"), ("a-1", "c-1"), ("c-1", "b-1")])
def test_rtt_matches_twice_the_delay(lab: Lab, src: str, dst: str) -> None:
    truth_ms = lab.ground_truth_rtt_ms(src, dst)
    avg_ms = ping_avg_ms(lab, src, dst)
    assert truth_ms - RTT_BELOW_MS <= avg_ms <= truth_ms + RTT_ABOVE_MS, (avg_ms, truth_ms)


def test_rtt_on_the_shared_two_region_lab(two_region_lab: Lab) -> None:
    truth_ms = two_region_lab.ground_truth_rtt_ms("hk-2", "us-1")
    avg_ms = ping_avg_ms(two_region_lab, "hk-2", "us-1")
    assert truth_ms - RTT_BELOW_MS <= avg_ms <= truth_ms + RTT_ABOVE_MS, (avg_ms, truth_ms)


@pytest.mark.parametrize(
    ("dst", "rate_mbps", "congestion_control"),
    [("b-1", 100, "bbr"), ("b-1", 100, "cubic"), ("c-1", 300, "bbr")],
)
def test_tcp_rate_matches_the_link(
    lab: Lab, dst: str, rate_mbps: float, congestion_control: str
) -> None:
    # The link shapes IP packets: compare the IP-level rate (goodput + TCP/IP headers).
    # A busy CPU can only slow the relay down, never speed it up, so a second try
    # (the best of two) measures the link rather than the machine's load.
    args = ["-t", "3", "-O", "1", "-C", congestion_control]
    tries_mbps: list[float] = []
    for _ in range(2):
        tries_mbps.append(ip_rate_mbps(iperf3_json(lab, "a-1", dst, args)))
        if abs(tries_mbps[-1] / rate_mbps - 1) <= RATE_TOLERANCE:
            break
    assert abs(max(tries_mbps) / rate_mbps - 1) <= RATE_TOLERANCE, tries_mbps


def test_udp_loss_within_the_binomial_interval(lab: Lab) -> None:
    before = lab.counters().between("b", "c")
    host_drops_before = udp_receive_buffer_drops(lab, "c-1")
    result = iperf3_json(lab, "b-1", "c-1", ["-u", "-b", "10M", "-l", "1000", "-t", "3"])
    summary = result["end"]["sum"]
    # Datagrams the receiving host dropped (a full socket buffer) were not lost on the link.
    host_drops = udp_receive_buffer_drops(lab, "c-1") - host_drops_before
    sent, lost = summary["packets"], summary["lost_packets"] - host_drops
    low, high = binomial_interval(sent, 0.02)
    assert sent > 3000
    assert low <= lost <= high, (lost, sent, low, high)
    # The relay's own count agrees in kind: the drops are random loss, not queueing.
    after = lab.counters().between("b", "c")
    assert after.drops_loss - before.drops_loss >= lost
    assert after.drops_queue == before.drops_queue
