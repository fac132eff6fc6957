"""A sync whose source cannot be reached when it starts tries again within its retry
window: a real server that comes up late, one that never does, one that refuses the
token (never retried), and the `netopt sync` command against a server that starts
after it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import SyncRequest, run_sync
from netopt.dataplane.client import ClientOptions
from netopt.dataplane.server import ServeSettings, ServeStats, create_app, load_dataset
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import AuthenticationError, PeerUnreachableError
from tests.service.coordinator_helpers import free_port
from tests.service.dataplane_helpers import CHUNK_BYTES, CPU, TOKEN, check_tree, make_dataset
from tests.service.serve_process import REPO

LATE_S = 1.2
"""How long after the sync starts the server comes up."""
WAIT_BOUND_S = 60.0
"""Not a speed bound: how long a test waits before it fails."""


async def _serve_on(root: Path, port: int, middleware: Any = None) -> web.AppRunner:
    """`netopt serve`'s app of ``root`` on ``port`` (with ``middleware`` first)."""
    dataset = load_dataset(root, "ds", CHUNK_BYTES)
    app = create_app(ServeSettings(token=TOKEN, worker_threads=2), {"ds": dataset}, CPU,
                     ServeStats())  # fmt: skip
    if middleware is not None:
        app.middlewares.insert(0, middleware)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def _request(tmp_path: Path, port: int, window_s: float, token: str = TOKEN) -> SyncRequest:
    return SyncRequest(
        f"netopt://127.0.0.1:{port}/ds", str(tmp_path / "dst"), str(tmp_path / "cache"),
        source_options=SourceOptions(client=ClientOptions(token=token), client_cpu=CPU),
        sync_options=SyncOptions(retry_window_s=window_s),
    )  # fmt: skip


async def test_a_sync_started_before_its_server_syncs_once_the_server_is_up(
    tmp_path: Path,
) -> None:
    files = make_dataset(tmp_path / "src")
    port = free_port()  # refused until the server comes up
    runner: web.AppRunner | None = None

    async def come_up_late() -> None:
        nonlocal runner
        await asyncio.sleep(LATE_S)
        runner = await _serve_on(tmp_path / "src", port)

    started_s = time.monotonic()
    coming = asyncio.ensure_future(come_up_late())
    try:
        report = await asyncio.wait_for(run_sync(_request(tmp_path, port, 30.0)), WAIT_BOUND_S)
        await coming
        assert time.monotonic() - started_s >= LATE_S  # it did wait for the server
        check_tree(tmp_path / "dst", files)
        assert report.summary is not None
        assert report.summary.files_written == len(files)
    finally:
        coming.cancel()
        if runner is not None:
            await runner.cleanup()


async def test_a_source_that_stays_unreachable_fails_once_the_window_has_passed(
    tmp_path: Path,
) -> None:
    port = free_port()  # nothing ever listens
    started_s = time.monotonic()
    with pytest.raises(PeerUnreachableError) as caught:
        await asyncio.wait_for(run_sync(_request(tmp_path, port, 1.0)), WAIT_BOUND_S)
    assert time.monotonic() - started_s >= 1.0
    assert "retry window 1 s" in str(caught.value)
    assert "--retry-window-s" in str(caught.value)
    assert not (tmp_path / "dst").exists()  # nothing written


async def test_a_refused_token_is_not_tried_again(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    port = free_port()
    asked = [0]

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        asked[0] += 1
        return await handler(request)

    runner = await _serve_on(tmp_path / "src", port, count)
    try:
        with pytest.raises(AuthenticationError):
            await asyncio.wait_for(
                run_sync(_request(tmp_path, port, 30.0, token="wrong-token-0123456789abcdef")),
                WAIT_BOUND_S,
            )
    finally:
        await runner.cleanup()
    # One open: its info request (and, at most, the manifest asked beside it).
    assert 1 <= asked[0] <= 3


def test_the_sync_command_waits_for_a_server_that_starts_after_it(tmp_path: Path) -> None:
    """`netopt sync` (with its start-up prefetch) then `netopt serve`, as two pods of a
    job that start together."""
    files = make_dataset(tmp_path / "src")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "NETOPT_TOKEN": TOKEN}
    sync = subprocess.Popen(
        [sys.executable, "-m", "netopt", "sync", f"netopt://127.0.0.1:{port}/ds",
         str(tmp_path / "dst"), "--cache-dir", str(tmp_path / "cache"), "--json",
         "--retry-window-s", "30"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    serve: subprocess.Popen[str] | None = None
    try:
        time.sleep(LATE_S)
        assert sync.poll() is None, sync.communicate()  # still trying
        serve = subprocess.Popen(
            [sys.executable, "-m", "netopt", "serve", str(tmp_path / "src"), "--name", "ds",
             "--bind", f"127.0.0.1:{port}", "--cc", "default"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        out, err = sync.communicate(timeout=WAIT_BOUND_S)
        assert sync.returncode == 0, err[-2000:]
        check_tree(tmp_path / "dst", files)
        assert "trying again" in err  # the wait was said
        assert TOKEN not in out + err
    finally:
        for proc in (sync, serve):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
