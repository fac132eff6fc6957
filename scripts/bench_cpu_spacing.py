"""CPU per unit of the same work against the time between units: the machine, not the code.

Does one unit of the coordinator's ingest work in Python (parse one
``bench_coordinator.py`` batch of 8 summaries, validate it as ``SummaryBatch``,
serialise its summaries as the store does) once every ``--spacing-ms``,
sleeping in between, on one core (the core ``bench_coordinator.py`` pins
coordinators to), and reports the thread's CPU microseconds per unit for each
spacing (the median of ``--rounds`` interleaved rounds). No sockets, threads,
event loop or database: only the spacing changes. ``--processes 1,2``: the units
are also taken in turn by two processes on that core (each one every twice the
spacing, the core still busy once per spacing), as two coordinator replicas
pinned to one core take a fleet's batches.

A coordinator replica that takes half the agents gets a batch every 10 ms
instead of every 5 ms (1,000 agents, one batch each per 5 s); where this script
shows each unit costing more in a process that runs one every 10 ms than in one
that runs one every 5 ms, each of two replicas pays that much more per batch
than one replica does, for the same work.

    .venv/bin/python scripts/bench_cpu_spacing.py [--rounds 3] [--seconds-per-step 6]
        [--spacing-ms 1,2.5,5,10,20] [--processes 1,2] [--out bench_cpu_spacing.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

from bench_coordinator import _batch

from netopt.cli.output import print_table
from netopt.coordinator.store import summary_json
from netopt.wire.schema import SummaryBatch

BODIES = 1000  # distinct batches, as from 1,000 agents


def _unit(body: str) -> str:
    batch = SummaryBatch.from_dict(json.loads(body))
    return ",".join(map(summary_json, batch.summaries))


def _run_units(bodies: list[str], period_s: float, first_due: float, count: int) -> float:
    """``count`` units, one every ``period_s`` from ``first_due`` (monotonic); CPU seconds."""
    cpu0 = time.thread_time()
    due = first_due
    for i in range(count):
        wait_s = due - time.monotonic()
        if wait_s > 0:
            time.sleep(wait_s)
        _unit(bodies[i % len(bodies)])
        due += period_s
    return time.thread_time() - cpu0


def _cpu_us_per_unit(bodies: list[str], spacing_s: float, seconds: float, processes: int) -> float:
    """Units on one core every ``spacing_s`` in all for about ``seconds``, taken in turn by
    ``processes`` processes (each one every ``processes * spacing_s``): CPU per unit."""
    count = max(100, int(seconds / max(spacing_s, 0.0025))) // processes
    first_due = time.monotonic() + 0.05
    if processes == 1:
        return _run_units(bodies, spacing_s, first_due, count) / count * 1e6
    context = multiprocessing.get_context("fork")
    results: multiprocessing.SimpleQueue[float] = context.SimpleQueue()

    def child(offset_s: float) -> None:
        results.put(_run_units(bodies, processes * spacing_s, first_due + offset_s, count))

    children = [context.Process(target=child, args=(0.2 + i * spacing_s,))
                for i in range(processes)]  # fmt: skip
    for each in children:
        each.start()
    cpu_s = [results.get() for _ in children]
    for each in children:
        each.join()
    return sum(cpu_s) / (count * processes) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds-per-step", type=float, default=6.0)
    parser.add_argument("--spacing-ms", default="1,2.5,5,10,20")
    parser.add_argument("--processes", default="1",
                        help="comma-separated: processes taking the units in turn")  # fmt: skip
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    spacings_ms = [float(x) for x in args.spacing_ms.split(",")]
    counts = [int(x) for x in args.processes.split(",")]
    good_steps = all(0 < s <= 1000 for s in spacings_ms) and all(1 <= n <= 4 for n in counts)
    if not (1 <= args.rounds <= 20 and 0.5 <= args.seconds_per_step <= 60 and good_steps):
        parser.error("--rounds 1..20, --seconds-per-step 0.5..60, --spacing-ms 0..1000,"
                     " --processes 1..4")  # fmt: skip
    core = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {core})
    now_s = time.time()
    bodies = [json.dumps(_batch(i, 0, 8, BODIES, now_s)) for i in range(BODIES)]
    for body in bodies * 2:  # warm up: imports, the interpreter's specialisation
        _unit(body)
    steps = [(s, n) for s in spacings_ms for n in counts]
    measured: dict[tuple[float, int], list[float]] = {step: [] for step in steps}
    for _ in range(args.rounds):
        for spacing_ms, processes in steps:
            cpu_us = _cpu_us_per_unit(bodies, spacing_ms / 1000, args.seconds_per_step, processes)
            measured[spacing_ms, processes].append(cpu_us)
    base = statistics.median(measured[steps[0]])
    rows = [
        [s, n, s * n, statistics.median(v), min(v), max(v),
         100 * (statistics.median(v) / base - 1)]
        for (s, n), v in measured.items()
    ]  # fmt: skip
    print_table(
        f"CPU per unit of ingest work (core {core}, {args.rounds} rounds)",
        ["spacing ms", "processes", "each process ms", "median us", "min us", "max us",
         "vs first %"],
        rows,
    )  # fmt: skip
    if args.out:
        units = [{"spacing_ms": s, "processes": n, "cpu_us": v} for (s, n), v in measured.items()]
        report = {"core": core, "rounds": args.rounds, "cpu_us_per_unit": units}
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
