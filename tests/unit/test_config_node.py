"""A client command's node settings: options win over the agent config, which is read
once (``netopt sync --config`` used to read it three or four times)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from netopt.config.node import DEFAULT_MAX_STREAMS, default_cache_dir, resolve_node
from netopt.errors import ValidationError

REPO = Path(__file__).resolve().parents[2]
TOKEN = "t" * 24

# Runs the CLI in-process under an audit hook that counts the opens of one file.
_COUNT_OPENS = """
import sys
target, reads = sys.argv[1], []
sys.addaudithook(lambda event, args: reads.append(1)
                 if event == "open" and args and str(args[0]) == target else None)
from netopt.cli.main import cli
try:
    cli.main(args=sys.argv[2:], standalone_mode=False)
finally:
    print("opens:", len(reads), file=sys.stderr)
"""


def _agent_yaml(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text(TOKEN)
    config = tmp_path / "agent.yaml"
    config.write_text(
        "kind: agent\nnode: n1\nregion: hk\ncoordinator_url: http://127.0.0.1:1\n"
        f"token_file: {tmp_path / 'token'}\n"
        f"cache: {{dir: {tmp_path / 'cache'}, capacity_bytes: 1GiB, max_parallel_streams: 8,"
        " rate_limit_mbps: 40, congestion_control: reno}\n"
    )
    return config


def test_the_agent_config_fills_what_the_options_leave(tmp_path: Path) -> None:
    config = _agent_yaml(tmp_path)
    here = resolve_node(str(config), agent_token=True)
    assert (here.cache_dir, here.capacity_bytes) == (str(tmp_path / "cache"), 2**30)
    assert (here.region, here.node, here.coordinator_url) == ("hk", "n1", "http://127.0.0.1:1")
    assert (here.token, here.max_parallel_streams, here.rate_limit_mbps) == (TOKEN, 8, 40)
    assert here.congestion_control == "reno"
    given = resolve_node(
        str(config), cache_dir="/x", capacity="2GiB", region="eu", node="n2",
        coordinator_url="http://127.0.0.1:2", token="given-" + TOKEN, agent_token=True,
    )  # fmt: skip
    assert (given.cache_dir, given.capacity_bytes, given.region) == ("/x", 2 * 2**30, "eu")
    assert (given.node, given.coordinator_url) == ("n2", "http://127.0.0.1:2")
    assert given.token == "given-" + TOKEN
    # The agent's token file is read only when the command asks for it.
    assert resolve_node(str(config)).token is None


def test_without_a_config_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    here = resolve_node(None, agent_token=True)
    assert here.cache_dir == default_cache_dir() == str(tmp_path / "netopt" / "cache")
    assert (here.config_file, here.region, here.node, here.token) == (None, None, None, None)
    assert (here.max_parallel_streams, here.congestion_control) == (DEFAULT_MAX_STREAMS, None)
    with pytest.raises(ValidationError, match="--capacity"):
        resolve_node(None, capacity="lots")


def test_sync_reads_the_agent_config_once(tmp_path: Path) -> None:
    config = _agent_yaml(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 4096)
    done = subprocess.run(
        [sys.executable, "-c", _COUNT_OPENS, str(config), "sync", str(src),
         str(tmp_path / "dest"), "--config", str(config), "--no-share", "--dry-run", "--json"],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"files_to_write": 1' in done.stdout
    assert "opens: 1\n" in done.stderr
