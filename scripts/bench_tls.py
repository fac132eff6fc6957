"""The cost of TLS on the data plane: one sync on loopback, TLS off and on, same run.

Makes a cluster CA and a node certificate with ``netopt tls`` machinery, writes
``--size-mib`` of random (incompressible) data, then for each mode runs
``python -m netopt serve`` and ``python -m netopt sync --level 0`` (fresh cache and
destination per run) as subprocesses and reports, per mode (median of ``--runs``):
the sync's wall time and throughput (Mbit/s of dataset bytes), and the CPU seconds
per GB moved on each end (the server from /proc/PID/stat utime+stime over the sync,
the client from its rusage). Loopback has no link limit: the throughput is what the
CPU allows, so this is the upper bound of TLS's cost, not its share of a 100 Mbit/s
border (the lab benchmark measures that).

    .venv/bin/python scripts/bench_tls.py [--size-mib 256] [--runs 3] [--out bench_tls.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from netopt.tlsca import issue_cert, make_ca, node_files, write_files  # noqa: E402

TOKEN = "bench-tls-token-0123456789"  # noqa: S105 - a throwaway for loopback
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _netopt(*args: str) -> list[str]:
    return [sys.executable, "-m", "netopt", *args]


def _one_run(
    root: Path, src: Path, tls: list[str], client_tls: list[str], i: int
) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NETOPT_TOKEN": TOKEN}
    server = subprocess.Popen(
        _netopt("serve", str(src), "--name", "ds", "--bind", "127.0.0.1:0", "--cc", "default",
                "--threads", "2", *tls),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline().decode()
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        before_server_s = _cpu_s(server.pid)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        subprocess.run(
            _netopt("sync", f"netopt://127.0.0.1:{port}/ds", str(root / f"dst{i}"), "--json",
                    "--level", "0", "--cc", "default", "--cache-dir", str(root / f"cache{i}"),
                    *client_tls),
            check=True, stdout=subprocess.DEVNULL, env=env, timeout=600,
        )  # fmt: skip
        wall_s = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_s = _cpu_s(server.pid) - before_server_s
    finally:
        server.terminate()
        server.wait(20)
        if server.stdout is not None:
            server.stdout.close()
    client_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall_s, "client_cpu_s": client_s, "server_cpu_s": server_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="bench_tls.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        root = Path(tmp)
        now = dt.datetime.now(dt.UTC)
        ca = make_ca("bench CA", now)
        node = issue_cert(ca, "bench", now, ips=["127.0.0.1"])
        cert, key = node_files(root, "bench")
        write_files({root / "ca.pem": ca.cert_pem, cert: node.cert_pem, key: node.key_pem},
                    force=False)  # fmt: skip
        src = root / "src"
        src.mkdir()
        size_bytes = args.size_mib * 1024**2
        with (src / "data.bin").open("wb") as f:
            for _ in range(args.size_mib):
                f.write(os.urandom(1024**2))
        modes = {
            "plain": ([], []),
            "tls": (["--tls-cert", str(cert), "--tls-key", str(key)],
                    ["--tls-ca", str(root / "ca.pem")]),
        }  # fmt: skip
        results: dict[str, dict[str, float]] = {}
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        run_id = 0
        for _ in range(args.runs):  # interleaved: both modes see the same machine load
            for mode, (server_tls, client_tls) in modes.items():
                runs[mode].append(_one_run(root, src, server_tls, client_tls, run_id))
                run_id += 1
        gb = size_bytes / 1e9
        for mode, samples in runs.items():
            wall_s = statistics.median(s["wall_s"] for s in samples)
            results[mode] = {
                "wall_s": round(wall_s, 3),
                "throughput_mbps": round(size_bytes * 8 / wall_s / 1e6, 1),
                "client_cpu_s_per_gb": round(
                    statistics.median(s["client_cpu_s"] for s in samples) / gb, 3
                ),
                "server_cpu_s_per_gb": round(
                    statistics.median(s["server_cpu_s"] for s in samples) / gb, 3
                ),
            }
    plain, tls = results["plain"], results["tls"]
    ratio = {
        "throughput_tls_over_plain": round(tls["throughput_mbps"] / plain["throughput_mbps"], 3),
        "client_cpu_tls_over_plain": round(
            tls["client_cpu_s_per_gb"] / plain["client_cpu_s_per_gb"], 3
        ),
        "server_cpu_tls_over_plain": round(
            tls["server_cpu_s_per_gb"] / plain["server_cpu_s_per_gb"], 3
        ),
    }
    print(
        f"{'mode':<6} {'wall s':>8} {'Mbit/s':>9} {'client CPU s/GB':>16} {'server CPU s/GB':>16}"
    )
    for mode, r in results.items():
        print(f"{mode:<6} {r['wall_s']:>8.2f} {r['throughput_mbps']:>9.1f} "
              f"{r['client_cpu_s_per_gb']:>16.3f} {r['server_cpu_s_per_gb']:>16.3f}")  # fmt: skip
    print(json.dumps(ratio))
    document = {"size_mib": args.size_mib, "runs": args.runs, "results": results, **ratio}
    Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
