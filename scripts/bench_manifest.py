#!/usr/bin/env python3
"""Time the manifest fetch of trees of many small files: bytes on the wire, client time,
server CPU per request; one checkout against another, back to back.

    .venv/bin/python scripts/bench_manifest.py --repo old=/tmp/netopt-old --repo new=. \\
        --files 20000,100000 --json-out /tmp/manifest.json
    sudo .venv/bin/python scripts/bench_manifest.py --lab configs/lab/bench-limit.yaml \\
        --prefix hm14 --files 20000 --repo old=/tmp/netopt-old --repo new=.

For each tree (``--files`` files of 1-4 KB of real text, built by
`bench_many_files.build_small` under --work-dir and reused) and each checkout, in the
order given: start that checkout's ``netopt serve`` of the tree (``--no-auth``, 64 KiB
chunks), ask for the dataset info once (the server names its version, as a sync's
first requests do), then fetch the manifest ``--requests`` times with that checkout's
own client (`HttpChunkSource.fetch_manifest`: the request, the decoding, the parse and
the checks), each time over a fresh connection as a sync's start does. Reported: the
body's bytes on the wire, the first fetch and the median of the others (s), and the
server's CPU (user + system, from /proc) for the first request and per later request.

``--lab TOPOLOGY`` runs the server on us-1 (its default congestion control, bbr) and
the client on hk-1 of a lab built from TOPOLOGY (configs/lab/bench-limit.yaml: 80
Mbit/s, 140 ms RTT, 1% loss); needs root.
Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_many_files import build_small

REPO = Path(__file__).resolve().parents[1]
PORT = 7470
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (and its finished threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


async def _client(host: str, port: int, requests: int, server_pid: int) -> dict[str, Any]:
    """Runs in the checkout under test (its netopt first on PYTHONPATH)."""
    from netopt.dataplane.httpsource import ClientOptions, HttpChunkSource, parse_dataset_url

    url = parse_dataset_url(f"netopt://{host}:{port}/ds")
    options = ClientOptions(congestion_control=None)
    async with HttpChunkSource(url, options) as source:
        info = await source.fetch_info()
    fetches: list[dict[str, float]] = []
    files = 0
    for _ in range(requests):
        cpu_before_s = _cpu_s(server_pid) if server_pid else 0.0
        started_s = time.perf_counter()
        async with HttpChunkSource(url, options) as source:
            manifest = await source.fetch_manifest()
            wire = source.wire_bytes
        seconds = time.perf_counter() - started_s
        cpu_s = _cpu_s(server_pid) - cpu_before_s if server_pid else 0.0
        if manifest.manifest_id != info.manifest_id:
            raise SystemExit("the manifest fetched is not the version the info named")
        files = len(manifest.files)
        fetches.append({"seconds": seconds, "wire_bytes": wire, "server_cpu_s": cpu_s})
    return {"files": files, "json_bytes": len(manifest.canonical_json), "fetches": fetches}


def _start_serve(
    repo: Path, src: Path, lab: Any | None, log_path: Path
) -> tuple[subprocess.Popen[Any], str, int]:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    argv = [sys.executable, "-m", "netopt", "serve", str(src), "--name", "ds", "--no-auth",
            "--chunk-size", "65536"]  # fmt: skip
    if lab is None:
        proc = subprocess.Popen(
            [*argv, "--cc", "default", "--bind", "127.0.0.1:0"], cwd=repo, env=env,
            stdout=subprocess.PIPE, stderr=log_path.open("w"), text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "netopt://127.0.0.1:" not in line:
            raise SystemExit(f"netopt serve said {line!r}: {log_path.read_text()[-2000:]}")
        return proc, "127.0.0.1", int(line.split("netopt://127.0.0.1:")[1].split("/")[0])
    host = lab.address("us-1")
    log = log_path.open("w")
    proc = lab.popen(
        "us-1", [*argv, "--allow-plaintext", "--bind", f"{host}:{PORT}"], cwd=repo, env=env,
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline_s = time.monotonic() + 600
    while time.monotonic() < deadline_s:
        ss = lab.exec("us-1", ["ss", "-ltnH", f"( sport = :{PORT} )"], check=False)
        if ss.stdout.strip():
            return proc, host, PORT
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise SystemExit(f"netopt serve did not listen: {log_path.read_text()[-2000:]}")


def _server_pid(proc: subprocess.Popen[Any]) -> int:
    """The serving Python's pid (``ip netns exec`` execs it in place); 0 if not found."""
    try:
        comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
    except OSError:
        return 0
    return proc.pid if comm.startswith("python") else 0


def run_one(
    label: str, repo: Path, src: Path, args: argparse.Namespace, lab: Any | None
) -> dict[str, Any]:
    work = args.work_dir
    server, host, port = _start_serve(repo, src, lab, work / f"serve-{label}.log")
    try:
        pid = _server_pid(server)
        argv = [sys.executable, str(Path(__file__).resolve()), "--client", host, str(port),
                str(args.requests), str(pid)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(repo)}
        if lab is None:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        else:
            proc = lab.popen(
                "hk-1", argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            out, err = proc.communicate(timeout=600)
            done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    finally:
        server.terminate()
        server.wait(timeout=30)
    if done.returncode != 0:
        raise SystemExit(f"{label}: the client failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    fetches = result["fetches"]
    later = fetches[1:] or fetches
    return {
        "label": label,
        "repo": str(repo),
        "files": result["files"],
        "json_bytes": result["json_bytes"],
        "wire_bytes": fetches[0]["wire_bytes"],
        "first_s": round(fetches[0]["seconds"], 4),
        "median_s": round(statistics.median(f["seconds"] for f in later), 4),
        "server_cpu_first_s": round(fetches[0]["server_cpu_s"], 3),
        "server_cpu_per_request_s": round(sum(f["server_cpu_s"] for f in later) / len(later), 4),
        "fetches": fetches,
    }


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--client":
        host, port, requests, pid = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        print(json.dumps(asyncio.run(_client(host, port, requests, int(pid)))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="20000,100000", help="tree sizes, comma-separated")
    parser.add_argument(
        "--repo", action="append", default=[], help="LABEL=CHECKOUT, in the order to run"
    )
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/netopt-bench-manifest"))
    parser.add_argument("--lab", type=Path, help="a lab topology: serve on us-1, fetch on hk-1")
    parser.add_argument("--prefix", help="lab prefix (namespace names)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    repos = [(s.split("=", 1)[0], Path(s.split("=", 1)[1]).resolve()) for s in args.repo]
    repos = repos or [("this", REPO)]
    args.work_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []

    def run_all(lab: Any | None) -> None:
        for count in (int(n) for n in args.files.split(",")):
            src = args.work_dir / f"src-small-{count}"
            marker = args.work_dir / f"{src.name}.complete"
            if not marker.exists():
                src.mkdir(parents=True, exist_ok=True)
                build_small(src, count)
                marker.write_text("")
            for label, repo in repos:
                row = run_one(label, repo, src, args, lab)
                rows.append(row)
                print(
                    f"{count:7d} files {label:6s} json {row['json_bytes'] / 1e6:6.2f} MB  "
                    f"wire {row['wire_bytes'] / 1e6:6.2f} MB  first {row['first_s']:6.3f} s  "
                    f"median {row['median_s']:6.3f} s  server CPU first "
                    f"{row['server_cpu_first_s']:5.2f} s, then "
                    f"{row['server_cpu_per_request_s']:5.3f} s/request",
                    flush=True,
                )

    if args.lab is not None:
        from netopt.lab import Lab

        with Lab.start(str(args.lab), prefix=args.prefix) as lab:
            run_all(lab)
    else:
        run_all(None)
    print(f"load {Path('/proc/loadavg').read_text().strip()}")
    if args.json_out is not None:
        doc = {"lab": str(args.lab) if args.lab else None, "rows": rows}
        args.json_out.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
