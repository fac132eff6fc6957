"""Pure doctor checks: ranking, TCP vs BDP, ports, MTU search, clock offset, host, GPU."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from netopt.doctor import apply as apply_mod
from netopt.doctor.clock import StampSample, check_clock, estimate_offset
from netopt.doctor.findings import DoctorReport, Finding, Skipped, rank_findings, severity_of
from netopt.doctor.gpu import GpuFacts, check_gpus, parse_gpus
from netopt.doctor.host import DiskRead, HostFacts, check_host, parse_meminfo
from netopt.doctor.mtu import PathMtu, ProbeOutcome, check_mtu, discover_path_mtu
from netopt.doctor.ports import PortResult, PortSpec, check_ports, required_ports
from netopt.doctor.tcp import (
    LinkView,
    TcpFacts,
    bdp_bytes,
    check_tcp,
    recommended_buffer_bytes,
)
from netopt.errors import PermissionDeniedError, ValidationError


def _tcp(rmem_max: int = 131072, cc: str = "bbr", probing: int = 1) -> TcpFacts:
    return TcpFacts(
        rmem_max_bytes=64 * 2**20,
        wmem_max_bytes=64 * 2**20,
        tcp_rmem_bytes=(4096, 65536, rmem_max),
        tcp_wmem_bytes=(4096, 16384, 64 * 2**20),
        congestion_control=cc,
        available_congestion_control=("reno", "bbr"),
        mtu_probing=probing,
    )


def test_ranking_is_by_impact_then_check() -> None:
    low = Finding("tcp", 8, "b", "e", "f")
    high = Finding("ports", 95, "a", "e", "f")
    mid = Finding("mtu", 70, "c", "e", "f")
    assert [f.impact for f in rank_findings([low, high, mid])] == [95, 70, 8]
    assert severity_of(95) == "critical"
    assert severity_of(30) == "warning"
    assert severity_of(5) == "info"
    assert Finding("x", 250, "t", "e", "f").impact == 100
    report = DoctorReport.build([low, high], [Skipped("gpu", "no nvidia-smi")] * 2)
    assert report.findings[0] is high
    assert len(report.skipped) == 1
    assert json.loads(json.dumps(report.to_dict()))["not_checked"][0]["check"] == "gpu"


def test_bdp_and_caps() -> None:
    assert bdp_bytes(100, 80) == pytest.approx(1_000_000)
    assert recommended_buffer_bytes(1_000_000) == 16 * 2**20
    assert recommended_buffer_bytes(20 * 2**20) == 64 * 2**20


def test_small_tcp_rmem_gets_bdp_finding_with_cap() -> None:
    links = [LinkView("hk-1<->us-1", 80.0, 100.0, 0.0), LinkView("hk-1<->hk-2", 0.5, 1000.0)]
    findings = check_tcp(_tcp(), links)
    rmem = [f for f in findings if f.title.startswith("net.ipv4.tcp_rmem")]
    assert len(rmem) == 1
    finding = rmem[0]
    assert finding.subject == "hk-1<->us-1"
    assert "13.1 Mbit/s" in finding.evidence
    assert "1,000,000 bytes" in finding.evidence
    assert finding.sysctls == (("net.ipv4.tcp_rmem", f"4096 65536 {16 * 2**20}"),)
    assert finding.impact == pytest.approx(90 * (1 - 13.1072 / 100), abs=0.1)
    assert not any(f.title.startswith("net.ipv4.tcp_wmem") for f in findings)


def test_big_buffers_give_no_buffer_finding() -> None:
    facts = _tcp(rmem_max=64 * 2**20)
    assert check_tcp(facts, [LinkView("a<->b", 80.0, 100.0, 0.0)]) == []


def test_unknown_rate_still_reports_cap() -> None:
    findings = check_tcp(_tcp(), [LinkView("a<->b", 80.0)])
    assert findings
    assert "link rate unknown" in findings[0].evidence


def test_cubic_on_lossy_link_recommends_bbr_with_mathis_bound() -> None:
    findings = check_tcp(
        _tcp(rmem_max=64 * 2**20, cc="cubic", probing=0), [LinkView("x", 80.0, 100.0, 0.01)]
    )
    cc = next(f for f in findings if "congestion" in f.title)
    assert cc.sysctls == (("net.ipv4.tcp_congestion_control", "bbr"),)
    assert "1.8 Mbit/s" in cc.evidence
    assert any(f.sysctls == (("net.ipv4.tcp_mtu_probing", "1"),) for f in findings)
    lossless = check_tcp(_tcp(rmem_max=64 * 2**20, cc="cubic"), [LinkView("x", 80.0, 100.0, 0)])
    assert lossless == []


def test_idle_restart_on_a_long_fat_link_only() -> None:
    facts = replace(_tcp(rmem_max=64 * 2**20), slow_start_after_idle=1)
    findings = check_tcp(facts, [LinkView("hk<->us", 80.0, 100.0, 0.005)])
    idle = next(f for f in findings if "idle" in f.title)
    assert idle.sysctls == (("net.ipv4.tcp_slow_start_after_idle", "0"),)
    assert "1,000,000 bytes" in idle.evidence  # 100 Mbit/s x 80 ms
    assert "7 extra round trips" in idle.evidence  # 1 MB / 14.5 KB = 69 windows < 2^7
    assert check_tcp(facts, [LinkView("lan", 0.2, 1000.0, 0)]) == []  # BDP 25 KB
    off = replace(facts, slow_start_after_idle=0)
    assert check_tcp(off, [LinkView("hk<->us", 80.0, 100.0, 0.0)]) == []


def test_required_ports_and_blocked_direction() -> None:
    specs = required_ports(29500, (32768, 60999), 4)
    assert [s.port for s in specs][:1] == [29500]
    assert {7460, 7470} <= {s.port for s in specs}
    ephemeral = [s for s in specs if s.purpose == "ephemeral"]
    assert len(ephemeral) == 4
    assert all(32768 <= s.port <= 60999 for s in ephemeral)
    results = [
        PortResult("hk-1", "198.18.1.10", "us-1", specs[0], "timeout", "no answer in 1.5 s"),
        *(PortResult("hk-1", "198.18.1.10", "us-1", s, "open") for s in specs[1:]),
    ]
    (finding,) = check_ports(results)
    assert finding.subject == "hk-1 -> us-1 tcp/29500"
    assert "dport 29500 accept" in finding.fix
    assert "saddr 198.18.1.10" in finding.fix
    assert "security group" in finding.fix
    assert finding.severity == "critical"


def test_blocked_ephemeral_ports_group_into_one_range_rule() -> None:
    spec = PortSpec(40000, "ephemeral", "ephemeral", "32768-60999")
    other = PortSpec(50000, "ephemeral", "ephemeral", "32768-60999")
    results = [PortResult("a", "10.0.0.1", "b", s, "refused") for s in (spec, other)]
    (finding,) = check_ports(results)
    assert "32768-60999" in finding.fix
    assert "32768:60999" in finding.fix


def _fake_path(path_mtu: int, icmp: bool):  # type: ignore[no-untyped-def]
    calls: list[int] = []

    def probe(payload: int) -> ProbeOutcome:
        calls.append(payload)
        if payload + 28 <= path_mtu:
            return ProbeOutcome(True)
        return ProbeOutcome(False, path_mtu if icmp else None, icmp)

    return probe, calls


@pytest.mark.parametrize("icmp", [True, False])
def test_mtu_search_finds_exact_path_mtu(icmp: bool) -> None:
    probe, calls = _fake_path(1400, icmp)
    result = discover_path_mtu("us-1", "eth0", 1500, probe)
    assert result.path_mtu == 1400
    assert result.blackholed is (not icmp)
    assert len(calls) <= 16
    finding = check_mtu(result)
    assert finding is not None
    assert "mtu 1400" in finding.fix
    assert finding.impact == (70 if not icmp else 20)


def test_mtu_full_path_and_dead_peer() -> None:
    probe, _ = _fake_path(1500, True)
    assert check_mtu(discover_path_mtu("p", "eth0", 1500, probe)) is None
    dead = discover_path_mtu("p", "eth0", 1500, lambda _size: ProbeOutcome(False))
    assert dead.path_mtu is None
    assert check_mtu(dead) is None
    assert check_mtu(PathMtu("p", "lo", 65536, 65535, False, 1)) is None


def test_clock_offset_from_best_rtt_samples() -> None:
    # Peer 50 ms ahead; symmetric 1 ms each way; one sample queued 20 ms on the way back.
    ahead_ns, way_ns = 50_000_000, 1_000_000
    samples = [
        StampSample(t, t + way_ns + ahead_ns, t + way_ns + ahead_ns + 10, t + 2 * way_ns + 10)
        for t in range(0, 10_000_000_000, 1_000_000_000)
    ]
    samples.append(StampSample(0, way_ns + ahead_ns, way_ns + ahead_ns, 22 * way_ns))
    offset = estimate_offset("us-1", samples)
    assert offset is not None
    assert offset.offset_ms == pytest.approx(50.0)
    assert offset.best_rtt_ms == pytest.approx(2.0)
    finding = check_clock(offset)
    assert finding is not None
    assert "+50.0 ms" in finding.title
    assert estimate_offset("x", []) is None


def test_host_checks() -> None:
    facts = HostFacts(
        cpu_count=4,
        load_1m=12.0,
        governors=("powersave",) * 4,
        mem_total_bytes=64 * 2**30,
        mem_available_bytes=2 * 2**30,
        disk=DiskRead("/data", 50_000_000, 1.0, True),
    )
    findings, skipped = check_host(facts)
    assert {f.check for f in findings} == {"host.cpu", "host.governor", "host.memory", "host.disk"}
    assert skipped == []
    quiet = HostFacts(2, 0.1, (), 2**30, 2**29)
    findings, skipped = check_host(quiet)
    assert findings == []
    assert {s.check for s in skipped} == {"host.governor", "host.disk"}
    assert parse_meminfo("MemTotal:  1000 kB\nHugePages_Total: 0\n")["MemTotal"] == 1_024_000


def test_gpu_parse_and_checks() -> None:
    gpus = parse_gpus("0, NVIDIA H200, 3, 8, 16, 5, 5\n1, NVIDIA H200, [N/A], 16, 16, 5, 5\n")
    assert gpus[0] == GpuFacts(0, "NVIDIA H200", 3.0, 8, 16, 5, 5)
    assert gpus[1].utilization_pct is None
    findings, _skipped = check_gpus(gpus)
    assert [f.check for f in findings] == ["gpu.pcie", "gpu.utilisation"]
    assert "x8 of x16" in findings[0].evidence
    assert check_gpus(())[1][0].check == "gpu"


def test_plan_changes_only_safe_and_different() -> None:
    findings = [
        Finding("tcp", 50, "t", "e", "f", (("net.ipv4.tcp_rmem", "4096 65536 16777216"),)),
        Finding("tcp", 8, "p", "e", "f", (("net.ipv4.tcp_mtu_probing", "1"),)),
        Finding("x", 8, "bad", "e", "f", (("kernel.panic", "1"),)),
    ]
    current = {"net.ipv4.tcp_rmem": "4096 65536 131072", "net.ipv4.tcp_mtu_probing": "1"}
    changes = apply_mod.plan_changes(findings, current)
    assert changes == [
        apply_mod.SysctlChange("net.ipv4.tcp_rmem", "4096 65536 131072", "4096 65536 16777216")
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="apply/undo refuse to run without root")
def test_apply_then_undo_with_fake_writer(tmp_path: Path) -> None:
    values = {"net.ipv4.tcp_rmem": "4096 65536 131072"}
    change = apply_mod.SysctlChange("net.ipv4.tcp_rmem", values["net.ipv4.tcp_rmem"], "1 2 3")
    undo = tmp_path / "undo.json"
    results = apply_mod.apply_changes([change], undo, write=values.__setitem__)
    assert results[0].error == ""
    assert values["net.ipv4.tcp_rmem"] == "1 2 3"
    apply_mod.undo_changes(undo, write=values.__setitem__, read=values.get)
    assert values == {"net.ipv4.tcp_rmem": "4096 65536 131072"}


def test_undo_file_refuses_unsafe_names(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": apply_mod.UNDO_FORMAT, "values": {"kernel.x": "1"}}))
    with pytest.raises(ValidationError):
        apply_mod.read_undo_file(bad)


def test_apply_needs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PermissionDeniedError):
        apply_mod.apply_changes([], tmp_path / "u.json")
    assert not (tmp_path / "u.json").exists()
