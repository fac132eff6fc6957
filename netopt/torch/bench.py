"""``netopt bench allreduce``: torch.distributed all-reduce, measured like nccl-tests.

For each message size the slowest rank's mean time ``t`` gives
``algbw = S / t`` and ``busbw = algbw x 2(n-1)/n`` (nccl-tests' PERFORMANCE.md:
the bus bandwidth of all-reduce, comparable with the link rate). Each rank runs
in its own process (:mod:`netopt.torch.bench_worker`): on loopback without a lab,
or one per lab node through ``lab.popen``. This module never imports torch.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from netopt.errors import NetworkError, ValidationError
from netopt.nccl.costmodel import Fabric, predict
from netopt.torch.bench_worker import RESULT_PREFIX
from netopt.torch.rendezvous import rendezvous_port

__all__ = [
    "BenchReport",
    "BenchRow",
    "LabLike",
    "bus_bandwidth_gbps",
    "run_allreduce",
    "run_loopback",
    "run_on_lab",
    "size_ladder",
    "with_predictions",
    "worker_argv",
]


class LabLike(Protocol):
    """What the bench needs from a lab (netopt.lab.Lab has it)."""

    def address(self, node: str) -> str: ...
    def popen(self, node: str, argv: Sequence[str], **popen_kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class BenchRow:
    """One message size: measured time and bandwidths, and the model's prediction."""

    size_bytes: int
    time_s: float
    algbw_gbps: float
    busbw_gbps: float
    predicted_s: float | None = None
    predicted_algorithm: str | None = None


@dataclass(frozen=True)
class BenchReport:
    """A whole run."""

    backend: str
    ranks: int
    nodes: tuple[str, ...]
    rows: tuple[BenchRow, ...]


def bus_bandwidth_gbps(algbw_gbps: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: ``algbw x 2(n-1)/n``."""
    return algbw_gbps * 2 * (ranks - 1) / ranks if ranks > 1 else 0.0


def size_ladder(min_bytes: int, max_bytes: int, factor: int = 4) -> tuple[int, ...]:
    """``min, min*factor, ...`` up to ``max`` (inclusive when it lands on it).

    Raises ValidationError unless 4 <= min <= max and factor >= 2.
    """
    if min_bytes < 4 or max_bytes < min_bytes or factor < 2:
        raise ValidationError(
            f"sizes {min_bytes}..{max_bytes} x{factor}: need 4 <= min <= max and factor >= 2"
        )
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes:
        sizes.append(sizes[-1] * factor)
    return tuple(sizes)


def worker_argv(
    rank: int,
    world: int,
    master: str,
    sizes: Sequence[int],
    *,
    iters: int,
    warmup: int,
    backend: str,
    ifname: str | None,
    timeout_s: float,
) -> list[str]:
    """The command line of one rank."""
    argv = [
        sys.executable, "-m", "netopt.torch.bench_worker",
        "--rank", str(rank), "--world", str(world), "--master", master,
        "--sizes", ",".join(str(s) for s in sizes),
        "--iters", str(iters), "--warmup", str(warmup), "--backend", backend,
        "--timeout-s", str(timeout_s),
    ]  # fmt: skip
    if ifname:
        argv += ["--ifname", ifname]
    return argv


def _rows(document: dict[str, Any], ranks: int) -> tuple[BenchRow, ...]:
    rows = []
    for item in document["results"]:
        size, time_s = int(item["size_bytes"]), float(item["time_s"])
        algbw = size / time_s / 1e9 if time_s > 0 else 0.0
        rows.append(BenchRow(size, time_s, algbw, bus_bandwidth_gbps(algbw, ranks)))
    return tuple(rows)


def run_allreduce(
    start_rank: Callable[[int, list[str]], Any],
    argv_for: Callable[[int], list[str]],
    ranks: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Start every rank with ``start_rank(rank, argv)`` and return rank 0's result document.

    Each rank's output is read on a thread of its own. Once a rank has failed, the others
    are killed at once: a rank waiting for a peer that is gone (its rendezvous, its
    collective) would otherwise hold the bench for its whole timeout. Every process is
    killed past ``timeout_s`` and waited for, its pipes closed. Raises NetworkError
    when a rank fails or no result comes back in time.
    """
    procs = [start_rank(rank, argv_for(rank)) for rank in range(ranks)]
    outputs: list[tuple[str, str]] = [("", "")] * ranks

    def collect(rank: int) -> None:
        out, err = procs[rank].communicate()  # reads to the end, then closes the pipes
        outputs[rank] = (out or "", err or "")

    readers = [threading.Thread(target=collect, args=(r,), daemon=True) for r in range(ranks)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        while any(reader.is_alive() for reader in readers):
            if any(proc.poll() not in (None, 0) for proc in procs):
                break  # a rank failed: the others are killed below
            if time.monotonic() > deadline:
                raise NetworkError(f"all-reduce bench ran over {timeout_s:g} s")
            time.sleep(_POLL_S)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for reader in readers:
            reader.join(timeout=10)
        for proc in procs:  # a reader still blocked (a pipe some child holds open)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
    failed = [r for r, proc in enumerate(procs) if proc.returncode != 0]
    if failed:
        # The first to fail says why; the ones killed after it (signals) only died of it.
        rank = min(failed, key=lambda r: (procs[r].returncode or 0) < 0)
        err = outputs[rank][1]
        raise NetworkError(
            f"bench rank {rank} exited {procs[rank].returncode}: {err.strip()[-1500:]}"
        )
    for line in outputs[0][0].splitlines():
        if line.startswith(RESULT_PREFIX):
            document: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            return document
    raise NetworkError("bench rank 0 printed no result")


_POLL_S = 0.05
"""How often `run_allreduce` looks for a failed rank."""


def run_loopback(
    ranks: int,
    sizes: Sequence[int],
    *,
    iters: int = 5,
    warmup: int = 1,
    backend: str = "gloo",
    timeout_s: float = 120.0,
) -> BenchReport:
    """All ranks as local processes over loopback (127.0.0.1, Gloo on ``lo``)."""
    if ranks < 2:
        raise ValidationError("an all-reduce bench needs at least 2 ranks")
    master = f"127.0.0.1:{rendezvous_port()}"

    def argv_for(rank: int) -> list[str]:
        return worker_argv(rank, ranks, master, sizes, iters=iters, warmup=warmup,
                           backend=backend, ifname="lo", timeout_s=timeout_s)  # fmt: skip

    def start(rank: int, argv: list[str]) -> subprocess.Popen[str]:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    document = run_allreduce(start, argv_for, ranks, timeout_s)
    names = tuple(f"rank{r}" for r in range(ranks))
    return BenchReport(document["backend"], ranks, names, _rows(document, ranks))


def run_on_lab(
    lab: LabLike,
    nodes: Sequence[str],
    sizes: Sequence[int],
    *,
    ifnames: Sequence[str] | None = None,
    iters: int = 3,
    warmup: int = 1,
    timeout_s: float = 300.0,
) -> BenchReport:
    """One Gloo rank per lab node (rank order = ``nodes``), rank 0 on ``nodes[0]``."""
    if len(nodes) < 2:
        raise ValidationError("an all-reduce bench needs at least 2 nodes")
    master = f"{lab.address(nodes[0])}:{20000 + secrets.randbelow(20000)}"

    def argv_for(rank: int) -> list[str]:
        ifname = ifnames[rank] if ifnames else None
        return worker_argv(rank, len(nodes), master, sizes, iters=iters, warmup=warmup,
                           backend="gloo", ifname=ifname, timeout_s=timeout_s)  # fmt: skip

    def start(rank: int, argv: list[str]) -> Any:
        return lab.popen(
            nodes[rank], argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    document = run_allreduce(start, argv_for, len(nodes), timeout_s)
    return BenchReport(document["backend"], len(nodes), tuple(nodes), _rows(document, len(nodes)))


def with_predictions(report: BenchReport, fabric: Fabric, algorithm: str = "ring") -> BenchReport:
    """The report with the cost model's time for ``algorithm`` beside each row.

    Gloo's all-reduce is a ring; pass ``best`` to take the model's fastest algorithm.
    """
    rows = []
    for row in report.rows:
        times = predict(fabric, row.size_bytes)
        name = min(times, key=lambda a: times[a]) if algorithm == "best" else algorithm
        rows.append(replace(row, predicted_s=times[name], predicted_algorithm=name))
    return replace(report, rows=tuple(rows))
