"""``netopt demo``: measure, tune and move data on an emulated two-region cluster.

With CAP_NET_ADMIN it builds the embedded two-region lab (hk <-> us: 100 Mbit/s,
40 ms one-way, 0.5% loss per direction), starts a coordinator and an agent on
every node, waits until the link matrix is full, measures bandwidth, writes the
NCCL env file from the measured links, plans a transfer and syncs a generated
dataset to both hk nodes: once across the border, then from the in-region peer;
and, for comparison, the naive way (each hk node straight from us). Without the
privilege it runs the same steps on loopback, where no link is emulated, and
says so. Everything it measured goes to ``REPORT_DIR/report.json``.
"""

from __future__ import annotations

import contextlib
import json
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
from netopt.coordinator.schema import Nic
from netopt.demo.cluster import PROBE_PORT, Cluster
from netopt.demo.dataset import write_jsonl_dataset
from netopt.demo.sites import LabSite, LoopbackSite, Site
from netopt.errors import NetworkError
from netopt.lab import Lab
from netopt.lab.netns import has_net_admin
from netopt.nccl.linksdoc import PairFigures, links_document

__all__ = ["DEFAULT_TOPOLOGY", "DemoOptions", "run_demo"]

DEFAULT_TOPOLOGY = """
kind: lab
name: demo
seed: 1
regions:
  hk: {nodes: [hk-1, hk-2]}
  us: {nodes: [us-1, us-2]}
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
        f"running on loopback ({reason}). No link is emulated here, so the figures are "
        "loopback's, not a cross-border link's"
    )
    regions = {region: spec.nodes for region, spec in topology.regions.items()}
    with LoopbackSite(regions, port_offset=1000) as site:
        yield site, None


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
        _transfer(site, cluster, pairs, options, report, work, lab, say)
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
    for a, b in _representatives(site):
        say(f"bandwidth {a} -> {b} ({site.region_of(a)} -> {site.region_of(b)})")
        target = f"{site.address(b)}:{site.port(b, PROBE_PORT)}"
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
        report.bandwidth[f"{a}->{b}"] = {
            "single_stream_mbps": bw["single_stream_bps"] / 1e6,
            "aggregate_mbps": bw["aggregate_bps"] / 1e6,
            "streams": bw["streams"],
        }
    pairs = []
    for (src, dst), figures in sorted(links.items()):
        latest = figures["latest"] or {}
        if latest.get("rtt_p50_ms") is None:
            continue
        single, aggregate = measured[frozenset((site.region_of(src), site.region_of(dst)))]
        pairs.append(
            PairFigures(
                src,
                dst,
                latest["rtt_p50_ms"],
                figures["window"]["loss_ratio"] or 0.0,
                single,
                max(aggregate, single),
            )
        )
    return pairs


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
    base = ["nccl-env", "--nodes", nodes, "--links", str(links_file), "--nccl-version", "2.26.2"]
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
    lab: Lab | None,
    say: Say,
) -> None:
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
    token = ["--token-file", str(cluster.token_file)]

    def serve(node: str, directory: Path) -> str:
        port = site.port(node, SERVE_PORT)
        with (work / f"serve-{node}.log").open("ab") as log:
            site.popen(node, _netopt(
                "serve", str(directory), "--name", "demo-data",
                "--bind", f"{site.address(node)}:{port}", *token,
            ), stdout=log, stderr=log)  # fmt: skip
        return f"netopt://{site.address(node)}:{port}/demo-data"

    def sync(node: str, url: str, dest: Path, cache: str = "cache") -> dict[str, Any]:
        # Each node has its own chunk cache (they share this machine's disk).
        cache_dir = work / node / cache
        before = lab.counters() if lab is not None else None
        for _ in range(50):  # the server may still be starting
            proc = site.exec(node, _netopt(
                "sync", url, str(dest), "--json", *token, "--cache-dir", str(cache_dir),
                "--link-rate-mbps", f"{cross.link_mbps:.3f}",
                "--link-loss", f"{min(cross.loss_ratio, 0.5):.6f}",
            ), check=False, timeout_s=600)  # fmt: skip
            if proc.returncode == 0:
                break
            time.sleep(0.5)
        else:
            detail = (proc.stderr or proc.stdout).strip()[-2000:]
            raise NetworkError(f"sync on {node} from {url} failed: {detail}")
        summary: dict[str, Any] = json.loads(proc.stdout)
        if lab is not None and before is not None:
            after = lab.counters()
            summary["border_bytes"] = (
                after.between("us", "hk").bytes - before.between("us", "hk").bytes
            )
        return summary

    origin_url = serve(origin_node, origin)
    say(f"{far[0]} syncs from {origin_node} across the border")
    first = sync(far[0], origin_url, work / far[0] / "demo-data")
    report.syncs.append({"node": far[0], "source": origin_node, "kind": "origin", **first})
    peer_url = serve(far[0], work / far[0] / "demo-data")
    for node in far[1:]:
        say(f"{node} syncs from its in-region peer {far[0]}")
        summary = sync(node, peer_url, work / node / "demo-data")
        report.syncs.append({"node": node, "source": far[0], "kind": "peer", **summary})
        say(f"{node} syncs straight from {origin_node} (the naive way, for comparison)")
        # The naive download starts from an empty cache, as a node without netopt would.
        summary = sync(node, origin_url, work / node / "naive", cache="naive-cache")
        report.syncs.append({"node": node, "source": origin_node, "kind": "naive", **summary})
    if lab is not None:
        by_kind: dict[str, int] = {}
        for s in report.syncs:
            by_kind[s["kind"]] = by_kind.get(s["kind"], 0) + s["border_bytes"]
        report.border_bytes = {
            "dataset_bytes": size,
            "netopt_bytes": by_kind["origin"] + by_kind.get("peer", 0),
            "naive_per_node_bytes": by_kind["origin"] + by_kind.get("naive", 0),
            "hk_nodes": len(far),
        }
