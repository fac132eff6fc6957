"""``--log-format json``: every service (coordinator, agent, serve) logs one JSON object
per line on stderr, real processes started and stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netopt.logfmt import JsonFormatter
from tests.service.coordinator_helpers import free_port

REPO = Path(__file__).resolve().parents[2]
TOKEN = "log-format-token-0123456789"


def _run_briefly(argv: list[str], seconds: float, tmp_path: Path) -> list[str]:
    """Run until the service's first log line (start-up can be slow on a busy machine),
    ``seconds`` more, then SIGTERM; its stderr lines."""
    env = {**os.environ, "NETOPT_TOKEN": TOKEN, "NETOPT_LOG_FORMAT": "json"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "netopt", "--log-level", "info", *argv],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stderr, selectors.EVENT_READ)
            assert selector.select(timeout=60), "no log line within 60 s"
        first = proc.stderr.readline()
        time.sleep(seconds)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        err = first + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return [line for line in err.splitlines() if line.strip()]


def _records(lines: list[str]) -> list[dict[str, object]]:
    assert lines, "the service logged nothing at info"
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    for record in records:
        assert {"ts", "level", "logger", "message", "pid"} <= record.keys()
        assert str(record["ts"]).endswith("Z")
    return records


def test_coordinator_and_agent_log_json_lines(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "c.yaml").write_text(
        f"kind: coordinator\nlisten: {{host: 127.0.0.1, port: {port}}}\n"
        f"database: {tmp_path / 'c.db'}\n"
    )
    records = _records(_run_briefly(["coordinator", "--config", "c.yaml"], 1, tmp_path))
    assert any("coordinator" in str(r["logger"]) for r in records)
    (tmp_path / "a.yaml").write_text(
        "kind: agent\nnode: a1\nregion: hk\n"
        f"coordinator_url: http://127.0.0.1:{port}\n"  # gone: the agent logs its retries
        f"listen: {{host: 127.0.0.1, port: {free_port()}}}\n"
        f"probe: {{port: {free_port()}}}\nspool: {{dir: {tmp_path / 'spool'}}}\n"
        f"cache: {{dir: {tmp_path / 'cache'}}}\n"
    )
    records = _records(_run_briefly(["agent", "--config", "a.yaml"], 1, tmp_path))
    assert any(r["logger"] == "netopt.agent.daemon" for r in records)


def test_serve_logs_json_lines(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.bin").write_bytes(os.urandom(1000))
    argv = ["serve", "data", "--name", "ds", "--bind", f"127.0.0.1:{free_port()}"]
    records = _records(_run_briefly(argv, 1, tmp_path))
    assert any(str(r["message"]).startswith("serving netopt://") for r in records)


def test_json_formatter_keeps_one_line_and_the_traceback() -> None:
    import logging

    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed: %s", ("a\nb",), None)
        record.exc_info = sys.exc_info()
    record.peer = "hk-1"  # extra={...}
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["message"] == "failed: a\nb"
    assert "ValueError: bad" in data["exc"]
    assert data["peer"] == "hk-1"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_format_option_is_validated(fmt: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "netopt", "--log-format", fmt, "--version"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "netopt", "--log-format", "xml", "config", "check", "x.yaml"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "xml" in bad.stderr
