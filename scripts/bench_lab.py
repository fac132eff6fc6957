"""Benchmark the lab's link emulator: configured vs measured RTT, rate and loss.

For each link setting it builds a two-node lab (one node per region) and
measures with real tools: ping (RTT), iperf3 TCP with bbr (and cubic on
loss-free links) for the rate, iperf3 UDP for the one-way loss ratio (with its
99% binomial interval), and the relay's CPU use during the TCP run. Then it
searches for the highest rate the relay sustains on this machine: the highest
configured rate whose bbr IP-level rate (goodput plus TCP/IP headers) stays
within 7% of it.

    sudo .venv/bin/python scripts/bench_lab.py --out bench-lab.json

Needs root (network namespaces). Takes about two minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from netopt.config import LabTopology, parse_settings
from netopt.lab import Lab
from netopt.lab.measure import (
    binomial_interval,
    ip_rate_mbps,
    iperf3_json,
    ping_avg_ms,
    process_cpu_s,
    udp_receive_buffer_drops,
)
from netopt.lab.netns import require_net_admin

SETTINGS: list[dict[str, float]] = [
    {"rate_mbps": 10, "delay_ms": 50, "loss_ratio": 0.0},
    {"rate_mbps": 30, "delay_ms": 35, "jitter_ms": 5, "loss_ratio": 0.02, "queue_ms": 100},
    {"rate_mbps": 50, "delay_ms": 15, "jitter_ms": 3, "loss_ratio": 0.01},
    {"rate_mbps": 100, "delay_ms": 40, "loss_ratio": 0.005},
    {"rate_mbps": 100, "delay_ms": 20, "loss_ratio": 0.0},
    {"rate_mbps": 200, "delay_ms": 18, "loss_ratio": 0.001},
    {"rate_mbps": 300, "delay_ms": 5, "loss_ratio": 0.0},
]
SEARCH_RATES_MBPS = [300, 400, 500, 600, 800, 1000, 1200]
RATE_TOLERANCE = 0.07
TCP_SECONDS = 5
TCP_OMIT_SECONDS = 2  # skip slow start and the first queue fill


@dataclass
class Row:
    """One link setting: what was configured and what was measured."""

    rate_mbps: float
    delay_ms: float
    jitter_ms: float
    loss_ratio: float
    rtt_truth_ms: float
    rtt_ms: float
    bbr_mbps: float
    bbr_ip_mbps: float
    cubic_mbps: float | None
    cubic_ip_mbps: float | None
    udp_packets: int
    udp_loss_ratio: float | None
    udp_loss_interval: tuple[float, float] | None
    relay_loss_ratio: float | None
    relay_cpu_ratio: float


def topology(link: dict[str, float]) -> LabTopology:
    fields = ", ".join(f"{k}: {v}" for k, v in link.items())
    text = (
        "kind: lab\nname: bench\nseed: 3\n"
        "regions: {a: {nodes: [a-1]}, b: {nodes: [b-1]}}\n"
        f"links: [{{between: [a, b], {fields}}}]\n"
    )
    result = parse_settings(text, "bench", "lab", env={})
    assert isinstance(result, LabTopology)
    return result


def tcp_mbps(lab: Lab, congestion_control: str) -> tuple[float, float, float]:
    """bbr/cubic a -> b: goodput and IP-level rate in Mbit/s, and the relay's CPU share."""
    relay_pid = lab.state.relays[0].pid
    cpu_before_s, started_s = process_cpu_s(relay_pid), time.monotonic()
    args = ["-t", str(TCP_SECONDS), "-O", str(TCP_OMIT_SECONDS), "-C", congestion_control]
    result = iperf3_json(lab, "a-1", "b-1", args)
    cpu_ratio = (process_cpu_s(relay_pid) - cpu_before_s) / (time.monotonic() - started_s)
    goodput_mbps = result["end"]["sum_received"]["bits_per_second"] / 1e6
    return goodput_mbps, ip_rate_mbps(result), cpu_ratio


def udp_loss(lab: Lab, link: dict[str, float]) -> tuple[int, float, tuple[float, float], float]:
    """One-way UDP loss a -> b: packets sent, loss ratio, its 99% interval, relay's count."""
    rate_mbps = min(20.0, link["rate_mbps"] / 4)
    args = ["-u", "-b", f"{rate_mbps}M", "-l", "1000", "-t", "3"]
    before = lab.counters().between("a", "b")
    host_drops_before = udp_receive_buffer_drops(lab, "b-1")
    summary = iperf3_json(lab, "a-1", "b-1", args)["end"]["sum"]
    after = lab.counters().between("a", "b")
    # Datagrams the receiving host dropped (full socket buffer) were not lost on the link.
    host_drops = udp_receive_buffer_drops(lab, "b-1") - host_drops_before
    sent, lost = int(summary["packets"]), int(summary["lost_packets"]) - host_drops
    low, high = binomial_interval(sent, link["loss_ratio"])
    offered = after.offered_packets - before.offered_packets
    relay_ratio = (after.drops_loss - before.drops_loss) / max(1, offered)
    return sent, lost / sent, (low / sent, high / sent), relay_ratio


def measure(link: dict[str, float]) -> Row:
    with Lab.start(topology(link)) as lab:
        lab.popen("b-1", ["iperf3", "-s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        rtt_ms = ping_avg_ms(lab, "a-1", "b-1")
        bbr_mbps, bbr_ip_mbps, cpu_ratio = tcp_mbps(lab, "bbr")
        cubic_mbps = cubic_ip_mbps = None
        if link["loss_ratio"] == 0:
            cubic_mbps, cubic_ip_mbps, _ = tcp_mbps(lab, "cubic")
        sent, loss, interval, relay_loss = (0, None, None, None)
        if link["loss_ratio"] > 0:
            sent, loss, interval, relay_loss = udp_loss(lab, link)
        return Row(
            rate_mbps=link["rate_mbps"],
            delay_ms=link["delay_ms"],
            jitter_ms=link.get("jitter_ms", 0.0),
            loss_ratio=link["loss_ratio"],
            rtt_truth_ms=lab.ground_truth_rtt_ms("a-1", "b-1"),
            rtt_ms=rtt_ms,
            bbr_mbps=bbr_mbps,
            bbr_ip_mbps=bbr_ip_mbps,
            cubic_mbps=cubic_mbps,
            cubic_ip_mbps=cubic_ip_mbps,
            udp_packets=sent,
            udp_loss_ratio=loss,
            udp_loss_interval=interval,
            relay_loss_ratio=relay_loss,
            relay_cpu_ratio=cpu_ratio,
        )


def search_max_rate() -> tuple[float, list[dict[str, float]]]:
    """Highest configured rate whose bbr IP-level rate is within 7%; and every try."""
    best_mbps, tries = 0.0, []
    for rate_mbps in SEARCH_RATES_MBPS:
        with Lab.start(topology({"rate_mbps": rate_mbps, "delay_ms": 5})) as lab:
            lab.popen("b-1", ["iperf3", "-s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.3)
            # Best of two: other load on the machine only ever lowers the figure.
            runs = [tcp_mbps(lab, "bbr")]
            if runs[0][1] < rate_mbps * (1 - RATE_TOLERANCE):
                runs.append(tcp_mbps(lab, "bbr"))
        goodput_mbps, ip_mbps, cpu_ratio = max(runs, key=lambda run: run[1])
        tries.append(
            {
                "rate_mbps": rate_mbps,
                "bbr_mbps": goodput_mbps,
                "bbr_ip_mbps": ip_mbps,
                "cpu": cpu_ratio,
            }
        )
        print(f"  search: {rate_mbps} Mbit/s -> IP rate {ip_mbps:.1f} (relay CPU {cpu_ratio:.0%})")
        if ip_mbps < rate_mbps * (1 - RATE_TOLERANCE):
            break
        best_mbps = rate_mbps
    return best_mbps, tries


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[Row]) -> str:
    head = (
        "| rate Mbit/s | delay ms | jitter ms | loss | RTT truth ms | RTT ping ms "
        "| bbr goodput (IP rate) Mbit/s | cubic goodput (IP rate) Mbit/s "
        "| UDP loss (99% interval) | relay-counted loss | relay CPU |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        loss = "-"
        if r.udp_loss_ratio is not None and r.udp_loss_interval is not None:
            low, high = r.udp_loss_interval
            loss = f"{r.udp_loss_ratio:.4f} ({low:.4f}–{high:.4f}, n={r.udp_packets})"
        lines.append(
            f"| {r.rate_mbps:g} | {r.delay_ms:g} | {r.jitter_ms:g} | {r.loss_ratio:g} "
            f"| {r.rtt_truth_ms:.2f} | {r.rtt_ms:.2f} | {r.bbr_mbps:.1f} ({r.bbr_ip_mbps:.1f}) "
            f"| {_fmt(r.cubic_mbps, '.1f')} ({_fmt(r.cubic_ip_mbps, '.1f')}) "
            f"| {loss} | {_fmt(r.relay_loss_ratio, '.4f')} | {r.relay_cpu_ratio:.0%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="Write results as JSON here.")
    parser.add_argument("--no-search", action="store_true", help="Skip the max-rate search.")
    args = parser.parse_args(argv)
    require_net_admin("bench_lab")
    rows = []
    for link in SETTINGS:
        row = measure(link)
        print(f"  {link} -> RTT {row.rtt_ms:.2f} ms, bbr {row.bbr_mbps:.1f} Mbit/s")
        rows.append(row)
    best_mbps, tries = (0.0, []) if args.no_search else search_max_rate()
    print(table(rows))
    if not args.no_search:
        print(f"\nhighest rate sustained within {RATE_TOLERANCE:.0%}: {best_mbps:g} Mbit/s")
    if args.out is not None:
        data: dict[str, Any] = {
            "rows": [asdict(r) for r in rows],
            "max_rate_mbps": best_mbps,
            "search": tries,
        }
        args.out.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
