"""The restart-storm scenario of ``bench_coordinator.py --scenario restart-storm``.

A fleet of simulated agents is registered with a coordinator that is then
SIGKILLed and replaced by a fresh one on an empty database (same port), while
every agent holds ``--spool-batches`` spooled batches. Each agent follows the
daemon's schedule (``netopt.agent.backoff``): its next heartbeat comes at a
random phase of ``--interval-s``, is answered 404, so it registers again
(retrying with full jitter) and replays its spool oldest first, one batch per
request. ``--lockstep`` gives every agent the same phase instead: the old
daemon's behaviour after a restart. Reports the latency of every request in the
storm (heartbeat, register, replay), p50/p90/p99/max, how long until every spool
was empty, and errors.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from netopt.agent.backoff import first_phase_s, full_jitter_s
from netopt.cli.output import print_table
from netopt.percentile import percentile

__all__ = ["print_storm", "storm", "storm_report"]

RETRY_MIN_S, RETRY_MAX_S = 1.0, 30.0  # as the daemon's
MAX_REGISTER_TRIES = 8


class _Storm:
    def __init__(self, url: str, args: argparse.Namespace, node: Callable[[int], tuple[str, str]]):
        self.url = url
        self.args = args
        self.node = node
        self.latency_ms: dict[str, list[float]] = {"heartbeat": [], "register": [], "replay": []}
        self.errors = 0
        self.first_error: str | None = None
        self.stored = 0
        self.replayed_at_s: list[float] = []
        self.registered_at_s: list[float] = []

    def _failed(self, what: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or what

    async def _call(
        self, kind: str, session: aiohttp.ClientSession, path: str, body: dict[str, Any]
    ) -> tuple[int, Any]:
        sent = time.perf_counter()
        try:
            async with session.post(self.url + path, json=body) as response:
                answer = await response.json()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, ValueError):
            status, answer = 0, None
        self.latency_ms[kind].append((time.perf_counter() - sent) * 1000)
        return status, answer

    async def agent(
        self,
        i: int,
        session: aiohttp.ClientSession,
        start_s: float,
        registration: Callable[[int], dict[str, Any]],
        batch: Callable[[int, int], dict[str, Any]],
    ) -> None:
        rng = random.Random(i)
        name = self.node(i)[0]
        phase_s = 0.0 if self.args.lockstep else first_phase_s(self.args.interval_s, rng)
        await asyncio.sleep(max(0.0, start_s + phase_s - time.time()))
        status, _ = await self._call("heartbeat", session, f"/api/v1/agents/{name}/heartbeat", {})
        if status != 404:
            self._failed(f"heartbeat: {status}, not 404")
        for attempt in range(MAX_REGISTER_TRIES):
            status, _ = await self._call("register", session, "/api/v1/agents/register",
                                         registration(i))  # fmt: skip
            if status == 200:
                break
            await asyncio.sleep(full_jitter_s(attempt, rng, base_s=RETRY_MIN_S, cap_s=RETRY_MAX_S))
        else:
            self._failed(f"register: {status}")
            return
        self.registered_at_s.append(time.time() - start_s)
        for seq in range(self.args.spool_batches):
            status, answer = await self._call(
                "replay", session, f"/api/v1/agents/{name}/summaries", batch(i, seq)
            )
            if status != 200:
                self._failed(f"replay: {status} {answer}")
                return
            self.stored += answer["accepted"]
        self.replayed_at_s.append(time.time() - start_s)


async def storm(
    url: str,
    args: argparse.Namespace,
    node: Callable[[int], tuple[str, str]],
    registration: Callable[[int], dict[str, Any]],
    batch: Callable[[int, int], dict[str, Any]],
    headers: dict[str, str],
) -> dict[str, Any]:
    """Run the storm against the (just restarted, empty) coordinator at ``url``."""
    state = _Storm(url, args, node)
    timeout = aiohttp.ClientTimeout(total=60)
    sessions = [
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1), timeout=timeout, headers=headers
        )
        for _ in range(args.agents)
    ]
    try:
        start_s = time.time() + 0.5
        await asyncio.gather(*(
            state.agent(i, sessions[i], start_s, registration, batch) for i in range(args.agents)
        ))  # fmt: skip
    finally:
        await asyncio.gather(*(s.close() for s in sessions))
    return {
        "latency_ms": state.latency_ms,
        "errors": state.errors,
        "first_error": state.first_error,
        "stored": state.stored,
        "registered_all_s": max(state.registered_at_s, default=None),
        "replayed_all_s": max(state.replayed_at_s, default=None),
    }


def _quantiles(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    if not ordered:
        return {"p50": None, "p90": None, "p99": None, "max": None, "count": 0}
    return {q: percentile(ordered, p) for q, p in (("p50", 50), ("p90", 90), ("p99", 99))} | {
        "max": ordered[-1], "count": len(ordered)}  # fmt: skip


def storm_report(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    """The JSON report: quantiles per request kind and over all requests of the storm."""
    by_kind = result.pop("latency_ms")
    every = [ms for values in by_kind.values() for ms in values]
    return {
        "scenario": "restart-storm",
        "agents": args.agents,
        "interval_s": args.interval_s,
        "spool_batches": args.spool_batches,
        "summaries_per_batch": args.summaries_per_batch,
        "lockstep": args.lockstep,
        "latency_ms": {"all": _quantiles(every)}
        | {kind: _quantiles(values) for kind, values in by_kind.items()},
        **result,
        "expected_stored": args.agents * args.spool_batches * args.summaries_per_batch,
    }


def print_storm(report: dict[str, Any]) -> None:
    """The table: one row per request kind, then all of them."""
    rows = []
    for kind in ("heartbeat", "register", "replay", "all"):
        q = report["latency_ms"][kind]
        rows.append([kind, q["count"], q["p50"], q["p90"], q["p99"], q["max"]])
    phase = "lockstep" if report["lockstep"] else "random phase"
    print_table(
        f"coordinator restart storm: {report['agents']} agents, {report['spool_batches']} "
        f"spooled batches each, {phase} over {report['interval_s']:g} s; all re-registered "
        f"after {report['registered_all_s']:.1f} s, all replayed after "
        f"{report['replayed_all_s']:.1f} s, {report['errors']} errors",
        ["requests", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"],
        rows,
    )
