"""A plain DDP job across a two-region lab, without netopt and with its advice applied.

The shape: a 2.0 M-parameter MLP (8 MB of fp32 gradients), Gloo on
CPU, 4 ranks on a 2 + 2 lab (100 Mbit/s, 70 ms RTT, 0.5% loss each way across
the border). Both runs are metered by netopt's StepMeter.

- *without*: hosts on ``--cc-without`` (loss-based reno by default: a network
  namespace may only pick from tcp_allowed_congestion_control), ranks as
  listed with the regions interleaved (hk-1, us-1, hk-2, us-2), no hook;
- *with*: what netopt advises: bbr on the hosts (``doctor --apply``), ranks
  grouped by region (hk-1, hk-2, us-1, us-2), the DDP hook the advice names
  (computed from the lab's figures, one measured cross-border TCP stream and
  the step's compute measured in the first run) and its process-group timeout.

Prints a table (seconds per step, data wait / exposed communication / compute)
and writes JSON with ``--out``. Needs root (network namespaces).

    sudo .venv/bin/python scripts/bench_train_lab.py --steps 10 --out bench-train.json
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from netopt.cli.bench_cmd import cross_region_flows
from netopt.config import LabTopology, parse_settings
from netopt.lab import Lab
from netopt.lab.netns import require_net_admin
from netopt.nccl.advice import advise
from netopt.nccl.costmodel import fabric_from_links
from netopt.nccl.model import TuneOptions
from netopt.torch.labfigures import lab_link_figures, lab_nodes

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "scripts" / "bench_train_worker.py"
TOPOLOGY = """
kind: lab
name: train-two-region
subnet: 198.18.0.0/16
seed: 1
intra_region:
  rate_mbps: 400
regions:
  hk:
    nodes: [hk-1, hk-2]
  us:
    nodes: [us-1, us-2]
links:
  - between: [hk, us]
    rate_mbps: 100
    delay_ms: 35
    loss_ratio: 0.005
"""
INTERLEAVED = ("hk-1", "us-1", "hk-2", "us-2")
GROUPED = ("hk-1", "hk-2", "us-1", "us-2")
PARAMS = 6 * (576 * 576 + 576)
LAYER_DIM = 576


def set_congestion_control(lab: Lab, cc: str) -> None:
    for node in lab.nodes:
        lab.exec(node, ["sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={cc}"])


def run_job(
    lab: Lab, order: tuple[str, ...], hook: str, rank: int, steps: int, timeout_s: float
) -> dict[str, Any]:
    master = f"{lab.address(order[0])}:{20000 + secrets.randbelow(20000)}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        lab.popen(node, [sys.executable, str(WORKER), str(i), str(len(order)), master,
                         lab.plan.node(node).ifname, hook, str(rank), str(steps), str(timeout_s)],
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for i, node in enumerate(order)
    ]  # fmt: skip
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout_s)
            if proc.returncode != 0:
                raise SystemExit(f"a rank failed ({proc.returncode}): {err[-2000:]}")
            outs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    result: dict[str, Any] = json.loads(outs[0].splitlines()[-1])
    return result


def summary(name: str, cc: str, order: tuple[str, ...], result: dict[str, Any]) -> dict[str, Any]:
    records = result["records"][1:] or result["records"]  # step 0 builds DDP's buckets

    def med(key: str) -> float:
        return statistics.median(r[key] for r in records)

    return {
        "run": name,
        "congestion_control": cc,
        "order": list(order),
        "hook": result["applied"],
        "steps": len(result["records"]),
        "wall_s": result["wall_s"],
        "step_s": med("step_s"),
        "data_wait_s": med("data_wait_s"),
        "comm_exposed_s": med("comm_exposed_s"),
        "compute_s": med("compute_s"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--cc-without", default="reno", choices=("reno", "cubic", "bbr"))
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    require_net_admin()
    topology = parse_settings(TOPOLOGY, "<bench_train_lab>", "lab", env={})
    assert isinstance(topology, LabTopology)
    rows = []
    with Lab.start(topology) as lab:
        set_congestion_control(lab, args.cc_without)
        plain = run_job(lab, INTERLEAVED, "plain", 0, args.steps, args.timeout_s)
        rows.append(summary("without netopt", args.cc_without, INTERLEAVED, plain))
        compute_ms = max(1.0, rows[0]["compute_s"] * 1000)
        set_congestion_control(lab, "bbr")
        flows = cross_region_flows(lab, topology, GROUPED)
        links = lab_link_figures(lab, topology, GROUPED, flows)
        fabric = fabric_from_links(lab_nodes(topology, GROUPED), links, flows=1)
        options = TuneOptions(params=PARAMS, step_compute_ms=compute_ms, layer_dim=LAYER_DIM)
        advice = advise(fabric, options, retry_window_s=0.0, max_outage_s=0.0)
        timeout_s = min(args.timeout_s, float(advice.timeout_s))
        tuned = run_job(lab, GROUPED, advice.hook, advice.powersgd_rank or 1, args.steps,
                        timeout_s)  # fmt: skip
        rows.append(summary("with netopt", "bbr", GROUPED, tuned))
    print(f"{'run':16} {'cc':6} {'hook':22} {'s/step':>8} {'data':>7} {'comm':>7} {'compute':>8}")
    for row in rows:
        print(f"{row['run']:16} {row['congestion_control']:6} {row['hook']:22} "
              f"{row['step_s']:8.3f} {row['data_wait_s']:7.3f} {row['comm_exposed_s']:7.3f} "
              f"{row['compute_s']:8.3f}")  # fmt: skip
    print(f"advice: {advice.hook} rank {advice.powersgd_rank}: {advice.hook_reason}")
    speedup = rows[0]["step_s"] / rows[1]["step_s"]
    print(f"with netopt: {speedup:.1f}x faster per step")
    document = {"rows": rows, "advice": {"hook": advice.hook, "rank": advice.powersgd_rank,
                "reason": advice.hook_reason, "timeout_s": advice.timeout_s},
                "cross_border_stream": {"-".join(sorted(k)): v for k, v in flows.items()},
                "speedup": speedup}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
