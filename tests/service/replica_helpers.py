"""A coordinator replica as a real process on a PostgreSQL URL, for the multi-replica tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest
from coordinator_helpers import TOKEN, free_port

from tests.pgserver import PASSWORD

REPO = Path(__file__).resolve().parents[2]


class Replica:
    """``python -m netopt coordinator`` on a PostgreSQL URL (password from PGPASSWORD)."""

    def __init__(self, tmp_path: Path, name: str, database: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp_path / f"{name}.yaml"
        self.config.write_text(
            f"kind: coordinator\nlisten: {{host: 127.0.0.1, port: {self.port}}}\n"
            f"token: {TOKEN}\ndatabase: {database}\nstale_after_s: 600\n"
        )
        self.log = tmp_path / f"{name}.log"
        env = {**os.environ, "PGPASSWORD": PASSWORD}
        env.pop("NETOPT_TOKEN", None)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "netopt", "coordinator", "--config", str(self.config)],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    async def wait_ready(self, session: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            try:
                async with session.get(self.url + "/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        pytest.fail(f"replica did not become ready: {self.log.read_text()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=20)


@contextmanager
def two_replicas(tmp_path: Path, database: str) -> Iterator[list[Replica]]:
    """Replicas "a" and "b" of a coordinator on ``database``; both killed at the end."""
    started = [Replica(tmp_path, "a", database)]
    try:
        started.append(Replica(tmp_path, "b", database))
        yield started
    finally:
        for replica in started:
            replica.kill()
