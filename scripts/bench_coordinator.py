"""Ingest load on the coordinator: simulated agents posting summary batches on loopback.

Starts ``python -m netopt coordinator`` as a subprocess (pinned to one core when
the machine has two or more; the load generator runs on another), registers
``--agents`` agents, then every agent posts one batch of
``--summaries-per-batch`` link summaries every ``--interval-s`` seconds (random
phase), each agent over its own keep-alive connection, for ``--duration-s``.

Reports ingest latency (client side, request sent to answer read) p50/p90/p99/
max, the achieved rate, errors, the coordinator's CPU (utime+stime from
/proc/PID/stat over the measured period, all its threads, as % of one core) and
its RSS; then checks every acknowledged summary is in the link matrix, and times
one ``GET /api/v1/links`` over the whole run.

The load generator shares the machine: its own CPU (% of one core), its own
event-loop stalls (the longest delay of a 5 ms timer, and the longest garbage
collection, during the measured period: time the client, not the coordinator,
adds to the latencies) and the machine's CPU pressure (``/proc/pressure/cpu``
"some", % of the measured time that runnable tasks waited for a CPU) are
reported too. With a high pressure the latencies say more about the machine than
about the coordinator: compare runs only at similar pressure. The load
generator's collector is off while measuring (a thousand real agents are a
thousand small heaps, not one large one).
Goal: p99 under 50 ms on one core at 1,000 agents / 5 s.

``--scenario restart-storm`` instead registers the fleet, SIGKILLs
the coordinator and starts a fresh one on an empty database: every agent, at
the random heartbeat phase the daemon gives it, is answered 404, registers
again and replays ``--spool-batches`` spooled batches (``--lockstep``: all at
the same phase, as the daemon did before). See ``bench_restart_storm.py``.

``--database postgresql://USER@HOST:PORT/DB`` runs the steady load on
a PostgreSQL store (the password from ``PGPASSWORD``; the database should be
empty) instead of a SQLite file, and reports PostgreSQL's CPU too (every process
named ``postgres`` on this machine, % of one core; only meaningful for a server
on loopback). ``--replicas 2`` starts two coordinators on it, agent i talking to
replica i mod 2; the CPU and RSS reported are the replicas' sum. The JSON report also
gives ``cpu_ms_per_batch`` and ``batches_per_transaction`` (group commit: under CPU
pressure latency grows, batches share transactions and each costs less CPU, so compare
CPU per batch only at similar groups).

    .venv/bin/python scripts/bench_coordinator.py [--agents 1000] [--interval-s 5]
        [--duration-s 30] [--summaries-per-batch 8] [--out bench_coordinator.json]
        [--scenario steady|restart-storm] [--spool-batches 6] [--lockstep] [--tls]
        [--database postgresql://USER@HOST:PORT/DB [--replicas 2]] [--ingest-linger-s 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from bench_restart_storm import print_storm, storm, storm_report

from netopt.cli.output import print_table
from netopt.percentile import percentile
from netopt.tlsca import issue_cert, make_ca, node_files, write_files

TOKEN = "bench-coordinator-token-0123456789"  # noqa: S105 - a throwaway test token
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOAL_P99_MS = 50.0
REGIONS = ("hk", "sg", "us", "cn")
_CPUS = sorted(os.sched_getaffinity(0))  # before any pinning


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _postgres_cpu_s() -> float:
    """CPU seconds of every process named ``postgres`` (a loopback server's backends)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended meanwhile
            continue
        if text.split(" (", 1)[1].startswith("postgres)"):
            fields = text.rsplit(") ", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_pressure_us() -> float | None:
    """Total microseconds some runnable task waited for a CPU (PSI), if the kernel has PSI."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None
    return float(some.rsplit("total=", 1)[1])


class _ClientStalls:
    """The load generator's own pauses: event-loop lag and garbage collections (ms)."""

    def __init__(self) -> None:
        self.loop_lag_max_ms = 0.0
        self.gc_max_ms = 0.0
        self._gc_started = 0.0

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_max_ms = max(self.gc_max_ms, (time.perf_counter() - self._gc_started) * 1000)

    async def watch_loop(self, tick_s: float = 0.005) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(tick_s)
            lag_ms = (time.perf_counter() - asked - tick_s) * 1000
            self.loop_lag_max_ms = max(self.loop_lag_max_ms, lag_ms)


def _agent_address(i: int) -> str:
    """Agent ``i``'s loopback source address (127.1.0.1, 127.1.0.2, ...; all of 127/8 is
    loopback on Linux)."""
    return f"127.1.{i // 250}.{i % 250 + 1}"


def _node(i: int) -> tuple[str, str]:
    region = REGIONS[i % len(REGIONS)]
    return f"{region}-{i:04d}", region


def _batch(src: int, seq: int, per_batch: int, agents: int, now_s: float) -> dict[str, Any]:
    rng = random.Random(src * 1_000_003 + seq)
    summaries = []
    for k in range(per_batch):
        dst = _node((src + 1 + k * 7) % agents)[0]
        rtt = rng.uniform(0.2, 200.0)
        lost = rng.randint(0, 3)
        summaries.append({
            "src": _node(src)[0], "dst": dst, "taken_at_s": now_s, "window_s": 5.0,
            "method": "udp", "probes_sent": 100, "probes_received": 100 - lost,
            "rtt_ms": {"min": rtt * 0.95, "mean": rtt, "p50": rtt, "p90": rtt * 1.05,
                       "p99": rtt * 1.2, "max": rtt * 1.3},
            "jitter_ms": rtt / 50, "loss_ratio": lost / 100,
            "loss_ratio_ci95": [0.0, min(1.0, lost / 100 + 0.04)],
            "reordered_count": 0, "duplicate_count": 0, "late_count": 0, "outages": [],
        })  # fmt: skip
    return {"batch_id": f"s{seq}", "summaries": summaries}


_CLIENT_SSL: ssl.SSLContext | bool = False
"""--tls: the clients' context (the bench's own CA); plain HTTP otherwise."""


def _session(
    limit: int = 100, local_addr: tuple[str, int] | None = None, **kwargs: Any
) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=limit, ssl=_CLIENT_SSL, local_addr=local_addr)
    return aiohttp.ClientSession(connector=connector, **kwargs)


def _tls_files(tmp: str) -> str:
    """A CA and a 127.0.0.1 certificate for --tls; the coordinator's ``tls:`` line."""
    global _CLIENT_SSL
    now = dt.datetime.now(dt.UTC)
    ca = make_ca("bench CA", now)
    pair = issue_cert(ca, "coordinator", now, ips=["127.0.0.1"])
    cert, key = node_files(Path(tmp), "coordinator")
    write_files({Path(tmp, "ca.pem"): ca.cert_pem, cert: pair.cert_pem, key: pair.key_pem},
                force=False)  # fmt: skip
    _CLIENT_SSL = ssl.create_default_context(cafile=str(Path(tmp, "ca.pem")))
    return f"tls: {{cert: {cert}, key: {key}}}\n"


async def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    async with _session() as session:
        for _ in range(300):
            if proc.poll() is not None:
                raise SystemExit("coordinator exited during start")
            try:
                async with session.get(url + "/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit("coordinator did not start")


def _registration(i: int) -> dict[str, Any]:
    name, region = _node(i)
    return {"node": name, "region": region, "netopt_version": "0.1.0", "cpu_count": 32,
            "advertise_host": "127.0.0.1", "nics": [{"name": "eth0", "mtu": 1500}]}  # fmt: skip


async def _register(i: int, session: aiohttp.ClientSession, url: str) -> None:
    async with session.post(url + "/api/v1/agents/register", json=_registration(i)) as response:
        assert response.status == 200, await response.text()


async def _register_all(urls: list[str], sessions: list[aiohttp.ClientSession]) -> None:
    """Register agent ``i`` over ``sessions[i]`` with the replica ``urls[i % len(urls)]``
    it reports to (as an agent registers with the first replica that answers), 50 at a
    time."""
    limit = asyncio.Semaphore(50)

    async def register(i: int) -> None:
        async with limit:
            await _register(i, sessions[i], urls[i % len(urls)])

    await asyncio.gather(*(register(i) for i in range(len(sessions))))


async def _register_fleet(url: str, agents: int) -> None:
    async with _session(headers=AUTH) as session:
        await _register_all([url], [session] * agents)


async def _agent(
    i: int,
    session: aiohttp.ClientSession,
    url: str,
    args: argparse.Namespace,
    start_s: float,
    stop_s: float,
    out: dict[str, Any],
) -> None:
    name = _node(i)[0]
    next_s = start_s + random.uniform(0, args.interval_s)
    seq = 0
    while True:
        await asyncio.sleep(max(0.0, next_s - time.time()))
        if time.time() >= stop_s:
            return
        body = json.dumps(_batch(i, seq, args.summaries_per_batch, args.agents, time.time()))
        sent = time.perf_counter()
        try:
            async with session.post(
                f"{url}/api/v1/agents/{name}/summaries",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as response:
                answer = await response.json()
                ok = response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        out["latency_ms"].append((time.perf_counter() - sent) * 1000)
        if ok and not answer["duplicate"]:
            out["stored"] += answer["accepted"]
        else:
            out["errors"] += 1
        seq += 1
        next_s += args.interval_s


async def _load(urls: list[str], pids: list[int], args: argparse.Namespace) -> dict[str, Any]:
    url = urls[0]
    out: dict[str, Any] = {"latency_ms": [], "stored": 0, "errors": 0}
    timeout = aiohttp.ClientTimeout(total=60)
    # One session (so one keep-alive connection) per agent, as real agents have, each from
    # its own loopback address: real agents are many hosts, and the coordinator's listener
    # holds at most 128 connections per address (webshell.ListenerLimits).
    sessions = [
        _session(limit=1, local_addr=(_agent_address(i), 0), timeout=timeout, headers=AUTH)
        for i in range(args.agents)
    ]
    try:
        registering = time.monotonic()
        await _register_all(urls, sessions)
        out["register_all_s"] = time.monotonic() - registering
        await asyncio.sleep(2.0)  # let the plan for the full fleet settle
        # A real fleet is a thousand small processes; this one process holds all their
        # sessions and tasks, and its collections (120 ms full, 35-60 ms middle ones
        # measured) stalled every answer in flight: time counted as coordinator latency.
        # Its collector stays off while measuring (a 30-300 s run's garbage fits in RAM).
        gc.collect()
        gc.freeze()
        gc.disable()
        stalls = _ClientStalls()
        gc.callbacks.append(stalls.on_gc)
        watcher = asyncio.create_task(stalls.watch_loop())
        start_s = time.time() + 0.5
        stop_s = start_s + args.duration_s
        tasks = [
            asyncio.create_task(
                _agent(i, sessions[i], urls[i % len(urls)], args, start_s, stop_s, out)
            )
            for i in range(args.agents)
        ]
        each0, wall0 = list(map(_cpu_s, pids)), time.monotonic()
        client0, pressure0 = time.process_time(), _cpu_pressure_us()
        pg0 = _postgres_cpu_s() if args.database else 0.0
        await asyncio.gather(*tasks)
        each1, wall1 = list(map(_cpu_s, pids)), time.monotonic()
        client1, pressure1 = time.process_time(), _cpu_pressure_us()
        pg1 = _postgres_cpu_s() if args.database else 0.0
        watcher.cancel()
        gc.callbacks.remove(stalls.on_gc)
        out["client_loop_lag_max_ms"] = stalls.loop_lag_max_ms
        out["client_gc_max_ms"] = stalls.gc_max_ms
    finally:
        gc.enable()
        await asyncio.gather(*(s.close() for s in sessions))
    out["cpu_pct_of_one_core"] = 100 * (sum(each1) - sum(each0)) / (wall1 - wall0)
    out["cpu_pct_per_replica"] = [
        100 * (after - before) / (wall1 - wall0) for before, after in zip(each0, each1, strict=True)
    ]
    out["postgres_cpu_pct_of_one_core"] = (
        100 * (pg1 - pg0) / (wall1 - wall0) if args.database else None
    )
    out["client_cpu_pct_of_one_core"] = 100 * (client1 - client0) / (wall1 - wall0)
    out["machine_cpu_pressure_pct"] = (
        None
        if pressure0 is None or pressure1 is None
        else (pressure1 - pressure0) / 1e6 / (wall1 - wall0) * 100
    )
    out["measured_s"] = wall1 - wall0
    out["rss_mb"] = sum(map(_rss_mb, pids))
    warmup_s = 60.0
    async with _session(headers=AUTH) as session:
        window = int(args.duration_s + warmup_s + 60)
        asked = time.perf_counter()
        async with session.get(f"{url}/api/v1/links?window_s={window}") as response:
            links = (await response.json())["links"]
        out["links_query_ms"] = (time.perf_counter() - asked) * 1000
        replica_metrics = []
        for each in urls:
            async with session.get(f"{each}/metrics") as response:
                replica_metrics.append(await response.text())
    out["matrix_summaries"] = sum(link["summary_count"] for link in links)
    out["server"] = _server_side(replica_metrics[0])
    # Group commit: batches arriving together share a transaction, so the CPU a batch costs
    # falls as latency (and so the groups) grow: compare CPU per batch at similar groups.
    transactions = sum(map(_ingest_transactions, replica_metrics))
    out["ingest_transactions"] = transactions
    out["batches_per_transaction"] = len(out["latency_ms"]) / transactions if transactions else None
    return out


def _ingest_transactions(metrics: str) -> int:
    """Ingest transactions since the start (the store latency histogram's count)."""
    for line in metrics.splitlines():
        if line.startswith("netopt_coordinator_store_duration_seconds_count") and (
            'operation="ingest"' in line
        ):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _server_side(metrics: str) -> dict[str, float | None]:
    """Mean and p99 (bucket upper bound) of the handler time, from the coordinator's /metrics."""
    route = 'route="/api/v1/agents/{node}/summaries"'
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in metrics.splitlines():
        if route not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("netopt_coordinator_request_duration_seconds_bucket"):
            bound = name.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if bound == "+Inf" else float(bound), float(value)))
        elif name.startswith("netopt_coordinator_request_duration_seconds_sum"):
            total = float(value)
        elif name.startswith("netopt_coordinator_request_duration_seconds_count"):
            count = float(value)
    p99 = next((b for b, c in sorted(buckets) if count and c >= 0.99 * count), None)
    return {
        "handler_mean_ms": 1000 * total / count if count else None,
        "handler_p99_le_ms": None if p99 is None else 1000 * p99,
    }


def _start_coordinator(
    tmp: str,
    port: int,
    database: str,
    pin: bool,
    tls_yaml: str = "",
    core: int = 0,
    linger_s: float = 0.0,
) -> subprocess.Popen[bytes]:
    """A coordinator on ``database``: a file name in ``tmp``, or a postgresql:// URL.

    ``pin``: the coordinator runs on core ``_CPUS[core]`` and this process on the others
    (when ``core`` is not 0, on every core: two replicas then hold both cores of a
    2-core machine and the load generator goes where the scheduler puts it).
    """
    where = database if "://" in database else f"{tmp}/{database}"
    config = Path(tmp, f"coordinator-{port}.yaml" if "://" in database else f"{database}.yaml")
    config.write_text(
        f"kind: coordinator\nlisten: {{host: 127.0.0.1, port: {port}}}\ntoken: {TOKEN}\n"
        f"database: {where}\nstale_after_s: 60\ningest_linger_s: {linger_s}\n{tls_yaml}"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "netopt", "coordinator", "--config", str(config)],
        stderr=None if os.environ.get("BENCH_COORDINATOR_LOG") else subprocess.DEVNULL,
    )
    if pin:
        os.sched_setaffinity(proc.pid, {_CPUS[core % len(_CPUS)]})
        os.sched_setaffinity(0, set(_CPUS[1:]) if core == 0 else set(_CPUS))
    return proc


def _restart_storm(args: argparse.Namespace, pin: bool) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = _start_coordinator(tmp, port, "first.db", pin)
        try:
            asyncio.run(_wait_ready(url, proc))
            asyncio.run(_register_fleet(url, args.agents))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        proc = _start_coordinator(tmp, port, "second.db", pin)  # the registry is lost
        try:
            asyncio.run(_wait_ready(url, proc))

            def batch(i: int, seq: int) -> dict[str, Any]:
                return _batch(i, seq, args.summaries_per_batch, args.agents, time.time())

            result = asyncio.run(storm(url, args, _node, _registration, batch, AUTH))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    report = storm_report(args, result)
    report["coordinator_pinned_to_one_core"] = pin
    report["all_stored"] = report["stored"] == report["expected_stored"]
    print_storm(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["errors"] == 0 and report["all_stored"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--interval-s", type=float, default=5.0)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--summaries-per-batch", type=int, default=8)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-pin", action="store_true", help="Do not pin to separate cores.")
    parser.add_argument(
        "--pin-replicas",
        choices=("one-core", "separate"),
        default="one-core",
        help="With --replicas 2+: all replicas on the first core (the load generator on"
        " the others), or replica i on core i (the load generator unpinned).",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="The coordinator listens over TLS (a CA made here); steady only.",
    )
    parser.add_argument("--scenario", choices=("steady", "restart-storm"), default="steady")
    parser.add_argument("--spool-batches", type=int, default=6,
                        help="restart-storm: batches each agent replays")  # fmt: skip
    parser.add_argument("--lockstep", action="store_true",
                        help="restart-storm: all agents at one phase (the old daemon)")  # fmt: skip
    parser.add_argument("--database", help="steady: a postgresql:// URL instead of SQLite")
    parser.add_argument("--ingest-linger-s", type=float, default=0.0,
                        help="steady: the coordinators' ingest_linger_s")  # fmt: skip
    parser.add_argument("--replicas", type=int, default=1,
                        help="steady, with --database: coordinators sharing it")  # fmt: skip
    args = parser.parse_args()
    if not 1 <= args.replicas <= 4 or (args.replicas > 1 and not args.database):
        parser.error("--replicas must be 1..4, and more than 1 needs --database")
    if args.database and not args.database.startswith(("postgresql://", "postgres://")):
        parser.error("--database must be a postgresql:// URL (the default is a SQLite file)")
    if not (1 <= args.agents <= 5000 and 1 <= args.duration_s <= 300):
        parser.error("--agents must be 1..5000 and --duration-s 1..300")
    if not 0 <= args.spool_batches <= 100:
        parser.error("--spool-batches must be 0..100")
    if args.tls and args.scenario != "steady":
        parser.error("--tls: the steady scenario only")
    pin = len(_CPUS) >= 2 and not args.no_pin
    if args.scenario == "restart-storm":
        return _restart_storm(args, pin)
    with tempfile.TemporaryDirectory(prefix="bench-coordinator-") as tmp:
        procs: list[subprocess.Popen[bytes]] = []
        urls: list[str] = []
        tls_yaml = _tls_files(tmp) if args.tls else ""
        scheme = "https" if args.tls else "http"
        try:
            for index in range(args.replicas):
                port = _free_port()
                database = args.database or "coordinator.db"
                core = index if args.pin_replicas == "separate" else 0
                procs.append(_start_coordinator(tmp, port, database, pin, tls_yaml, core,
                                                args.ingest_linger_s))  # fmt: skip
                urls.append(f"{scheme}://127.0.0.1:{port}")
                asyncio.run(_wait_ready(urls[-1], procs[-1]))
            result = asyncio.run(_load(urls, [p.pid for p in procs], args))
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=30)
    lat = sorted(result.pop("latency_ms"))
    report = {
        "agents": args.agents,
        "tls": args.tls,
        "interval_s": args.interval_s,
        "duration_s": args.duration_s,
        "summaries_per_batch": args.summaries_per_batch,
        "coordinator_pinned_to_one_core": pin,
        "pin_replicas": args.pin_replicas if pin else "none",
        "store": "postgresql" if args.database else "sqlite",
        "replicas": args.replicas,
        "ingest_linger_s": args.ingest_linger_s,
        "batches": len(lat),
        "batches_per_s": len(lat) / args.duration_s,
        "latency_ms": {q: percentile(lat, p) for q, p in (("p50", 50), ("p90", 90), ("p99", 99))}
        | {"max": lat[-1]},
        **result,
        "goal_p99_ms": GOAL_P99_MS,
    }
    report["cpu_ms_per_batch"] = (
        result["cpu_pct_of_one_core"] * 10 * result["measured_s"] / len(lat) if lat else None
    )
    report["goal_met"] = report["latency_ms"]["p99"] < GOAL_P99_MS and result["errors"] == 0
    report["all_stored"] = result["matrix_summaries"] == result["stored"]
    lm = report["latency_ms"]
    print_table(
        "coordinator ingest",
        ["agents", "batch/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "server mean ms",
         "server p99 <= ms", "errors", "CPU %", "client CPU %", "client lag max ms",
         "client GC max ms", "CPU pressure %", "postgres CPU %", "RSS MB",
         "links ms", "stored ok", "goal"],
        [[args.agents, report["batches_per_s"], lm["p50"], lm["p90"], lm["p99"], lm["max"],
          result["server"]["handler_mean_ms"], result["server"]["handler_p99_le_ms"],
          result["errors"], result["cpu_pct_of_one_core"], result["client_cpu_pct_of_one_core"],
          result["client_loop_lag_max_ms"], result["client_gc_max_ms"],
          result["machine_cpu_pressure_pct"], result["postgres_cpu_pct_of_one_core"],
          result["rss_mb"], result["links_query_ms"],
          report["all_stored"], report["goal_met"]]],
    )  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["goal_met"] and report["all_stored"] else 1


if __name__ == "__main__":
    sys.exit(main())
