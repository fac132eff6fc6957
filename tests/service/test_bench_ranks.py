"""`netopt.torch.bench.run_allreduce`, the harness that starts an all-reduce bench's ranks,
on real processes (no torch needed): a failed rank ends the bench at once, a bench past
its time is killed, and no process or pipe is left behind either way."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest

from netopt.errors import NetworkError
from netopt.torch.bench import run_allreduce
from netopt.torch.bench_worker import RESULT_PREFIX

SLEEPS = "import time; time.sleep(60)"


def _starter(procs: list[subprocess.Popen[str]]) -> Callable[[int, list[str]], object]:
    def start(_rank: int, argv: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    return start


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _all_closed(procs: list[subprocess.Popen[str]]) -> bool:
    return all(p.stdout is not None and p.stdout.closed for p in procs) and all(
        p.stderr is not None and p.stderr.closed for p in procs
    )


def test_a_failed_rank_ends_the_bench_at_once() -> None:
    # Rank 0 fails (as one whose rendezvous port was taken); ranks 1 and 2 would wait for
    # it for a minute. They are killed, and the error is rank 0's own.
    fails = "import sys; print('cannot bind the store', file=sys.stderr); sys.exit(3)"
    procs: list[subprocess.Popen[str]] = []
    with pytest.raises(NetworkError, match="rank 0 exited 3: cannot bind the store"):
        run_allreduce(
            _starter(procs), lambda rank: _python(fails if rank == 0 else SLEEPS), 3, 120.0
        )
    assert [p.returncode for p in procs] == [3, -signal.SIGKILL, -signal.SIGKILL]
    assert _all_closed(procs)


def test_a_bench_past_its_time_is_killed() -> None:
    procs: list[subprocess.Popen[str]] = []
    with pytest.raises(NetworkError, match="ran over 1 s"):
        run_allreduce(_starter(procs), lambda _rank: _python(SLEEPS), 2, 1.0)
    assert [p.returncode for p in procs] == [-signal.SIGKILL] * 2
    assert _all_closed(procs)


def test_rank_zeros_result_is_returned() -> None:
    doc = {"backend": "gloo", "results": [{"size_bytes": 1024, "time_s": 0.001}]}
    says = f"print('noise'); print({RESULT_PREFIX + json.dumps(doc)!r})"
    procs: list[subprocess.Popen[str]] = []
    got = run_allreduce(
        _starter(procs), lambda rank: _python(says if rank == 0 else "pass"), 3, 60.0
    )
    assert got == doc
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert _all_closed(procs)
