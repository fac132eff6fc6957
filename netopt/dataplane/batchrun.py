"""Run a sync's small blocking calls in its thread pool, many per hand-off.

A tree of small files costs the sync a few blocking calls per chunk (verify, store in
the cache, write the file), each only microseconds of work. Handed to the pool one by
one, the hand-offs themselves (a future, a queue put, a thread wake-up, a wake-up of
the loop) cost more than the work: 60,000 of them for 20,000 files kept the client's
CPU busy. A `ThreadBatcher` queues the calls and hands them over in batches: one pool
job runs every call queued meanwhile (up to `MAX_BATCH` calls, `MAX_BATCH_BYTES` of
weight) in order, then wakes the loop once for them all. At most one job per pool
thread runs at a time; while they all run, new calls queue and go out together, so the
batches grow exactly when the CPU is short. A call alone in the queue goes out at
once, as a batch of one (a large chunk's verify keeps the latency it had).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any

__all__ = ["MAX_BATCH", "MAX_BATCH_BYTES", "ThreadBatcher"]

MAX_BATCH = 64
"""Calls one pool job runs at most."""
MAX_BATCH_BYTES = 4 * 1024 * 1024
"""Weight (bytes handled) one pool job takes at most, beyond its first call: large chunks
still spread over the pool's threads."""

_Call = tuple[Callable[..., Any], tuple[Any, ...], int, "asyncio.Future[Any]"]


def _run_batch(calls: list[_Call]) -> list[tuple[bool, Any]]:
    """Run each call in order; per call (ok, result or exception)."""
    results: list[tuple[bool, Any]] = []
    for func, args, _, _ in calls:
        try:
            results.append((True, func(*args)))
        except Exception as exc:  # handed back to the caller's await
            results.append((False, exc))
    return results


class ThreadBatcher:
    """Runs blocking calls on ``executor`` (with ``jobs`` threads), batched (module doc)."""

    def __init__(self, executor: Executor, jobs: int) -> None:
        self.executor = executor
        self.jobs = max(1, jobs)
        self._queue: deque[_Call] = deque()
        self._running = 0
        self._scheduled = False
        self.handoffs = 0
        """Pool jobs started (for tests and traces)."""
        self.calls = 0
        """Calls run."""

    async def run(self, func: Callable[..., Any], *args: Any, weight_bytes: int = 0) -> Any:
        """``func(*args)`` on a pool thread; its result, or its exception raised here.

        A call cancelled before its batch starts is not run (as with `run_in_executor`);
        one whose batch started runs to its end."""
        return await self.submit(func, *args, weight_bytes=weight_bytes)

    def submit(
        self, func: Callable[..., Any], *args: Any, weight_bytes: int = 0
    ) -> asyncio.Future[Any]:
        """`run` without a coroutine: the future of ``func(*args)`` (on the running loop).
        Cancelling it before its batch starts keeps the call from running. A server's
        stream queues a call per chunk ahead of sending it: a task each cost more than
        the call."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((func, args, weight_bytes, future))
        if not self._scheduled and self._running < self.jobs:
            # Launched on the loop's next turn: calls queued in this turn share the job.
            self._scheduled = True
            loop.call_soon(self._launch, loop)
        return future

    def _take(self, count: int) -> list[_Call]:
        """Up to ``count`` queued calls (and `MAX_BATCH`, `MAX_BATCH_BYTES`), oldest first;
        calls already cancelled are dropped."""
        batch: list[_Call] = []
        weight_bytes = 0
        while self._queue and len(batch) < min(count, MAX_BATCH):
            call = self._queue[0]
            if batch and weight_bytes + call[2] > MAX_BATCH_BYTES:
                break
            self._queue.popleft()
            if call[3].cancelled():
                continue
            batch.append(call)
            weight_bytes += call[2]
        return batch

    def _launch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduled = False
        while self._queue and self._running < self.jobs:
            # Split what is queued over the free threads (large calls run side by side).
            free = self.jobs - self._running
            batch = self._take(max(1, -(-len(self._queue) // free)))
            if not batch:
                continue
            self._running += 1
            self.handoffs += 1
            self.calls += len(batch)
            try:
                job = self.executor.submit(_run_batch, batch)
            except RuntimeError as exc:  # the pool is shut down
                self._finished(loop, batch, exc)
                continue
            job.add_done_callback(partial(self._job_done, loop, batch))

    def _job_done(
        self, loop: asyncio.AbstractEventLoop, batch: list[_Call], job: Future[Any]
    ) -> None:
        """On the pool thread: wake the loop once, with every result of ``batch``."""
        try:
            outcome: list[tuple[bool, Any]] | BaseException = job.result()
        except BaseException as exc:  # the pool refused or cancelled the job
            outcome = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(self._finished, loop, batch, outcome)

    def _finished(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: list[_Call],
        outcome: list[tuple[bool, Any]] | BaseException,
    ) -> None:
        self._running -= 1
        for index, (_, _, _, future) in enumerate(batch):
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
                continue
            ok, value = outcome[index]
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
        if self._queue and not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._launch, loop)
