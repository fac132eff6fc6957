"""Start one worker process per Gloo rank on loopback and collect their JSON lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from coordinator_helpers import free_port

REPO = Path(__file__).resolve().parents[2]


PORT_ATTEMPTS = 3
"""Starts with a fresh port when rank 0 finds its rendezvous port taken: the port is free
when picked, but rank 0 binds it only after importing torch (seconds), and another
process of a busy machine may take it meanwhile (EADDRINUSE)."""


def run_worker_ranks(
    worker: Path, world: int, args: tuple[str, ...], timeout_s: float, errs: list[str] | None = None
) -> list[dict]:
    """Run ``worker RANK WORLD PORT *args`` for every rank; a rank past ``timeout_s`` fails.

    Each rank's stderr is appended to ``errs`` when given.
    """
    for attempt in range(PORT_ATTEMPTS):
        try:
            return _run_once(worker, world, args, timeout_s, errs)
        except _PortTaken:
            if attempt == PORT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


class _PortTaken(Exception):
    pass


def _run_once(
    worker: Path, world: int, args: tuple[str, ...], timeout_s: float, errs: list[str] | None
) -> list[dict]:
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(rank), str(world), port, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        )
        for rank in range(world)
    ]  # fmt: skip
    results: list[dict] = []
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pytest.fail(f"a rank hung for {timeout_s}s ({worker.name} {args}, {world} ranks)")
            if proc.returncode != 0 and "EADDRINUSE" in err:
                raise _PortTaken(err[-500:])
            assert proc.returncode == 0, err[-3000:]
            if errs is not None:
                errs.append(err)
            results += [json.loads(line) for line in out.splitlines()]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results
