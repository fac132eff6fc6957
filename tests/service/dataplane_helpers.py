"""Shared pieces of the data-plane service tests: a dataset, a server, a killing proxy."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from aiohttp import web

from netopt.dataplane.served import ServedDataset
from netopt.dataplane.server import ServeSettings, ServeStats, create_app, load_dataset
from netopt.dataplane.server import start_server as _start_server
from netopt.dataplane.sync import SyncOptions
from netopt.transfer.manifest import Manifest
from netopt.transfer.planner import CpuProfile
from netopt.webshell import ListenerLimits

TOKEN = "test-token-0123456789abcdef"
CPU = CpuProfile(2, {1: 300e6, 3: 150e6}, {1: 900e6, 3: 900e6}, per_file_s=0.0)
FAST = SyncOptions(retry_window_s=0.3, max_attempts=4, backoff_initial_s=0.01, backoff_max_s=0.05)
CHUNK_BYTES = 64 * 1024
REPO = Path(__file__).resolve().parents[2]


def real_text(size_bytes: int) -> bytes:
    """``size_bytes`` of this repository's own Python source (real, compressible text;
    about 2 MB in all)."""
    text = bytearray()
    for path in sorted((REPO / "netopt").rglob("*.py")):
        text += path.read_bytes()
        if len(text) >= size_bytes:
            break
    assert len(text) >= size_bytes, f"only {len(text)} bytes of source text"
    return bytes(text[:size_bytes])


def make_dataset(root: Path) -> dict[str, bytes]:
    """About 1.3 MB in four files: random, text, nested, empty."""
    files = {
        "random.bin": os.urandom(600_000),
        "text/data.jsonl": b"".join(
            b'{"id": %d, "text": "hello world"}\n' % i for i in range(20000)
        ),
        "text/nested/small.txt": b"small\n",
        "empty": b"",
    }
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def check_tree(dest: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data, rel


async def start(
    root: Path, name: str = "ds", token: str | None = TOKEN, limits: ListenerLimits | None = None
) -> tuple[web.AppRunner, int, ServeStats, Manifest]:
    dataset = load_dataset(root, name, CHUNK_BYTES)
    stats = ServeStats()
    app = create_app(ServeSettings(token=token, worker_threads=2), {name: dataset}, CPU, stats)
    runner, port = await _start_server(app, "127.0.0.1", 0, limits)
    return runner, port, stats, dataset.manifest


async def serve_with_middleware(
    root: Path, middleware: Any, name: str = "ds"
) -> tuple[web.AppRunner, int, ServedDataset]:
    """`netopt serve`'s app of ``root`` on a free loopback port with ``middleware`` first
    (a server that stalls, fails or lies on some routes); the runner, port and dataset."""
    dataset = load_dataset(root, name, CHUNK_BYTES)
    app = create_app(ServeSettings(token=TOKEN, worker_threads=2), {name: dataset}, CPU,
                     ServeStats())  # fmt: skip
    app.middlewares.insert(0, middleware)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1], dataset


async def serve_routes(routes: list[web.RouteDef]) -> tuple[web.AppRunner, int]:
    """A bare aiohttp app of ``routes`` on a free loopback port (a hostile server)."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


class Proxy:
    """A TCP proxy to ``target_port``; it can cut one connection mid-response or vanish
    (when told, or once ``vanish_after_bytes`` went to the clients over all connections),
    or go dark and come back (`go_dark`, `come_back`)."""

    def __init__(
        self,
        target_port: int,
        kill_connection: int = 0,
        kill_after_bytes: int = 0,
        vanish_after_bytes: int = 0,
    ):
        self.target_port = target_port
        self.kill_connection = kill_connection
        self.kill_after_bytes = kill_after_bytes
        self.vanish_after_bytes = vanish_after_bytes
        self.sent_to_clients = 0
        self.vanished = False
        self.connections = 0
        self.killed = 0
        self.transports: list[asyncio.WriteTransport] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self.forwarding = asyncio.Event()
        self.forwarding.set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    def go_dark(self) -> None:
        """Stop listening (connects are refused) and stop forwarding in both directions,
        holding what is in flight, as a server whose link is cut answers nothing."""
        assert self.server is not None
        self.forwarding.clear()
        self.server.close()

    async def come_back(self) -> None:
        """Listen on the same port again and forward what was held."""
        await self.start()
        self.forwarding.set()

    def vanish(self) -> None:
        """Stop listening and abort every connection at once, like a dead server."""
        assert self.server is not None
        self.vanished = True
        self.server.close()
        for transport in self.transports:
            transport.abort()
        self.forwarding.set()  # the held pipes find their connections gone

    async def close(self) -> None:
        if self.server is not None:
            self.vanish()
            await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        limit = self.kill_after_bytes if self.connections == self.kill_connection else None
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.transports += [writer.transport, up_writer.transport]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, cap: int | None):
            sent = 0
            to_client = dst is writer
            try:
                while (await self.forwarding.wait()) and (data := await src.read(16384)):
                    await self.forwarding.wait()
                    if to_client and not self.vanish_after_bytes:
                        self.sent_to_clients += len(data)
                    if to_client and self.vanish_after_bytes:
                        room = self.vanish_after_bytes - self.sent_to_clients
                        if self.vanished or len(data) >= room:
                            if not self.vanished:
                                dst.write(data[: max(0, room)])
                                self.sent_to_clients += max(0, room)
                            self.vanish()
                            return
                        self.sent_to_clients += len(data)
                    if cap is not None and sent + len(data) >= cap:
                        dst.write(data[: cap - sent])
                        await dst.drain()
                        self.killed += 1
                        writer.transport.abort()
                        up_writer.transport.abort()
                        return
                    dst.write(data)
                    await dst.drain()
                    sent += len(data)
                dst.close()
            except (ConnectionError, OSError):
                writer.transport.abort()
                up_writer.transport.abort()

        await asyncio.gather(pipe(reader, up_writer, None), pipe(up_reader, writer, limit))


class ShapingProxy:
    """A TCP proxy to ``target_port`` on loopback whose subclass may hold each piece before
    it passes on (`hold`): a link's pace, one slow connection."""

    READ_BYTES = 16 * 1024

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def hold(self, piece: bytes, conn: object, to_client: bool) -> None:
        """Called with each piece read on connection ``conn`` (one object per client
        connection) before it is passed on; ``to_client``: it comes from the server."""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        conn = object()

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, to_client: bool
        ) -> None:
            try:
                while piece := await src.read(self.READ_BYTES):
                    await self.hold(piece, conn, to_client)
                    dst.write(piece)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        for coro in (pipe(reader, up_writer, False), pipe(up_reader, writer, True)):
            task = asyncio.ensure_future(coro)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
