"""Overhead of continuous probing: one agent-like process measuring 16 peers.

The measured process runs what an agent runs: one reflector and a prober that
probes ``--peers`` peers at ``--rate`` probes/s each (Poisson spacing, the agent
default). A helper process plays the peers: ``--peers`` reflectors on loopback
ports, each of which also probes the measured process's reflector at the same
rate, so the measured reflector answers as much as a real agent's would.

Reports the measured process's CPU time as a % of one core and its RSS (current
and peak). Goal (issue 4): <= 2% of a core and <= 60 MB RSS for 16 peers at 20/s.

    .venv/bin/python scripts/bench_probe.py [--peers 16] [--rate 20] [--duration 30]
                                            [--out bench_probe.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from netopt.measure import ProbeTarget, Reflector, UdpProber, summarise

TOKEN = "bench-probe-token-0123456789"  # noqa: S105 - a benchmark's throwaway token
GOAL_CPU_PCT = 2.0
GOAL_RSS_MB = 60.0


def _on_cpu_s() -> float:
    """Exact on-CPU time of this (single-threaded) process from the scheduler, seconds."""
    return int(Path("/proc/self/schedstat").read_text().split()[0]) / 1e9


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _probe_all(
    targets: list[ProbeTarget], rate_pps: float, duration_s: float, batch_s: float
) -> list[dict[str, Any]]:
    count = max(1, round(rate_pps * duration_s))
    probers = [
        UdpProber(TOKEN, count=count, rate_pps=rate_pps, timeout_s=1.0, batch_s=batch_s)
        for _ in targets
    ]
    series = await asyncio.gather(*(p.probe(t) for p, t in zip(probers, targets, strict=True)))
    return [summarise(s).to_dict() for s in series]


async def _measured(args: argparse.Namespace) -> dict[str, Any]:
    reflector = await Reflector.start(TOKEN, batch_s=args.batch_ms / 1e3)
    helper = subprocess.Popen(  # noqa: ASYNC220 - started once, before measuring
        [
            sys.executable,
            __file__,
            "--serve-peers",
            str(args.peers),
            "--rate",
            str(args.rate),
            "--duration",
            str(args.duration),
            "--target-port",
            str(reflector.port),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert helper.stdout is not None
        line = await asyncio.to_thread(helper.stdout.readline)
        ports = json.loads(line)
        targets = [ProbeTarget("127.0.0.1", port) for port in ports]
        await asyncio.sleep(0.5)  # let imports and start-up costs settle before measuring
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        sched0 = _on_cpu_s()
        wall0 = time.monotonic()
        links = await _probe_all(targets, args.rate, args.duration, args.batch_ms / 1e3)
        wall_s = time.monotonic() - wall0
        sched_s = _on_cpu_s() - sched0
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        helper.wait(timeout=args.duration + 30)
        reflector.close()
    cpu_s = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    return {
        "peers": args.peers,
        "rate_pps_per_peer": args.rate,
        "batch_ms": args.batch_ms,
        "duration_s": wall_s,
        "probes_sent": sum(link["probes_sent"] for link in links),
        "probes_reflected": reflector.counters.reflected,
        "cpu_s": cpu_s,
        "cpu_pct_of_one_core": cpu_s / wall_s * 100,
        "on_cpu_s_schedstat": sched_s,
        "on_cpu_pct_schedstat": sched_s / wall_s * 100,
        "rss_mb": _status_mb("VmRSS"),
        "peak_rss_mb": _status_mb("VmHWM"),
        "loss_ratio_max": max(link["loss_ratio"] for link in links),
        "rtt_ms_p50_median": sorted(link["rtt_ms"]["p50"] for link in links)[len(links) // 2],
        "goal_cpu_pct": GOAL_CPU_PCT,
        "goal_rss_mb": GOAL_RSS_MB,
    }


async def _serve_peers(args: argparse.Namespace) -> None:
    reflectors = [await Reflector.start(TOKEN) for _ in range(args.serve_peers)]
    sys.stdout.write(json.dumps([r.port for r in reflectors]) + "\n")
    sys.stdout.flush()
    target = ProbeTarget("127.0.0.1", args.target_port)
    count = max(1, round(args.rate * args.duration))
    probers = [UdpProber(TOKEN, count=count, rate_pps=args.rate, timeout_s=1.0)] * args.serve_peers
    await asyncio.gather(*(p.probe(target) for p in probers))
    await asyncio.sleep(5.0)  # the measured side starts later: keep answering it
    for reflector in reflectors:
        reflector.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=16)
    parser.add_argument("--rate", type=float, default=20.0, help="probes/s per peer")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds (at most 600)")
    parser.add_argument(
        "--batch-ms", type=float, default=100.0, help="timer grid of probers and reflector"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.add_argument("--serve-peers", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--target-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.duration = min(args.duration, 600.0)
    if args.serve_peers:
        asyncio.run(_serve_peers(args))
        return 0
    result = asyncio.run(_measured(args))
    width = max(len(k) for k in result)
    for key, value in result.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")
    ok = result["cpu_pct_of_one_core"] <= GOAL_CPU_PCT and result["peak_rss_mb"] <= GOAL_RSS_MB
    print(f"{'goal met':<{width}}  {ok}")
    if args.out is not None:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
