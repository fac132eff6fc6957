"""A netopt deployment on a site: a coordinator on one node, an agent on every node.

Used by ``netopt demo`` and by tests. On a lab every process runs inside its
node's network namespace (the lab reaps it at teardown); on loopback the site
stops them. Configuration files and logs live in a work directory of the caller's.

Everything speaks TLS, as on a real cluster: a cluster CA and one certificate per node
(its address, 127.0.0.1 for the loopback site's proxies) are made with ``netopt tls``
machinery in ``WORKDIR/tls``; the coordinator is ``https://``, agents and ``netopt serve``
listen over TLS, and clients get :meth:`Cluster.tls_args`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netopt.demo.sites import Site
from netopt.errors import LabError
from netopt.tlsca import CA_CERT, issue_cert, make_ca, node_files, write_files

__all__ = ["Cluster", "MatrixNotFull"]

COORDINATOR_PORT = 7460
AGENT_PORT = 7470
PROBE_PORT = 7471


class MatrixNotFull(LabError):
    """The link matrix did not hold every planned pair in time."""


@dataclass
class Cluster:
    """Coordinator + agents on ``site``. Call :meth:`start`; the site stops them."""

    site: Site
    workdir: Path
    coordinator_node: str | None = None
    probe_rate_pps: float = 50.0
    probe_window_s: float = 2.0
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    def __post_init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[Any]] = {}
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.token_file = self.workdir / "token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        if self.coordinator_node is None:
            self.coordinator_node = self.site.nodes[0]
        self.tls_dir = self.workdir / "tls"
        self.tls_ca = self.tls_dir / CA_CERT
        self._issue_certificates()

    def _issue_certificates(self) -> None:
        now = dt.datetime.now(dt.UTC)
        ca = make_ca("netopt demo CA", now, days=30)
        files = {self.tls_ca: ca.cert_pem}
        for node in self.site.nodes:
            ips = list(dict.fromkeys([self.site.address(node), "127.0.0.1"]))
            pair = issue_cert(ca, node, now, dns=["localhost"], ips=ips, days=30)
            cert, key = node_files(self.tls_dir, node)
            files[cert], files[key] = pair.cert_pem, pair.key_pem
        # The CA's key is not kept: the demo's certificates are all issued here.
        write_files(files, force=True)

    def tls_files(self, node: str) -> tuple[Path, Path]:
        """``node``'s certificate and key."""
        return node_files(self.tls_dir, node)

    def tls_args(self, node: str | None = None) -> list[str]:
        """A client's TLS options: the cluster CA (and ``node``'s certificate)."""
        args = ["--tls-ca", str(self.tls_ca)]
        if node is not None:
            cert, key = self.tls_files(node)
            args += ["--tls-cert", str(cert), "--tls-key", str(key)]
        return args

    def _tls_yaml(self, node: str) -> str:
        cert, key = self.tls_files(node)
        return f"tls: {{cert: {cert}, key: {key}, ca: {self.tls_ca}}}\n"

    @property
    def coordinator_url(self) -> str:
        assert self.coordinator_node is not None
        node = self.coordinator_node
        return f"https://{self.site.address(node)}:{self.site.port(node, COORDINATOR_PORT)}"

    def _netopt(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "netopt", *args]

    def start(self) -> None:
        """Start the coordinator, wait for it, then start every agent."""
        assert self.coordinator_node is not None
        config = self.workdir / "coordinator.yaml"
        host = self.site.address(self.coordinator_node)
        port = self.site.port(self.coordinator_node, COORDINATOR_PORT)
        config.write_text(
            "kind: coordinator\n"
            f"listen: {{host: {host}, port: {port}}}\n"
            f"token_file: {self.token_file}\n"
            f"database: {self.workdir / 'coordinator.db'}\n"
            "stale_after_s: 10\n"
            # The demo and the tests measure bandwidth themselves and count the bytes on
            # the links: scheduled bulk-TCP tests would land in the middle of that.
            "probe_plan: {bandwidth_tests: false}\n" + self._tls_yaml(self.coordinator_node)
        )
        self._spawn(self.coordinator_node, "coordinator", ["coordinator", "--config", str(config)])
        self._wait_for_coordinator()
        for node in self.site.nodes:
            self._spawn(node, f"agent-{node}", ["--log-level", "info", "agent", "--config",
                                                str(self._agent_config(node))])  # fmt: skip

    def _agent_config(self, node: str) -> Path:
        path = self.agent_config(node)
        host, port = self.site.address(node), self.site.port(node, AGENT_PORT)
        path.write_text(
            "kind: agent\n"
            f"node: {node}\nregion: {self.site.region_of(node)}\n"
            f"coordinator_url: {self.coordinator_url}\n"
            f"token_file: {self.token_file}\n"
            f"listen: {{host: {host}, port: {port}}}\n"
            "heartbeat_interval_s: 1\nreport_interval_s: 1\n"
            f"probe: {{port: {self.site.port(node, PROBE_PORT)}, rate_pps: {self.probe_rate_pps}, "
            f"window_s: {self.probe_window_s}}}\n"
            f"spool: {{dir: {self.workdir / ('spool-' + node)}}}\n"
            f"cache: {{dir: {self.workdir / ('cache-' + node)}}}\n" + self._tls_yaml(node)
        )
        return path

    def _spawn(self, node: str, name: str, args: list[str]) -> None:
        with (self.workdir / f"{name}.log").open("ab") as log:
            self.procs[name] = self.site.popen(node, self._netopt(*args), stdout=log, stderr=log)

    def serve(
        self,
        node: str,
        directory: Path,
        name: str,
        base_port: int,
        *extra: str,
        timeout_s: float = 120.0,
    ) -> None:
        """Start ``netopt serve DIRECTORY --name NAME`` on ``node`` (with the cluster's
        token) and wait until it answers ``/v1/health`` (it chunks the data first)."""
        host, port = self.site.address(node), self.site.port(node, base_port)
        args = ["serve", str(directory), "--name", name, "--bind", f"{host}:{port}",
                "--token-file", str(self.token_file), *self._serve_tls(node), *extra]  # fmt: skip
        self._spawn(node, f"serve-{name}", args)
        health = f"https://{host}:{port}/v1/health"
        script = (
            "import ssl, sys, urllib.request\n"
            "ctx = ssl.create_default_context(cafile=sys.argv[2])\n"
            "urllib.request.urlopen(sys.argv[1], timeout=2, context=ctx)\n"
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.site.exec(node, [sys.executable, "-c", script, health, str(self.tls_ca)],
                              check=False).returncode == 0:  # fmt: skip
                return
            time.sleep(0.3)
        raise LabError(
            f"netopt serve {name} did not answer {health} within {timeout_s:g} s; "
            f"see {self.workdir / ('serve-' + name + '.log')}"
        )

    def _serve_tls(self, node: str) -> list[str]:
        cert, key = self.tls_files(node)
        return ["--tls-cert", str(cert), "--tls-key", str(key)]

    def agent_config(self, node: str) -> Path:
        """The agent config file of ``node`` (``netopt sync --config`` shares through it)."""
        return self.workdir / f"agent-{node}.yaml"

    def kill_agent(self, node: str) -> None:
        """SIGKILL the agent of ``node`` (a node dying, for fault tests)."""
        proc = self.procs[f"agent-{node}"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def wait_for_nodes(self, timeout_s: float = 60.0) -> None:
        """Wait until every node's agent registered and is live."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            nodes = self.api("/api/v1/nodes")["nodes"]
            if sum(1 for n in nodes if n["state"] == "live") == len(self.site.nodes):
                return
            time.sleep(0.5)
        raise LabError(f"not every agent registered within {timeout_s:g} s; logs in {self.workdir}")

    def _wait_for_coordinator(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.api("/healthz", check=False)
            if result is not None:
                return
            time.sleep(0.5)
        raise LabError(
            f"the coordinator did not start within {timeout_s:g} s; "
            f"see {self.workdir / 'coordinator.log'}"
        )

    def api(self, path: str, *, check: bool = True) -> Any:
        """GET a coordinator API path from inside the coordinator's node; parsed JSON.

        Returns None (``check=False``) or raises LabError when it fails.
        """
        assert self.coordinator_node is not None
        script = (
            "import ssl, sys, urllib.request\n"
            "req = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + "
            "open(sys.argv[2]).read().strip()})\n"
            "ctx = ssl.create_default_context(cafile=sys.argv[3])\n"
            "print(urllib.request.urlopen(req, timeout=5, context=ctx).read().decode())\n"
        )
        argv = [sys.executable, "-c", script, self.coordinator_url + path, str(self.token_file),
                str(self.tls_ca)]  # fmt: skip
        proc = self.site.exec(self.coordinator_node, argv, check=check, timeout_s=30)
        if proc.returncode != 0:
            return None
        return json.loads(proc.stdout)

    def planned_pairs(self) -> set[tuple[str, str]]:
        """(src, dst) of every probe in the coordinator's plan."""
        plan = self.api("/api/v1/plan")
        return {(p["src"], p["dst"]) for p in plan["probes"]}

    def links(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The coordinator's link matrix, keyed by (src, dst)."""
        return {(x["src"], x["dst"]): x for x in self.api("/api/v1/links")["links"]}

    def wait_for_full_matrix(self, timeout_s: float = 60.0) -> dict[tuple[str, str], Any]:
        """Wait until every node registered and every planned pair has RTT figures."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            nodes = self.api("/api/v1/nodes")["nodes"]
            if len(nodes) == len(self.site.nodes):
                planned = self.planned_pairs()
                links = self.links()
                measured = {
                    k for k, v in links.items() if (v["latest"] or {}).get("rtt_p50_ms") is not None
                }
                if planned and planned <= measured:
                    return {pair: links[pair] for pair in planned}
            time.sleep(1.0)
        raise MatrixNotFull(
            f"the link matrix was not full after {timeout_s:g} s; logs in {self.workdir}"
        )
