"""The version check a sync of a served origin ends with rides out a server restart
for the sync's retry window, as its chunks do (`netopt.cache.openretry.check_riding_out`):
a real `netopt serve` app on loopback, stopped after the source was opened and started
again on the same port, or not at all."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiohttp import web

from netopt.cache.openretry import check_riding_out
from netopt.cache.sources import parse_source
from netopt.dataplane.server import ServeSettings, create_app, load_dataset, start_server
from netopt.dataplane.synctypes import SyncOptions
from netopt.errors import PeerUnreachableError
from tests.service.cache_helpers import served_options
from tests.service.dataplane_helpers import CHUNK_BYTES, CPU, TOKEN, make_dataset

OPTIONS = SyncOptions(retry_window_s=5.0, backoff_initial_s=0.05, backoff_max_s=0.2)
OUTAGE_S = 0.6


async def _serve(src: Path, port: int = 0) -> tuple[web.AppRunner, int]:
    dataset = load_dataset(src, "ds", CHUNK_BYTES)
    app = create_app(ServeSettings(token=TOKEN, worker_threads=2), {"ds": dataset}, CPU)
    return await start_server(app, "127.0.0.1", port)


async def test_the_version_check_waits_out_a_server_restart(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port = await _serve(tmp_path / "src")
    source = parse_source(f"netopt://127.0.0.1:{port}/ds")
    again: web.AppRunner | None = None
    try:
        async with source.open(served_options(TOKEN, CPU)) as opened:
            await runner.cleanup()

            async def restart() -> None:
                nonlocal again
                await asyncio.sleep(OUTAGE_S)
                again, _ = await _serve(tmp_path / "src", port)

            restarting = asyncio.ensure_future(restart())
            started_s = time.monotonic()
            # shared=True: the check asks the server (no stream ends to ride on).
            await check_riding_out(opened, True, OPTIONS)
            waited_s = time.monotonic() - started_s
            await restarting
    finally:
        if again is not None:
            await again.cleanup()
    assert OUTAGE_S <= waited_s < OPTIONS.retry_window_s


async def test_the_version_check_gives_up_after_the_window(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    runner, port = await _serve(tmp_path / "src")
    source = parse_source(f"netopt://127.0.0.1:{port}/ds")
    window = SyncOptions(retry_window_s=0.5, backoff_initial_s=0.05, backoff_max_s=0.1)
    async with source.open(served_options(TOKEN, CPU)) as opened:
        await runner.cleanup()
        started_s = time.monotonic()
        with pytest.raises(PeerUnreachableError, match="checking the source's version"):
            await check_riding_out(opened, True, window)
        assert time.monotonic() - started_s >= window.retry_window_s
