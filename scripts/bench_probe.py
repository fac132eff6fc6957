"""Overhead of continuous probing: one agent-like process measuring 16 peers.

The measured process runs what an agent runs: one reflector and a prober that
probes ``--peers`` peers at ``--rate`` probes/s each (Poisson spacing, the agent
default). A helper process plays the peers: ``--peers`` reflectors on loopback
ports, each of which also probes the measured process's reflector at the same
rate, so the measured reflector answers as much as a real agent's would.

Two probers are compared, each in its own fresh measured process (so RSS is its
own): ``shared`` (one :class:`SharedProber`: one socket and one timer for all
peers, what the agent daemon runs) and ``per-peer`` (one :class:`UdpProber` per
peer, each with its own socket and task, what ``measure_link`` runs). CPU is the
process's own CPU time (user + system, from getrusage), so other load on the
machine slows it down but does not count; the 1-minute load average before and
after each run is printed alongside. Goal: <= 2% of one core and
<= 60 MB RSS for 16 peers at 20/s.

    .venv/bin/python scripts/bench_probe.py [--peers 16] [--rate 20] [--duration 30]
                                            [--mode both|shared|per-peer]
                                            [--batch-ms 100[,200,...]]
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
from netopt.measure.multiprober import SharedProber
from netopt.measure.prober import Prober

TOKEN = "bench-probe-token-0123456789"  # noqa: S105 - a benchmark's throwaway token
GOAL_CPU_PCT = 2.0
GOAL_RSS_MB = 60.0
MODES = ("shared", "per-peer")


def _on_cpu_s() -> float:
    """Exact on-CPU time of this (single-threaded) process from the scheduler, seconds."""
    return int(Path("/proc/self/schedstat").read_text().split()[0]) / 1e9


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _probers(mode: str, peers: int, count: int, rate_pps: float, batch_s: float) -> list[Prober]:
    """``peers`` probers (one shared one, repeated, or one UdpProber each)."""
    if mode == "shared":
        shared = SharedProber(TOKEN, count=count, rate_pps=rate_pps, timeout_s=1.0, batch_s=batch_s)
        return [shared] * peers
    return [
        UdpProber(TOKEN, count=count, rate_pps=rate_pps, timeout_s=1.0, batch_s=batch_s)
        for _ in range(peers)
    ]


async def _probe_all(
    mode: str, targets: list[ProbeTarget], rate_pps: float, duration_s: float, batch_s: float
) -> list[dict[str, Any]]:
    count = max(1, round(rate_pps * duration_s))
    probers = _probers(mode, len(targets), count, rate_pps, batch_s)
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
            "--mode",
            args.measure,
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
        load0 = os.getloadavg()[0]
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        sched0 = _on_cpu_s()
        wall0 = time.monotonic()
        links = await _probe_all(
            args.measure, targets, args.rate, args.duration, args.batch_ms / 1e3
        )
        wall_s = time.monotonic() - wall0
        sched_s = _on_cpu_s() - sched0
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        load1 = os.getloadavg()[0]
    finally:
        # Off the loop, so the reflector keeps answering the helper's last probes.
        await asyncio.to_thread(helper.wait, timeout=args.duration + 30)
        reflector.close()
    user_s = usage1.ru_utime - usage0.ru_utime
    system_s = usage1.ru_stime - usage0.ru_stime
    cpu_s = user_s + system_s
    return {
        "mode": args.measure,
        "peers": args.peers,
        "rate_pps_per_peer": args.rate,
        "batch_ms": args.batch_ms,
        "duration_s": wall_s,
        "probes_sent": sum(link["probes_sent"] for link in links),
        "probes_reflected": reflector.counters.reflected,
        "cpu_user_s": user_s,
        "cpu_system_s": system_s,
        "cpu_s": cpu_s,
        "cpu_pct_of_one_core": cpu_s / wall_s * 100,
        "on_cpu_pct_schedstat": sched_s / wall_s * 100,
        "cpu_us_per_probe": cpu_s / max(1, sum(link["probes_sent"] for link in links)) * 1e6,
        "rss_mb": _status_mb("VmRSS"),
        "peak_rss_mb": _status_mb("VmHWM"),
        "loss_ratio_max": max(link["loss_ratio"] for link in links),
        "rtt_ms_p50_median": sorted(link["rtt_ms"]["p50"] for link in links)[len(links) // 2],
        "load_avg_1m_before": load0,
        "load_avg_1m_after": load1,
    }


async def _serve_peers(args: argparse.Namespace) -> None:
    batch_s = float(os.environ.get("BENCH_HELPER_BATCH_MS", "100")) / 1e3
    reflectors = [await Reflector.start(TOKEN, batch_s=batch_s) for _ in range(args.serve_peers)]
    sys.stdout.write(json.dumps([r.port for r in reflectors]) + "\n")
    sys.stdout.flush()
    target = ProbeTarget("127.0.0.1", args.target_port)
    count = max(1, round(args.rate * args.duration))
    probers = _probers(args.mode, args.serve_peers, count, args.rate, batch_s)
    await asyncio.gather(*(p.probe(target) for p in probers))
    await asyncio.sleep(5.0)  # the measured side starts later: keep answering it
    for reflector in reflectors:
        reflector.close()


def _run_measured(mode: str, batch_ms: float, args: argparse.Namespace) -> dict[str, Any]:
    """One measured run in a fresh process (so its RSS is its own)."""
    command = [
        sys.executable,
        __file__,
        "--measure",
        mode,
        "--peers",
        str(args.peers),
        "--rate",
        str(args.rate),
        "--duration",
        str(args.duration),
        "--batch-ms",
        str(batch_ms),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _table(results: list[dict[str, Any]]) -> str:
    keys = list(results[0])
    width = max(len(k) for k in keys)
    heads = [f"{r['mode']}@{r['batch_ms']:g}ms" for r in results]
    lines = [f"{'':<{width}}  " + "  ".join(f"{h:>15}" for h in heads)]
    for key in keys[1:]:
        cells = []
        for result in results:
            value = result[key]
            cells.append(f"{value:>15.3f}" if isinstance(value, float) else f"{value!s:>15}")
        lines.append(f"{key:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=16)
    parser.add_argument("--rate", type=float, default=20.0, help="probes/s per peer")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds (at most 600)")
    parser.add_argument(
        "--batch-ms",
        default="100",
        help="timer grid of probers and reflector (ms); several, comma-separated, for a sweep",
    )
    parser.add_argument("--mode", choices=("both", *MODES), default="both")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--measure", choices=MODES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve-peers", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--target-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.duration = min(args.duration, 600.0)
    if args.serve_peers:
        asyncio.run(_serve_peers(args))
        return 0
    if args.measure:
        args.batch_ms = float(args.batch_ms)
        print(json.dumps(asyncio.run(_measured(args))))
        return 0
    modes = MODES if args.mode == "both" else (args.mode,)
    results = []
    for batch_ms, mode in [(float(b), m) for b in str(args.batch_ms).split(",") for m in modes]:
        result = _run_measured(mode, batch_ms, args)
        result["goal_met"] = (
            result["cpu_pct_of_one_core"] <= GOAL_CPU_PCT and result["peak_rss_mb"] <= GOAL_RSS_MB
        )
        results.append(result)
    print(_table(results))
    print(f"goal: <= {GOAL_CPU_PCT:g}% of one core and <= {GOAL_RSS_MB:g} MB peak RSS")
    if args.out is not None:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(results, indent=2) + "\n")
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
