"""A cluster CA and certificates made with ``netopt tls`` machinery, and a real TLS server
on loopback running in its own thread (so CLI commands can run in the test's thread)."""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from netopt.cli.main import main
from netopt.tlsca import CA_CERT, CA_KEY, IssuedPair, issue_cert, make_ca, node_files, write_files
from netopt.webshell import ListenerLimits, bearer_refusal, start_site

TOKEN = "tls-test-token-0123456789"
NOW = dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class NodeFiles:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    root: Path
    ca: Path
    ca_pair: IssuedPair

    def issue(
        self,
        node: str,
        *,
        ips: tuple[str, ...] = ("127.0.0.1",),
        dns: tuple[str, ...] = ("localhost",),
        now: dt.datetime = NOW,
        days: int = 30,
    ) -> NodeFiles:
        pair = issue_cert(self.ca_pair, node, now, dns=dns, ips=ips, days=days)
        cert, key = node_files(self.root, node)
        write_files({cert: pair.cert_pem, key: pair.key_pem}, force=True)
        return NodeFiles(cert, key)


def make_pki(root: Path, name: str = "test CA") -> Pki:
    pair = make_ca(name, NOW)
    write_files({root / CA_CERT: pair.cert_pem, root / CA_KEY: pair.key_pem}, force=False)
    return Pki(root, root / CA_CERT, pair)


async def _nodes(request: web.Request) -> web.StreamResponse:
    refusal = bearer_refusal(request, TOKEN)
    if refusal is not None:
        return refusal
    return web.json_response({"nodes": []})


async def _links(request: web.Request) -> web.StreamResponse:
    refusal = bearer_refusal(request, TOKEN)
    if refusal is not None:
        return refusal
    return web.json_response({"links": []})


@contextmanager
def thread_server(
    ssl_context: ssl.SSLContext | None, limits: ListenerLimits | None = None
) -> Iterator[str]:
    """A coordinator-shaped app (``/api/v1/nodes``, ``/api/v1/links``) behind
    `webshell.start_site` on 127.0.0.1 in a thread; yields its URL."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def start() -> None:
        app = web.Application()
        app.router.add_get("/api/v1/nodes", _nodes)
        app.router.add_get("/api/v1/links", _links)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await start_site(runner, limits, host="127.0.0.1", port=0, ssl_context=ssl_context)
        state["runner"] = runner
        state["port"] = int(runner.addresses[0][1])

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(state["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    scheme = "https" if ssl_context is not None else "http"
    try:
        yield f"{scheme}://127.0.0.1:{state['port']}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def run_cli(argv: list[str]) -> int:
    """``netopt ARGV`` in this process, in a copy of the context: the client TLS it sets
    stays with that command."""
    return contextvars.copy_context().run(main, argv)
