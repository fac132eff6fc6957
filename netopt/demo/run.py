"""``netopt demo``: measure, tune and move data on an emulated two-region cluster.

With CAP_NET_ADMIN it builds the embedded two-region lab (hk-1..3 <-> us-1: 100
Mbit/s, 40 ms one-way, 0.5% loss per direction), starts a coordinator and an
agent on every node, waits until the link matrix is full, measures bandwidth,
writes the NCCL env file from the measured links, plans a transfer and syncs a
generated dataset to the three hk nodes at once with region sharing (each chunk
crosses the border once, then spreads between hk peers); and, for comparison,
the naive way (each hk node straight from us). Without the privilege it runs
the same on loopback, with the hk <-> us link emulated by user-space proxies, and
says so. Everything it measured goes to ``REPORT_DIR/report.json``, with PNG
plots of the link matrix and the transfer timeline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from netopt.agent.host import parse_ip_addr_json
from netopt.config import LabTopology, parse_settings
from netopt.demo.cluster import AGENT_PORT, COORDINATOR_PORT, PROBE_PORT, Cluster
from netopt.demo.dataset import write_jsonl_dataset
from netopt.demo.plots import SyncSpan, plot_link_matrix, plot_transfer_timeline
from netopt.demo.sites import LabSite, LoopbackSite, Site
from netopt.errors import NetworkError
from netopt.lab import Lab
from netopt.lab.netns import has_net_admin
from netopt.nccl.linksdoc import PairFigures, links_document
from netopt.wire.schema import Nic

__all__ = ["DEFAULT_TOPOLOGY", "DemoOptions", "run_demo"]

DEFAULT_TOPOLOGY = """
kind: lab
name: demo
seed: 1
regions:
  hk: {nodes: [hk-1, hk-2, hk-3]}
  us: {nodes: [us-1]}
links:
  - between: [hk, us]
    rate_mbps: 100
    delay_ms: 40
    loss_ratio: 0.005
"""
SERVE_PORT = 7480
Say = Callable[[str], None]


@dataclass(frozen=True)
class DemoOptions:
    """What the demo does; ``loopback`` None means: lab when privileged."""

    report_dir: Path
    dataset_bytes: int = 32 * 1024 * 1024
    loopback: bool | None = None
    bandwidth_duration_s: float = 4.0


@dataclass
class DemoReport:
    """Everything the demo measured (written as report.json)."""

    mode: str
    notes: list[str] = field(default_factory=list)
    matrix: list[dict[str, Any]] = field(default_factory=list)
    bandwidth: dict[str, Any] = field(default_factory=dict)
    nccl_env_file: str | None = None
    nccl: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    syncs: list[dict[str, Any]] = field(default_factory=list)
    border_bytes: dict[str, Any] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _netopt(*args: str) -> list[str]:
    return [sys.executable, "-m", "netopt", *args]


def _json_of(site: Site, node: str, argv: list[str], timeout_s: float = 300) -> Any:
    return json.loads(site.exec(node, argv, timeout_s=timeout_s).stdout)


@contextlib.contextmanager
def _site(options: DemoOptions, say: Say) -> Iterator[tuple[Site, Lab | None]]:
    topology = parse_settings(DEFAULT_TOPOLOGY, "<embedded demo topology>", "lab", env={})
    assert isinstance(topology, LabTopology)
    use_lab = has_net_admin() if options.loopback is None else not options.loopback
    if use_lab:
        say("building the two-region lab (hk <-> us: 100 Mbit/s, 80 ms RTT, 0.5% loss each way)")
        with Lab.start(topology) as lab:
            yield LabSite(lab), lab
        return
    reason = "asked for" if options.loopback else "no CAP_NET_ADMIN (not root)"
    say(
        f"running on loopback ({reason}): the hk <-> us link is emulated in user space by "
        "proxies (delay and rate for TCP, also loss for UDP; TCP sees no packet loss), and "
        "the agents' own mesh probes run on plain loopback"
    )
    regions = {region: spec.nodes for region, spec in topology.regions.items()}
    links = {(link.between[0], link.between[1]): link.shape for link in topology.links}
    offset = _free_port_offset(sum(len(nodes) for nodes in regions.values()))
    with LoopbackSite(regions, port_offset=offset, links=links, seed=topology.seed) as site:
        yield site, None


def _free_port_offset(node_count: int) -> int:
    """A port offset whose ports (coordinator, agents, probes, serve; per node) are all
    free on 127.0.0.1, so a second demo (or a test) on this machine does not collide."""
    bases = (COORDINATOR_PORT, AGENT_PORT, PROBE_PORT, SERVE_PORT)
    for offset in range(1000, 20000, 1000):
        stride = LoopbackSite.PORT_STRIDE
        ports = [b + offset + stride * i for b in bases for i in range(node_count)]
        if all(_port_free(port) for port in ports):
            return offset
    raise NetworkError("no free block of loopback ports for the demo (7460 + 1000..19000)")


def _port_free(port: int) -> bool:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def run_demo(options: DemoOptions, say: Say) -> DemoReport:
    """Run every step; raises a NetoptError subclass when one fails (the lab is torn down)."""
    started = time.monotonic()
    options.report_dir.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="netopt-demo-") as tmp,
        _site(options, say) as (
            site,
            lab,
        ),
    ):
        work = Path(tmp)
        report = DemoReport(mode="lab" if lab is not None else "loopback")
        cluster = Cluster(site, work / "cluster", probe_rate_pps=50, probe_window_s=2)
        say("starting a coordinator and an agent on every node")
        cluster.start()
        matrix = cluster.wait_for_full_matrix(timeout_s=90)
        report.matrix = [
            {"src": a, "dst": b, **figures["latest"], "window": figures["window"]}
            for (a, b), figures in sorted(matrix.items())
        ]
        say(f"link matrix full: {len(matrix)} planned pairs measured")
        pairs = _measure_bandwidth(site, cluster, options, report, say)
        _nccl_env(site, cluster, pairs, options, report, say)
        spans = _transfer(site, cluster, pairs, options, report, work, say)
        report.plots = [
            str(plot_link_matrix(_pair_rows(pairs), options.report_dir / "link-matrix.png",
                                 nodes=site.nodes)),
            str(plot_transfer_timeline(spans, options.report_dir / "transfer-timeline.png")),
        ]  # fmt: skip
        report.seconds = time.monotonic() - started
        (options.report_dir / "report.json").write_text(json.dumps(vars(report), indent=2))
        return report


def _representatives(site: Site) -> list[tuple[str, str]]:
    """One node pair per region pair (in-region pairs included)."""
    chosen: dict[frozenset[str], tuple[str, str]] = {}
    for a in site.nodes:
        for b in site.nodes:
            key = frozenset((site.region_of(a), site.region_of(b)))
            if a < b and key not in chosen:
                chosen[key] = (a, b)
    return list(chosen.values())


def _measure_bandwidth(
    site: Site, cluster: Cluster, options: DemoOptions, report: DemoReport, say: Say
) -> list[PairFigures]:
    links = cluster.links()
    measured: dict[frozenset[str], tuple[float, float]] = {}
    probed: dict[frozenset[str], tuple[float | None, float]] = {}
    for a, b in _representatives(site):
        say(f"bandwidth {a} -> {b} ({site.region_of(a)} -> {site.region_of(b)})")
        host, port = site.endpoint(a, b, PROBE_PORT)
        target = f"{host}:{port}"
        result = _json_of(site, a, _netopt(
            "probe", "measure", target, "--duration", "1", "--bandwidth",
            "--bandwidth-duration", str(options.bandwidth_duration_s),
            "--token-file", str(cluster.token_file), "--json",
        ))  # fmt: skip
        bw = result["bandwidth"]
        measured[frozenset((site.region_of(a), site.region_of(b)))] = (
            bw["single_stream_bps"] / 1e6,
            bw["aggregate_bps"] / 1e6,
        )
        rtt = result.get("rtt_ms") or {}
        probed[frozenset((site.region_of(a), site.region_of(b)))] = (
            rtt.get("p50"),
            result.get("loss_ratio") or 0.0,
        )
        report.bandwidth[f"{a}->{b}"] = {
            "single_stream_mbps": bw["single_stream_bps"] / 1e6,
            "aggregate_mbps": bw["aggregate_bps"] / 1e6,
            "streams": bw["streams"],
            "rtt_p50_ms": rtt.get("p50"),
            "loss_ratio": result.get("loss_ratio"),
        }
    # On loopback the agents' mesh probes do not cross the user-space link; the figures
    # of this run's probes, which do, stand in for the cross-region pairs.
    proxied = not isinstance(site, LabSite)
    pairs = []
    for (src, dst), figures in sorted(links.items()):
        latest = figures["latest"] or {}
        if latest.get("rtt_p50_ms") is None:
            continue
        key = frozenset((site.region_of(src), site.region_of(dst)))
        single, aggregate = measured[key]
        rtt_ms, loss_ratio = latest["rtt_p50_ms"], figures["window"]["loss_ratio"] or 0.0
        if proxied and len(key) == 2 and probed[key][0] is not None:
            rtt_ms, loss_ratio = probed[key]
        pairs.append(PairFigures(src, dst, rtt_ms, loss_ratio, single, max(aggregate, single)))
    if proxied:
        report.notes.append(
            "loopback: cross-region RTT and loss come from the demo's probes through the "
            "user-space link, not from the agents' mesh (which runs on plain loopback)"
        )
    return _fill_unprobed(site, pairs, report)


def _pair_rows(pairs: list[PairFigures]) -> list[dict[str, Any]]:
    """The figures the NCCL tuner used, both directions, as rows for the heatmap."""
    rows = []
    for p in pairs:
        for src, dst in ((p.a, p.b), (p.b, p.a)):
            rows.append({"src": src, "dst": dst, "rtt_p50_ms": p.rtt_ms,
                         "loss_ratio": p.loss_ratio})  # fmt: skip
    return rows


def _fill_unprobed(site: Site, pairs: list[PairFigures], report: DemoReport) -> list[PairFigures]:
    """Give node pairs the probe plan left out (only a few representatives per region
    pair cross the border) the figures of a measured pair of the same region pair."""
    by_regions: dict[frozenset[str], PairFigures] = {}
    have = set()
    for pair in pairs:
        by_regions.setdefault(frozenset((site.region_of(pair.a), site.region_of(pair.b))), pair)
        have.add(frozenset((pair.a, pair.b)))
    filled = list(pairs)
    for i, a in enumerate(site.nodes):
        for b in site.nodes[i + 1 :]:
            key = frozenset((site.region_of(a), site.region_of(b)))
            if frozenset((a, b)) in have or key not in by_regions:
                continue
            filled.append(dataclasses.replace(by_regions[key], a=a, b=b))
            report.notes.append(
                f"{a} <-> {b} was not probed (the plan probes representatives across "
                "borders): the region pair's figures stand in for it"
            )
    return filled


def _node_nics(site: Site, node: str) -> tuple[Nic, ...]:
    proc = site.exec(node, ["ip", "-j", "address", "show"], check=True)
    return parse_ip_addr_json(proc.stdout)


def _nccl_env(
    site: Site,
    cluster: Cluster,
    pairs: list[PairFigures],
    options: DemoOptions,
    report: DemoReport,
    say: Say,
) -> None:
    regions = {node: site.region_of(node) for node in site.nodes}
    nics = {node: _node_nics(site, node) for node in site.nodes}
    document = links_document(regions, nics, pairs, time.strftime("%Y-%m-%dT%H:%M:%SZ"))
    links_file = options.report_dir / "links.yaml"
    links_file.write_text(yaml.safe_dump(document, sort_keys=False))
    env_file = options.report_dir / "nccl.env"
    nodes = ",".join(site.nodes)
    base = [
        "nccl-env",
        "--nodes",
        nodes,
        "--links",
        str(links_file),
        "--nccl-version",
        "2.26.2",
        "--per-node",
        "switch",
    ]
    proc = site.exec(site.nodes[0], _netopt(*base, "-o", str(env_file)), check=False)
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip()
        report.notes.append(f"nccl-env: {message}")
        say(f"nccl-env could not tune these nodes: {message}")
        return
    report.nccl_env_file = str(env_file)
    report.nccl = _json_of(site, site.nodes[0], _netopt(*base, "--format", "json"))
    say(f"NCCL env file written: {env_file}")


def _transfer(
    site: Site,
    cluster: Cluster,
    pairs: list[PairFigures],
    options: DemoOptions,
    report: DemoReport,
    work: Path,
    say: Say,
) -> list[SyncSpan]:
    regions = {node: site.region_of(node) for node in site.nodes}
    origin_node = next(n for n in site.nodes if regions[n] == "us")
    far = [n for n in site.nodes if regions[n] == "hk"]
    cross = next(p for p in pairs if regions[p.a] != regions[p.b])
    origin = work / "origin" / "demo-data"
    size = write_jsonl_dataset(origin, options.dataset_bytes)
    say(f"generated a {size / 1e6:.1f} MB JSON-lines dataset on {origin_node}")
    report.plan = _json_of(site, far[0], _netopt(
        "plan", "--rate-mbps", f"{cross.link_mbps:.3f}", "--rtt-ms", f"{cross.rtt_ms:.3f}",
        "--loss", f"{min(cross.loss_ratio, 0.5):.6f}", "--sample", str(origin / "part-000.jsonl"),
        "--size-bytes", str(size), "--json",
    ))  # fmt: skip
    token = ["--token-file", str(cluster.token_file), *cluster.tls_args()]
    cluster.serve(origin_node, origin, "demo-data", SERVE_PORT)

    def url_for(node: str) -> str:
        host, proxy_port = site.endpoint(node, origin_node, SERVE_PORT)
        return f"netopt://{host}:{proxy_port}/demo-data"

    link = ["--link-rate-mbps", f"{cross.link_mbps:.3f}",
            "--link-loss", f"{min(cross.loss_ratio, 0.5):.6f}"]  # fmt: skip
    t0 = time.monotonic()
    spans: list[SyncSpan] = []

    def run_all(kind: str, extra: dict[str, list[str]], dest: str) -> int:
        before = site.border_bytes("us", "hk")
        argvs = {node: _netopt("sync", url_for(node), str(work / node / dest), "--json",
                               *token, *link, *extra[node]) for node in far}  # fmt: skip
        for node, summary in _run_at_once(site, argvs).items():
            ended_s = summary.pop("ended_s") - t0
            started_s = summary.pop("started_s") - t0
            report.syncs.append({"node": node, "source": origin_node, "kind": kind, **summary})
            spans.append(SyncSpan(node, kind, started_s, ended_s, summary["logical_bytes"],
                                  summary["wire_bytes"], None))  # fmt: skip
        return site.border_bytes("us", "hk") - before

    say(f"{', '.join(far)} sync it at once, sharing chunks through the coordinator: each "
        "chunk crosses the border once, then spreads between the hk peers")  # fmt: skip
    shared_bytes = run_all(
        "shared", {n: ["--config", str(cluster.agent_config(n))] for n in far}, "demo-data"
    )
    say(f"the naive way, for comparison: {', '.join(far)} each download it from "
        f"{origin_node} (no sharing, empty caches)")  # fmt: skip
    naive_bytes = run_all(
        "naive", {n: ["--no-share", "--cache-dir", str(work / n / "naive-cache")] for n in far},
        "naive",
    )  # fmt: skip
    report.border_bytes = {
        "dataset_bytes": size,
        "netopt_bytes": shared_bytes,
        "naive_per_node_bytes": naive_bytes,
        "hk_nodes": len(far),
        "counted": "IP packets on the lab link, both directions" if isinstance(site, LabSite)
                   else "payload bytes through the user-space proxies, both directions",
    }  # fmt: skip
    return spans


def _run_at_once(site: Site, argvs: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Start every node's command at once; their JSON outputs with start and end times."""
    started: dict[str, tuple[float, subprocess.Popen[str]]] = {}
    for node, argv in argvs.items():
        proc = site.popen(node, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started[node] = (time.monotonic(), proc)
    out: dict[str, dict[str, Any]] = {}
    pending = dict(started)
    deadline = time.monotonic() + 900
    while pending:
        for node, (start_s, proc) in list(pending.items()):
            if proc.poll() is None:
                continue
            del pending[node]
            stdout, stderr = proc.communicate()
            if proc.returncode != 0:
                raise NetworkError(f"sync on {node} failed: {(stderr or stdout).strip()[-2000:]}")
            out[node] = {**json.loads(stdout), "started_s": start_s, "ended_s": time.monotonic()}
        if time.monotonic() > deadline:
            raise NetworkError(f"syncs on {', '.join(pending)} ran over 900 s")
        time.sleep(0.05)
    return out
