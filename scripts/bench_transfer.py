#!/usr/bin/env python3
"""Benchmark netopt's data plane against curl, aria2c, rsync and iperf3 on the lab link.

    sudo .venv/bin/python scripts/bench_transfer.py --size-mb 50

Builds the lab in configs/lab/bench-transfer.yaml (hk <-> us: 100 Mbit/s, 80 ms
RTT, 1% loss each way), puts a JSON-lines file and an incompressible file on
us-1, and fetches each to hk-1 with every tool, once with the nodes' default
congestion control left at bbr and once with reno (loss-based; a namespace
cannot default to cubic, see shared/LAB.md). netopt's server sets bbr on its own
sockets in both modes: that is the point of comparing against the tools' default.

Per run: seconds, effective (logical) Mbit/s, bytes on the wire (IP bytes
us -> hk from the lab's relay counters), wire Mbit/s, CPU seconds (client +
server) and, for netopt, the plan's predicted time. Every run is bounded by
--timeout-s; a run cut short reports its rate from the bytes that did arrive
(marked "timeout"). Needs root.

With ``--precompress LEVEL`` a second netopt origin, ``netopt-pre``, first
publishes the dataset (``netopt serve --precompress LEVEL``: every chunk compressed
once at that level, ``--precompress-chunk-mib`` chunks) and then serves the stored
frames; the publish time is reported apart from the transfer times (it is paid
once per dataset version, not per transfer).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from netopt.lab import Lab

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = REPO / "configs" / "lab" / "bench-transfer.yaml"
TOOLS = ("iperf3", "netopt", "curl", "aria2c", "rsync")
PORTS = {"http": 8080, "rsync": 8873, "netopt": 7470, "netopt-pre": 7471, "iperf3": 5201}


@dataclass
class Row:
    mode: str
    data: str
    tool: str
    seconds: float
    logical_bytes: int
    wire_bytes: int
    cpu_s: float
    timed_out: bool = False
    predicted_s: float | None = None
    internal_s: float | None = None
    """netopt's own count of seconds (without interpreter start-up and codec-profile load)."""
    publish_s: float | None = None
    """netopt-pre: seconds the origin took to precompress the dataset (before any run)."""

    @property
    def effective_mbps(self) -> float:
        return self.logical_bytes * 8 / self.seconds / 1e6 if self.seconds else 0.0

    @property
    def wire_mbps(self) -> float:
        return self.wire_bytes * 8 / self.seconds / 1e6 if self.seconds else 0.0


def make_data(root: Path, size_mb: int) -> dict[str, Path]:
    """A JSON-lines file and a random file of ``size_mb`` MB each, in their own dirs."""
    size = size_mb * 1_000_000
    rng = random.Random(42)
    words = [f"{rng.choice('abcdefghij')}{rng.randrange(20000)}" for _ in range(20000)]
    jsonl = root / "jsonl" / "data.jsonl"
    jsonl.parent.mkdir(parents=True)
    with jsonl.open("w") as f:
        written, i = 0, 0
        while written < size:
            line = json.dumps(
                {
                    "id": i,
                    "user": f"u{rng.randrange(10**6)}",
                    "text": " ".join(rng.choices(words, k=rng.randrange(10, 40))),
                    "score": round(rng.random(), 4),
                    "tags": rng.sample(words[:50], 3),
                }
            )
            f.write(line + "\n")
            written += len(line) + 1
            i += 1
    rand = root / "random" / "data.bin"
    rand.parent.mkdir(parents=True)
    with rand.open("wb") as f:
        for _ in range(size_mb):
            f.write(os.urandom(1_000_000))
    return {"jsonl": jsonl, "random": rand}


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process (its threads included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wire_bytes(lab: Lab) -> int:
    link = lab.counters().links[0]
    # Data flows from us-1 (the server) to hk-1 (the client).
    return link.b_to_a.bytes if link.a == "hk" else link.a_to_b.bytes


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def run_client(
    lab: Lab,
    argv: list[str],
    timeout_s: float,
    server_pid: int | None,
    env: dict[str, str] | None = None,
) -> tuple[float, int, float, bool, str, float]:
    """Run ``argv`` on hk-1: seconds, wire bytes, CPU seconds, timed out, stdout, start.

    ``start`` is ``time.monotonic()`` at launch (the clock a trace's marks use).
    """
    before_wire = wire_bytes(lab)
    before_srv = proc_cpu_s(server_pid) if server_pid else 0.0
    before_children = os.times()
    start = time.monotonic()
    proc = lab.popen(
        "hk-1", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        stop(proc)
        out, err = proc.communicate()
    seconds = time.monotonic() - start
    time.sleep(0.3)  # let the relay count the last packets in flight
    after_children = os.times()
    cpu = (after_children.children_user - before_children.children_user) + (
        after_children.children_system - before_children.children_system
    )
    if server_pid:
        cpu += proc_cpu_s(server_pid) - before_srv
    if proc.returncode not in (0, None) and not timed_out:
        print(f"  ! {argv[0]} exited {proc.returncode}: {err.strip()[-300:]}", file=sys.stderr)
    return seconds, wire_bytes(lab) - before_wire, cpu, timed_out, out, start


def wait_published(log: Path, timeout_s: float) -> float:
    """Seconds until ``netopt serve --precompress`` (logging to ``log``) says it is done.

    Raises RuntimeError when it stops or does not finish within ``timeout_s``.
    """
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        text = log.read_text() if log.exists() else ""
        if "precompression stopped" in text:
            raise RuntimeError(f"precompression failed: {text.strip()[-300:]}")
        if "precompressed " in text:
            return time.monotonic() - start
        time.sleep(0.5)
    raise RuntimeError(f"precompression did not finish within {timeout_s:.0f} s")


def wait_port(lab: Lab, node: str, port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ok = lab.exec(node, ["ss", "-ltnH", f"( sport = :{port} )"], check=False).stdout
        if ok.strip():
            return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {node}:{port} after {timeout_s} s")


def bench_dataset(
    lab: Lab, mode: str, name: str, path: Path, out_dir: Path, args: argparse.Namespace
) -> list[Row]:
    srv = lab.address("us-1")
    rows: list[Row] = []
    servers: dict[str, subprocess.Popen[Any]] = {}
    out_dir.mkdir(parents=True, exist_ok=True)
    rsync_conf = out_dir / f"rsyncd-{name}.conf"
    rsync_conf.write_text(
        f"[data]\n  path = {path.parent}\n  read only = yes\n  use chroot = no\n"
        "  uid = root\n  gid = root\n"
    )
    null = subprocess.DEVNULL
    servers["curl"] = lab.popen(
        "us-1",
        [
            sys.executable,
            "-m",
            "http.server",
            str(PORTS["http"]),
            "--bind",
            srv,
            "--directory",
            str(path.parent),
        ],
        stdout=null,
        stderr=null,
    )
    servers["rsync"] = lab.popen(
        "us-1",
        [
            "rsync",
            "--daemon",
            "--no-detach",
            f"--config={rsync_conf}",
            f"--port={PORTS['rsync']}",
            f"--address={srv}",
        ],
        stdout=null,
        stderr=null,
    )
    servers["netopt"] = lab.popen(
        "us-1",
        [
            sys.executable,
            "-m",
            "netopt",
            "serve",
            str(path.parent),
            "--name",
            name,
            "--no-auth",
            "--bind",
            f"{srv}:{PORTS['netopt']}",
            "--cc",
            "bbr",
            # Server and client share this machine's cores: plan with one for compression.
            "--threads",
            "1",
        ],
        stdout=null,
        stderr=null,
    )
    publish_log = out_dir / f"publish-{mode}-{name}.log"
    if "netopt-pre" in args.tools:
        # The same server, publishing first: every chunk compressed once at a high level
        # (larger chunks compress better), then served as stored frames.
        with publish_log.open("w") as log_file:
            servers["netopt-pre"] = lab.popen(
                "us-1",
                [sys.executable, "-m", "netopt", "serve", str(path.parent), "--name", name,
                 "--no-auth", "--bind", f"{srv}:{PORTS['netopt-pre']}", "--cc", "bbr",
                 "--threads", "1", "--precompress", str(args.precompress),
                 "--chunk-size", str(args.precompress_chunk_mib * 1024 * 1024),
                 "--frames-dir", str(out_dir / "frames")],
                stdout=null, stderr=log_file,
            )  # fmt: skip
    servers["aria2c"] = servers["curl"]
    publish_s: float | None = None
    try:
        for port in (PORTS["http"], PORTS["rsync"], PORTS["netopt"]):
            wait_port(lab, "us-1", port)
        if "netopt-pre" in args.tools:
            publish_s = wait_published(publish_log, args.publish_timeout_s)
            print(
                f"  {mode:5} {name:6} netopt-pre: published (zstd {args.precompress}, "
                f"{args.precompress_chunk_mib} MiB chunks) in {publish_s:.1f} s",
                flush=True,
            )
        for tool in args.tools:
            if tool == "iperf3":
                continue
            dest = out_dir / f"{mode}-{name}-{tool}"
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            url = f"http://{srv}:{PORTS['http']}/{path.name}"
            argv = {
                "curl": ["curl", "-sS", "-o", str(dest / path.name), url],
                "aria2c": [
                    "aria2c",
                    "-x",
                    "16",
                    "-s",
                    "16",
                    "-k",
                    "1M",
                    "-q",
                    "-d",
                    str(dest),
                    "--file-allocation=none",
                    "--allow-overwrite=true",
                    url,
                ],
                "rsync": ["rsync", f"rsync://{srv}:{PORTS['rsync']}/data/{path.name}", str(dest)],
                **{
                    netopt: [
                        sys.executable,
                        "-m",
                        "netopt",
                        "sync",
                        f"netopt://{srv}:{PORTS[netopt]}/{name}",
                        str(dest),
                        "--json",
                        "--link-rate-mbps",
                        str(args.link_rate_mbps),
                        "--link-loss",
                        str(args.link_loss),
                        # A fresh chunk cache per run: a warm one would measure the disk.
                        "--cache-dir",
                        str(out_dir / f"{mode}-{name}-cache"),
                    ]
                    for netopt in ("netopt", "netopt-pre")
                },
            }[tool]
            for attempt in range(args.repeat if tool.startswith("netopt") else 1):
                if attempt:
                    shutil.rmtree(dest, ignore_errors=True)
                    shutil.rmtree(out_dir / f"{mode}-{name}-cache", ignore_errors=True)
                    dest.mkdir(parents=True)
                row = _run_tool(lab, tool, argv, servers[tool], (mode, name, path, dest), args)
                row.publish_s = publish_s if tool == "netopt-pre" else None
                rows.append(row)
            shutil.rmtree(dest, ignore_errors=True)
            shutil.rmtree(out_dir / f"{mode}-{name}-cache", ignore_errors=True)
    finally:
        for proc in {id(p): p for p in servers.values()}.values():
            stop(proc)
    return rows


def _run_tool(
    lab: Lab,
    tool: str,
    argv: list[str],
    server: subprocess.Popen[Any],
    where: tuple[str, str, Path, Path],
    args: argparse.Namespace,
) -> Row:
    mode, name, path, dest = where
    size = path.stat().st_size
    env = None
    trace_path = dest.parent / f"trace-{mode}-{name}.json"
    if tool.startswith("netopt") and args.trace:
        trace_path.unlink(missing_ok=True)
        env = {**os.environ, "NETOPT_TRACE": str(trace_path)}
    server_cpu_before_s = proc_cpu_s(server.pid)
    seconds, wire, cpu, timed_out, out, start = run_client(
        lab, argv, args.timeout_s, server.pid, env
    )
    server_cpu_s = proc_cpu_s(server.pid) - server_cpu_before_s
    got = (dest / path.name).stat().st_size if (dest / path.name).exists() else 0
    logical = size if not timed_out and got == size else got
    predicted = internal = None
    if tool.startswith("netopt") and not timed_out:
        with_plan = json.loads(out)
        # The cache's sync reports the transfer plan as "transfer_plan".
        plan = with_plan.get("transfer_plan") or with_plan["plan"]
        predicted = float(plan["predicted_time_s"])
        internal = float(with_plan["seconds"])
    row = Row(mode, name, tool, seconds, logical, wire, cpu, timed_out, predicted, internal)
    if timed_out and tool in ("aria2c", "rsync"):
        # Partial files say little for segmented or temp-file downloads: rate from wire.
        row.logical_bytes = wire
    print(
        f"  {mode:5} {name:6} {tool:7} {seconds:7.1f} s {row.effective_mbps:7.1f} Mbit/s"
        f" eff, {row.wire_mbps:6.1f} wire{'  (timeout)' if timed_out else ''}",
        flush=True,
    )
    if env is not None and trace_path.exists():
        print_trace(json.loads(trace_path.read_text()), start, start + seconds)
        plan = json.loads(out).get("transfer_plan", {}) if not timed_out else {}
        print(
            f"    server cpu {server_cpu_s:.2f} s; plan: level {plan.get('zstd_level')},"
            f" {plan.get('streams')} streams, predicted {plan.get('predicted_time_s')} s",
            flush=True,
        )
    return row


def print_trace(trace: dict[str, Any], launched_s: float, ended_s: float) -> None:
    """One netopt process's timeline (s since launch), its CPU and its summed costs."""
    marks = {k: v - launched_s for k, v in trace["marks"].items()}
    marks["ended (seen by the bench)"] = ended_s - launched_s
    line = ", ".join(f"{k} {v:.2f}" for k, v in sorted(marks.items(), key=lambda kv: kv[1]))
    print(f"    timeline: {line}")
    costs = ", ".join(f"{k} {v:.2f}" for k, v in sorted(trace["seconds"].items()))
    print(f"    summed s: {costs}")
    counts = ", ".join(f"{k} {v:g}" for k, v in sorted(trace["counts"].items()))
    print(
        f"    cpu: user {trace['cpu_user_s']:.2f} s, system {trace['cpu_system_s']:.2f} s;"
        f" counts: {counts}",
        flush=True,
    )


def bench_iperf3(lab: Lab, mode: str, args: argparse.Namespace) -> Row:
    server = lab.popen(
        "us-1",
        ["iperf3", "-s", "-p", str(PORTS["iperf3"]), "-1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(lab, "us-1", PORTS["iperf3"])
        argv = [
            "iperf3",
            "-c",
            lab.address("us-1"),
            "-p",
            str(PORTS["iperf3"]),
            "-P",
            "8",
            "-R",
            "-t",
            str(args.iperf_s),
            "-J",
        ]
        _, wire, cpu, timed_out, out, _ = run_client(lab, argv, args.iperf_s + 30, server.pid)
        received = int(json.loads(out)["end"]["sum_received"]["bytes"]) if not timed_out else 0
    finally:
        stop(server)
    row = Row(mode, "-", "iperf3 -P8", float(args.iperf_s), received, wire, cpu, timed_out)
    print(f"  {mode:5} iperf3 -P 8: {row.effective_mbps:.1f} Mbit/s", flush=True)
    return row


def print_table(rows: list[Row]) -> None:
    head = (
        "mode",
        "data",
        "tool",
        "seconds",
        "effective Mbit/s",
        "wire MB",
        "wire Mbit/s",
        "CPU s",
        "plan s",
        "plan err",
        "netopt s",
        "plan err (netopt s)",
        "publish s",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        err = f"{(r.predicted_s - r.seconds) / r.seconds:+.0%}" if r.predicted_s else "-"
        own = f"{r.internal_s:.1f}" if r.internal_s else "-"
        own_err = (
            f"{(r.predicted_s - r.internal_s) / r.internal_s:+.0%}"
            if r.predicted_s and r.internal_s
            else "-"
        )
        cells = (
            r.mode,
            r.data,
            r.tool + (" (timeout)" if r.timed_out else ""),
            f"{r.seconds:.1f}",
            f"{r.effective_mbps:.1f}",
            f"{r.wire_bytes / 1e6:.1f}",
            f"{r.wire_mbps:.1f}",
            f"{r.cpu_s:.1f}",
            f"{r.predicted_s:.1f}" if r.predicted_s else "-",
            err,
            own,
            own_err,
            f"{r.publish_s:.0f}" if r.publish_s is not None else "-",
        )
        print("| " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--modes", default="bbr,reno", help="node default CCs, comma-separated")
    parser.add_argument("--data", default="jsonl,random")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per client run")
    parser.add_argument("--iperf-s", type=int, default=10)
    parser.add_argument("--link-rate-mbps", type=float, default=100.0, help="for netopt's plan")
    parser.add_argument("--link-loss", type=float, default=0.01, help="for netopt's plan")
    parser.add_argument("--topology", default=str(TOPOLOGY))
    parser.add_argument("--json-out", default=None, help="write the rows here as JSON")
    parser.add_argument("--repeat", type=int, default=1, help="netopt runs per dataset and mode")
    parser.add_argument(
        "--precompress",
        type=int,
        default=None,
        help="also run netopt-pre: an origin that first compresses every chunk once at "
        "this zstd level (netopt serve --precompress); publish time reported apart",
    )
    parser.add_argument("--precompress-chunk-mib", type=int, default=4)
    parser.add_argument("--publish-timeout-s", type=float, default=1200.0)
    parser.add_argument(
        "--trace",
        action="store_true",
        help="print each netopt run's timeline (NETOPT_TRACE, see netopt.dataplane.trace)",
    )
    args = parser.parse_args()
    args.tools = [t for t in args.tools.split(",") if t]
    if args.precompress is not None and "netopt-pre" not in args.tools:
        args.tools.append("netopt-pre")
    if "netopt-pre" in args.tools and args.precompress is None:
        parser.error("netopt-pre needs --precompress LEVEL")
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="netopt-bench-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        data = make_data(work / "data", args.size_mb)
        print(f"data ready in {time.monotonic() - t0:.1f} s", flush=True)
        with Lab.start(args.topology) as lab:
            for mode in args.modes.split(","):
                for node in ("hk-1", "us-1"):
                    lab.exec(node, ["sysctl", "-qw", f"net.ipv4.tcp_congestion_control={mode}"])
                if "iperf3" in args.tools:
                    rows.append(bench_iperf3(lab, mode, args))
                for name in args.data.split(","):
                    rows.extend(bench_dataset(lab, mode, name, data[name], work / "out", args))
    print_table(rows)
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps(
                [
                    {**asdict(r), "effective_mbps": r.effective_mbps, "wire_mbps": r.wire_mbps}
                    for r in rows
                ],
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
