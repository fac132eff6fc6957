"""`netopt doctor` in the lab: each half runs in its own node namespace.

One small lab (hk-1 <-> us-1, 100 Mbit/s, 40 ms one-way) serves the module;
every test restores what it changes (nft tables, MTU, sysctls).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netopt.lab import Lab
from netopt.lab.netns import has_net_admin
from tests.lab.conftest import NEEDS_ROOT, topology_from_yaml

pytestmark = pytest.mark.lab

TOPOLOGY = """
kind: lab
name: doctor
subnet: 198.18.0.0/16
seed: 3
intra_region:
  rate_mbps: 1000
regions:
  hk:
    nodes: [hk-1]
  us:
    nodes: [us-1]
links:
  - between: [hk, us]
    rate_mbps: 100
    delay_ms: 40
"""

LINKS = """
kind: links
nodes:
  hk-1: {region: hk}
  us-1: {region: us}
links:
  - between: [hk-1, us-1]
    rtt_ms: 80
    link_mbps: 100
    single_stream_mbps: 90
    loss_ratio: 0.01
"""

DOCTOR = [sys.executable, "-m", "netopt", "doctor"]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if not has_net_admin():
        pytest.skip(NEEDS_ROOT)
    with Lab.start(topology_from_yaml(TOPOLOGY)) as running:
        yield running


def _doctor(lab: Lab, node: str, *args: str) -> dict[str, Any]:
    proc = lab.exec(node, [*DOCTOR, "--json", "--node", node, *args], timeout_s=60)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def _listener(lab: Lab, node: str) -> subprocess.Popen[str]:
    proc = lab.popen(
        node,
        [*DOCTOR, "--listen", "--bind", lab.address(node), "--listen-s", "30"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("listening on")
    return proc


def _sysctl(lab: Lab, node: str, name: str) -> str:
    return lab.exec(node, ["sysctl", "-n", name]).stdout.strip()


def test_blocked_port_names_direction_and_port(lab: Lab) -> None:
    ns = lab.netns("us-1")
    nft = ["ip", "netns", "exec", ns, "nft"]
    subprocess.run([*nft, "add table inet doctortest"], check=True)
    try:
        subprocess.run(
            [*nft, "add chain inet doctortest input { type filter hook input priority 0 ; }"],
            check=True,
        )
        subprocess.run([*nft, "add rule inet doctortest input tcp dport 29500 drop"], check=True)
        listener = _listener(lab, "us-1")
        try:
            report = _doctor(lab, "hk-1", "--peers", "us-1", "--no-mtu")
        finally:
            listener.terminate()
            listener.wait(10)
    finally:
        subprocess.run([*nft, "delete table inet doctortest"], check=True)
    blocked = [f for f in report["findings"] if f["check"] == "ports"]
    assert [f["subject"] for f in blocked] == ["hk-1 -> us-1 tcp/29500"]
    assert "SYN dropped" in blocked[0]["evidence"]
    assert f"saddr {lab.address('hk-1')} tcp dport 29500 accept" in blocked[0]["fix"]


def test_lowered_mtu_inside_path_is_found(lab: Lab) -> None:
    router = lab.plan.region("hk").netns
    device = lab.plan.link("hk", "us").ifname
    subprocess.run(["ip", "-n", router, "link", "set", device, "mtu", "1400"], check=True)
    try:
        report = _doctor(lab, "hk-1", "--peers", "us-1")
    finally:
        subprocess.run(["ip", "-n", router, "link", "set", device, "mtu", "1500"], check=True)
        lab.exec("hk-1", ["ip", "route", "flush", "cache"], check=False)
    (finding,) = [f for f in report["findings"] if f["check"] == "mtu"]
    assert finding["title"].startswith("path MTU to us-1 is 1400, below eth0 MTU 1500")
    assert "ip link set dev eth0 mtu 1400" in finding["fix"]


def test_small_tcp_buffers_get_bdp_finding(lab: Lab, tmp_path: Path) -> None:
    links = tmp_path / "links.yaml"
    links.write_text(LINKS)
    before = _sysctl(lab, "hk-1", "net.ipv4.tcp_rmem")
    lab.exec("hk-1", ["sysctl", "-q", "-w", "net.ipv4.tcp_rmem=4096 65536 131072"])
    try:
        report = _doctor(lab, "hk-1", "--links", str(links))
    finally:
        lab.exec("hk-1", ["sysctl", "-q", "-w", f"net.ipv4.tcp_rmem={before}"])
    (finding,) = [f for f in report["findings"] if f["title"].startswith("net.ipv4.tcp_rmem")]
    assert "13.1 Mbit/s of 100 Mbit/s" in finding["evidence"]
    assert "1,000,000 bytes" in finding["evidence"]
    assert finding["auto_fixable"] is True


def test_apply_then_undo_restores_exactly(lab: Lab, tmp_path: Path) -> None:
    links = tmp_path / "links.yaml"
    links.write_text(LINKS)
    names = [
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_mtu_probing",
        "net.ipv4.tcp_congestion_control",
        "net.ipv4.tcp_slow_start_after_idle",
    ]
    lab.exec("hk-1", ["sysctl", "-q", "-w", "net.ipv4.tcp_rmem=4096 65536 131072"])
    lab.exec("hk-1", ["sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=1"])
    lab.exec("hk-1", ["sysctl", "-q", "-w", "net.ipv4.tcp_mtu_probing=0"])
    lab.exec("hk-1", ["sysctl", "-q", "-w", "net.ipv4.tcp_congestion_control=reno"])
    original = {n: _sysctl(lab, "hk-1", n) for n in names}
    undo = tmp_path / "undo.json"
    report = _doctor(lab, "hk-1", "--links", str(links), "--apply", "--undo-file", str(undo))
    changed = {c["sysctl"]: c for c in report["applied"]["changes"]}
    assert set(changed) == set(names)
    assert all(c["error"] == "" for c in changed.values())
    applied = {n: _sysctl(lab, "hk-1", n) for n in names}
    assert applied["net.ipv4.tcp_congestion_control"] == "bbr"
    assert applied["net.ipv4.tcp_mtu_probing"] == "1"
    assert applied["net.ipv4.tcp_slow_start_after_idle"] == "0"
    assert applied["net.ipv4.tcp_rmem"] == f"4096\t65536\t{16 * 2**20}"
    lab.exec("hk-1", [*DOCTOR, "--undo", str(undo)])
    assert {n: _sysctl(lab, "hk-1", n) for n in names} == original
    assert json.loads(undo.read_text())["values"]["net.ipv4.tcp_rmem"] == "4096 65536 131072"
