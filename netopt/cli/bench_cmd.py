"""``netopt bench allreduce`` and ``netopt bench train`` (``cli.bench_train``).

``allreduce``: torch.distributed all-reduce bus bandwidth, nccl-tests style.

Without ``--lab`` the ranks run on loopback; with ``--lab TOPOLOGY`` a lab is
built for the run (root needed) and each node runs one Gloo rank. The cost
model's prediction is printed beside each size when link figures are known:
from the lab (configured shapes plus one measured single TCP stream per region
pair), or from ``--links FILE`` for loopback runs.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from netopt.cli.nccl_cmd import select_nodes
from netopt.cli.output import console, print_json
from netopt.config import LabTopology, load_settings
from netopt.config.loader import parse_byte_size
from netopt.errors import UsageError
from netopt.nccl.costmodel import fabric_from_links
from netopt.nccl.from_links import link_figures
from netopt.torch.bench import BenchReport, run_loopback, run_on_lab, size_ladder, with_predictions
from netopt.torch.labfigures import LabHandle, lab_link_figures, lab_nodes, measure_single_stream
from netopt.torch.trainbench import TRAIN_HOOKS

__all__ = ["allreduce_command", "bench_group", "run_lab_bench", "train_command"]


@click.group("bench")
def bench_group() -> None:
    """Benchmarks that check netopt's models against real transfers."""


def _bytes(text: str, option: str) -> int:
    try:
        return parse_byte_size(text)
    except ValueError:
        raise UsageError(f"{option} {text!r} is not a size such as 1KiB or 256MiB") from None


def cross_region_flows(
    lab: LabHandle, topology: LabTopology, names: tuple[str, ...]
) -> dict[frozenset[str], tuple[float, str]]:
    """One measured single TCP stream (Mbit/s, congestion control) per region pair."""
    out: dict[frozenset[str], tuple[float, str]] = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pair = frozenset((topology.region_of(a), topology.region_of(b)))
            if len(pair) == 2 and pair not in out:
                out[pair] = measure_single_stream(lab, b, a)
    return out


def run_lab_bench(
    topology: LabTopology,
    names: tuple[str, ...],
    sizes: tuple[int, ...],
    *,
    iters: int,
    warmup: int,
    timeout_s: float,
) -> BenchReport:
    """Build the lab, run one Gloo rank per node, measure the cross-region flows,
    tear the lab down; the report carries the ring model's prediction per size."""
    from netopt.lab import Lab

    unknown = [n for n in names if n not in topology.nodes]
    if unknown:
        raise UsageError(
            f"unknown lab node {', '.join(unknown)} (the lab has {', '.join(topology.nodes)})"
        )
    with Lab.start(topology) as lab:
        report = run_on_lab(
            lab,
            names,
            sizes,
            ifnames=[lab.plan.node(n).ifname for n in names],
            iters=iters,
            warmup=warmup,
            timeout_s=timeout_s,
        )
        flows = cross_region_flows(lab, topology, names)
        links = lab_link_figures(lab, topology, names, flows)
    fabric = fabric_from_links(lab_nodes(topology, names), links, flows=1)
    return with_predictions(report, fabric)


def _print(report: BenchReport) -> None:
    table = Table(title=f"all-reduce, {report.backend}, {report.ranks} ranks")
    for name in ("size", "time ms", "algbw GB/s", "busbw GB/s", "predicted ms", "pred/meas"):
        table.add_column(name, justify="right")
    for row in report.rows:
        predicted = "-" if row.predicted_s is None else f"{row.predicted_s * 1000:,.1f}"
        ratio = "-" if row.predicted_s is None else f"{row.predicted_s / row.time_s:.2f}"
        table.add_row(
            f"{row.size_bytes:,}",
            f"{row.time_s * 1000:,.2f}",
            f"{row.algbw_gbps:.4f}",
            f"{row.busbw_gbps:.4f}",
            predicted,
            ratio,
        )
    console.print(table)


@bench_group.command("allreduce")
@click.option("--ranks", type=int, default=None, help="Loopback ranks (default 2).")
@click.option("--lab", "lab_file", type=click.Path(dir_okay=False), help="Lab topology to build.")
@click.option("--nodes", default=None, help="Comma-separated nodes (lab or --links), rank order.")
@click.option("--links", "links_file", type=click.Path(dir_okay=False), help="Links file for "
              "the prediction on loopback runs.")  # fmt: skip
@click.option("--min-size", default="1KiB", show_default=True, help="Smallest message size.")
@click.option("--max-size", default="256MiB", show_default=True, help="Largest message size.")
@click.option("--factor", type=int, default=4, show_default=True, help="Size step factor.")
@click.option("--iters", type=int, default=5, show_default=True, help="Timed runs per size.")
@click.option(
    "--warmup", type=int, default=1, show_default=True, help="Untimed runs per size first."
)
@click.option(
    "--timeout-s", type=float, default=600.0, show_default=True, help="Give up after this long."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def allreduce_command(
    ranks: int | None,
    lab_file: str | None,
    nodes: str | None,
    links_file: str | None,
    min_size: str,
    max_size: str,
    factor: int,
    iters: int,
    warmup: int,
    timeout_s: float,
    as_json: bool,
) -> int:
    """Time all_reduce per message size; print algbw, busbw and the model's prediction."""
    sizes = size_ladder(_bytes(min_size, "--min-size"), _bytes(max_size, "--max-size"), factor)
    names = tuple(n.strip() for n in (nodes or "").split(",") if n.strip())
    if iters < 1 or warmup < 0:
        raise UsageError("--iters must be >= 1 and --warmup >= 0")
    if lab_file and (ranks is not None or links_file):
        raise UsageError("--lab runs one rank per lab node: drop --ranks and --links")
    if lab_file:
        topology = load_settings(lab_file, "lab")
        report = run_lab_bench(
            topology, names or topology.nodes, sizes, iters=iters, warmup=warmup,
            timeout_s=timeout_s,
        )  # fmt: skip
    else:
        if links_file and not names:
            raise UsageError("--links needs --nodes (which links-file node each rank stands for)")
        if names and ranks is not None and ranks != len(names):
            raise UsageError(f"--ranks {ranks} contradicts --nodes ({len(names)} names)")
        count = len(names) if names else (ranks or 2)
        report = run_loopback(count, sizes, iters=iters, warmup=warmup, timeout_s=timeout_s)
        if links_file:
            settings = load_settings(links_file, "links")
            chosen = select_nodes(settings, names)
            fabric = fabric_from_links(chosen, link_figures(settings), flows=1)
            report = with_predictions(report, fabric)
    if as_json:
        print_json(asdict(report))
    else:
        _print(report)
    return 0


def _print_train(report: dict[str, Any]) -> None:
    runs = report["runs"]
    title = f"bench train, {report['where']}" + (f", {report['cc']} hosts" if report["cc"] else "")
    table = Table(title=f"{title}, {report['steps']} steps, {report['model']['params']:,} params")
    for name in ("run", "time to N s", "setup s", "step s", "data wait", "exposed comm",
                 "compute", "predicted step s", "final loss", "border B/step"):  # fmt: skip
        table.add_column(name, justify="right")
    for name, run in runs.items():
        border = run["border_bytes_per_step"]
        predicted = run["predicted_step_s"]
        table.add_row(
            f"{name} ({run['hook']})",
            f"{run['time_to_n_s']:.1f}",
            f"{run['setup_s']:.1f}",
            f"{run['step_s']:.2f}",
            f"{run['data_wait_s']:.2f}",
            f"{run['comm_exposed_after_backward_s']:.2f} "
            f"({run['exposed_after_backward_share']:.0%}; own {run['exposed_comm_share']:.0%})",
            f"{run['compute_s']:.2f}",
            "-" if predicted is None else f"{predicted:.2f}",
            f"{run['final_loss']:.3f}",
            " ".join(f"{k} {v / 1e6:.1f}M" for k, v in border.items()) or "-",
        )
    console.print(table)
    for name, goal in report["goals"].items():
        state = "met" if goal["met"] else "NOT met"
        state += " (another measure, beside the goal)" if goal.get("beside_the_goal") else ""
        console.print(f"goal {name}: {goal['value']:.3f} (limit {goal['limit']}) {state}",
                      markup=False)  # fmt: skip


@bench_group.command("train")
@click.option(
    "--lab",
    "lab_file",
    type=click.Path(dir_okay=False),
    help="Lab topology to build (root); without it the ranks run on loopback.",
)
@click.option("--nodes", default=None, help="Comma-separated lab nodes (default: all).")
@click.option("--ranks", type=int, default=2, show_default=True, help="Loopback ranks.")
@click.option(
    "--cc",
    type=click.Choice(["bbr", "reno"]),
    default="bbr",
    show_default=True,
    help="With --lab: the hosts' congestion control before netopt's advice.",
)
@click.option(
    "--steps",
    type=click.IntRange(2, 10_000),
    default=20,
    show_default=True,
    help="Optimizer steps per run (N).",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Weights and data order (the same in both runs).",
)
@click.option(
    "--dim", type=click.IntRange(8, 4096), default=256, show_default=True, help="Model width."
)
@click.option(
    "--layers", type=click.IntRange(1, 64), default=7, show_default=True, help="Transformer layers."
)
@click.option(
    "--heads",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Attention heads (divide --dim).",
)
@click.option(
    "--seq",
    type=click.IntRange(2, 4096),
    default=128,
    show_default=True,
    help="Context length in tokens (bytes).",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 4096),
    default=8,
    show_default=True,
    help="Samples per rank and step.",
)
@click.option(
    "--shards",
    type=click.IntRange(1, 10_000),
    default=16,
    show_default=True,
    help="Token shards cut from the machine's text.",
)
@click.option("--shard-size", default="256KiB", show_default=True, help="Bytes per shard.")
@click.option(
    "--hook",
    type=click.Choice(["auto", *TRAIN_HOOKS]),
    default="auto",
    show_default=True,
    help="netopt's run: the advised hook (auto) or this one.",
)
@click.option(
    "--buckets",
    type=click.Choice(["auto", "default"]),
    default="auto",
    show_default=True,
    help="netopt's run: DDP's bucket_cap_mb as advised (auto) or DDP's own 25 MiB.",
)
@click.option("--lab-prefix", default=None, help="Namespace prefix of the lab (unique).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("bench-train"),
    show_default=True,
    help="Where report.json goes.",
)
@click.option(
    "--timeout-s",
    type=click.FloatRange(10, 86_400),
    default=1800.0,
    show_default=True,
    help="Give up on the whole bench after this long.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def train_command(
    lab_file: str | None, nodes: str | None, ranks: int, cc: str, steps: int, seed: int,
    dim: int, layers: int, heads: int, seq: int, batch: int, shards: int, shard_size: str,
    hook: str, buckets: str, lab_prefix: str | None, out_dir: Path, timeout_s: float, as_json: bool,
) -> int:  # fmt: skip
    """Train a small byte-level language model with DDP twice: defaults against netopt."""
    import importlib.util

    from netopt.cli.bench_train import TrainOptions, run_train_lab, run_train_loopback, summaries
    from netopt.errors import DependencyError
    from netopt.torch.trainbench import ModelShape, write_svg

    if importlib.util.find_spec("torch") is None:  # the ranks import it; this process need not
        raise DependencyError("PyTorch is needed: pip install 'netopt[torch]'")
    options = TrainOptions(
        steps=steps, seed=seed, shape=ModelShape(dim, layers, heads, seq), batch=batch,
        shards=shards, shard_bytes=_bytes(shard_size, "--shard-size"), hook=hook,
        buckets=buckets, timeout_s=timeout_s, out_dir=out_dir,
    )  # fmt: skip
    if lab_file:
        topology = load_settings(lab_file, "lab")
        names = tuple(n.strip() for n in (nodes or "").split(",") if n.strip()) or topology.nodes
        report = run_train_lab(options, topology, names, cc, prefix=lab_prefix)
    else:
        if nodes:
            raise UsageError("--nodes needs --lab (loopback ranks are given with --ranks)")
        report = run_train_loopback(options, ranks)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot = out_dir / "report.svg"
    write_svg(plot, summaries(report), f"bench train ({report['where']}, {report['cc'] or '-'})")
    report["files"] = {"json": str(out_dir / "report.json"), "plot": str(plot)}
    if as_json:
        print_json(report)
    else:
        _print_train(report)
        console.print(f"report: {out_dir / 'report.json'}, plot: {plot}", markup=False)
    return 0
