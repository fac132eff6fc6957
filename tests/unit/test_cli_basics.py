"""The CLI's help, exit codes and `netopt config check`, run as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netopt", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )


def test_help_lists_commands_and_exits_zero() -> None:
    result = run("--help")
    assert result.returncode == 0
    assert "config" in result.stdout
    assert "--log-level" in result.stdout


def test_version() -> None:
    from netopt import __version__

    result = run("--version")
    assert result.returncode == 0
    assert __version__ in result.stdout


def test_unknown_command_is_usage_error() -> None:
    result = run("no-such-command")
    assert result.returncode == 2
    assert "No such command" in result.stderr


def test_bad_option_is_usage_error() -> None:
    result = run("config", "check", "--kind", "toaster", "configs/agent.yaml")
    assert result.returncode == 2


def test_config_check_good_files() -> None:
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").rglob("*.yaml"))
    result = run("config", "check", *files)
    assert result.returncode == 0, result.stderr
    for file in files:
        assert f"{file}: ok" in result.stdout


def test_config_check_json_good() -> None:
    result = run("config", "check", "--json", "configs/lab/two-region.yaml")
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["ok"] is True
    assert data["kind"] == "lab"


@pytest.mark.parametrize("as_json", [False, True])
def test_config_check_bad_file_exit_2_with_the_loader_error(tmp_path: Path, as_json: bool) -> None:
    bad = tmp_path / "lab.yaml"
    bad.write_text("regions:\n  hk:\n    nodes: [hk-1]\nlinks:\n  - between: [hk, mars]\n")
    args = ["config", "check", str(bad)] + (["--json"] if as_json else [])
    result = run(*args)
    assert result.returncode == 2
    if as_json:
        data = json.loads(result.stdout)
        assert data["error"] == "ConfigError"
        assert data["file"] == str(bad)
        assert data["key"] == "links[0].between[1]"
        assert data["line"] == 5
    else:
        assert f"{bad}:5: key 'links[0].between[1]' names unknown region 'mars'" in result.stderr


def test_config_check_kind_forces_the_schema(tmp_path: Path) -> None:
    file = tmp_path / "x.yaml"
    file.write_text("node: n1\nregion: hk\n")
    assert run("config", "check", "--kind", "agent", str(file)).returncode == 0
    wrong = run("config", "check", "--kind", "coordinator", str(file))
    assert wrong.returncode == 2
    assert "'node' is not a known key" in wrong.stderr


def test_config_show_applies_defaults_and_env(tmp_path: Path) -> None:
    file = tmp_path / "agent.yaml"
    file.write_text("node: n1\nregion: hk\n")
    result = subprocess.run(
        [sys.executable, "-m", "netopt", "config", "show", str(file)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"NETOPT_AGENT__PROBE__RATE_PPS": "33", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["probe"]["rate_pps"] == 33.0
    assert data["listen"] == {"host": "127.0.0.1", "port": 7470}


def test_log_level_is_validated() -> None:
    assert run("--log-level", "debug", "config", "--help").returncode == 0
    assert run("--log-level", "loud", "config", "--help").returncode == 2


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).parent / "netopt"
    assert exe.exists()
    result = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0


_QUICK_EXIT = """
import atexit, sys, threading, time
from pathlib import Path
from netopt.cli.main import run
out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
if sys.argv[2] == "thread":
    def late() -> None:
        time.sleep(0.3)
        (out / "thread").write_text("finished")
    threading.Thread(target=late).start()
sys.argv = ["netopt", "config", "show", "configs/coordinator.yaml"]
run()
"""


@pytest.mark.parametrize("thread", ["none", "thread"])
def test_quick_exit_flushes_output_runs_atexit_and_waits_for_threads(
    tmp_path: Path, thread: str
) -> None:
    # `run` ends the process with os._exit after the command: buffered output, atexit
    # handlers and a still-running non-daemon thread must not be lost to it.
    result = subprocess.run(
        [sys.executable, "-c", _QUICK_EXIT, str(tmp_path), thread],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "listen" in json.loads(result.stdout)
    assert (tmp_path / "atexit").read_text() == "ran"
    if thread == "thread":
        assert (tmp_path / "thread").read_text() == "finished"


def _all_commands() -> list[tuple[str, click.Command]]:
    from netopt.cli.main import cli

    out: list[tuple[str, click.Command]] = []

    def walk(command: click.Command, path: str) -> None:
        out.append((path, command))
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, f"{path} {name}")

    walk(cli, "netopt")
    return out


def test_every_command_and_option_has_help_text() -> None:
    missing = []
    commands = _all_commands()
    assert len(commands) > 20
    for path, command in commands:
        if not (command.help or command.short_help):
            missing.append(path)
        for param in command.params:
            builtin = {"--help", "--version"} & set(param.opts)
            if isinstance(param, click.Option) and not (param.hidden or param.help or builtin):
                missing.append(f"{path} {'/'.join(param.opts)}")
    assert missing == []


def test_shell_completion_works_as_documented() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "_NETOPT_COMPLETE": "bash_complete", "COMP_WORDS": "netopt sy",
           "COMP_CWORD": "1"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "netopt"], env=env, capture_output=True, text=True, check=False
    )
    assert "plain,sync" in done.stdout.splitlines()
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "_NETOPT_COMPLETE=bash_source netopt" in readme
