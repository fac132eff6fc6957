#!/usr/bin/env python3
"""Time a 1 MB ``netopt sync`` on the lab link against the goal: 4 RTTs + 0.5 s.

    sudo .venv/bin/python scripts/bench_small_sync.py --json-out small-sync.json

Builds the lab in --topology (default configs/lab/bench-limit.yaml: hk <-> us, 80 Mbit/s,
140 ms RTT, 1% loss), serves a 1 MB dataset (--files files cut from the venv's real
``.py`` text; one file by default) with ``netopt serve`` on us-1 and runs ``netopt sync``
on hk-1 --runs times, each into an empty DEST and an empty cache. The time is the wall
clock of the whole command (interpreter start-up included); the JSON keeps each run's
``NETOPT_TRACE`` marks (seconds since the command was launched) to show where it went.
netopt's modules are compiled to bytecode first, as ``pip install`` does: a checkout run
with ``PYTHONDONTWRITEBYTECODE=1`` would otherwise compile every module on every call
(~0.15 s here) and measure that instead. Prints a table (each run, the median, the goal
and the share of it) and writes JSON. The server and client speak TLS with a token,
as users run them (a throwaway cluster CA); ``--plaintext`` drops both.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from netopt.lab import Lab
from netopt.tlsca import ServerFiles, issue_server_files

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_transfer import netopt_env

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = REPO / "configs" / "lab" / "bench-limit.yaml"
PORT = 7470
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"


def make_dataset(root: Path, size_bytes: int, files: int) -> int:
    """``files`` files of real text (the venv's .py files) totalling ``size_bytes``."""
    text = bytearray()
    for path in sorted((SITE / "site-packages").rglob("*.py")):
        text += path.read_bytes()
        if len(text) >= size_bytes:
            break
    root.mkdir(parents=True, exist_ok=True)
    per_file = size_bytes // files
    for i in range(files):
        end = size_bytes if i == files - 1 else (i + 1) * per_file
        (root / f"part-{i:04d}.py").write_bytes(bytes(text[i * per_file : end]))
    return size_bytes


def rtt_ms_of(topology: Path) -> float:
    link = yaml.safe_load(topology.read_text())["links"][0]
    return 2 * float(link.get("delay_ms", 0))


def wait_port(lab: Lab, node: str, port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if lab.exec(node, ["ss", "-ltnH", f"( sport = :{port} )"], check=False).stdout.strip():
            return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {node}:{port} after {timeout_s} s")


def one_sync(
    lab: Lab, url: str, work: Path, timeout_s: float, tls: ServerFiles | None
) -> dict[str, Any]:
    dest, cache = work / "dest", work / "cache"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    argv = [sys.executable, "-m", "netopt", "sync", url, str(dest), "--cache-dir", str(cache),
            "--json", *(tls.client_args() if tls is not None else [])]  # fmt: skip
    started_s = time.monotonic()
    trace_path = work / "trace.json"
    trace_path.unlink(missing_ok=True)
    env = {**netopt_env(tls), "NETOPT_TRACE": str(trace_path)}
    proc = lab.popen(
        "hk-1", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    out, err = proc.communicate(timeout=timeout_s)
    wall_s = time.monotonic() - started_s
    if proc.returncode != 0:
        raise SystemExit(f"netopt sync exited {proc.returncode}: {err.strip()[-1000:]}")
    report = json.loads(out)
    traced = json.loads(trace_path.read_text()) if trace_path.exists() else {}
    raw = traced.get("marks", {})
    marks = {name: round(at_s - started_s, 3) for name, at_s in raw.items()}  # one clock
    return {"marks": marks, "wall_s": round(wall_s, 3), "sync_s": round(report["seconds"], 3),
            "files_written": report["files_written"],
            "chunks_fetched": report["chunks_fetched"],
            "wire_bytes": report.get("wire_bytes"), "counts": traced.get("counts", {}),
            "plan": report.get("plan")}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", type=Path, default=TOPOLOGY)
    parser.add_argument("--size-kb", type=int, default=1024)
    parser.add_argument("--files", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=60)
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--plaintext", action="store_true", help="no TLS, no token")
    parser.add_argument("--prefix", help="lab prefix (namespace names); default: a random one")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    rtt_ms = rtt_ms_of(args.topology)
    compileall.compile_dir(REPO / "netopt", quiet=1)  # as an installed package has it
    goal_s = 4 * rtt_ms / 1000 + 0.5
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="netopt-small-") as tmp:
        work = Path(tmp)
        size = make_dataset(work / "src", args.size_kb * 1024, args.files)
        with Lab.start(str(args.topology), prefix=args.prefix) as lab:
            srv = lab.address("us-1")
            tls = None if args.plaintext else issue_server_files(work / "tls", "us-1", ips=[srv])
            security = ["--no-auth", "--allow-plaintext"] if tls is None else tls.server_args()
            server_log = (work / "serve.log").open("w")
            server = lab.popen(
                "us-1",
                [sys.executable, "-m", "netopt", "serve", str(work / "src"), "--name", "ds",
                 "--bind", f"{srv}:{PORT}", *security],
                stdout=server_log, stderr=subprocess.STDOUT, env=netopt_env(tls),
            )  # fmt: skip
            try:
                try:
                    wait_port(lab, "us-1", PORT)
                except RuntimeError as exc:
                    tail = (work / "serve.log").read_text(errors="replace")[-2000:]
                    raise SystemExit(f"{exc}; netopt serve said:\n{tail}") from None
                for _ in range(args.runs):
                    url = f"netopt://{srv}:{PORT}/ds"
                    runs.append(one_sync(lab, url, work, args.timeout_s, tls))
            finally:
                server.terminate()
                server.wait(timeout=10)
                server_log.close()
    median_s = statistics.median(r["wall_s"] for r in runs)
    print(f"| run | wall s | sync s | goal s (4 x {rtt_ms:g} ms + 0.5) | RTTs request->last byte |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(runs, 1):
        marks = r["marks"]
        data_rtts = (
            f"{(marks['last_byte'] - marks['first_request']) / (rtt_ms / 1000):.1f}"
            if "last_byte" in marks and "first_request" in marks
            else "-"
        )
        print(f"| {i} | {r['wall_s']:.3f} | {r['sync_s']:.3f} | {goal_s:.3f} | {data_rtts} |")
    verdict = "meets" if median_s < goal_s else "misses"
    print(f"median {median_s:.3f} s for {size / 1e6:.2f} MB in {args.files} file(s): "
          f"{median_s / goal_s:.2f} x the goal ({verdict} it)")  # fmt: skip
    if args.json_out is not None:
        doc = {"topology": str(args.topology), "rtt_ms": rtt_ms, "tls": tls is not None,
               "bytes": size, "files": args.files, "goal_s": goal_s, "median_wall_s": median_s,
               "meets_goal": median_s < goal_s, "runs": runs}  # fmt: skip
        args.json_out.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
