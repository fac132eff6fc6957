#!/usr/bin/env python3
"""Benchmark netopt's data plane against curl, aria2c, rclone, rsync and iperf3 on the lab link.

    sudo .venv/bin/python scripts/bench_transfer.py --size-mb 50
    sudo .venv/bin/python scripts/bench_transfer.py --topology configs/lab/bench-limit.yaml \
        --data packages,images,parquet,tokens,jsonl,random,smallfiles --corpus-dir /var/tmp/corpus

Builds the lab in --topology (default configs/lab/bench-transfer.yaml, hk <-> us:
100 Mbit/s, 80 ms RTT, 1% loss each way; configs/lab/bench-limit.yaml is the goals'
80 Mbit/s, 140 ms RTT, 1% loss), builds the corpus kinds named by --data from real
files of this machine (scripts/corpus.py; --size-mb each) and fetches each kind,
a directory, from us-1 to hk-1 with every tool, once with the nodes' default
congestion control left at bbr and once with reno (loss-based; a namespace cannot
default to cubic: `tcp_allowed_congestion_control` is `reno bbr`). netopt's server
sets bbr on its own sockets in both modes: that is the point of comparing against the
tools' default. netopt's server and client speak TLS (a throwaway cluster CA, the
server's certificate for us-1's address) with a token, as users run them; ``--plaintext``
drops both (scripts/bench_tls.py measures what TLS costs).

The peers run in their strongest configuration: nginx on us-1 (foreground, a
temp config: ranges, keep-alive, listings) serves curl, ``aria2c -x16 -s16``
(trees: an input file of every URL, ``-j 16``) and ``rclone copy --http-url``
(``--multi-thread-streams 16``, ``--transfers 16``; ``--http-no-head`` on trees of
small files); an rsync daemon serves ``rsync -a -z --compress-choice=zstd``; curl
fetches a tree with one process, the URLs in sequence over one connection. The tool
``netopt-web`` is netopt syncing that same nginx listing (a web origin without a netopt
server: crawled, downloaded and chunked on hk-1), side by side with the peers that
read it.

Per run: seconds, effective (logical) Mbit/s, share of the kind's limit (the same
mode's ``iperf3 -P8`` x the kind's best zstd ratio among --limit-levels; iperf3
alone for an incompressible kind), bytes on the wire (IP bytes us -> hk from the
lab's relay counters), CPU seconds (client + server) and, for netopt, the plan's
predicted time and its error; beside it the cold-start floor: ``iperf3 -P8 -R -n``
moving the kind's bytes at its best ratio over fresh connections (what a perfect
compressor would send, from slow start), and each tool's seconds against it. A
summary per kind and mode sets netopt's share
against the goal (0.85; 0.95 incompressible; 0.7 for smallfiles) and the
best peer. Every run is bounded by --timeout-s; a run cut short reports its rate
from the bytes that did arrive (status "timeout"). Needs root.

With ``--precompress LEVEL`` a second netopt origin, ``netopt-pre``, first
publishes the dataset (``netopt serve --precompress LEVEL``: every chunk compressed
once at that level, ``--precompress-chunk-mib`` chunks) and then serves the stored
frames; the publish time is reported apart from the transfer times (it is paid
once per dataset version, not per transfer).
"""

from __future__ import annotations

import argparse
import itertools
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
from urllib.parse import quote

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import KINDS, RATIO_LEVELS, KindInfo, build_corpus, print_kinds

from netopt.fsutil import syncfs
from netopt.lab import Lab
from netopt.tlsca import ServerFiles, issue_server_files

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = REPO / "configs" / "lab" / "bench-transfer.yaml"
TOOLS = ("iperf3", "netopt", "netopt-web", "curl", "aria2c", "rclone", "rsync")
FLOOR_RTTS = 3
"""Round trips before any TCP tool's first byte: the handshake, the request, the answer's
first byte (TLS adds one; netopt's run counts it)."""
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
    exit_code: int | None = 0
    complete: bool = True
    """Every byte of the kind arrived."""
    plan_rtt_ms: float | None = None
    """The RTT netopt's plan used, when its JSON says."""
    plan_reasons: list[str] | None = None
    """The plan's reasons (level, streams, bottleneck, fixed costs), when its JSON says."""
    limit_mbps: float | None = None
    """iperf3 -P8 of the same mode x the kind's best zstd ratio (iperf3 alone if incompressible)."""

    rtt_ms: float = 0.0
    """The link's round trip (the topology's), for `reachable_share`."""
    cold_s: float | None = None
    """Seconds ``iperf3 -P8 -n`` took, over fresh connections, to move the kind's bytes
    at its best ratio (the same mode): the cold-start floor, for `cold_share`."""

    disk_s: float | None = None
    """Seconds `disk_write_s` took to write the kind's files on the destination's
    filesystem, for `floor_share`."""

    @property
    def share(self) -> float | None:
        return self.effective_mbps / self.limit_mbps if self.limit_mbps else None

    @property
    def reachable_share(self) -> float | None:
        """The run's seconds against the fastest any TCP tool could take: the kind's bytes
        at the limit plus `FLOOR_RTTS` round trips (connect, ask, first byte: no tool moves
        a byte sooner). A short transfer on a long link cannot reach ``share`` 1.0: 100 MB
        at 340 Mbit/s is 2.35 s, and three 140 ms round trips add 0.42 s to it."""
        if not self.limit_mbps or not self.seconds:
            return None
        floor_s = self.logical_bytes * 8 / (self.limit_mbps * 1e6) + FLOOR_RTTS * self.rtt_ms / 1e3
        return floor_s / self.seconds

    @property
    def cold_share(self) -> float | None:
        """The cold-start floor (`cold_s`: the bytes a perfect compressor sends, moved by
        iperf3 from slow start) against the run's seconds. A transfer of a few seconds on
        a long, lossy link spends most of them in slow start, which the steady-state
        ``share`` does not count: there 1.0 is out of reach for every tool."""
        if not self.cold_s or not self.seconds:
            return None
        return self.cold_s / self.seconds

    @property
    def floor_share(self) -> float | None:
        """The larger of the two floors (`cold_s`, the link's; `disk_s`, the destination
        filesystem's) against the run's seconds: a tree of many small files is held
        back by creating them, whatever the link."""
        floors = [f for f in (self.cold_s, self.disk_s) if f]
        if not floors or not self.seconds:
            return None
        return max(floors) / self.seconds

    @property
    def status(self) -> str:
        if self.timed_out:
            return "timeout"
        if self.exit_code:
            return f"exit {self.exit_code}"
        return "ok" if self.complete else "missing bytes"

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
) -> tuple[float, int, float, bool, str, float, int | None]:
    """Run ``argv`` on hk-1: seconds, wire bytes, CPU seconds, timed out, stdout, start, rc.

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
    rc = None if timed_out else proc.returncode
    return seconds, wire_bytes(lab) - before_wire, cpu, timed_out, out, start, rc


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


def file_list(info: KindInfo) -> list[str]:
    """The kind's files, relative to its root (one for a single-file kind)."""
    if info.single_file:
        return [info.single_file]
    return sorted(p.relative_to(info.root).as_posix() for p in info.root.rglob("*") if p.is_file())


def nginx_conf(work: Path, root: Path, address: str, port: int) -> Path:
    """A minimal nginx serving ``root`` with ranges and listings, in the foreground. Every
    directory is answered with its listing, also one holding an index.html (the tree of
    packages has one): with nginx's default ``index``, the crawlers (rclone, netopt-web)
    would be shown the page instead and could not find that directory's files."""
    for temp in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (work / temp).mkdir(parents=True, exist_ok=True)
    conf = work / "nginx.conf"
    conf.write_text(
        f"""daemon off;
user root;
worker_processes 2;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  default_type application/octet-stream;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 1000000;
  client_body_temp_path {work}/body;
  proxy_temp_path {work}/proxy;
  fastcgi_temp_path {work}/fastcgi;
  uwsgi_temp_path {work}/uwsgi;
  scgi_temp_path {work}/scgi;
  server {{
    listen {address}:{port};
    root {root};
    index netopt-bench-listings-only;
    autoindex on;
  }}
}}
"""
    )
    return conf


def peer_argv(
    tool: str, info: KindInfo, files: list[str], base_url: str, dest: Path, work: Path
) -> list[str]:
    """Each peer's strongest configuration for fetching ``files`` of ``info``."""
    one = info.single_file
    urls = [f"{base_url}/{quote(f)}" for f in files]
    if tool == "curl":
        if one:
            return ["curl", "-sS", "-o", str(dest / one), urls[0]]
        # One curl for the whole tree: URLs in sequence over one kept-alive connection.
        listing = work / "curl.list"
        listing.write_text(
            "".join(
                f'url = "{u}"\noutput = "{dest / f}"\n' for u, f in zip(urls, files, strict=True)
            )
        )
        return ["curl", "-sS", "--create-dirs", "-K", str(listing)]
    if tool == "aria2c":
        common = [
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
            "--auto-file-renaming=false",
        ]
        if one:
            return [*common, urls[0]]
        listing = work / "aria2c.list"
        listing.write_text("".join(f"{u}\n  out={f}\n" for u, f in zip(urls, files, strict=True)))
        return [*common, "-j", "16", "-i", str(listing)]
    if tool == "rclone":
        (work / "rclone.conf").touch()
        argv = [
            "rclone",
            "copy",
            "--config",
            str(work / "rclone.conf"),
            "-q",
            "--http-url",
            f"{base_url}/",
            "--multi-thread-streams",
            "16",
            # Parts are at least the cutoff: 256 KiB lets a 4 MB+ file use all 16 streams.
            "--multi-thread-cutoff",
            "256k",
            "--transfers",
            "16",
            "--checkers",
            "16",
        ]
        if not one and info.size_bytes / max(1, len(files)) < 4_000_000:
            # Small files: a HEAD per file (sizes for multi-thread) costs an RTT each.
            argv.append("--http-no-head")
        return [*argv, f":http:{one or ''}", str(dest)]
    raise ValueError(tool)


TOKEN = "bench-transfer-token-0123456789"  # noqa: S105 - a throwaway for the lab


def netopt_env(tls: ServerFiles | None) -> dict[str, str]:
    """netopt's server and client environment: the token with TLS, as users run them; none
    in plaintext (the client would refuse to send it in the clear to another host)."""
    env = {k: v for k, v in os.environ.items() if k != "NETOPT_TOKEN"}
    return {**env, "NETOPT_TOKEN": TOKEN} if tls is not None else env


def serve_argv(info: KindInfo, bind: str, tls: ServerFiles | None) -> list[str]:
    """``netopt serve`` of the kind's directory on ``bind``, bbr on its sockets, over TLS
    with the token unless ``tls`` is None (then plaintext, no token)."""
    security = tls.server_args() if tls is not None else ["--no-auth", "--allow-plaintext"]
    return [sys.executable, "-m", "netopt", "serve", str(info.root), "--name", info.kind,
            "--bind", bind, "--cc", "bbr", *security,
            # Server and client share this machine's cores: plan with one for compression.
            "--threads", "1"]  # fmt: skip


def bench_dataset(
    lab: Lab, mode: str, info: KindInfo, out_dir: Path, args: argparse.Namespace
) -> list[Row]:
    srv = lab.address("us-1")
    name = info.kind
    rows: list[Row] = []
    servers: dict[str, subprocess.Popen[Any]] = {}
    out_dir.mkdir(parents=True, exist_ok=True)
    files = file_list(info)
    rsync_conf = out_dir / f"rsyncd-{name}.conf"
    rsync_conf.write_text(
        f"[data]\n  path = {info.root}\n  read only = yes\n  use chroot = no\n"
        "  uid = root\n  gid = root\n"
    )
    null = subprocess.DEVNULL
    nginx_dir = out_dir / f"nginx-{mode}-{name}"
    shutil.rmtree(nginx_dir, ignore_errors=True)
    conf = nginx_conf(nginx_dir, info.root, srv, PORTS["http"])
    servers["nginx"] = lab.popen(
        "us-1", ["nginx", "-c", str(conf), "-p", str(nginx_dir)], stdout=null, stderr=null
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
        "us-1", serve_argv(info, f"{srv}:{PORTS['netopt']}", args.tls), stdout=null,
        stderr=null, env=netopt_env(args.tls),
    )  # fmt: skip
    publish_log = out_dir / f"publish-{mode}-{name}.log"
    if "netopt-pre" in args.tools:
        # The same server, publishing first: every chunk compressed once at a high level
        # (larger chunks compress better), then served as stored frames.
        with publish_log.open("w") as log_file:
            servers["netopt-pre"] = lab.popen(
                "us-1",
                [
                    *serve_argv(info, f"{srv}:{PORTS['netopt-pre']}", args.tls),
                    "--precompress",
                    str(args.precompress),
                    "--chunk-size",
                    str(args.precompress_chunk_mib * 1024 * 1024),
                    "--frames-dir",
                    str(out_dir / "frames"),
                ],
                stdout=null,
                stderr=log_file,
                env=netopt_env(args.tls),
            )
    for peer in ("curl", "aria2c", "rclone", "netopt-web"):
        servers[peer] = servers["nginx"]
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
            clear(dest)
            dest.mkdir(parents=True)
            cache = out_dir / f"{mode}-{name}-cache"
            if tool == "netopt-web":
                # netopt syncing nginx's listing, as from an origin that is a web server:
                # crawled, downloaded and chunked on this side (no netopt server there).
                argv = [sys.executable, "-m", "netopt", "sync", f"http://{srv}:{PORTS['http']}/",
                        str(dest), "--name", name, "--json", "--cache-dir", str(cache)]  # fmt: skip
            elif tool.startswith("netopt"):
                argv = [
                    sys.executable,
                    "-m",
                    "netopt",
                    "sync",
                    f"netopt://{srv}:{PORTS[tool]}/{name}",
                    str(dest),
                    "--json",
                    "--link-rate-mbps",
                    str(args.link_rate_mbps),
                    "--link-loss",
                    str(args.link_loss),
                    # A fresh chunk cache per run: a warm one would measure the disk.
                    "--cache-dir",
                    str(cache),
                    *(args.tls.client_args() if args.tls is not None else []),
                    *args.netopt_args,
                ]
            elif tool == "rsync":
                # Daemon mode, zstd on the wire (rsync >= 3.2), the whole tree in one run.
                src = f"rsync://{srv}:{PORTS['rsync']}/data/{info.single_file or ''}"
                argv = ["rsync", "-a", "-z", "--compress-choice=zstd", src, f"{dest}/"]
            else:
                base = f"http://{srv}:{PORTS['http']}"
                argv = peer_argv(tool, info, files, base, dest, out_dir)
            for attempt in range(args.repeat if tool.startswith("netopt") else 1):
                if attempt:
                    clear(dest, cache)
                    dest.mkdir(parents=True)
                row = _run_tool(lab, tool, argv, servers[tool], (mode, info, dest), args)
                row.publish_s = publish_s if tool == "netopt-pre" else None
                rows.append(row)
            clear(dest, cache)
    finally:
        for proc in {id(p): p for p in servers.values()}.values():
            stop(proc)
    return rows


_retired = itertools.count()


def clear(*paths: Path) -> None:
    """Move ``paths`` aside (renamed beside themselves); the bench's temporary directory,
    removed when every run is done, takes them. Not removed between runs: a removal
    frees the tree's inodes, and ext4 without a journal (this lab's disk) scans past
    inodes freed in the last minute (`recently_deleted`) on every file it creates, in
    kernel time. Writing 100,000 small files took 6-18 s right after such a removal
    and 3 s without one, so whichever tool ran after a removal paid for it. A rename
    frees nothing. The runs' trees stay on disk until the end (a few GB at
    ``--size-mb 100``)."""
    for path in paths:
        if path.exists():
            path.rename(path.with_name(f"{path.name}.retired-{next(_retired)}"))


def arrived_bytes(dest: Path) -> int:
    """Bytes of the files under ``dest`` (netopt's own state left out)."""
    return sum(
        p.stat().st_size
        for p in dest.rglob("*")
        if p.is_file() and not any(part.startswith(".netopt") for part in p.parts)
    )


def _run_tool(
    lab: Lab,
    tool: str,
    argv: list[str],
    server: subprocess.Popen[Any],
    where: tuple[str, KindInfo, Path],
    args: argparse.Namespace,
) -> Row:
    mode, info, dest = where
    name = info.kind
    served = tool.startswith("netopt") and tool != "netopt-web"  # by a netopt server
    env = netopt_env(args.tls) if served else None
    trace_path = dest.parent / f"trace-{mode}-{name}.json"
    if tool.startswith("netopt") and args.trace:  # netopt-web too: its own timeline
        trace_path.unlink(missing_ok=True)
        env = {**netopt_env(args.tls), "NETOPT_TRACE": str(trace_path)}
    server_cpu_before_s = proc_cpu_s(server.pid)
    seconds, wire, cpu, timed_out, out, start, rc = run_client(
        lab, argv, args.timeout_s, server.pid, env
    )
    server_cpu_s = proc_cpu_s(server.pid) - server_cpu_before_s
    got = arrived_bytes(dest)
    logical = min(got, info.size_bytes)
    predicted = internal = plan_rtt = None
    reasons: list[str] | None = None
    if served and not timed_out and rc == 0:
        with_plan = json.loads(out)
        # The cache's sync reports the transfer plan as "transfer_plan".
        plan = with_plan.get("transfer_plan") or with_plan["plan"]
        predicted = float(plan["predicted_time_s"])
        internal = float(with_plan["seconds"])
        # The figures the plan used, each with its source (`link_figures` in --json).
        rtt = with_plan.get("link_figures", {}).get("rtt_ms", {}).get("value")
        plan_rtt = float(rtt) if rtt is not None else None
        reasons = [str(r) for r in plan.get("reasons", [])]
    row = Row(mode, name, tool, seconds, logical, wire, cpu, timed_out, predicted, internal)
    row.exit_code, row.complete, row.plan_rtt_ms = rc, got == info.size_bytes, plan_rtt
    row.plan_reasons = reasons
    if timed_out and tool in ("aria2c", "rsync", "rclone"):
        # Partial files say little for segmented or temp-file downloads: rate from wire.
        row.logical_bytes = wire
    status = "" if row.complete else f"  (incomplete: {row.status})"
    print(
        f"  {mode:5} {name:10} {tool:7} {seconds:7.1f} s {row.effective_mbps:7.1f} Mbit/s"
        f" eff, {row.wire_mbps:6.1f} wire{status}",
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


def bench_iperf3(lab: Lab, mode: str, args: argparse.Namespace, n_bytes: int | None = None) -> Row:
    """``iperf3 -P8 -R`` for ``--iperf-s`` (the steady-state reference), or until
    ``n_bytes`` have moved (``-n``: the cold-start floor of a kind, fresh connections)."""
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
            *(["-t", str(args.iperf_s)] if n_bytes is None else ["-n", str(n_bytes)]),
            "-J",
        ]
        _, wire, cpu, timed_out, out, _, _ = run_client(lab, argv, args.iperf_s + 30, server.pid)
        summed = json.loads(out)["end"]["sum_received"] if not timed_out else {}
        received = int(summed.get("bytes", 0))
        seconds = float(summed.get("seconds", args.iperf_s))
    finally:
        stop(server)
    if n_bytes is not None:
        row = Row(mode, "-", "iperf3 -P8 -n", seconds, received, wire, cpu, timed_out)
        print(f"  {mode:5} iperf3 -P 8 -n {n_bytes}: {seconds:.2f} s", flush=True)
        return row
    row = Row(mode, "-", "iperf3 -P8", float(args.iperf_s), received, wire, cpu, timed_out)
    print(f"  {mode:5} iperf3 -P 8: {row.effective_mbps:.1f} Mbit/s", flush=True)
    return row


def cold_floor_s(lab: Lab, mode: str, info: KindInfo, args: argparse.Namespace) -> float | None:
    """`Row.cold_s` for a kind: iperf3 moving its bytes at its best ratio from slow start
    (None when iperf3 failed)."""
    n_bytes = max(1, int(info.size_bytes / limit_ratio(info, args.limit_levels)))
    row = bench_iperf3(lab, mode, args, n_bytes)
    return row.seconds if not row.timed_out and row.logical_bytes >= n_bytes else None


def disk_write_s(info: KindInfo, scratch: Path) -> float:
    """Seconds to write the kind's files under ``scratch`` as a sync lands them, one at a
    time: each under a temporary name with its mtime, renamed, and one ``syncfs`` at
    the end (netopt's durability; rsync and rclone rename without syncing). No network
    and no reading (the files are read before the clock starts): what the destination's
    filesystem alone costs. ``scratch`` is moved aside after (`clear`)."""
    contents = [(rel, (info.root / rel).read_bytes()) for rel in file_list(info)]
    clear(scratch)
    scratch.mkdir(parents=True)
    try:
        made: set[Path] = set()
        started = time.monotonic()
        for rel, data in contents:
            final = scratch / rel
            if final.parent not in made:
                final.parent.mkdir(parents=True, exist_ok=True)
                made.add(final.parent)
            tmp = final.with_name(f".{final.name}.part")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.utime(fd, ns=(0, 0))
            finally:
                os.close(fd)
            os.rename(tmp, final)
        syncfs(scratch)
        return time.monotonic() - started
    finally:
        clear(scratch)


def goal_share(info: KindInfo) -> float:
    """The goal for the kind, as a share of its limit."""
    if info.kind == "smallfiles":
        return 0.7
    return 0.95 if info.incompressible else 0.85


def limit_ratio(info: KindInfo, levels: list[int]) -> float:
    """The kind's best zstd ratio among ``levels`` (1.0 when incompressible)."""
    if info.incompressible:
        return 1.0
    measured = [info.zstd_ratios[str(lv)] for lv in levels if str(lv) in info.zstd_ratios]
    return max(measured, default=info.best_ratio)


def set_limits(
    rows: list[Row], infos: dict[str, KindInfo], levels: list[int], rtt_ms: float
) -> None:
    """Each row's limit: the same mode's iperf3 -P8 x the kind's best ratio among ``levels``;
    and the link's RTT (for `Row.reachable_share`)."""
    iperf = {r.mode: r.effective_mbps for r in rows if r.tool == "iperf3 -P8"}
    for r in rows:
        info = infos.get(r.data)
        r.rtt_ms = rtt_ms
        if info is not None and r.mode in iperf:
            r.limit_mbps = iperf[r.mode] * limit_ratio(info, levels)


def _pct(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def _err(predicted: float | None, actual: float | None) -> str:
    return f"{(predicted - actual) / actual:+.0%}" if predicted and actual else "-"


def print_table(rows: list[Row], rtt_ms: float) -> None:
    head = (
        "kind",
        "mode",
        "tool",
        "seconds",
        "effective Mbit/s",
        "share of limit",
        "of reachable",
        "plan s",
        "plan err",
        "plan RTT err",
        "status",
        "wire MB",
        "wire Mbit/s",
        "CPU s",
        "netopt s",
        "plan err (netopt s)",
        "publish s",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = (
            r.data,
            r.mode,
            r.tool,
            f"{r.seconds:.1f}",
            f"{r.effective_mbps:.1f}",
            _pct(r.share),
            _pct(r.reachable_share),
            f"{r.predicted_s:.1f}" if r.predicted_s else "-",
            _err(r.predicted_s, r.seconds),
            _err(r.plan_rtt_ms, rtt_ms),
            r.status,
            f"{r.wire_bytes / 1e6:.1f}",
            f"{r.wire_mbps:.1f}",
            f"{r.cpu_s:.1f}",
            f"{r.internal_s:.1f}" if r.internal_s else "-",
            _err(r.predicted_s, r.internal_s),
            f"{r.publish_s:.0f}" if r.publish_s is not None else "-",
        )
        print("| " + " | ".join(cells) + " |")


def summarize(rows: list[Row], infos: dict[str, KindInfo]) -> list[dict[str, Any]]:
    """Per kind and mode: the limit, netopt's share against the goal, the best peer. netopt
    is its best row: from its own server (``netopt``) or from the web origin the peers
    read (``netopt-web``), whichever ran faster."""
    out = []
    for kind, mode in dict.fromkeys((r.data, r.mode) for r in rows if r.data in infos):
        info = infos[kind]
        here = [r for r in rows if (r.data, r.mode) == (kind, mode)]
        ours = [r for r in here if r.tool.startswith("netopt")]
        peers = [r for r in here if not r.tool.startswith("netopt")]
        best_peer = max(peers, key=lambda r: r.effective_mbps, default=None)
        netopt = max(ours, key=lambda r: r.effective_mbps, default=None)
        out.append(
            {
                "kind": kind,
                "mode": mode,
                "zstd_ratios": info.zstd_ratios,
                "limit_mbps": here[0].limit_mbps,
                "goal_share": goal_share(info),
                "netopt_tool": netopt.tool if netopt else None,
                "netopt_mbps": netopt.effective_mbps if netopt else None,
                "netopt_share": netopt.share if netopt else None,
                "netopt_reachable_share": netopt.reachable_share if netopt else None,
                "cold_s": here[0].cold_s,
                "netopt_cold_share": netopt.cold_share if netopt else None,
                "best_peer_cold_share": best_peer.cold_share if best_peer else None,
                "disk_s": here[0].disk_s,
                "netopt_floor_share": netopt.floor_share if netopt else None,
                "best_peer_floor_share": best_peer.floor_share if best_peer else None,
                "netopt_complete": bool(netopt and netopt.status == "ok"),
                "best_peer": best_peer.tool if best_peer else None,
                "best_peer_mbps": best_peer.effective_mbps if best_peer else None,
                "ahead_of_peers": bool(
                    netopt and best_peer and netopt.effective_mbps > best_peer.effective_mbps
                ),
            }
        )
    return out


def print_summary(summary: list[dict[str, Any]]) -> None:
    print(
        "\n| kind | mode | zstd ratios | limit Mbit/s | netopt Mbit/s | share | of reachable "
        "| cold floor s | of cold floor (netopt / best peer) | disk write s "
        "| of the larger floor (netopt / best peer) | goal | met | best peer (Mbit/s) | ahead |"
    )
    print("|" + "---|" * 15)
    for s in summary:
        ratios = "/".join(f"{v:.2f}" for v in s["zstd_ratios"].values())
        met = s["netopt_share"] is not None and s["netopt_share"] >= s["goal_share"]
        limit, ours, peer = s["limit_mbps"], s["netopt_mbps"], s["best_peer_mbps"]
        print(
            f"| {s['kind']} | {s['mode']} | {ratios} | {limit or 0:.1f} "
            f"| {ours or 0:.1f} ({s['netopt_tool']}) "
            f"| {_pct(s['netopt_share'])} | {_pct(s['netopt_reachable_share'])} "
            f"| {_pct(s['cold_s'])} "
            f"| {_pct(s['netopt_cold_share'])} / {_pct(s['best_peer_cold_share'])} "
            f"| {_pct(s['disk_s'])} "
            f"| {_pct(s['netopt_floor_share'])} / {_pct(s['best_peer_floor_share'])} "
            f"| {s['goal_share']:.2f} | {'yes' if met else 'no'} "
            f"| {s['best_peer']} ({peer or 0:.1f}) | {'yes' if s['ahead_of_peers'] else 'no'} |"
        )


def link_of(topology: str) -> dict[str, float]:
    """The first cross-region link of a lab file: rate, one-way delay, loss."""
    link = yaml.safe_load(Path(topology).read_text())["links"][0]
    return {
        "rate_mbps": float(link["rate_mbps"]),
        "delay_ms": float(link.get("delay_ms", 0)),
        "loss_ratio": float(link.get("loss_ratio", 0)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=200, help="per corpus kind")
    parser.add_argument("--modes", default="bbr,reno", help="node default CCs, comma-separated")
    parser.add_argument("--data", default="jsonl,random", help=f"corpus kinds: {','.join(KINDS)}")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per client run")
    parser.add_argument("--iperf-s", type=int, default=10)
    parser.add_argument(
        "--link-rate-mbps",
        type=float,
        default=None,
        help="for netopt's plan (default: the topology's link)",
    )
    parser.add_argument(
        "--link-loss",
        type=float,
        default=None,
        help="for netopt's plan (default: the topology's link)",
    )
    parser.add_argument("--topology", default=str(TOPOLOGY))
    parser.add_argument(
        "--corpus-dir",
        default=None,
        help="build the corpus here and reuse it in later runs (default: a temp dir)",
    )
    parser.add_argument("--smallfiles-count", type=int, default=100_000)
    parser.add_argument(
        "--limit-levels",
        default="1,3",
        help="zstd levels whose best ratio sets each kind's limit (the goals quote L1/L3; "
        "the corpus also measures L19)",
    )
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
        "--plaintext",
        action="store_true",
        help="netopt without TLS and token (default: TLS with the cluster CA and a token, "
        "as users run it; scripts/bench_tls.py measures the difference)",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="print each netopt run's timeline (NETOPT_TRACE, see netopt.dataplane.trace)",
    )
    parser.add_argument(
        "--netopt-args",
        default="",
        help="extra options for each `netopt sync` (split on spaces), e.g. '--streams 8'",
    )
    args = parser.parse_args()
    args.netopt_args = args.netopt_args.split()
    args.tools = [t for t in args.tools.split(",") if t]
    args.limit_levels = [int(x) for x in args.limit_levels.split(",") if x]
    kinds = [k for k in args.data.split(",") if k]
    if set(kinds) - set(KINDS):
        parser.error(f"--data: unknown kinds {sorted(set(kinds) - set(KINDS))}")
    if args.precompress is not None and "netopt-pre" not in args.tools:
        args.tools.append("netopt-pre")
    if "netopt-pre" in args.tools and args.precompress is None:
        parser.error("netopt-pre needs --precompress LEVEL")
    link = link_of(args.topology)
    if args.link_rate_mbps is None:
        args.link_rate_mbps = link["rate_mbps"]
    if args.link_loss is None:
        args.link_loss = link["loss_ratio"]
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="netopt-bench-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        corpus_root = Path(args.corpus_dir) if args.corpus_dir else work / "corpus"
        infos = build_corpus(
            corpus_root,
            kinds,
            args.size_mb,
            smallfiles_count=args.smallfiles_count,
            levels=sorted({*RATIO_LEVELS, *args.limit_levels}),
        )
        print(f"corpus ready in {time.monotonic() - t0:.1f} s", flush=True)
        print_kinds(infos.values())
        cold: dict[tuple[str, str], float | None] = {}
        disk: dict[tuple[str, str], float] = {}
        with Lab.start(args.topology) as lab:
            args.tls = None
            if not args.plaintext:
                args.tls = issue_server_files(work / "tls", "us-1", ips=[lab.address("us-1")])
            for mode in args.modes.split(","):
                for node in ("hk-1", "us-1"):
                    lab.exec(node, ["sysctl", "-qw", f"net.ipv4.tcp_congestion_control={mode}"])
                if "iperf3" in args.tools:
                    rows.append(bench_iperf3(lab, mode, args))
                for kind in kinds:
                    if "iperf3" in args.tools:
                        cold[mode, kind] = cold_floor_s(lab, mode, infos[kind], args)
                    disk[mode, kind] = disk_write_s(infos[kind], work / "out" / "disk-floor")
                    print(f"  {mode:5} {kind:10} disk write: {disk[mode, kind]:.2f} s", flush=True)
                    rows.extend(bench_dataset(lab, mode, infos[kind], work / "out", args))
    set_limits(rows, infos, args.limit_levels, 2 * link["delay_ms"])
    for r in rows:
        r.cold_s = cold.get((r.mode, r.data))
        r.disk_s = disk.get((r.mode, r.data))
    print_table(rows, 2 * link["delay_ms"])
    summary = summarize(rows, infos)
    print_summary(summary)
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps(
                {
                    "link": link,
                    "corpus": {k: v.to_dict() for k, v in infos.items()},
                    "rows": [
                        {
                            **asdict(r),
                            "effective_mbps": r.effective_mbps,
                            "wire_mbps": r.wire_mbps,
                            "share": r.share,
                            "status": r.status,
                        }
                        for r in rows
                    ],
                    "summary": summary,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
