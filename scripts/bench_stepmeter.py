"""What netopt's StepMeter costs a training step (goal: <= 1% of the step time).

Two measurements, one process, Gloo on CPU (a world of one rank on loopback, so
DDP's buckets and comm hooks run as in a job):

- **the meter alone**: ``--bare-steps`` empty loop bodies through
  ``meter.batches()`` with a timed hook call per bucket, the JSON-lines log
  and the Prometheus and agent files (fsynced every ``prom_every`` steps) on
  the disk of ``--dir``: microseconds per step;
- **a real step**: a DDP MLP (``--width``, ``--layers``, 1 MB buckets) trained
  ``--steps`` steps without the meter and with it, alternating in ``--rounds``
  rounds so load on the machine hits both alike: the median step time of each.

The overhead is the meter's own cost over the real step's median (the A/B
difference is printed beside it, but on a shared machine its noise is larger
than the meter's cost). Prints a table; ``--out`` writes JSON.

    .venv/bin/python scripts/bench_stepmeter.py --out bench-stepmeter.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from netopt.torch import StepMeter, import_torch

GOAL_RATIO = 0.01


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=576)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30, help="steps per round and variant")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--bare-steps", type=int, default=5000)
    parser.add_argument("--buckets", type=int, default=6, help="hook calls per bare step")
    parser.add_argument("--dir", type=Path, default=None, help="where the meter writes")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


class _Done:
    """A completed future's stand-in for the bare loop (``then`` runs at once)."""

    def then(self, callback: Any) -> Any:
        return callback(self)

    def value(self) -> None:
        return None


def bare_cost_us(steps: int, buckets: int, directory: Path) -> float:
    """Microseconds per step of the meter itself, files included."""
    meter = StepMeter(
        "bench", log_path=directory / "bare.jsonl", prom_path=directory / "bare.prom",
        agent_dir=directory, prom_every=10,
    )  # fmt: skip
    hook = meter.wrap_hook(lambda state, bucket: _Done())
    start = time.perf_counter()
    for _ in meter.batches(range(steps)):
        for _bucket in range(buckets):
            hook(None, None)
    return (time.perf_counter() - start) / steps * 1e6


def real_steps(torch: Any, args: argparse.Namespace, directory: Path) -> dict[str, list[float]]:
    """Per-step seconds of the same training loop without and with the meter."""
    layers: list[Any] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    module = torch.nn.Sequential(*layers)
    x = torch.randn(args.batch, args.width)
    times: dict[str, list[float]] = {"without": [], "with": []}
    for round_index in range(args.rounds):
        for variant in ("without", "with") if round_index % 2 == 0 else ("with", "without"):
            model = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=1)
            optimiser = torch.optim.SGD(model.parameters(), lr=1e-3)
            batches: Any = range(args.steps)
            if variant == "with":
                meter = StepMeter(
                    "bench", log_path=directory / f"real-{round_index}.jsonl",
                    prom_path=directory / "real.prom", agent_dir=directory,
                )  # fmt: skip
                meter.watch(model)
                batches = meter.batches(batches)
            last = time.perf_counter()
            for _ in batches:
                optimiser.zero_grad()
                model(x).pow(2).mean().backward()
                optimiser.step()
                now = time.perf_counter()
                times[variant].append(now - last)
                last = now
    return times


def main() -> int:
    args = parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch = import_torch()
    torch.set_num_threads(1)
    dist = torch.distributed
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dir if args.dir is not None else Path(tmp)
        store = dist.HashStore()
        dist.init_process_group(
            "gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60)
        )
        try:
            bare_us = bare_cost_us(args.bare_steps, args.buckets, directory)
            times = real_steps(torch, args, directory)
        finally:
            dist.destroy_process_group()
    without_s = statistics.median(times["without"])
    with_s = statistics.median(times["with"])
    ratio = bare_us / 1e6 / without_s
    result = {
        "params": args.layers * (args.width * args.width + args.width),
        "buckets_per_bare_step": args.buckets,
        "meter_cost_us_per_step": bare_us,
        "step_s_median_without": without_s,
        "step_s_median_with": with_s,
        "ab_difference_ratio": with_s / without_s - 1,
        "overhead_ratio": ratio,
        "goal_ratio": GOAL_RATIO,
        "meets_goal": ratio <= GOAL_RATIO,
        "steps_per_variant": len(times["without"]),
    }
    print(f"{'quantity':<38}{'value':>14}")
    print(f"{'model parameters':<38}{result['params']:>14,}")
    print(f"{'meter cost per step (us)':<38}{bare_us:>14.1f}")
    print(f"{'step median without meter (ms)':<38}{without_s * 1e3:>14.2f}")
    print(f"{'step median with meter (ms)':<38}{with_s * 1e3:>14.2f}")
    print(f"{'A/B difference (noise included)':<38}{result['ab_difference_ratio']:>14.2%}")
    print(f"{'overhead: meter cost / step':<38}{ratio:>14.3%}")
    print(f"{'goal <= 1%':<38}{'met' if result['meets_goal'] else 'NOT met':>14}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["meets_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
