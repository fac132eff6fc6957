"""The demo's training section: a short `netopt bench train` on the demo's topology.

After the demo's own cluster is down, two DDP runs of a small byte-level language
model (defaults against netopt's advice, `netopt.cli.bench_train`) on a lab of the
same shape (root), or two loopback ranks without root, where there is no border and
the section only shows the step meter's split. Skipped, with a note, without PyTorch.
The bench's report and plot go to ``REPORT_DIR/train/``.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from netopt.cli.bench_train import TrainOptions, run_train_lab, run_train_loopback, summaries
from netopt.config import LabTopology, parse_settings
from netopt.demo.run import DEFAULT_TOPOLOGY
from netopt.torch.trainbench import ModelShape, write_svg

__all__ = ["DEMO_SHAPE", "demo_train"]

DEMO_SHAPE = ModelShape(128, 2, 4, 64)
"""About 0.5 M parameters (2 MB of fp32 gradients): a step of well under a second of
compute, so the section stays under two minutes on the lab."""


def demo_train(
    report_dir: Path, on_lab: bool, steps: int, say: Callable[[str], None]
) -> dict[str, Any]:
    """Run the section; the figures the demo reports (``skipped`` with the reason when
    PyTorch is missing)."""
    if importlib.util.find_spec("torch") is None:
        return {"skipped": "PyTorch is not installed (pip install 'netopt[torch]')"}
    out_dir = report_dir / "train"
    options = TrainOptions(
        steps=steps, shape=DEMO_SHAPE, batch=8, shards=8, shard_bytes=128 * 1024,
        timeout_s=600.0, out_dir=out_dir,
    )  # fmt: skip
    if on_lab:
        topology = parse_settings(DEFAULT_TOPOLOGY, "<embedded demo topology>", "lab", env={})
        assert isinstance(topology, LabTopology)
        say(
            f"training: {steps} DDP steps of a {DEMO_SHAPE.params / 1e6:.1f} M-parameter model "
            "on the lab, torch's defaults, then netopt's advice (bbr hosts)"
        )
        report = run_train_lab(options, topology, topology.nodes, "bbr")
    else:
        say(f"training: {steps} DDP steps on 2 loopback ranks (no border: the meter's split)")
        report = run_train_loopback(options, 2)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot = out_dir / "report.svg"
    write_svg(plot, summaries(report), f"demo training ({report['where']})")
    runs = report["runs"]
    shown: dict[str, Any] = {
        "where": report["where"],
        "steps": steps,
        "params": DEMO_SHAPE.params,
        "report": str(out_dir / "report.json"),
        "plot": str(plot),
    }
    for name in ("defaults", "netopt"):
        run = runs[name]
        shown[name] = {
            "time_to_n_s": round(run["time_to_n_s"], 2),
            "step_s": round(run["step_s"], 3),
            "exposed_comm_share": round(run["exposed_comm_share"], 3),
            "data_wait_s": round(run["data_wait_s"], 3),
            "hook": run["hook"],
            "final_loss": round(run["final_loss"], 4),
            "border_bytes_per_step": run["border_bytes_per_step"],
        }
    defaults_s = runs["defaults"]["time_to_n_s"]
    shown["ratio"] = round(runs["netopt"]["time_to_n_s"] / defaults_s, 3) if defaults_s else None
    return shown
