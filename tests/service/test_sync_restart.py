"""A real `netopt sync` rides out its `netopt serve` being killed (SIGKILL) mid-transfer and
restarted on the same port 3 s later; with the server gone for good it fails with a
clear error once its retry window is over, not before. Real processes, real sockets
on localhost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.service.cache_helpers import stored_chunks
from tests.service.coordinator_helpers import free_port

CHUNK_BYTES = 256 * 1024
RATE_MBPS = 12
"""The sync's own bandwidth limit: 6 MB take about 4 s, so the server dies mid-transfer."""
DEADLINE_S = 120


def _netopt(*args: str) -> list[str]:
    return [sys.executable, "-m", "netopt", *args]


def _dataset(root: Path) -> dict[str, bytes]:
    files = {"a.bin": os.urandom(4_000_000), "dir/b.bin": os.urandom(2_000_000), "c": b"x\n"}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _serve(src: Path, port: int, codec_cache: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        _netopt("serve", str(src), "--name", "ds", "--bind", f"127.0.0.1:{port}", "--no-auth",
                "--chunk-size", str(CHUNK_BYTES), "--codec-cache", str(codec_cache)),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "serving netopt://..." once it listens
    assert "serving" in line, line
    return proc


def _sync(port: int, dest: Path, cache: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _netopt("sync", f"netopt://127.0.0.1:{port}/ds", str(dest), "--json",
                "--cache-dir", str(cache), "--rate-limit-mbps", str(RATE_MBPS), "--level", "0",
                "--streams", "8", *extra),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _wait_mid_transfer(cache: Path, sync: subprocess.Popen[str]) -> None:
    """Until the sync has stored a few chunks (and is still running)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        assert sync.poll() is None, "the sync ended before the server was killed"
        if len(stored_chunks(cache)) >= 3:
            return
        time.sleep(0.05)
    raise AssertionError("the sync stored no chunks")


def _kill(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


def test_sync_survives_a_server_restart(tmp_path: Path) -> None:
    files = _dataset(tmp_path / "src")
    codec_cache = tmp_path / "codec.json"
    port = free_port()
    for run in range(3):
        server = _serve(tmp_path / "src", port, codec_cache)
        dest, cache = tmp_path / f"dst{run}", tmp_path / f"cache{run}"
        sync = _sync(port, dest, cache)
        try:
            _wait_mid_transfer(cache, sync)
            _kill(server)
            time.sleep(3)  # the outage the sync must ride out
            server = _serve(tmp_path / "src", port, codec_cache)
            out, err = sync.communicate(timeout=DEADLINE_S)
            assert sync.returncode == 0, (run, out[-2000:], err[-2000:])
            for rel, data in files.items():
                assert (dest / rel).read_bytes() == data, (run, rel)
        finally:
            _kill(server)
            _kill(sync)


def test_sync_fails_after_its_retry_window_when_the_server_is_gone(tmp_path: Path) -> None:
    _dataset(tmp_path / "src")
    port = free_port()
    server = _serve(tmp_path / "src", port, tmp_path / "codec.json")
    cache = tmp_path / "cache"
    sync = _sync(port, tmp_path / "dst", cache, "--retry-window-s", "2")
    try:
        _wait_mid_transfer(cache, sync)
        _kill(server)
        killed_s = time.monotonic()
        out, err = sync.communicate(timeout=DEADLINE_S)
        failed_after_s = time.monotonic() - killed_s
    finally:
        _kill(server)
        _kill(sync)
    assert sync.returncode == 1, (out[-2000:], err[-2000:])
    assert "retry window 2 s" in out + err
    assert "unreachable" in out + err
    # Not before the window; and not much after it (one connect attempt and backoff).
    assert 2.0 <= failed_after_s < 2.0 + 8.0, failed_after_s
