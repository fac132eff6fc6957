"""The tail's hedge on a real server: a stream whose connection crawls is cut, and what it
was asked for comes in parts over the other connections.

A real server on localhost behind a real TCP proxy that paces one connection, the one
that carries the sync's first stream, to 1 Mbit/s (a stream of a lossy long link that
fell behind the others); every other connection runs at loopback speed. Without the
hedge the sync would wait for that stream's chunks, over 10 s.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from netopt.cache.sources import SourceOptions
from netopt.cache.syncer import SyncRequest, run_sync
from netopt.dataplane.httpsource import ClientOptions
from netopt.dataplane.server import ServeSettings, create_app, load_dataset
from netopt.dataplane.server import start_server as _start_server
from netopt.dataplane.synctypes import SyncOptions
from tests.service.dataplane_helpers import CPU, ShapingProxy

SLOW_BYTES_PER_S = 128 * 1024
STREAM_REQUEST = b"POST /v1/datasets/ds/stream"
PART_REQUEST = b"&part="
END_OF_BODY = b"\r\n0\r\n\r\n"
"""How a chunked response's body ends: a stream that ran to its end sent this."""


class OneSlowStreamProxy(ShapingProxy):
    """Forwards to ``target_port``; the connection that carries the first stream request
    gets what the server sends back at `SLOW_BYTES_PER_S`. Notes the part requests seen
    and whether the slow stream's response reached its end."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.slow: object | None = None
        self.slow_started_s = 0.0
        self.slow_forwarded_bytes = 0
        self.slow_tail = b""
        self.slow_ended = False
        self.part_requests = 0

    async def hold(self, piece: bytes, conn: object, to_client: bool) -> None:
        if not to_client:
            self.part_requests += piece.count(PART_REQUEST)
            if self.slow is None and STREAM_REQUEST in piece:
                self.slow = conn
                self.slow_started_s = time.monotonic()
            return
        if conn is not self.slow:
            return
        due_s = self.slow_started_s + (self.slow_forwarded_bytes + len(piece)) / SLOW_BYTES_PER_S
        await asyncio.sleep(max(0.0, due_s - time.monotonic()))
        self.slow_forwarded_bytes += len(piece)
        self.slow_tail = (self.slow_tail + piece)[-len(END_OF_BODY) :]
        self.slow_ended = self.slow_ended or self.slow_tail == END_OF_BODY


async def test_a_crawling_streams_chunks_come_in_parts_and_it_is_cut(tmp_path: Path) -> None:
    data = os.urandom(4 * 1024 * 1024)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "data.bin").write_bytes(data)
    dataset = load_dataset(tmp_path / "src", "ds", 256 * 1024)
    app = create_app(ServeSettings(token=None, worker_threads=1), {"ds": dataset}, CPU)
    runner, port = await _start_server(app, "127.0.0.1", 0)
    proxy = OneSlowStreamProxy(port)
    proxy_port = await proxy.start()
    try:
        opts = SourceOptions(client=ClientOptions(), streams=2, client_cpu=CPU)
        await asyncio.wait_for(
            run_sync(
                SyncRequest(
                    source=f"netopt://127.0.0.1:{proxy_port}/ds",
                    dest=str(tmp_path / "dst"),
                    cache_dir=str(tmp_path / "cache"),
                    source_options=opts,
                    sync_options=SyncOptions(stream_ahead_bytes=600_000),
                )
            ),
            timeout=30,
        )
    finally:
        await proxy.close()
        await runner.cleanup()
    assert (tmp_path / "dst" / "data.bin").read_bytes() == data
    assert proxy.slow is not None  # a stream went over the paced connection
    assert proxy.part_requests >= 2  # what it was asked for came in parts
    # Cut before its end: the body never reached its last chunk-size line.
    assert not proxy.slow_ended
    assert proxy.slow_forwarded_bytes < 600_000
