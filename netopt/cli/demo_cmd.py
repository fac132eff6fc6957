"""``netopt demo``: the whole system on an emulated two-region cluster, one command."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from netopt.cli.output import console, print_json, print_table

__all__ = ["demo"]


@click.command("demo")
@click.option(
    "--report-dir",
    type=click.Path(file_okay=False),
    default="netopt-report",
    show_default=True,
    help="Where report.json, links.yaml, nccl.env and the PNG plots are written.",
)
@click.option(
    "--dataset-mb", type=click.IntRange(1, 2048), default=32, show_default=True,
    help="Size of the generated dataset.",
)  # fmt: skip
@click.option(
    "--loopback",
    is_flag=True,
    help="Run on loopback even with root (links emulated by user-space proxies).",
)
@click.option(
    "--train-steps", type=click.IntRange(0, 100), default=6, show_default=True,
    help="DDP steps of the training section, each run (0: skip it).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def demo(report_dir: str, dataset_mb: int, loopback: bool, train_steps: int, as_json: bool) -> int:
    """Measure, tune NCCL and sync a dataset on an emulated two-region cluster.

    With root: a lab of hk-1, hk-2, hk-3 (Hong Kong) and us-1 (US) joined by a
    100 Mbit/s, 80 ms RTT, 0.5%-loss link. Without root: the same on loopback, the
    link emulated by user-space proxies.
    """
    import importlib.util

    from netopt.errors import DependencyError

    if importlib.util.find_spec("matplotlib") is None:
        raise DependencyError(
            "netopt demo draws its report with matplotlib: pip install 'netopt[demo]'"
        )
    from netopt.demo.run import DemoOptions, run_demo

    # The demo's cluster uses only its own settings: a node already set up for a real
    # cluster (NETOPT_TOKEN, NETOPT_COORDINATOR, NETOPT_AGENT__...) must not reach the
    # processes it starts (the coordinator would take the real token and refuse the demo's).
    for key in [k for k in os.environ if k.startswith("NETOPT_")]:
        if key not in ("NETOPT_LOG_LEVEL", "NETOPT_LOG_FORMAT"):
            del os.environ[key]

    def say(message: str) -> None:
        if not as_json:
            console.print(f"[bold cyan]demo:[/] {message}")

    options = DemoOptions(
        Path(report_dir),
        dataset_bytes=dataset_mb * 1024 * 1024,
        loopback=True if loopback else None,
    )
    report = run_demo(options, say)
    shown = vars(report)
    if train_steps:
        from netopt.cli.demo_train import demo_train

        shown["train"] = demo_train(Path(report_dir), report.mode == "lab", train_steps, say)
        (Path(report_dir) / "report.json").write_text(json.dumps(shown, indent=2))
    if as_json:
        print_json(shown)
        return 0
    _print_report(shown, Path(report_dir))
    return 0


def _mbps(value: Any) -> float | None:
    return None if value is None else round(float(value), 1)


def _print_report(report: dict[str, Any], report_dir: Path) -> None:
    from netopt.measure.losstext import loss_text

    print_table(
        "link matrix (measured by the agents)",
        ["src", "dst", "rtt p50 ms", "rtt p99 ms", "jitter ms", "loss (95% interval)"],
        [
            [
                m["src"],
                m["dst"],
                m["rtt_p50_ms"],
                m["rtt_p99_ms"],
                m["jitter_ms"],
                loss_text(m["window"]["loss_ratio"], m["window"].get("probes_sent")),
            ]
            for m in report["matrix"]
        ],
    )
    print_table(
        "bandwidth (bulk TCP, bbr)",
        ["pair", "1 stream Mbit/s", "N streams Mbit/s", "N"],
        [
            [pair, _mbps(b["single_stream_mbps"]), _mbps(b["aggregate_mbps"]), b["streams"]]
            for pair, b in report["bandwidth"].items()
        ],
    )
    if report["nccl_env_file"]:
        console.print(f"\n[bold]NCCL environment[/] ({report['nccl_env_file']}):")
        console.print(Path(report["nccl_env_file"]).read_text(), markup=False)
    plan = report["plan"]
    if plan:
        console.print("[bold]transfer plan for the cross-border link[/]:")
        console.print(json.dumps(plan, indent=2), markup=False)
    rows = [
        [f"{s['node']} <- {s['source']}", s["kind"], _mbps(s["logical_bytes"] / 1e6),
         _mbps(s["wire_bytes"] / 1e6), s["seconds"], s["throughput_mbps"],
         (s.get("sharing") or {}).get("chunks_from_peers"),
         (s.get("sharing") or {}).get("chunks_from_source")]
        for s in report["syncs"]
    ]  # fmt: skip
    print_table(
        "dataset syncs (all hk nodes at once, shared then naive)",
        ["sync", "kind", "logical MB", "wire MB", "s", "effective Mbit/s", "chunks from peers",
         "chunks from us"],
        rows,
    )  # fmt: skip
    border = report["border_bytes"]
    if border:
        console.print(
            f"cross-border bytes for {border['hk_nodes']} hk nodes: netopt "
            f"{border['netopt_bytes'] / 1e6:.1f} MB (once per region) vs naive per-node "
            f"downloads {border['naive_per_node_bytes'] / 1e6:.1f} MB "
            f"(dataset {border['dataset_bytes'] / 1e6:.1f} MB; {border['counted']})"
        )
    _print_train(report.get("train"))
    for plot in report.get("plots", []):
        console.print(f"plot: {plot}")
    for note in report["notes"]:
        console.print(f"note: {note}")
    console.print(
        f"report: {report_dir / 'report.json'} ({report['seconds']:.0f} s, {report['mode']})"
    )


def _print_train(train: dict[str, Any] | None) -> None:
    if not train:
        return
    if "skipped" in train:
        console.print(f"training section skipped: {train['skipped']}", markup=False)
        return
    print_table(
        f"training ({train['steps']} DDP steps, {train['params'] / 1e6:.1f} M parameters, "
        f"{train['where']})",
        ["run", "hook", "time to N s", "step s", "exposed comm", "data wait s", "final loss"],
        [
            [name, run["hook"], run["time_to_n_s"], run["step_s"],
             f"{100 * run['exposed_comm_share']:.0f}%", run["data_wait_s"], run["final_loss"]]
            for name in ("defaults", "netopt")
            for run in (train[name],)
        ],
    )  # fmt: skip
    if train["ratio"] is not None:
        ratio = train["ratio"]
        console.print(f"netopt's time to {train['steps']} steps: {ratio:.2f}x the defaults'")
    console.print(f"plot: {train['plot']}")
