"""Every listener bounds header time, idle time and connections per address.

A slowloris flood (1,100 connections that never finish a header, from 127.0.0.2)
against a real ``netopt serve`` limited to 1,024 descriptors: a real sync from
127.0.0.1 still succeeds while the flood holds, and the flood costs one log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import select
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from netopt.agent.daemon import Agent
from netopt.config import parse_settings
from netopt.config.services import AgentSettings
from netopt.coordinator.server import serve
from netopt.dataplane.client import ClientOptions, sync_url
from netopt.webshell import ListenerLimits
from tests.service.coordinator_helpers import free_port, make_settings
from tests.service.dataplane_helpers import CPU, FAST, check_tree, make_dataset, start
from tests.service.serve_process import serve_process

SLOW_CONNECTIONS = 1100
PARTIAL_HEADER = b"GET /v1/health HTTP/1.1\r\nHost: slow\r\n"
SYNC_TIMEOUT_S = 30.0
LOG_BOUND_BYTES = 16 * 1024


@contextlib.contextmanager
def _files_limit(wanted: int) -> Iterator[None]:
    """This process may open ``wanted`` descriptors (root may raise the hard limit)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, max(wanted, before[1])))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def _open_slow(port: int, count: int, source: str) -> list[socket.socket]:
    """``count`` connections from ``source`` that send part of a header and stop."""
    socks: list[socket.socket] = []
    deadline_s = time.monotonic() + 60
    try:
        for _ in range(count):
            assert time.monotonic() < deadline_s, "opening the slow connections took too long"
            sock = socket.socket()
            socks.append(sock)
            sock.settimeout(5)
            sock.bind((source, 0))
            sock.connect(("127.0.0.1", port))
            with contextlib.suppress(OSError):  # one the server closed already
                sock.sendall(PARTIAL_HEADER)
    except BaseException:
        _close(socks)
        raise
    return socks


def _one_request(port: int) -> socket.socket:
    """A keep-alive connection that made one request and got its answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: idle\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    return sock


def _close(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def _closed_by_server(socks: list[socket.socket], at_least: int, within_s: float) -> int:
    """Wait until ``at_least`` of ``socks`` see the server's EOF (or ``within_s``)."""
    closed: set[socket.socket] = set()
    deadline_s = time.monotonic() + within_s
    while len(closed) < at_least and time.monotonic() < deadline_s:
        readable, _, _ = select.select([s for s in socks if s not in closed], [], [], 0.2)
        for sock in readable:
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                closed.add(sock)
    return len(closed)


async def test_slowloris_flood_does_not_stop_a_real_sync(tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "src")
    with (
        _files_limit(8192),
        serve_process(tmp_path / "src", tmp_path, max_files=1024) as server,
    ):
        slow = await asyncio.to_thread(_open_slow, server.port, SLOW_CONNECTIONS, "127.0.0.2")
        try:
            summary, _ = await asyncio.wait_for(
                sync_url(
                    f"netopt://127.0.0.1:{server.port}/ds",
                    tmp_path / "dest",
                    ClientOptions(congestion_control=None),
                    client_cpu=CPU,
                    sync_options=FAST,
                    startup_s=0,
                ),
                SYNC_TIMEOUT_S,
            )
        finally:
            _close(slow)
        check_tree(tmp_path / "dest", files)
        log = server.log()
    print(f"log {len(log)} bytes; sync {summary.seconds:.2f} s")
    assert len(log.encode()) < LOG_BOUND_BYTES, log[-3000:]
    assert log.count("logged once") == 1, log[-3000:]
    assert "Traceback" not in log


async def test_header_deadline_and_idle_timeout(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    limits = ListenerLimits(header_timeout_s=0.5, idle_timeout_s=0.5)
    runner, port, _, _ = await start(tmp_path / "src", token=None, limits=limits)
    try:
        slow = await asyncio.to_thread(_open_slow, port, 3, "127.0.0.1")
        idle = await asyncio.to_thread(_one_request, port)
        try:
            closed = await asyncio.to_thread(_closed_by_server, [*slow, idle], 4, 10.0)
        finally:
            _close([*slow, idle])
        assert closed == 4
    finally:
        await runner.cleanup()


async def test_connections_per_address_are_capped(tmp_path: Path) -> None:
    make_dataset(tmp_path / "src")
    limits = ListenerLimits(max_connections_per_address=8)
    runner, port, _, _ = await start(tmp_path / "src", token=None, limits=limits)
    try:
        slow = await asyncio.to_thread(_open_slow, port, 20, "127.0.0.3")
        try:
            closed = await asyncio.to_thread(_closed_by_server, slow, 12, 10.0)
        finally:
            _close(slow)
        assert closed == 12  # the 8 allowed wait for their header deadline (15 s)
    finally:
        await runner.cleanup()


async def _coordinator_port(tmp_path: Path, stop: asyncio.Event) -> tuple[asyncio.Task[None], int]:
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(make_settings(tmp_path), stop, on_ready=lambda _h, p: ready.set_result(p))
    )
    return task, await asyncio.wait_for(ready, 30)


async def _agent_port(tmp_path: Path, stop: asyncio.Event) -> tuple[asyncio.Task[None], int]:
    settings = parse_settings(
        f"node: n1\nregion: hk\ncoordinator_url: http://127.0.0.1:{free_port()}\n"
        f"listen: {{host: 127.0.0.1, port: 0}}\nprobe: {{port: {free_port()}}}\n"
        f"spool: {{dir: {tmp_path / 'spool'}}}\n",
        "agent.yaml", "agent", env={},
    )  # fmt: skip
    assert isinstance(settings, AgentSettings)
    agent = Agent(settings, "listener-test-token-0123456789")
    task = asyncio.create_task(agent.run(stop))
    deadline_s = time.monotonic() + 30
    while not agent.http_port:
        assert time.monotonic() < deadline_s, "the agent did not start"
        await asyncio.sleep(0.05)
    return task, agent.http_port


@pytest.mark.parametrize("service", [_coordinator_port, _agent_port], ids=["coordinator", "agent"])
async def test_coordinator_and_agent_cap_connections_per_address(
    tmp_path: Path, service: Callable[..., Awaitable[tuple[asyncio.Task[None], int]]]
) -> None:
    cap = ListenerLimits().max_connections_per_address
    stop = asyncio.Event()
    task, port = await service(tmp_path, stop)
    try:
        slow = await asyncio.to_thread(_open_slow, port, cap + 12, "127.0.0.4")
        try:
            closed = await asyncio.to_thread(_closed_by_server, slow, 12, 10.0)
        finally:
            _close(slow)
        assert closed == 12
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
