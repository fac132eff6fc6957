"""``netopt bench train``: a real DDP job, run twice, defaults against netopt's advice.

Loopback (no ``--lab``): the ranks are local processes; the defaults read the shards
from a local plain HTTP server, netopt's run reads them through ``CachedDataset``
from a local directory (there is no border to sync across). With ``--lab TOPOLOGY``
(root): one rank per lab node, the hosts' congestion control set to ``--cc``, the
shards served from a node of the far region, and

- *defaults*: the nodes with the regions interleaved, no hook, each rank fetching
  its shards from the origin with a plain HTTP client (``urllib``);
- *netopt*: what ``netopt doctor`` finds on each node for the lab's links applied
  (its ``net.ipv4.tcp_*`` sysctls: congestion control and TCP buffers, inside the
  node's namespace), the ``nccl-env`` environment and advised node order, the advised
  hook, and ``CachedDataset`` over a region-shared ``netopt sync`` of the shards
  (a coordinator and an agent per node for the sync, stopped before the steps).

The lab's per-link byte counters give the border bytes of each run's steps.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from netopt.cli.bench_cmd import cross_region_flows
from netopt.config import LabTopology
from netopt.errors import LabError, NetworkError, UsageError
from netopt.nccl.costmodel import Fabric, fabric_from_links
from netopt.nccl.model import Advice, LinkFigures, Nic, NodeInfo, TuneOptions
from netopt.nccl.rankorder import rank_order
from netopt.torch.labfigures import lab_link_figures, lab_nodes
from netopt.torch.rendezvous import rendezvous_port
from netopt.torch.trainbench import (
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    ModelShape,
    RunSummary,
    goals,
    make_shards,
    predicted_comm_s,
    predicted_step_s,
    run_train_ranks,
    summarize,
    text_sources,
    worker_argv,
)

__all__ = ["TrainOptions", "choose_hook", "interleave", "run_train_lab", "run_train_loopback"]

GLOO_VERSION = (2, 21, 5)
"""The NCCL version nccl-env is asked about (Gloo reads none of it; the env file is kept)."""


BUFFERS_REASON = (
    "the model's one buffer, the causal mask, is the same on every rank and never changes: "
    "DDP(broadcast_buffers=False) saves the broadcast from rank 0 (across the border) that "
    "DDP otherwise starts every forward pass with"
)

DEFAULT_SHAPE = ModelShape(256, 7, 4, 128)
"""5.7 M parameters (23 MB of fp32 gradients), a step about 1 s of CPU per rank."""


@dataclass(frozen=True)
class TrainOptions:
    """What both runs share."""

    steps: int = 20
    seed: int = 0
    shape: ModelShape = DEFAULT_SHAPE
    batch: int = 8
    lr: float = 1e-3
    shards: int = 16
    shard_bytes: int = 256 * 1024
    hook: str = "auto"
    buckets: str = "auto"
    """``auto``: DDP's bucket_cap_mb as advised; ``default``: DDP's own 25 MiB."""
    timeout_s: float = 1800.0
    out_dir: Path = Path("bench-train")
    threads: int = 1

    def worker_flags(self) -> dict[str, Any]:
        s = self.shape
        return {
            "steps": self.steps, "seed": self.seed, "dim": s.dim, "layers": s.layers,
            "heads": s.heads, "seq": s.seq, "batch": self.batch, "lr": self.lr,
            "shards": self.shards, "shard_bytes": self.shard_bytes, "threads": self.threads,
            "timeout_s": self.timeout_s,
        }  # fmt: skip


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.total, self.end = seconds, time.monotonic() + seconds

    def left(self, what: str) -> float:
        left = self.end - time.monotonic()
        if left <= 1:
            raise NetworkError(f"bench train ran over its {self.total:g} s before {what}")
        return left


def interleave(nodes: Sequence[str], region_of: Callable[[str], str]) -> tuple[str, ...]:
    """The nodes round-robin over their regions (regions in order of first appearance)."""
    by_region: dict[str, list[str]] = {}
    for node in nodes:
        by_region.setdefault(region_of(node), []).append(node)
    out: list[str] = []
    while any(by_region.values()):
        for members in by_region.values():
            if members:
                out.append(members.pop(0))
    return tuple(out)


def choose_hook(advice: Advice, two_level_noted: bool) -> tuple[str, str]:
    """The bench's hook for ``advice``: (hook, why)."""
    if advice.hook == "hierarchical_powerSGD_hook":
        alternate = "-alternating" if advice.powersgd_alternate else ""
        return "hierarchical-powersgd" + alternate, advice.hook_reason
    if advice.hook == "powerSGD_hook":
        return "powersgd", advice.hook_reason
    if advice.hook == "bf16_compress_hook":
        if two_level_noted:
            return "hierarchical-fp16", advice.hook_reason + "; two-level all-reduce advised"
        return "fp16", advice.hook_reason
    if two_level_noted:
        return "hierarchical", advice.hook_reason + "; two-level all-reduce advised"
    return "none", advice.hook_reason


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _local_http(directory: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _run_loopback_ranks(
    world: int, flags: dict[str, Any], timeout_s: float
) -> list[dict[str, Any]]:
    for attempt in range(3):
        master = f"127.0.0.1:{rendezvous_port()}"

        def argv_for(rank: int) -> list[str]:
            return worker_argv(rank, world, master, {**flags, "ifname": "lo"})  # noqa: B023

        def start(rank: int, argv: list[str]) -> subprocess.Popen[str]:
            return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)  # fmt: skip

        try:
            return run_train_ranks(start, argv_for, world, timeout_s)
        except NetworkError as exc:  # the rendezvous port taken meanwhile: a fresh one
            if ("EADDRINUSE" not in str(exc) and "in use" not in str(exc)) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def run_train_loopback(options: TrainOptions, ranks: int) -> dict[str, Any]:
    """Both runs on loopback; the report as a JSON-able dict."""
    if ranks < 2:
        raise UsageError("bench train needs at least 2 ranks")
    deadline = _Deadline(options.timeout_s)
    hook = "none" if options.hook == "auto" else options.hook
    if hook.startswith("hierarchical"):
        raise UsageError("the hierarchical hooks need regions: use --lab")
    work = Path(tempfile.mkdtemp(prefix="netopt-bench-train-"))
    try:  # the shards (--shards x --shard-bytes) go with the run
        shards = work / "shards"
        make_shards(shards, options.shards, options.shard_bytes, text_sources())
        flags = options.worker_flags()
        names = tuple(f"rank{r}" for r in range(ranks))
        with _local_http(shards) as url:
            docs = _run_loopback_ranks(ranks, {**flags, "data_url": url, "hook": "none"},
                                       deadline.left("the defaults' run"))  # fmt: skip
        defaults = summarize("defaults", names, docs, settings={"data": "plain HTTP, 127.0.0.1"})
        docs = _run_loopback_ranks(ranks, {**flags, "data_dir": str(shards), "hook": hook,
                                           "no_broadcast_buffers": True},
                                   deadline.left("netopt's run"))  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    netopt = summarize("netopt", names, docs, settings={
        "data": "CachedDataset over the local shards (loopback: no border to sync across)",
    })  # fmt: skip
    return _report(options, "loopback", None, defaults, netopt, {})


# ---------------------------------------------------------------------------- the lab


def _lab_cc(lab: Any, node: str) -> str:
    proc = lab.exec(node, ["sysctl", "-n", "net.ipv4.tcp_congestion_control"])
    return str(proc.stdout).strip()


def _idle_restarts(lab: Any, nodes: Sequence[str]) -> bool:
    """Whether any node restarts idle TCP connections from the initial window."""
    name = "net.ipv4.tcp_slow_start_after_idle"
    return any(lab.exec(n, ["sysctl", "-n", name]).stdout.strip() != "0" for n in nodes)


def _set_cc(lab: Any, nodes: Sequence[str], cc: str) -> None:
    for node in nodes:
        lab.exec(node, ["sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={cc}"])


def _links_yaml(path: Path, links: Sequence[LinkFigures], region_of: Callable[[str], str]) -> None:
    nodes = sorted({n for link in links for n in (link.a, link.b)})
    lines = ["kind: links", "nodes:"]
    lines += [f"  {n}: {{region: {region_of(n)}}}" for n in nodes]
    lines.append("links:")
    for link in links:
        lines.append(
            f"  - {{between: [{link.a}, {link.b}], rtt_ms: {link.rtt_ms:g}, "
            f"single_stream_mbps: {link.single_stream_mbps:g}, link_mbps: {link.link_mbps:g}, "
            f"loss_ratio: {link.loss_ratio:g}, congestion_control: {link.congestion_control}}}"
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _doctor_fixes(lab: Any, nodes: Sequence[str], links_file: Path) -> dict[str, Any]:
    """``netopt doctor`` on each node; its ``net.ipv4.tcp_*`` sysctls written there.

    ``net.core.*`` values are left out: on some kernels they are not per namespace,
    and the bench must not change the host's."""
    applied: dict[str, Any] = {}
    for node in nodes:
        argv = [sys.executable, "-m", "netopt", "doctor", "--json", "--links", str(links_file),
                "--node", node, "--no-mtu"]  # fmt: skip
        proc = lab.exec(node, argv, check=False, timeout_s=120)
        try:
            report = json.loads(proc.stdout)
        except ValueError:
            raise LabError(
                f"netopt doctor on {node} gave no report: {proc.stderr[-800:]}"
            ) from None
        wanted: dict[str, str] = {}
        for finding in report.get("findings", []):
            for name, value in (finding.get("sysctls") or {}).items():
                if name.startswith("net.ipv4.tcp_"):
                    wanted.setdefault(name, str(value))
        for name, value in wanted.items():
            lab.exec(node, ["sysctl", "-q", "-w", f"{name}={value}"])
        applied[node] = wanted
    return applied


def _fabric(
    lab: Any, topology: LabTopology, order: Sequence[str]
) -> tuple[Fabric, tuple[LinkFigures, ...]]:
    links = lab_link_figures(lab, topology, order, cross_region_flows(lab, topology, tuple(order)))
    return fabric_from_links(lab_nodes(topology, order), links, flows=1), links


def _nic_nodes(lab: Any, topology: LabTopology, order: Sequence[str]) -> tuple[NodeInfo, ...]:
    """The nodes with their lab interface (what nccl-env reads from ``ip addr``)."""
    return tuple(
        NodeInfo(
            n, topology.region_of(n), (Nic(lab.plan.node(n).ifname, (f"{lab.address(n)}/32",)),)
        )
        for n in order
    )


def _border(lab: Any, regions: Sequence[str]) -> dict[str, int]:
    counters = lab.counters()
    return {
        f"{a}->{b}": int(counters.between(a, b).bytes) for a in regions for b in regions if a != b
    }


def _wait_http(lab: Any, node: str, url: str, timeout_s: float = 30.0) -> None:
    script = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)"
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if lab.exec(node, [sys.executable, "-c", script, url], check=False).returncode == 0:
            return
        time.sleep(0.3)
    raise LabError(f"the origin's HTTP server {url} did not answer in {timeout_s:g} s")


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _lab_ranks(
    lab: Any, order: Sequence[str], flags: dict[str, Any], env: dict[str, dict[str, str]],
    timeout_s: float, regions: Sequence[str], dirs: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, int]]:  # fmt: skip
    """One rank per node of ``order`` (``dirs``: each node's own ``--data-dir``); the
    ranks' documents and the border bytes per direction between the first step's start
    and the last step's end (rank 0 marks them; DDP's start-up broadcast is left out)."""
    master = f"{lab.address(order[0])}:{20000 + secrets.randbelow(20000)}"
    marks = Path(tempfile.mkdtemp(prefix="netopt-train-marks-"))
    snapshots: dict[str, dict[str, int]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and len(snapshots) < 2:
            for name in ("start", "end"):
                if name not in snapshots and (marks / name).exists():
                    snapshots[name] = _border(lab, regions)
            done.wait(0.05)

    def argv_for(rank: int) -> list[str]:
        node = order[rank]
        mine = {"ifname": lab.plan.node(node).ifname, "mark_dir": str(marks)}
        if dirs is not None:
            mine["data_dir"] = dirs[node]
        return worker_argv(rank, len(order), master, {**flags, **mine})

    def start(rank: int, argv: list[str]) -> Any:
        node = order[rank]
        return lab.popen(node, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, **env.get(node, {})})  # fmt: skip

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        docs = run_train_ranks(start, argv_for, len(order), timeout_s)
    finally:
        done.set()
        watcher.join(timeout=5)
        shutil.rmtree(marks, ignore_errors=True)
    if set(snapshots) != {"start", "end"}:
        raise LabError("the ranks finished without marking their steps' start and end")
    border = {k: snapshots["end"][k] - snapshots["start"][k] for k in snapshots["end"]}
    return docs, border


def _region_sync(
    lab: Any, topology: LabTopology, nodes: Sequence[str], origin: str, shards: Path,
    work: Path, deadline: _Deadline,
) -> tuple[dict[str, Path], float, dict[str, Any]]:  # fmt: skip
    """A coordinator and agents, the shards served on ``origin``, every node syncing at
    once (region-shared); the cluster stopped again. (dest per node, seconds, facts)."""
    from netopt.demo.cluster import Cluster
    from netopt.demo.sites import LabSite

    cluster = Cluster(LabSite(lab), work / "cluster", probe_rate_pps=5, probe_window_s=2)
    try:
        cluster.start()
        cluster.wait_for_nodes(timeout_s=min(90.0, deadline.left("the cluster's start")))
        cluster.serve(origin, shards, "shards", 7480, "--chunk-size", str(256 * 1024))
        url = f"netopt://{lab.address(origin)}:7480/shards"
        link = topology.links[0]
        dests = {n: work / "sync" / n / "shards" for n in nodes}
        started = time.monotonic()
        procs = {
            n: lab.popen(n, [sys.executable, "-m", "netopt", "sync", url, str(dests[n]), "--json",
                             "--config", str(cluster.agent_config(n)),
                             "--link-rate-mbps", f"{link.rate_mbps:g}",
                             "--link-loss", f"{link.loss_ratio:g}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for n in nodes
        }  # fmt: skip
        reports: dict[str, Any] = {}
        for n, proc in procs.items():
            try:
                out, err = proc.communicate(timeout=deadline.left("the sync"))
            except subprocess.TimeoutExpired:
                raise NetworkError(f"netopt sync on {n} did not finish in time") from None
            if proc.returncode != 0:
                raise NetworkError(f"netopt sync on {n} exited {proc.returncode}: {err[-800:]}")
            reports[n] = json.loads(out)
        seconds = time.monotonic() - started
    finally:
        for proc in cluster.procs.values():
            _stop(proc)
    facts = {
        n: {
            "wire_bytes": r.get("wire_bytes"),
            "chunks_from_source": (r.get("sharing") or {}).get("chunks_from_source"),
            "chunks_from_peers": (r.get("sharing") or {}).get("chunks_from_peers"),
        }
        for n, r in reports.items()
    }
    return dests, seconds, facts


def run_train_lab(
    options: TrainOptions, topology: LabTopology, nodes: Sequence[str], cc: str,
    prefix: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Build the lab, run both runs, tear it down; the report as a JSON-able dict."""
    from netopt.lab import Lab
    from netopt.nccl.model import parse_version
    from netopt.nccl.tuner import tune_nccl

    deadline = _Deadline(options.timeout_s)
    unknown = [n for n in nodes if n not in topology.nodes]
    if unknown or len(nodes) < 2:
        raise UsageError(f"need two or more lab nodes (unknown: {', '.join(unknown) or '-'})")
    region_of = topology.region_of
    regions = tuple(dict.fromkeys(region_of(n) for n in nodes))
    if len(regions) < 2:
        raise UsageError("bench train --lab needs nodes in two regions")
    counts = {r: sum(region_of(n) == r for n in nodes) for r in regions}
    far = min(regions, key=lambda r: counts[r])
    origin = next(n for n in nodes if region_of(n) == far)
    given = interleave(nodes, region_of)
    order = rank_order(given, {n: region_of(n) for n in nodes})
    work = options.out_dir.resolve() / "work"
    work.mkdir(parents=True, exist_ok=True)
    shards = work / "shards"
    make_shards(shards, options.shards, options.shard_bytes, text_sources())
    flags = options.worker_flags()
    shape, params = options.shape, options.shape.params
    with Lab.start(topology, prefix=prefix) as lab:
        _set_cc(lab, nodes, cc)
        fabric_before, links_before = _fabric(lab, topology, given)
        # --- defaults: interleaved order, no hook, plain HTTP from the origin
        port = 8000 + secrets.randbelow(1000)
        url = f"http://{lab.address(origin)}:{port}/"
        server = lab.popen(origin, [sys.executable, "-m", "http.server", str(port), "--bind",
                                    lab.address(origin), "--directory", str(shards)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            _wait_http(lab, given[0], url)
            docs, border = _lab_ranks(lab, given, {**flags, "data_url": url, "hook": "none",
                                      "regions": ",".join(region_of(n) for n in given)},
                                      {}, deadline.left("the defaults' run"), regions)  # fmt: skip
        finally:
            _stop(server)
        defaults = summarize("defaults", given, docs, settings={
            "host_cc": {n: _lab_cc(lab, n) for n in nodes}, "data": f"plain HTTP from {origin}",
        })  # fmt: skip
        defaults.border_bytes = border
        defaults.settings["idle_restart"] = _idle_restarts(lab, nodes)
        comm = predicted_comm_s(fabric_before, defaults.grad_bytes, "none", layer_dim=shape.dim,
                                idle_restart=defaults.settings["idle_restart"])  # fmt: skip
        defaults.predicted_comm_s = comm
        defaults.predicted_step_s = predicted_step_s(defaults.compute_s, comm)
        # nccl-env is told the compute the user's meter saw on the defaults' run
        # --- netopt: doctor's fixes, nccl-env's advice, the advised order and hook, the sync
        links_file = work / "links.yaml"
        _links_yaml(links_file, links_before, region_of)
        fixes = _doctor_fixes(lab, nodes, links_file)
        fabric_after, links_after = _fabric(lab, topology, order.advised)
        tuned = tune_nccl(
            _nic_nodes(lab, topology, order.advised), links_after, parse_version("2.21.5"),
            TuneOptions(params=params, step_compute_ms=max(1.0, 1000 * defaults.compute_s),
                        layer_dim=shape.dim, backend="gloo", grad_layout=shape.grad_layout()),
        )  # fmt: skip
        advice = tuned.advice
        two_level = any("two-level" in note for note in advice.notes)
        hook, why = choose_hook(advice, two_level)
        if options.hook != "auto":
            hook, why = options.hook, "--hook given"
        env = {n: tuned.env_for(n) for n in nodes}
        dests, sync_s, sync_facts = _region_sync(lab, topology, nodes, origin, shards, work,
                                                 deadline)  # fmt: skip
        per_node_dir = {n: str(dests[n]) for n in nodes}
        psgd_rank = advice.powersgd_rank or 4
        bucket_cap_mb = advice.bucket_cap_mb if options.buckets == "auto" else None
        docs, border = _lab_ranks(lab, order.advised, {**flags, "hook": hook,
                                  "powersgd_rank": psgd_rank, "bucket_cap_mb": bucket_cap_mb,
                                  "no_broadcast_buffers": True,
                                  "regions": ",".join(region_of(n) for n in order.advised)},
                                  env, deadline.left("netopt's run"), regions,
                                  per_node_dir)  # fmt: skip
        netopt = summarize("netopt", order.advised, docs, setup_s=sync_s, settings={
            "host_cc": {n: _lab_cc(lab, n) for n in nodes}, "doctor_sysctls": fixes,
            "advice_hook": advice.hook, "powersgd_rank": psgd_rank,
            "advice_reason": advice.hook_reason,
            "advice_notes": list(advice.notes), "hook_why": why,
            "bucket_cap_mb": bucket_cap_mb, "bucket_reason": advice.bucket_reason,
            "broadcast_buffers": False, "broadcast_buffers_reason": BUFFERS_REASON,
            "accumulation": None if advice.accumulation is None else {
                "micro_batches": advice.accumulation.micro_batches,
                "applied": False,
                "why_not": "it changes the effective batch: the bench keeps batch and data "
                           "order equal in both runs to compare the losses",
            },
            "env": env, "sync_s": sync_s, "sync": sync_facts,
            "data": f"CachedDataset over a region-shared netopt sync from {origin}",
        })  # fmt: skip
        netopt.border_bytes = border
        netopt.settings["idle_restart"] = _idle_restarts(lab, nodes)
        cap_bytes = None if bucket_cap_mb is None else bucket_cap_mb * 2**20
        comm = predicted_comm_s(fabric_after, netopt.grad_bytes, hook, layer_dim=shape.dim,
                                powersgd_rank=psgd_rank, bucket_bytes=cap_bytes or DDP_BUCKET_BYTES,
                                first_bucket_bytes=cap_bytes or DDP_FIRST_BUCKET_BYTES,
                                idle_restart=netopt.settings["idle_restart"])  # fmt: skip
        netopt.predicted_comm_s = comm
        netopt.predicted_step_s = predicted_step_s(netopt.compute_s, comm)
        lab_facts = {"prefix": lab.prefix, "origin": origin, "cc": cc,
                     "rank_order": {"given": list(order.given), "advised": list(order.advised),
                                    "border_hops_given": order.border_hops_given,
                                    "border_hops_advised": order.border_hops_advised}}  # fmt: skip
    return _report(options, "lab", cc, defaults, netopt, lab_facts)


def _report(
    options: TrainOptions, where: str, cc: str | None, defaults: RunSummary, netopt: RunSummary,
    extra: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    shape = options.shape
    return {
        "where": where,
        "cc": cc,
        "steps": options.steps,
        "seed": options.seed,
        "model": {
            "params": shape.params,
            "dim": shape.dim,
            "layers": shape.layers,
            "heads": shape.heads,
            "seq": shape.seq,
            "batch_per_rank": options.batch,
            "tokenizer": "bytes (vocabulary 256)",
        },
        "runs": {"defaults": defaults.to_dict(), "netopt": netopt.to_dict()},
        "goals": goals(defaults, netopt, cc or "bbr") if where == "lab" else {},
        **extra,
    }


def summaries(report: dict[str, Any]) -> list[RunSummary]:
    """The report's runs back as RunSummary objects (for the plot)."""
    out = []
    for data in report["runs"].values():
        fields = {k: v for k, v in data.items() if k in RunSummary.__dataclass_fields__}
        out.append(replace(RunSummary(**fields), nodes=tuple(data["nodes"])))
    return out
