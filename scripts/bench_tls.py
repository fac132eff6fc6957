"""The cost of TLS on the data plane: one sync, TLS off and on, same run (loopback or the lab).

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

With ``--lab`` (root) it measures the TLS goal's figure instead: the lab's border link
(``--topology``, default configs/lab/bench-transfer.yaml: 100 Mbit/s, 80 ms RTT, 1%
loss each way), ``netopt serve`` on us-1 (bbr, one compression thread, as in
bench_transfer.py) and ``netopt sync`` on hk-1 with the link's figures for the plan,
for each corpus kind of ``--data`` (scripts/corpus.py: ``jsonl`` is compressible real
text, so the server's CPU includes zstd; ``random`` is not). Per kind it first runs
``iperf3 -P 8 -R`` (the link's TCP limit), then ``--runs`` rounds of plain and TLS
back to back, and reports the median per mode: dataset Mbit/s, the link's wire
Mbit/s (IP bytes, from the relay's counters) and its share of iperf3's rate, the
client's and the server's CPU seconds per GB of dataset, and TLS over plain for each.

    sudo .venv/bin/python scripts/bench_tls.py --lab --data random,jsonl --size-mib 200 \
        --runs 3 --prefix nltls --out bench-tls-lab.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "scripts"))

from netopt.tlsca import ServerFiles, issue_server_files  # noqa: E402

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


LAB_PORT = 7470
IPERF_PORT = 5201


def _lab_iperf3(lab: Any, seconds: int) -> float:
    """``iperf3 -P 8 -R`` hk-1 <- us-1: Mbit/s received."""
    from bench_transfer import stop, wait_port

    server = lab.popen("us-1", ["iperf3", "-s", "-p", str(IPERF_PORT), "-1"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_port(lab, "us-1", IPERF_PORT)
        out = lab.exec("hk-1", ["iperf3", "-c", lab.address("us-1"), "-p", str(IPERF_PORT),
                                "-P", "8", "-R", "-t", str(seconds), "-J"],
                       timeout_s=seconds + 30).stdout  # fmt: skip
    finally:
        stop(server)
    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"]) / 1e6


def _lab_one_run(
    lab: Any, src: Path, work: Path, tls: bool, pki: ServerFiles,
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """One serve + sync over the lab's link: seconds, wire bytes, CPU of each end, the plan."""
    from bench_transfer import proc_cpu_s, stop, wait_port, wire_bytes

    address = lab.address("us-1")
    env = {**os.environ, "PYTHONPATH": str(REPO), "NETOPT_TOKEN": TOKEN}
    server_tls = pki.server_args() if tls else ["--allow-plaintext"]
    client_tls = pki.client_args() if tls else ["--insecure"]
    level = ["--level", str(args.level)] if args.level is not None else []
    server = lab.popen(
        "us-1",
        _netopt("serve", str(src), "--name", "ds", "--bind", f"{address}:{LAB_PORT}", "--cc",
                "bbr", "--threads", "1", *server_tls),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    dest, cache = work / "dst", work / "cache"
    try:
        wait_port(lab, "us-1", LAB_PORT)
        link = lab.topology.links[0]
        argv = _netopt("sync", f"netopt://{address}:{LAB_PORT}/ds", str(dest), "--json",
                       "--link-rate-mbps", str(link.rate_mbps), "--link-loss",
                       str(link.loss_ratio), "--cache-dir", str(cache), *level,
                       *client_tls)  # fmt: skip
        before_wire = wire_bytes(lab)
        before_server_s = proc_cpu_s(server.pid)
        before = os.times()
        started = time.monotonic()
        client = lab.popen("hk-1", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env)  # fmt: skip
        try:
            out, err = client.communicate(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            stop(client)
            raise RuntimeError(f"sync ran over {args.timeout_s} s") from None
        wall_s = time.monotonic() - started
        after = os.times()
        server_s = proc_cpu_s(server.pid) - before_server_s
        time.sleep(0.3)  # the relay counts the last packets in flight
        wire = wire_bytes(lab) - before_wire
        if client.returncode != 0:
            raise RuntimeError(f"sync exited {client.returncode}: {err.strip()[-500:]}")
    finally:
        stop(server)
        shutil.rmtree(dest, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    result = json.loads(out)
    plan = result.get("transfer_plan") or result.get("plan") or {}
    if "zstd_level" not in plan:
        print(f"  (no plan in the sync's --json: keys {sorted(result)})", flush=True)
    client_s = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return {"wall_s": wall_s, "wire_bytes": wire, "client_cpu_s": client_s,
            "server_cpu_s": server_s, "zstd_level": plan.get("zstd_level"),
            "streams": plan.get("streams")}  # fmt: skip


def _lab_summary(
    samples: list[dict[str, Any]], size_bytes: int, limit_mbps: float
) -> dict[str, Any]:
    wall_s = statistics.median(s["wall_s"] for s in samples)
    gb = size_bytes / 1e9
    wire_mbps = statistics.median(s["wire_bytes"] * 8 / s["wall_s"] / 1e6 for s in samples)
    return {
        "wall_s": round(wall_s, 2),
        "throughput_mbps": round(size_bytes * 8 / wall_s / 1e6, 1),
        "wire_mbps": round(wire_mbps, 1),
        # The link's use: IP bytes on the wire (relay counters) over iperf3 -P 8's rate.
        "share_of_limit": round(wire_mbps / limit_mbps, 3),
        "client_cpu_s_per_gb": round(statistics.median(s["client_cpu_s"] for s in samples) / gb, 3),
        "server_cpu_s_per_gb": round(statistics.median(s["server_cpu_s"] for s in samples) / gb, 3),
        "zstd_levels": sorted({str(s["zstd_level"]) for s in samples}),
        "streams": sorted({str(s["streams"]) for s in samples}),
        "samples": samples,
    }


def _ratios(plain: dict[str, Any], tls: dict[str, Any]) -> dict[str, float]:
    return {
        "throughput_tls_over_plain": round(tls["throughput_mbps"] / plain["throughput_mbps"], 3),
        "client_cpu_tls_over_plain": round(
            tls["client_cpu_s_per_gb"] / plain["client_cpu_s_per_gb"], 3
        ),
        "server_cpu_tls_over_plain": round(
            tls["server_cpu_s_per_gb"] / plain["server_cpu_s_per_gb"], 3
        ),
    }


def main_lab(args: argparse.Namespace) -> int:
    """The lab mode (see the module's doc)."""
    from corpus import build_corpus

    from netopt.lab import Lab

    if os.geteuid() != 0:
        print("--lab needs root (network namespaces)", file=sys.stderr)
        return 2
    kinds = [k for k in args.data.split(",") if k]
    document: dict[str, Any] = {"topology": args.topology, "size_mib": args.size_mib,
                                "runs": args.runs, "level": args.level, "kinds": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-tls-lab-") as tmp:
        root = Path(tmp)
        corpus_root = Path(args.corpus_dir) if args.corpus_dir else root / "corpus"
        size_mb = args.size_mib * 1024**2 // 1_000_000
        infos = build_corpus(corpus_root, kinds, size_mb, levels=(1, 3))
        with Lab.start(args.topology, prefix=args.prefix) as lab:
            pki = issue_server_files(root, "us-1", ips=[lab.address("us-1")])
            for kind in kinds:
                info = infos[kind]
                limit_mbps = _lab_iperf3(lab, args.iperf_s)
                print(f"{kind}: {info.size_bytes / 1e6:.0f} MB, zstd ratios {info.zstd_ratios};"
                      f" iperf3 -P 8: {limit_mbps:.1f} Mbit/s", flush=True)  # fmt: skip
                runs: dict[str, list[dict[str, Any]]] = {"plain": [], "tls": []}
                for i in range(args.runs):  # interleaved, the order alternating per round
                    for mode in ("plain", "tls") if i % 2 == 0 else ("tls", "plain"):
                        sample = _lab_one_run(lab, info.root, root / "run", mode == "tls", pki,
                                              args)  # fmt: skip
                        runs[mode].append(sample)
                        print(f"  {mode:5} {sample['wall_s']:6.1f} s "
                              f"{info.size_bytes * 8 / sample['wall_s'] / 1e6:6.1f} Mbit/s  "
                              f"client {sample['client_cpu_s']:.2f} s  server "
                              f"{sample['server_cpu_s']:.2f} s CPU  level {sample['zstd_level']}",
                              flush=True)  # fmt: skip
                results = {m: _lab_summary(s, info.size_bytes, limit_mbps) for m, s in runs.items()}
                load = [round(x, 2) for x in os.getloadavg()]
                ratio = _ratios(results["plain"], results["tls"])
                document["kinds"][kind] = {"size_bytes": info.size_bytes,
                                           "zstd_ratios": info.zstd_ratios,
                                           "iperf3_mbps": round(limit_mbps, 1),
                                           "loadavg_after": load,
                                           "results": results, **ratio}  # fmt: skip
                print(f"{'mode':<6} {'Mbit/s':>7} {'share':>6} {'wire':>6} "
                      f"{'client s/GB':>12} {'server s/GB':>12}")  # fmt: skip
                for mode, r in results.items():
                    print(f"{mode:<6} {r['throughput_mbps']:>7.1f} {r['share_of_limit']:>6.3f} "
                          f"{r['wire_mbps']:>6.1f} {r['client_cpu_s_per_gb']:>12.3f} "
                          f"{r['server_cpu_s_per_gb']:>12.3f}")  # fmt: skip
                print(json.dumps({**ratio, "loadavg_after": load}), flush=True)
    Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="bench_tls.json")
    parser.add_argument("--lab", action="store_true", help="over the lab's border link (root)")
    parser.add_argument("--topology", default=str(REPO / "configs/lab/bench-transfer.yaml"))
    parser.add_argument("--prefix", default=None, help="the lab's prefix (default: a random one)")
    parser.add_argument("--data", default="random,jsonl", help="--lab: corpus kinds")
    parser.add_argument("--corpus-dir", default=None, help="--lab: build or reuse the corpus here")
    parser.add_argument("--level", type=int, default=None, help="--lab: zstd level (default: plan)")
    parser.add_argument("--iperf-s", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="--lab: per sync")
    args = parser.parse_args()
    if args.lab:
        return main_lab(args)
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        root = Path(tmp)
        pki = issue_server_files(root, "bench", ips=["127.0.0.1"])
        src = root / "src"
        src.mkdir()
        size_bytes = args.size_mib * 1024**2
        with (src / "data.bin").open("wb") as f:
            for _ in range(args.size_mib):
                f.write(os.urandom(1024**2))
        modes = {
            "plain": ([], []),
            "tls": (pki.server_args(), pki.client_args()),
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
