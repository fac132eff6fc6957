"""`netopt nccl-env`: formats, per-node output, the links file, bad input (exit 2)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from netopt.cli.main import main
from netopt.config import LinksSettings, load_settings
from netopt.errors import ConfigError
from netopt.nccl.domains import check_value
from netopt.nccl.from_links import node_infos

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "links-example.yaml"
NODES = "hk-1,hk-2,us-1,us-2"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def env_lines(text: str) -> list[tuple[str, str]]:
    """KEY=VALUE lines outside comments (the switch's lines included)."""
    pairs = []
    for line in text.splitlines():
        match = re.match(r"^\s*(?:export )?([A-Z][A-Z0-9_]+)=(.*)$", line)
        if match:
            pairs.append((match.group(1), match.group(2)))
    return pairs


def test_example_links_file_loads_and_is_detected(capsys) -> None:
    settings = load_settings(EXAMPLE)
    assert isinstance(settings, LinksSettings)
    assert [n.name for n in node_infos(settings)] == ["hk-1", "hk-2", "us-1", "us-2"]
    code, out, _ = run(capsys, "config", "check", str(EXAMPLE))
    assert code == 0
    assert "links: 4 nodes in 2 regions" in out


def test_env_output_puts_a_reason_above_every_value(capsys) -> None:
    code, out, _ = run(capsys, "nccl-env", "--nodes", NODES, "--links", str(EXAMPLE),
                       "--nccl-version", "2.26.2", "--per-node", "switch")  # fmt: skip
    assert code == 0
    lines = out.splitlines()
    assignments = [i for i, line in enumerate(lines) if re.match(r"^\s*[A-Z][A-Z0-9_]+=", line)]
    assert len(assignments) >= 10
    for i in assignments:
        assert lines[i - 1].strip().startswith("# "), lines[i]
        assert len(lines[i - 1].strip()) > 10
    for key, value in env_lines(out):
        check_value(key, value, (2, 26, 2), (2, 4, 0))
    # Interface names differ between regions: a hostname switch, exact names.
    assert 'case "$(hostname -s)" in' in out
    assert "NCCL_SOCKET_IFNAME==bond0" in out
    assert "NCCL_SOCKET_IFNAME==ens5" in out
    assert "docker0" not in [v for k, v in env_lines(out) if k.endswith("IFNAME")]


def test_env_switch_runs_in_a_real_shell(capsys, tmp_path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    import subprocess

    target = tmp_path / "nccl.env"
    code, _, _ = run(capsys, "nccl-env", "--nodes", NODES, "--links", str(EXAMPLE), "-o",
                     str(target), "--per-node", "switch")  # fmt: skip
    assert code == 0
    script = (
        f'hostname() {{ echo us-2; }}; set -a; . "{target}"; set +a; '
        'echo "$NCCL_SOCKET_IFNAME|$GLOO_SOCKET_IFNAME|$NCCL_SOCKET_FAMILY"'
    )
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert shell.stdout.strip() == "=ens5|ens5|AF_INET"


def test_per_node_files(capsys, tmp_path) -> None:
    target = tmp_path / "nccl.env"
    code, _, _ = run(capsys, "nccl-env", "--nodes", NODES, "--links", str(EXAMPLE),
                     "--per-node", "files", "-o", str(target))  # fmt: skip
    assert code == 0
    hk = (tmp_path / "nccl.hk-1.env").read_text()
    us = (tmp_path / "nccl.us-1.env").read_text()
    assert "NCCL_SOCKET_IFNAME==bond0" in hk
    assert "NCCL_SOCKET_IFNAME==ens5" in us
    assert "case " not in hk
    assert dict(env_lines(hk))["NCCL_IB_DISABLE"] == "1"


def test_json_format_and_explain(capsys) -> None:
    code, out, err = run(capsys, "nccl-env", "--nodes", "hk-1,us-1", "--links", str(EXAMPLE),
                         "--format", "json", "--explain", "--params", "100000000",
                         "--step-compute-ms", "500")  # fmt: skip
    assert code == 0
    document = json.loads(out)
    assert document["nodes"] == ["hk-1", "us-1"]
    assert document["advice"]["hook"] in ("bf16_compress_hook", "powerSGD_hook")
    assert document["per_node"]["us-1"][0]["key"] == "NCCL_SOCKET_IFNAME"
    sizes = {p["size_bytes"] for p in document["predictions"]}
    assert min(sizes) == 1024
    assert max(sizes) == 256 * 2**20
    assert "predicted all-reduce time" in err  # --explain goes to stderr when env is on stdout
    assert "ring ms" in err


def test_backend_gloo_weighs_the_advice_with_glooplan(capsys) -> None:
    args = ["nccl-env", "--nodes", NODES, "--links", str(EXAMPLE), "--format", "json",
            "--params", "5700000", "--step-compute-ms", "1900"]  # fmt: skip
    code, out, _err = run(capsys, *args, "--backend", "gloo")
    assert code == 0
    gloo = json.loads(out)["advice"]
    assert "round trip" in gloo["bucket_reason"]  # Gloo's fixed waits, per bucket
    assert isinstance(gloo["powersgd_alternate"], bool)
    assert gloo["powersgd_alternate"] == ("powersgd_alternate=True" in gloo["hook_reason"])
    code, out, _err = run(capsys, *args)
    assert code == 0
    assert "round trip" not in json.loads(out)["advice"]["bucket_reason"]
    assert json.loads(out)["advice"]["powersgd_alternate"] is False  # NCCL: not weighed
    code, _out, err = run(capsys, *args, "--backend", "mpi")
    assert code == 2
    assert "mpi" in err


def test_slurm_and_k8s_formats(capsys) -> None:
    code, out, _ = run(capsys, "nccl-env", "--nodes", NODES, "--links", str(EXAMPLE),
                       "--format", "slurm", "--per-node", "switch")  # fmt: skip
    assert code == 0
    assert out.startswith("#!/bin/bash")
    assert "export NCCL_IB_DISABLE=1" in out
    assert "${SLURMD_NODENAME:-$(hostname -s)}" in out
    code, out, _ = run(capsys, "nccl-env", "--nodes", NODES, "--links", str(EXAMPLE),
                       "--format", "k8s")  # fmt: skip
    assert code == 0
    docs = [d for d in yaml.safe_load_all(out) if d]
    names = [d["metadata"]["name"] for d in docs]
    assert names[0] == "netopt-nccl-env"
    assert "netopt-nccl-env-us-2" in names
    assert docs[0]["data"]["NCCL_NET"] == "Socket"
    assert all(isinstance(v, str) for d in docs for v in d["data"].values())


def test_tuner_csv_matches_the_example_plugin_format(capsys, tmp_path) -> None:
    csv = tmp_path / "tuner.conf"
    code, out, _ = run(capsys, "nccl-env", "--nodes", NODES, "--links", str(EXAMPLE),
                       "--nccl-version", "2.26.2", "--tuner-csv", str(csv),
                       "--node", "hk-1")  # fmt: skip
    assert code == 0
    assert f"NCCL_TUNER_CONFIG_FILE={csv.resolve()}" in out
    rows = [line for line in csv.read_text().splitlines() if line and not line.startswith("#")]
    assert rows
    for row in rows:
        fields = row.split(",")
        assert len(fields) == 8  # the plugin's required fields
        assert fields[0] == "allreduce"
        assert fields[3] in ("ring", "tree")
        assert fields[4] in ("ll", "ll128", "simple")
        assert int(fields[1]) <= int(fields[2]) <= 4294967295
        assert len(row) < 256  # the plugin's MAX_LINE_LENGTH


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "hk-1,hk-9"], "unknown node hk-9"),
        (["--nodes", "hk-1,hk-1"], "twice"),
        (["--nodes", "hk-1"], "at least two nodes"),
        (["--nodes", NODES, "--per-node", "files"], "needs -o"),
        (["--nodes", NODES, "--per-node", "files", "--format", "json", "-o", "x"], "cannot be"),
        (["--nodes", NODES, "--tuner-csv", "t.csv", "--nccl-version", "2.18.1"], "2.19.3"),
        (["--nodes", NODES, "--params", "1000"], "both"),
        (["--nodes", NODES, "--nccl-version", "latest"], "MAJOR"),
        (["--nodes", NODES, "--nccl-version", "2.3.7"], "older"),
        (["--nodes", NODES, "--bucket-mib", "0"], "positive"),
        (["--nodes", NODES], "GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME differ"),
        (["--nodes", NODES, "--node", "eu-1"], "not one of --nodes"),
        (["--nodes", NODES, "--node", "hk-1", "--per-node", "switch"], "cannot be combined"),
        (["--nodes", NODES, "--node", "hk-1", "--format", "k8s"], "env or slurm"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(capsys, args, message) -> None:
    code, _out, err = run(capsys, "nccl-env", "--links", str(EXAMPLE), *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_a_pair_without_figures_is_named(capsys, tmp_path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["links"] = [x for x in data["links"] if set(x["between"]) != {"hk-2", "us-2"}]
    path = tmp_path / "links.yaml"
    path.write_text(yaml.safe_dump(data))
    code, _, err = run(capsys, "nccl-env", "--nodes", NODES, "--links", str(path))
    assert code == 2
    assert "hk-2 <-> us-2" in err


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda d: d["links"][0].update(between=["hk-1", "eu-1"]), "links[0].between[1]"),
        (lambda d: d["links"][0].update(interfaces=["bond7", "bond0"]), "links[0].interfaces[0]"),
        (lambda d: d["links"][0].update(single_stream_mbps=99999), "links[0].single_stream_mbps"),
        (lambda d: d["links"][0].update(loss_ratio=1.5), "links[0].loss_ratio"),
        (lambda d: d["links"][0].update(outages_s=[-3]), "links[0].outages_s[0]"),
        (lambda d: d["nodes"]["hk-1"]["nics"][1].update(addresses=["10.0.0.300/24"]),
         "nodes.hk-1.nics[1].addresses[0]"),
        (lambda d: d["links"].append(dict(d["links"][0])), "links[7]"),
    ],
)  # fmt: skip
def test_links_file_errors_name_the_key(tmp_path, mutate, key) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    mutate(data)
    path = tmp_path / "links.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError) as info:
        load_settings(path, "links")
    assert info.value.key_path == key


PLAIN_LINE = re.compile(r"^[A-Z_][A-Z0-9_]*=[^'\"\s]*$")


def test_default_env_output_is_a_plain_key_value_file(capsys, tmp_path) -> None:
    """Without --per-node switch: KEY=VALUE and comment lines only (docker --env-file,
    systemd EnvironmentFile=, /etc/nccl.conf), the same values a shell reads from it."""
    code, out, _ = run(capsys, "nccl-env", "--nodes", "hk-1,hk-2", "--links", str(EXAMPLE),
                       "--nccl-version", "2.26.2")  # fmt: skip
    assert code == 0
    body = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert len(body) >= 8
    for line in body:
        assert PLAIN_LINE.match(line), line
    assert "case " not in out
    assert "# versions: NCCL 2.26.2 (given)" in out
    if shutil.which("bash") is not None:
        import subprocess

        path = tmp_path / "nccl.env"
        path.write_text(out)
        shell = subprocess.run(
            ["bash", "-c", f'set -a; . "{path}"; env'], capture_output=True, text=True, check=True
        )
        seen = dict(line.split("=", 1) for line in shell.stdout.splitlines() if "=" in line)
        for key, value in (line.split("=", 1) for line in body):
            assert seen[key] == value


def test_one_nodes_file_holds_its_own_interfaces(capsys) -> None:
    code, out, _ = run(capsys, "nccl-env", "--nodes", NODES, "--links", str(EXAMPLE),
                       "--node", "us-2")  # fmt: skip
    assert code == 0
    values = dict(env_lines(out))
    assert values["NCCL_SOCKET_IFNAME"] == "=ens5"
    assert values["GLOO_SOCKET_IFNAME"] == "ens5"
    assert "NCCL_IB_DISABLE" in values  # and the common values
    for line in out.splitlines():
        assert not line or line.startswith("#") or PLAIN_LINE.match(line), line


def test_slurm_node_output_is_what_a_task_prolog_prints(capsys) -> None:
    """Slurm reads a TaskProlog's stdout: 'export NAME=value' (value taken literally);
    comments are ignored. Nothing else may appear."""
    code, out, _ = run(capsys, "nccl-env", "--nodes", NODES, "--links", str(EXAMPLE),
                       "--node", "hk-1", "--format", "slurm")  # fmt: skip
    assert code == 0
    exports = []
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        match = re.match(r"^export ([A-Z_][A-Z0-9_]*)=([^'\"\s]*)$", line)
        assert match, line
        exports.append(match[1])
    assert "NCCL_SOCKET_IFNAME" in exports
    assert len(exports) == len(set(exports))


TASK_PROLOG = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "task-prolog.sh"


def _task_prolog(tmp_path: Path, **env: str) -> str:
    import subprocess
    import sys

    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    netopt = tmp_path / "netopt"
    netopt.write_text(f'#!/bin/sh\nexec {sys.executable} -m netopt "$@"\n')
    netopt.chmod(0o755)
    full = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "NETOPT": str(netopt),
            "SLURM_JOB_ID": "4242", **env}  # fmt: skip
    done = subprocess.run(
        ["bash", str(TASK_PROLOG)], env=full, capture_output=True, text=True, check=False,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_task_prolog_prints_only_exports_for_its_node(tmp_path) -> None:
    out = _task_prolog(tmp_path, NETOPT_LINKS=str(EXAMPLE), SLURM_JOB_NODELIST=NODES,
                       SLURMD_NODENAME="us-1")  # fmt: skip
    lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert lines
    assert all(re.match(r"^export [A-Z_][A-Z0-9_]*=\S*$", line) for line in lines)
    assert "export GLOO_SOCKET_IFNAME=ens5" in lines
    assert (tmp_path / "netopt-nccl.4242.us-1").read_text() == out  # tuned once per job and node


def test_task_prolog_never_fails_a_task(tmp_path) -> None:
    out = _task_prolog(tmp_path, NETOPT_LINKS=str(EXAMPLE), SLURM_JOB_NODELIST="hk-1,zz-9",
                       SLURMD_NODENAME="hk-1")  # fmt: skip
    (line,) = out.splitlines()
    assert line.startswith("print netopt task prolog: nccl-env failed")
    assert "zz-9" in line
    assert not list(tmp_path.glob("netopt-nccl.*"))
