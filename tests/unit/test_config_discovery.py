"""Config discovery (/etc/netopt, then XDG_CONFIG_HOME), NETOPT_COORDINATOR for every
command that takes --coordinator, and `config show` never printing a secret."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from netopt.config.discovery import config_candidates, coordinator_url, find_config
from netopt.errors import UsageError
from tests.service.coordinator_helpers import free_port

REPO = Path(__file__).resolve().parents[2]


def _netopt(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
    return subprocess.run(
        [sys.executable, "-m", "netopt", *args], cwd=REPO, env=full, capture_output=True,
        text=True, check=False, timeout=60,
    )  # fmt: skip


def test_system_dir_first_then_xdg(tmp_path: Path) -> None:
    system, xdg = tmp_path / "etc", tmp_path / "xdg"
    env = {"XDG_CONFIG_HOME": str(xdg), "HOME": str(tmp_path / "home")}
    assert config_candidates("agent", env, system) == (
        system / "agent.yaml", xdg / "netopt" / "agent.yaml",
    )  # fmt: skip
    with pytest.raises(UsageError, match=r"no agent config: give --config FILE \(tried .*etc"):
        find_config("agent", None, env, system)
    (xdg / "netopt").mkdir(parents=True)
    (xdg / "netopt" / "agent.yaml").write_text("kind: agent\n")
    assert find_config("agent", None, env, system) == str(xdg / "netopt" / "agent.yaml")
    system.mkdir()
    (system / "agent.yaml").write_text("kind: agent\n")
    assert find_config("agent", None, env, system) == str(system / "agent.yaml")
    assert find_config("agent", "given.yaml", env, system) == "given.yaml"
    home_default = config_candidates("coordinator", {"HOME": "/home/u"}, system)[1]
    assert home_default == Path("/home/u/.config/netopt/coordinator.yaml")


def test_coordinator_url_from_the_environment() -> None:
    assert coordinator_url("http://a:1", {"NETOPT_COORDINATOR": "http://b:2"}) == "http://a:1"
    assert coordinator_url(None, {"NETOPT_COORDINATOR": "http://b:2"}) == "http://b:2"
    assert coordinator_url(None, {"NETOPT_COORDINATOR": ""}) is None
    assert coordinator_url(None, {}) is None


@pytest.mark.skipif(Path("/etc/netopt/coordinator.yaml").exists(), reason="a real config here")
def test_the_coordinator_command_finds_its_config_in_xdg(tmp_path: Path) -> None:
    (tmp_path / "netopt").mkdir()
    found = tmp_path / "netopt" / "coordinator.yaml"
    found.write_text("kind: coordinator\nretention_s: -5\n")  # invalid: the error names it
    done = _netopt("coordinator", env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert str(found) in done.stderr
    assert "retention_s" in done.stderr
    done = _netopt("coordinator", env={"XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert done.returncode == 2
    assert "no coordinator config: give --config FILE" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["nccl-env", "--nodes", "a,b"],
        ["doctor", "--json"],
        ["plan", "--to", "b", "--from", "a", "--sample", "README.md"],
    ],
)
def test_netopt_coordinator_reaches_every_coordinator_command(args: list[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the error names the URL
    env = {"NETOPT_COORDINATOR": url, "NETOPT_TOKEN": "discovery-token-0123456789"}
    done = _netopt(*args, env=env)
    assert done.returncode != 0
    assert url in done.stdout + done.stderr


def test_config_show_never_prints_a_token(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("kind: coordinator\ntoken: inline-secret-0123456789\n")
    done = _netopt("config", "show", str(path), env={})
    assert done.returncode == 0, done.stderr
    assert "inline-secret" not in done.stdout
    assert '"token": "(hidden)"' in done.stdout
    done = _netopt("config", "show", str(path), env={"NETOPT_TOKEN": "env-secret-0123456789"})
    assert "env-secret" not in done.stdout


def test_doctor_reaches_a_peer_at_its_registered_address_not_its_loopback() -> None:
    from netopt.cli.doctor_cmd import _peer_address
    from netopt.wire.answers import NodeView
    from netopt.wire.fields import Reader

    lo_first = {"node": "b", "region": "eu", "state": "live",
                "nics": [{"name": "lo", "addresses": ["127.0.0.1/8"]},
                         {"name": "eth0", "addresses": ["198.18.0.7/24"]}]}  # fmt: skip

    def peer(data: dict[str, object]) -> str | None:
        return _peer_address(NodeView.read(Reader(data)))

    assert peer(lo_first) == "198.18.0.7"
    assert peer({**lo_first, "host": "198.18.9.9"}) == "198.18.9.9"
    assert peer({**lo_first, "host": "127.0.0.1"}) == "198.18.0.7"
    assert peer({**lo_first, "host": "127.0.0.1", "nics": []}) == "127.0.0.1"  # all it has
    assert peer({**lo_first, "nics": []}) is None
