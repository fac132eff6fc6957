"""Start one worker process per Gloo rank on loopback and collect their JSON lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from coordinator_helpers import free_port

REPO = Path(__file__).resolve().parents[2]


def run_worker_ranks(
    worker: Path, world: int, args: tuple[str, ...], timeout_s: float, errs: list[str] | None = None
) -> list[dict]:
    """Run ``worker RANK WORLD PORT *args`` for every rank; a rank past ``timeout_s`` fails.

    Each rank's stderr is appended to ``errs`` when given.
    """
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
