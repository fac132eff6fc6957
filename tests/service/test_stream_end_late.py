"""A stream's end frame that does not come (a lost packet on a lossy link held one for
1.76 s on the lab): once every frame of the stream is in and its end is late, a version
check asked after its last frame stands in for the end frame, and the sync ends without
waiting for it. A real `netopt serve` app whose streams hold their end frames (their
last step, bringing the dataset up to date, waits), a real ``netopt sync`` process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from netopt.dataplane import handlers
from netopt.dataplane.streaming import END_WAIT_S
from tests.service.dataplane_helpers import TOKEN, check_tree, real_text, serve_with_middleware

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> dict[str, bytes]:
    """Three files of 600 KB of real text: ~28 chunks of 64 KiB, more than the streams, so
    they are streamed (not cut into parts)."""
    text = real_text(3 * 600_000)
    files = {f"part-{i}.py": text[i * 600_000 : (i + 1) * 600_000] for i in range(3)}
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    return files


async def test_a_late_end_frame_is_stood_in_for_by_a_version_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "src").mkdir()
    files = _tree(tmp_path / "src")
    release = asyncio.Event()
    held: list[str] = []
    fresh = handlers._fresh_dataset

    async def held_at_stream_end(request: web.Request) -> handlers.DatasetView:
        if request.path.endswith("/stream"):
            held.append(request.path)  # the stream's last frame is out: hold its end frame
            await asyncio.wait_for(release.wait(), 30)
        return await fresh(request)

    monkeypatch.setattr(handlers, "_fresh_dataset", held_at_stream_end)
    routes: list[str] = []

    @web.middleware
    async def record(request: web.Request, handler: web.Handler) -> web.StreamResponse:
        routes.append(request.path.rsplit("/", 1)[-1])
        return await handler(request)

    runner, port, _ = await serve_with_middleware(tmp_path / "src", record)
    trace_path = tmp_path / "trace.json"
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "netopt", "sync", f"netopt://127.0.0.1:{port}/ds",
            str(tmp_path / "dest"), "--cache-dir", str(tmp_path / "cache"), "--json",
            "--streams", "4",  # the plan's count on every kind of the lab's benchmark
            cwd=REPO, env={**os.environ, "NETOPT_TOKEN": TOKEN, "NETOPT_TRACE": str(trace_path)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        # Waiting out the end frames would take END_WAIT_S; standing in, a few tenths.
        async with asyncio.timeout(END_WAIT_S - 1):
            out, err = await proc.communicate()
        assert not release.is_set()  # every end frame was still held when the sync ended
    finally:
        release.set()
        await runner.cleanup()
    assert proc.returncode == 0, err.decode()[-2000:]
    report = json.loads(out)
    check_tree(tmp_path / "dest", files)
    assert report["version_restarts"] == 0
    assert held, routes  # the streams did reach their ends
    counts = json.loads(trace_path.read_text())["counts"]
    assert counts.get("stream_ends_late", 0) >= 1, counts
    assert counts.get("stream_ends_stood_in", 0) >= 1, counts
    data_at = routes.index("stream")
    assert "ds" in routes[data_at:], routes  # the version check: an info request after
