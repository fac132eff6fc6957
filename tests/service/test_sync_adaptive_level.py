"""The level follows the link while a sync runs, and the stream route's per-line levels.

A real server on localhost behind a real TCP proxy that throttles what the server
sends (the link the client knows nothing about): the plan guesses a 1 Gbit/s link,
picks a cheap level, and the level rises once the client sees the link, not the
CPUs, holding the transfer back.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import aiohttp
from dataplane_helpers import CHUNK_BYTES, ShapingProxy

from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import SyncRequest, run_sync
from netopt.dataplane.httpsource import ClientOptions
from netopt.dataplane.server import ServeSettings, ServeStats, create_app, load_dataset
from netopt.dataplane.server import start_server as _start_server
from netopt.dataplane.synctypes import SyncOptions
from netopt.transfer.planner import CpuProfile

PROXY_RATE_BPS = 16e6
"""What the proxy lets through from the server (bits/s)."""
SERVER_CPU = CpuProfile(
    1, {1: 200e6, 3: 80e6, 5: 50e6, 7: 30e6, 9: 25e6}, {lvl: 600e6 for lvl in (1, 3, 5, 7, 9)}
)
CLIENT_CPU = CpuProfile(2, {}, {lvl: 600e6 for lvl in (1, 3, 5, 7, 9)})


def _jsonl(path: Path, size_bytes: int) -> bytes:
    rng = random.Random(7)
    words = [f"{rng.choice('abcdefghij')}{rng.randrange(20000)}" for _ in range(20000)]
    lines: list[bytes] = []
    total = 0
    while total < size_bytes:
        line = json.dumps(
            {"id": total, "text": " ".join(rng.choices(words, k=rng.randrange(10, 40))),
             "score": round(rng.random(), 4), "tags": rng.sample(words[:50], 3)}
        ).encode() + b"\n"  # fmt: skip
        lines.append(line)
        total += len(line)
    data = b"".join(lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


class ThrottlingProxy(ShapingProxy):
    """Forwards to ``target_port``; what comes back is paced to ``rate_bps``."""

    def __init__(self, target_port: int, rate_bps: float) -> None:
        super().__init__(target_port)
        self.rate_bytes_per_s = rate_bps / 8
        self.started_s: float | None = None
        self.sent_bytes = 0

    async def hold(self, piece: bytes, conn: object, to_client: bool) -> None:
        if to_client:  # one shared bucket: the link, for all connections
            if self.started_s is None:
                self.started_s = time.monotonic()
            self.sent_bytes += len(piece)
            due_s = self.started_s + self.sent_bytes / self.rate_bytes_per_s
            await asyncio.sleep(max(0.0, due_s - time.monotonic()))


async def test_the_level_rises_when_the_link_holds_the_sync_back(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "src" / "data.jsonl", 8_000_000)
    dataset = load_dataset(tmp_path / "src", "ds", CHUNK_BYTES)
    app = create_app(ServeSettings(token=None, worker_threads=1), {"ds": dataset}, SERVER_CPU)
    runner, port = await _start_server(app, "127.0.0.1", 0)
    proxy = ThrottlingProxy(port, PROXY_RATE_BPS)
    proxy_port = await proxy.start()
    try:
        opts = SourceOptions(client=ClientOptions(), streams=2, client_cpu=CLIENT_CPU)
        report = await run_sync(
            SyncRequest(
                source=f"netopt://127.0.0.1:{proxy_port}/ds",
                dest=str(tmp_path / "dst"),
                cache_dir=str(tmp_path / "cache"),
                source_options=opts,
                # Little asked ahead: a new level applies to the chunks asked after it.
                sync_options=SyncOptions(stream_ahead_bytes=300_000),
            )
        )
    finally:
        await proxy.close()
        await runner.cleanup()
    assert (tmp_path / "dst" / "data.jsonl").read_bytes() == data
    out = report.to_dict()
    figures = out["link_figures"]
    assert isinstance(figures, dict)
    assert "default guess" in figures["rate_bps"]["source"]
    plan = out["transfer_plan"]
    assert isinstance(plan, dict)
    levels = out["levels_over_time"]
    assert isinstance(levels, list)
    assert levels, out
    # The 1 Gbit/s guess planned a cheap level; on a 16 Mbit/s link the level rose.
    planned = plan["zstd_level"] or 0
    assert levels[0]["level"] == planned
    assert max(s["level"] for s in levels) > planned, levels
    assert all(s["goodput_mbps"] < PROXY_RATE_BPS / 1e6 * 1.1 for s in levels), levels


async def _stream(port: int, params: dict[str, str], body: bytes) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}/v1/datasets/ds/stream", params=params, data=body
        ) as resp,
    ):
        return resp.status, await resp.read()


async def test_stream_lines_may_carry_a_level(tmp_path: Path) -> None:
    _jsonl(tmp_path / "src" / "data.jsonl", 300_000)
    dataset = load_dataset(tmp_path / "src", "ds", CHUNK_BYTES)
    stats = ServeStats()
    settings = ServeSettings(token=None, worker_threads=1)
    app = create_app(settings, {"ds": dataset}, SERVER_CPU, stats)
    runner, port = await _start_server(app, "127.0.0.1", 0)
    first, second = list(dataset.manifest.unique_chunks())[:2]
    try:
        plain = f"{first}\n{second}\n".encode()
        status, off = await _stream(port, {"level": "0"}, plain)
        assert status == 200
        status, mixed = await _stream(port, {"level": "0"}, f"{first} 9\n{second}\n".encode())
        assert status == 200
        assert len(mixed) < len(off)  # the first frame compressed at 9, the second not
        assert mixed.endswith(off[-len(off) // 3 :])
        for bad in (f"{first} 20\n", f"{first} -1\n", f"{first} x\n", f"{first} 3 4\n"):
            status, body = await _stream(port, {"level": "0"}, bad.encode())
            assert status == 400, (bad, body)
            assert b"Bad Request" in body or b"level" in body
    finally:
        await runner.cleanup()
