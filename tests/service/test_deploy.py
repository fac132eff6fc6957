"""The deployment artefacts in deploy/ and the Dockerfile: rendered, validated, linted.

Kubernetes: ``kubectl kustomize`` renders the whole system and each region's overlay;
every object passes the Kubernetes schema (kubernetes-validate, strict: unknown fields
fail) and the configs inside the ConfigMaps pass ``netopt config check``. systemd:
``systemd-analyze verify`` with no warning, and ``systemd-analyze security`` exposure.
The container image is built and run where a builder can run (podman or buildah, which
need a registry to pull the base image from), else skipped with that reason; its
Dockerfile's shape is checked everywhere.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NETOPT = [sys.executable, "-m", "netopt"]


def _kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (scripts/setup.sh installs kubernetes-client)")
    version = subprocess.run(
        [kubectl, "version", "--client"], capture_output=True, text=True, check=False
    ).stdout
    match = re.search(r"Kustomize Version: v(\d+)", version)
    if match is None or int(match[1]) < 4:
        pytest.skip(f"kubectl's kustomize is older than v4 (labels/patches fields): {version!r}")
    done = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr  # no deprecated field left
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _validate(doc: dict[str, Any]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return list(spec["containers"]) + list(spec.get("initContainers", []))


def test_whole_system_renders_and_passes_the_kubernetes_schema() -> None:
    docs = _kustomize(DEPLOY / "kubernetes")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["Namespace", "ConfigMap", "ConfigMap", "ConfigMap", "Service", "StatefulSet",
         "DaemonSet", "DaemonSet"]
    )  # fmt: skip
    for doc in docs:
        _validate(doc)
    # The validator is strict: a misspelt field fails (so passing means something).
    broken = copy.deepcopy(_by_kind(docs, "StatefulSet")[0])
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(Exception, match="readinesProbe"):
        _validate(broken)
    assert all(d["metadata"].get("namespace") == "netopt" for d in docs if d["kind"] != "Namespace")


def test_coordinator_is_a_statefulset_with_a_volume_probes_and_the_token_secret() -> None:
    docs = _kustomize(DEPLOY / "kubernetes")
    (sts,) = _by_kind(docs, "StatefulSet")
    (svc,) = _by_kind(docs, "Service")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "state", "mountPath": "/var/lib/netopt"} in container["volumeMounts"]
    assert claim["metadata"]["name"] == "state"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]
    token = {e["name"]: e for e in container["env"]}["NETOPT_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": "netopt-token", "key": "token"}
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["port"] == 7460
    assert sts["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_each_region_gets_its_agents_on_gpu_nodes_with_its_own_config(tmp_path: Path) -> None:
    docs = _kustomize(DEPLOY / "kubernetes")
    maps = {d["metadata"]["name"]: d for d in _by_kind(docs, "ConfigMap")}
    for region in ("hk", "us"):
        (ds,) = [d for d in _by_kind(docs, "DaemonSet") if d["metadata"]["name"].endswith(region)]
        spec = ds["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"topology.kubernetes.io/region": region}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
            "tolerations"
        ]
        assert spec["hostNetwork"] is True
        agent = spec["containers"][0]
        for probe in ("readinessProbe", "livenessProbe"):
            assert agent[probe]["httpGet"] == {"path": "/healthz", "port": 7470, "scheme": "HTTPS"}
        assert agent["resources"]["limits"]["memory"]
        assert agent["securityContext"]["allowPrivilegeEscalation"] is False
        # The DaemonSet mounts the generated ConfigMap of its region, and that config is valid.
        (config_volume,) = [v for v in spec["volumes"] if v["name"] == "config"]
        config_map = maps[config_volume["configMap"]["name"]]
        path = tmp_path / f"agent-{region}.yaml"
        path.write_text(config_map["data"]["agent.yaml"])
        assert yaml.safe_load(path.read_text())["region"] == region
        _config_check(path, "agent", _agent_tls_env(spec))
    (coordinator_map,) = [m for name, m in maps.items() if name.startswith("netopt-coordinator")]
    path = tmp_path / "coordinator.yaml"
    path.write_text(coordinator_map["data"]["coordinator.yaml"])
    _config_check(path, "coordinator")
    _assert_coordinator_tls(_by_kind(docs, "StatefulSet")[0], path)
    for workload in _by_kind(docs, "DaemonSet") + _by_kind(docs, "StatefulSet"):
        for container in _containers(workload):
            assert container["image"] == "registry.example.internal/netopt:0.1.0"


def _agent_tls_env(spec: dict[str, Any]) -> dict[str, str]:
    """The agent's TLS as the DaemonSet sets it, checked against what node-cert writes."""
    (init,) = [c for c in spec["initContainers"] if c["name"] == "node-cert"]
    args = init["args"]
    assert args[:3] == ["tls", "issue", "$(NODE)"]
    out = args[args.index("--out") + 1]
    assert args[args.index("--ip") + 1] == "$(HOST_IP)"
    init_env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in init["env"]}
    assert init_env == {"NODE": "spec.nodeName", "HOST_IP": "status.hostIP"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    ca_volume = volumes[mounts[args[args.index("--dir") + 1]]]
    assert ca_volume["secret"]["secretName"] == "netopt-ca"
    assert volumes[mounts[out]]["emptyDir"]["medium"] == "Memory"
    agent = spec["containers"][0]
    # The agent sees the node's files, never the CA's directory (its key).
    assert {m["name"] for m in agent["volumeMounts"]} >= {mounts[out]}
    assert mounts[args[args.index("--dir") + 1]] not in {m["name"] for m in agent["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in agent["env"]}
    # Kubernetes expands $(VAR) from variables defined earlier in the list.
    names = [e["name"] for e in agent["env"]]
    assert names.index("NETOPT_AGENT__NODE") < names.index("NETOPT_AGENT__TLS__CERT")
    tls = {k: v.replace("$(NETOPT_AGENT__NODE)", "gpu-node-7")
           for k, v in env.items() if k.startswith("NETOPT_AGENT__TLS__") and v}  # fmt: skip
    assert tls == {"NETOPT_AGENT__TLS__CERT": f"{out}/gpu-node-7.pem",
                   "NETOPT_AGENT__TLS__KEY": f"{out}/gpu-node-7-key.pem"}  # fmt: skip
    return tls


def _assert_coordinator_tls(sts: dict[str, Any], config: Path) -> None:
    tls = yaml.safe_load(config.read_text())["tls"]
    spec = sts["spec"]["template"]["spec"]
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "tls"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "netopt-coordinator-tls"
    assert sorted(tls) == ["ca", "cert", "key"]
    assert all(Path(tls[k]).parent == Path(mount["mountPath"]) for k in tls)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert spec["containers"][0][probe]["httpGet"]["scheme"] == "HTTPS"


def test_shipped_kubernetes_configs_run_tls_not_plaintext() -> None:
    for path in (DEPLOY / "kubernetes").rglob("*.yaml"):
        assert "allow_plaintext" not in path.read_text(), path
        assert "http://netopt-coordinator" not in path.read_text(), path


def test_one_region_overlay_renders_alone() -> None:
    docs = _kustomize(DEPLOY / "kubernetes" / "overlays" / "us")
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "DaemonSet"]
    for doc in docs:
        _validate(doc)


def _config_check(path: Path, kind: str, extra_env: dict[str, str] | None = None) -> None:
    env = {"NETOPT_TOKEN": "k8s-test-token-0123456789", "PATH": "/usr/bin:/bin",
           **(extra_env or {})}  # fmt: skip
    done = subprocess.run(
        [*NETOPT, "config", "check", "--kind", kind, str(path)],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


UNITS = ("netopt-coordinator.service", "netopt-agent.service")


@pytest.fixture
def units(tmp_path: Path) -> list[Path]:
    """The units with ExecStart pointing at this checkout's netopt (verify checks the path)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    netopt = Path(sys.executable).parent / "netopt"
    out = []
    for name in UNITS:
        text = (DEPLOY / "systemd" / name).read_text()
        path = tmp_path / name
        path.write_text(text.replace("/opt/netopt/bin/netopt", str(netopt)))
        out.append(path)
    return out


def test_systemd_units_verify_without_a_warning(units: list[Path]) -> None:
    done = subprocess.run(
        ["systemd-analyze", "verify", *map(str, units)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr  # unknown keys are only warnings
    for path in units:
        text = path.read_text()
        assert "User=netopt" in text
        assert "LoadCredential=token:" in text
        assert re.search(r"^Environment=NETOPT_\w+__TOKEN_FILE=%d/token$", text, re.M)
        for key in ("ProtectKernelTunables", "ProtectKernelModules", "PrivateDevices",
                    "RestrictAddressFamilies", "SystemCallFilter", "NoNewPrivileges"):  # fmt: skip
            assert re.search(rf"^{key}=", text, re.M), key


def test_systemd_units_expose_little(units: list[Path]) -> None:
    for path in units:
        done = subprocess.run(
            ["systemd-analyze", "security", "--offline=yes", str(path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
        assert match, done.stdout[-500:] + done.stderr
        assert float(match[1]) <= 2.0, f"{path.name}: exposure {match[1]}"


def test_the_units_token_credential_reaches_the_config(tmp_path: Path) -> None:
    """What the unit sets (token_file from $CREDENTIALS_DIRECTORY) is what netopt reads."""
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "token").write_text("credential-token-0123456789\n")
    config = tmp_path / "coordinator.yaml"
    config.write_text("kind: coordinator\nlisten: {host: 127.0.0.1, port: 7460}\n")
    env = {"NETOPT_COORDINATOR__TOKEN_FILE": str(creds / "token"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [*NETOPT, "config", "show", "--kind", "coordinator", str(config)],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert str(creds / "token") in done.stdout
    assert "credential-token" not in done.stdout  # never printed


def test_logrotate_file_parses() -> None:
    logrotate = shutil.which("logrotate") or "/usr/sbin/logrotate"
    if not Path(logrotate).exists():
        pytest.skip("logrotate is not installed")
    done = subprocess.run(
        [logrotate, "--debug", str(DEPLOY / "logrotate" / "netopt")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "error" not in done.stderr.lower(), done.stderr


def test_dockerfile_is_multi_stage_non_root_without_a_compiler_in_the_final_stage() -> None:
    text = (REPO / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) == 2
    final = stages[-1]
    assert re.search(r"^USER 10001", final, re.M)
    assert "iperf3" in final
    assert not re.search(r"build-essential|gcc|g\+\+|clang", final)
    assert "--no-cache-dir" in final
    assert re.search(r'^ENTRYPOINT \["netopt"\]', final, re.M)
    # Whatever the stages COPY from the context is let through by .dockerignore.
    ignore = (REPO / ".dockerignore").read_text().split()
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.M):
        for name in source.split():
            assert f"!{name}" in ignore or f"!{name}/" in ignore, name
            assert (REPO / name).exists(), name


def test_container_image_builds_and_runs(tmp_path: Path) -> None:
    builder = shutil.which("podman") or shutil.which("buildah")
    if builder is None:
        pytest.skip("no container builder (podman or buildah) is installed")
    probe = subprocess.run(
        [builder, "pull", "python:3.11-slim-bookworm"], capture_output=True, text=True,
        check=False, timeout=120,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"{builder} cannot pull the base image here: {probe.stderr.strip()[-200:]}")
    tag = "localhost/netopt-test:ci"
    build = [builder, "build", "-t", tag, str(REPO)]
    if builder.endswith("buildah"):
        build = [builder, "bud", "-t", tag, str(REPO)]
    done = subprocess.run(build, capture_output=True, text=True, check=False, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    try:
        if not builder.endswith("podman"):
            pytest.skip("buildah builds but cannot run the image; podman can")
        version = subprocess.run(
            [builder, "run", "--rm", tag, "--version"], capture_output=True, text=True,
            check=False, timeout=120,
        )  # fmt: skip
        assert version.returncode == 0, version.stderr
        assert "0." in version.stdout
        config = tmp_path / "agent.yaml"
        config.write_text((REPO / "configs" / "agent.yaml").read_text())
        check = subprocess.run(
            [builder, "run", "--rm", "-e", "NETOPT_TOKEN=image-test-token-0123456789",
             "-v", f"{config}:/etc/netopt/agent.yaml:ro", tag,
             "config", "check", "--kind", "agent", "/etc/netopt/agent.yaml"],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr
        user = subprocess.run(
            [builder, "run", "--rm", "--entrypoint", "id", tag, "-u"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert user.stdout.strip() == "10001"
    finally:
        subprocess.run([builder, "rmi", "-f", tag], capture_output=True, check=False)


PROMETHEUS = DEPLOY / "prometheus"


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus; scripts/setup.sh --dev)")
    return promtool


def test_alert_rules_check_and_their_unit_tests_pass() -> None:
    promtool = _promtool()
    check = subprocess.run(
        [promtool, "check", "rules", str(PROMETHEUS / "netopt-alerts.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", "netopt-alerts.test.yml"],
        capture_output=True, text=True, check=False, cwd=PROMETHEUS,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_scrape_config_checks(tmp_path: Path) -> None:
    promtool = _promtool()
    (tmp_path / "token").write_text("scrape-token-0123456789\n")
    (tmp_path / "agents.yml").write_text("- targets: ['127.0.0.1:7470']\n")
    shutil.copy(PROMETHEUS / "netopt-alerts.yml", tmp_path / "netopt-alerts.yml")
    text = (PROMETHEUS / "prometheus.yml").read_text()
    text = text.replace("/etc/prometheus/netopt-token", str(tmp_path / "token"))
    text = text.replace("/etc/prometheus/netopt-agents.yml", str(tmp_path / "agents.yml"))
    (tmp_path / "prometheus.yml").write_text(text)
    done = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr
    (job,) = yaml.safe_load((PROMETHEUS / "prometheus-kubernetes.yml").read_text())[
        "scrape_configs"
    ]
    assert job["job_name"] == "netopt-agent"
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["netopt"]}}]


def _exported_names() -> set[str]:
    """Every metric name netopt exports, from the real exporters' text output."""
    from prometheus_client import generate_latest

    from netopt.agent.metrics import AgentMetrics, SyncTotalsCollector
    from netopt.cache.synctotals import SyncTotals, record_sync
    from netopt.coordinator.linkmetrics import link_families
    from netopt.coordinator.metrics import CoordinatorMetrics

    agent = AgentMetrics()
    agent.spool_dropped.set(1)
    agent.reflected.set(1, "answered")
    agent.served_chunks.set(1)
    agent.served_bytes.set(1)
    for family in (agent.rtt_p50_seconds, agent.loss_ratio, agent.loss_ratio_upper,
                   agent.goodput_bits_per_second):  # fmt: skip
        family.labels("peer").set(1)
    agent.summaries.labels("probe").inc()
    coordinator = CoordinatorMetrics(lambda: {"live": 1, "stale": 0})
    coordinator.requests.labels("/x", "GET", "200").inc()
    coordinator.latency.labels("/x").observe(0.01)
    coordinator.batches.labels("stored").inc()
    coordinator.summaries.labels("stored").inc()
    link = {
        "src": "a", "dst": "b", "src_region": "hk", "dst_region": "us", "latest_at_s": 1.0,
        "latest": {"rtt_p50_ms": 1.0, "rtt_p99_ms": 2.0, "jitter_ms": 0.1},
        "window": {"loss_ratio": 0.0, "probes_sent": 100},
        "bandwidth": {"single_stream_bps": 1e6, "aggregate_bps": 2e6},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as cache_dir:
        record_sync(cache_dir, "ds", SyncTotals(runs_ok=1, written_bytes=1, seconds=1.0))
        agent.registry.register(SyncTotalsCollector(cache_dir))
        agent_text = generate_latest(agent.registry)
    text = (agent_text + coordinator.render(link_families([link]))).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def test_dashboard_and_alerts_use_only_metrics_netopt_exports() -> None:
    exported = _exported_names() | {"up"}
    dashboard = json.loads((DEPLOY / "grafana" / "netopt-dashboard.json").read_text())
    assert dashboard["uid"] == "netopt-overview"
    assert isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    exprs = []
    for panel in dashboard["panels"]:
        assert panel["type"] in {"timeseries", "heatmap", "table", "stat"}, panel["type"]
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys()
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"]
        exprs += [t["expr"] for t in panel["targets"]]
    rules = yaml.safe_load((PROMETHEUS / "netopt-alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = {name for e in exprs for name in re.findall(r"\b(netopt_[a-z0-9_]+|up)\b", e)}
    assert used, exprs
    assert used <= exported, sorted(used - exported)
    # What the issue asks to see: link heatmaps, node health, loss with its interval.
    assert any(p["type"] == "heatmap" for p in dashboard["panels"])
    assert {"netopt_link_loss_ratio_upper", "netopt_coordinator_nodes"} <= used
    # ... and transfer throughput, the cache hit ratio, border bytes saved, sync failures.
    assert {
        "netopt_sync_written_bytes_total",
        "netopt_sync_reused_bytes_total",
        "netopt_sync_wire_bytes_total",
        "netopt_sync_runs_total",
    } <= used


def test_postgres_variant_runs_two_replicas_with_a_disruption_budget(tmp_path: Path) -> None:
    docs = _kustomize(DEPLOY / "kubernetes" / "coordinator-postgres")
    assert sorted(d["kind"] for d in docs) == sorted(
        ["Namespace", "ConfigMap", "Service", "Deployment", "PodDisruptionBudget"]
    )
    for doc in docs:
        _validate(doc)
    (deployment,) = _by_kind(docs, "Deployment")
    (budget,) = _by_kind(docs, "PodDisruptionBudget")
    (svc,) = _by_kind(docs, "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] >= 2
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["image"] == "registry.example.internal/netopt:0.1.0"
    (config_map,) = _by_kind(docs, "ConfigMap")
    text = config_map["data"]["coordinator.yaml"]
    assert yaml.safe_load(text)["database"].startswith("postgresql://")
    path = tmp_path / "coordinator.yaml"
    path.write_text(text)
    _config_check(path, "coordinator")
    _assert_coordinator_tls(deployment, path)
